"""CPU model of the device assign kernel (src/kernels/split_kv_decode/assign.cu), checked against build_task_map.

The CUDA kernel cannot run here, so its algorithm is mirrored thread by thread in Python: the same per-thread pair
ownership, the same warp shuffle scans, the same closed-form chunk counts, the same multiply-high division, the
same bin-thread binary search and the same write loops. Every store goes through `_Workspace.store`, which
counts writes, so the tests also prove that every workspace entry is written exactly once (no entry left
unwritten from a previous step, no two threads racing on one address). The generic path (the original two-scan
kernel, used above FAST_MAX_PAIRS pairs) is mirrored as well. early=True mirrors the PDL launch (plan(early=True)):
the model marks the kernel's cudaGridDependencySynchronize, and a workspace store before it fails (a store there
could race the previous kernel still reading or writing the workspace); test_assign_source_* pin the same ordering
in assign.cu itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hotpaths.reference.split_kv_decode import build_task_map, compare_workspaces, workspace_len

FAST_THREADS = 256
FAST_WARPS = FAST_THREADS // 32
FAST_PER = 4
FAST_MAX_PAIRS = FAST_THREADS * FAST_PER
GENERIC_THREADS = 1024
U32 = 0xFFFFFFFF


class _Workspace:
    """The int32 workspace with a write counter per entry (a second write to an entry is a race)."""

    def __init__(self, C: int, max_pairs: int, early: bool = False):
        self.v = np.full(workspace_len(C, max_pairs), 0x5EED, dtype=np.int64)  # never a legal value
        self.count = np.zeros(len(self.v), dtype=np.int64)
        self.early, self.waited = early, False

    def wait(self) -> None:
        """The kernel's PDL wait (hp::pdl_wait): from here on the previous kernel has completed."""
        self.waited = True

    def store(self, i: int, x: int) -> None:
        assert self.waited or not self.early, f"workspace store to {i} before the PDL wait (early launch)"
        assert 0 <= i < len(self.v), f"store out of bounds: {i} of {len(self.v)}"
        assert -2 ** 31 <= x < 2 ** 31, f"int32 overflow: {x}"
        self.v[i] = x
        self.count[i] += 1


def make_fastdiv(d: int) -> tuple[int, int]:
    """(d, m) with m = ceil(2^32 / d) as the kernel's `0xFFFFFFFF / d + 1` (0 for d == 1)."""
    assert 1 <= d < 2 ** 31
    return d, ((U32 // d + 1) & U32) if d > 1 else 0


def fdiv(x: int, f: tuple[int, int]) -> int:
    """The kernel's fdiv: umulhi(x, m), minus one if that overshoots; exact for 0 <= x < 2^31."""
    d, m = f
    assert 0 <= x < 2 ** 31, x
    q = (x * m) >> 32
    q = q - 1 if ((q * d) & U32) > x else q
    return x if d == 1 else q


def _warp_inclusive_scan(vals: list[int]) -> list[int]:
    """__shfl_up_sync inclusive scan over one warp's 32 lanes (Hillis-Steele, as in the kernel)."""
    x = list(vals)
    o = 1
    while o < 32:
        y = [x[lane - o] if lane >= o else x[lane] for lane in range(32)]
        x = [x[lane] + y[lane] if lane >= o else x[lane] for lane in range(32)]
        o <<= 1
    return x


def assign_fast_model(lens, H: int, C: int, F: int, max_pairs: int, early: bool = False) -> _Workspace:
    """Mirror of assign_fast_kernel (batch * H <= FAST_MAX_PAIRS). Returns the written workspace."""
    batch = len(lens)
    n = batch * H
    assert n <= FAST_MAX_PAIRS and n <= max_pairs
    ws = _Workspace(C, max_pairs, early)
    hdr, bs = 0, 8
    dsc = bs + C + 1
    cst = dsc + 4 * (max_pairs + C)
    nch = cst + max_pairs
    per = (n + FAST_THREADS - 1) // FAST_THREADS
    threads = range(FAST_THREADS)
    st = [dict() for _ in threads]  # per-thread registers

    # 1. loads, then the data-independent stores
    for tid in threads:
        s = st[tid]
        p0 = tid * per
        cnt = max(0, min(per, n - p0))
        r = h = 0
        if cnt > 0:
            h = 0 if H == 1 else p0 // batch
            r = p0 - h * batch
        rr, hh, ln = [], [], []
        for k in range(FAST_PER):
            rr.append(r)
            hh.append(h)
            ln.append(int(lens[r]) if k < cnt else 0)
            r += 1
            if r == batch:
                r, h = 0, h + 1
        s.update(p0=p0, cnt=cnt, rr=rr, hh=hh, len=ln, lane=tid & 31, warp=tid >> 5)

    def write_fixed(tid: int) -> None:  # the data-independent entries (early: after the wait)
        if tid == 0:
            for j, v in enumerate((batch, H, C, F)):
                ws.store(hdr + 4 + j, v)
        for p in range(n + tid, max_pairs, FAST_THREADS):
            ws.store(cst + p, -1)
            ws.store(nch + p, -1)
        for i in range(4 * (n + C - 1) + tid, 4 * (max_pairs + C), FAST_THREADS):
            ws.store(dsc + i, -1)

    if not early:
        ws.wait()  # a plain launch: the previous kernel completed before this one started
        for tid in threads:
            write_fixed(tid)
    divC = make_fastdiv(C)

    # 2. tiles, warp scan, barrier 1
    for s in st:
        t, tx, my = [], [], 0
        for k in range(FAST_PER):
            t.append((max(s["len"][k], 0) + 63) >> 6)
            tx.append(my)
            my += t[-1]
        s.update(t=t, tx=tx, my_t=my)
    s_wtiles = [0] * FAST_WARPS
    for w in range(FAST_WARPS):
        inc = _warp_inclusive_scan([st[w * 32 + lane]["my_t"] for lane in range(32)])
        for lane in range(32):
            st[w * 32 + lane]["inc"] = inc[lane]
        s_wtiles[w] = inc[31]
    # after barrier 1: each thread reads the warp totals itself
    for s in st:
        T = woff = 0
        for w in range(FAST_WARPS):
            woff += s_wtiles[w] if w < s["warp"] else 0
            T += s_wtiles[w]
        ts0 = woff + s["inc"] - s["my_t"]
        B = F
        if T > 0:
            q = fdiv(T, divC)
            q += 1 if q * C < T else 0
            B = max(q, F)
        divB = make_fastdiv(B)
        nbins = 0
        if T > 0:
            nbins = fdiv(T, divB)
            nbins += 1 if nbins * B < T else 0
        s.update(T=T, ts0=ts0, B=B, divB=divB, nbins=nbins)

    # 3. chunks, warp scan, shared pair records, barrier 2
    s_pair = [None] * FAST_MAX_PAIRS
    for s in st:
        b0, nc, cx, my = [], [], [], 0
        for k in range(FAST_PER):
            ts = s["ts0"] + s["tx"][k]
            b0.append(fdiv(ts, s["divB"]))
            nc.append(fdiv(ts + s["t"][k] - 1, s["divB"]) - b0[k] + 1 if s["t"][k] > 0 else 0)
            cx.append(my)
            my += nc[k]
        s.update(b0=b0, nc=nc, cx=cx, my_c=my)
    s_wchunks = [0] * FAST_WARPS
    for w in range(FAST_WARPS):
        cinc = _warp_inclusive_scan([st[w * 32 + lane]["my_c"] for lane in range(32)])
        for lane in range(32):
            s = st[w * 32 + lane]
            s["cinc"] = cinc[lane]
            for k in range(FAST_PER):
                if k < s["cnt"]:
                    assert s_pair[s["p0"] + k] is None, "two owners of one pair"
                    ts = s["ts0"] + s["tx"][k]
                    s_pair[s["p0"] + k] = (ts, ts + s["t"][k], s["cinc"] - s["my_c"] + s["cx"][k], s["warp"])
        s_wchunks[w] = cinc[31]
    assert all(s_pair[p] is not None for p in range(n)), "a pair without an owner"

    # 4. after barrier 2 (early: the PDL wait, then the data-independent entries)
    if early:
        ws.wait()
        for tid in threads:
            write_fixed(tid)
    for tid, s in enumerate(st):
        wc, ndesc = [], 0
        for w in range(FAST_WARPS):
            wc.append(ndesc)
            ndesc += s_wchunks[w]
        B, divB, nbins, T = s["B"], s["divB"], s["nbins"], s["T"]
        cs0 = wc[s["warp"]] + s["cinc"] - s["my_c"]
        for k in range(FAST_PER):  # 4a. pair owner
            if k < s["cnt"]:
                p, cs, ts, t = s["p0"] + k, cs0 + s["cx"][k], s["ts0"] + s["tx"][k], s["t"][k]
                ws.store(cst + p, cs)
                ws.store(nch + p, s["nc"][k])
                if t > 0 and s["b0"][k] * B != ts:
                    b0 = s["b0"][k]
                    for j, v in enumerate((s["rr"][k], s["hh"][k], 0, min(ts + t, (b0 + 1) * B) - ts)):
                        ws.store(dsc + 4 * cs + j, v)
        for b in range(tid, nbins, FAST_THREADS):  # 4b. bin thread
            x = b * B
            lo, hi = 0, n - 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if s_pair[mid][1] > x:
                    hi = mid
                else:
                    lo = mid + 1
            e = s_pair[lo]
            idx = wc[e[3]] + e[2] + b - fdiv(e[0], divB)
            h = lo // batch
            for j, v in enumerate((lo - h * batch, h, x - e[0], min(e[1], x + B) - e[0])):
                ws.store(dsc + 4 * idx + j, v)
            ws.store(bs + b, idx)
        for b in range(nbins + tid, C + 1, FAST_THREADS):
            ws.store(bs + b, ndesc)
        for i in range(4 * ndesc + tid, 4 * (n + C - 1), FAST_THREADS):
            ws.store(dsc + i, -1)
        if tid == 0:
            for j, v in enumerate((T, B, nbins, ndesc)):
                ws.store(hdr + j, v)
    return ws


def assign_generic_model(lens, H: int, C: int, F: int, max_pairs: int, early: bool = False) -> _Workspace:
    """Mirror of assign_generic_kernel (the original kernel: contiguous pairs per thread, two block scans)."""
    batch = len(lens)
    n = batch * H
    ws = _Workspace(C, max_pairs, early)
    if not early:
        ws.wait()
    bs = 8
    dsc = bs + C + 1
    cst = dsc + 4 * (max_pairs + C)
    nch = cst + max_pairs
    per = (n + GENERIC_THREADS - 1) // GENERIC_THREADS
    rng = [(min(n, tid * per), min(n, min(n, tid * per) + per)) for tid in range(GENERIC_THREADS)]
    tiles = [(max(int(lens[p % batch]), 0) + 63) >> 6 for p in range(n)]
    my_t = [sum(tiles[p0:p1]) for p0, p1 in rng]
    ts0 = np.concatenate([[0], np.cumsum(my_t)[:-1]]).tolist()  # block exclusive scan
    T = int(sum(my_t))
    B = F if T == 0 else max((T + C - 1) // C, F)
    nbins = 0 if T == 0 else (T + B - 1) // B
    my_c = []
    for (p0, p1), ts in zip(rng, ts0):
        c = 0
        for p in range(p0, p1):
            if tiles[p] > 0:
                c += (ts + tiles[p] - 1) // B - ts // B + 1
            ts += tiles[p]
        my_c.append(c)
    cs0 = np.concatenate([[0], np.cumsum(my_c)[:-1]]).tolist()
    ndesc = int(sum(my_c))
    if early:
        ws.wait()  # passes 1-2 read only kv_lens; pass 3 writes
    for _tid, ((p0, p1), ts, cs) in enumerate(zip(rng, ts0, cs0)):
        for p in range(p0, p1):
            r, h, t = p % batch, p // batch, tiles[p]
            nc = 0
            if t > 0:
                b0, b1 = ts // B, (ts + t - 1) // B
                nc = b1 - b0 + 1
                for c in range(nc):
                    b = b0 + c
                    beg, end = max(ts, b * B), min(ts + t, (b + 1) * B)
                    for j, v in enumerate((r, h, beg - ts, end - ts)):
                        ws.store(dsc + 4 * (cs + c) + j, v)
                    if beg == b * B:
                        ws.store(bs + b, cs + c)
            ws.store(cst + p, cs)
            ws.store(nch + p, nc)
            ts += t
            cs += nc
    for tid in range(GENERIC_THREADS):
        for b in range(nbins + tid, C + 1, GENERIC_THREADS):
            ws.store(bs + b, ndesc)
        for i in range(4 * ndesc + tid, 4 * (max_pairs + C), GENERIC_THREADS):
            ws.store(dsc + i, -1)
        for p in range(n + tid, max_pairs, GENERIC_THREADS):
            ws.store(cst + p, -1)
            ws.store(nch + p, -1)
    for j, v in enumerate((T, B, nbins, ndesc, batch, H, C, F)):
        ws.store(j, v)
    return ws


def assign_model(lens, H: int, C: int, F: int, max_pairs: int, early: bool = False) -> _Workspace:
    """The launcher's dispatch: the fast path up to FAST_MAX_PAIRS pairs, the generic kernel above."""
    n = len(lens) * H
    if n <= FAST_MAX_PAIRS:
        return assign_fast_model(lens, H, C, F, max_pairs, early)
    return assign_generic_model(lens, H, C, F, max_pairs, early)


def _check(lens, H, C, F=2, extra=0, model=assign_model, early=False):
    lens = [int(x) for x in lens]
    max_pairs = len(lens) * H + extra
    ws = model(lens, H, C, F, max_pairs, early)
    assert ws.waited, "the model never reached the kernel's PDL wait"
    unwritten = np.nonzero(ws.count == 0)[0]
    assert len(unwritten) == 0, f"{len(unwritten)} entries never written, first flat {unwritten[0]}"
    twice = np.nonzero(ws.count > 1)[0]
    assert len(twice) == 0, f"{len(twice)} entries written more than once, first flat {twice[0]}"
    tm = build_task_map(lens, H, C, min_tiles=F, max_pairs=max_pairs)
    msg = compare_workspaces(ws.v, tm)
    assert msg is None, f"lens={lens[:12]}... H={H} C={C} F={F} extra={extra}: {msg}"


def test_fastdiv_exact():
    rng = np.random.default_rng(0)
    ds = [1, 2, 3, 7, 16, 63, 64, 65, 1000, 2 ** 16 + 1, 2 ** 30 - 1, 2 ** 31 - 1]
    ds += rng.integers(1, 2 ** 31, 40).tolist()
    xs = [0, 1, 2 ** 31 - 1, 2 ** 31 - 2] + rng.integers(0, 2 ** 31, 200).tolist()
    for d in ds:
        f = make_fastdiv(int(d))
        for x in xs + [int(d) - 1, int(d), int(d) + 1, 2 * int(d) - 1]:
            if 0 <= x < 2 ** 31:
                assert fdiv(int(x), f) == int(x) // int(d), (x, d)


EDGE = [
    ([], 1, 5), ([0], 1, 1), ([0] * 7, 1, 132), ([1], 1, 1), ([1], 3, 5), ([64], 1, 264), ([65], 1, 264),
    ([131072] + [4096] * 31, 1, 264), ([4096] * 64, 1, 264), ([512] * 64, 1, 264), ([16384] + [64] * 15, 1, 264),
    ([4096] * 256, 1, 264), ([1, 64, 65, 127, 128, 129], 2, 7), ([500000], 1, 132), ([0, 0, 5000, 0], 2, 3),
    ([64 * 3] * 4, 1, 132), ([2 ** 20], 1, 132), ([7] * 256, 4, 264), ([4096] * 1024, 1, 264),
    ([100] * 512, 2, 1000), ([64] * 264, 1, 264), ([128] * 132, 1, 264),
]


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("case", range(len(EDGE)))
def test_model_edge_cases(case, early):
    lens, H, C = EDGE[case]
    for F in (1, 2, 16):
        _check(lens, H, C, F, early=early)
    _check(lens, H, C, 2, extra=5, early=early)


def test_model_random_distributions():
    rng = np.random.default_rng(1)
    kinds = ("uniform", "skewed", "sparse", "tiny", "aligned")
    for it in range(120):
        batch = int(rng.choice([1, 2, 3, 31, 32, 33, 64, 100, 255, 256, 257, 511, 1024]))
        H = int(rng.choice([1, 1, 2, 4, 8]))
        while batch * H > FAST_MAX_PAIRS:
            H = max(1, H // 2) if H > 1 else H
            if batch * H > FAST_MAX_PAIRS:
                batch //= 2
        kind = kinds[it % len(kinds)]
        if kind == "uniform":
            lens = rng.integers(0, 9000, batch)
        elif kind == "skewed":
            lens = rng.integers(0, 300, batch)
            lens[rng.integers(0, batch)] = int(rng.integers(50000, 300000))
        elif kind == "sparse":
            lens = np.where(rng.random(batch) < 0.8, 0, rng.integers(1, 20000, batch))
        elif kind == "tiny":
            lens = rng.integers(0, 3, batch)
        else:
            lens = 64 * rng.integers(0, 40, batch)
        C = int(rng.choice([1, 3, 8, 132, 264, 1000]))
        F = int(rng.choice([1, 2, 4, 16, 64]))
        _check(lens, H, C, F, extra=int(rng.choice([0, 0, 7])))


def test_generic_path_random():
    """Above FAST_MAX_PAIRS pairs the launcher uses the generic kernel: same map."""
    rng = np.random.default_rng(2)
    for batch, H, C in ((1025, 1, 264), (600, 2, 132), (2048, 2, 264), (4100, 1, 7)):
        lens = rng.integers(0, 5000, batch)
        lens[0] = 200000
        _check(lens, H, C, int(rng.choice([1, 2, 8])), extra=3)
        _check(lens, H, C, 2, extra=3, early=True)


def test_fast_model_agrees_with_generic_model():
    rng = np.random.default_rng(3)
    for _ in range(6):
        lens = rng.integers(0, 6000, int(rng.integers(1, 300))).tolist()
        _check(lens, 1, 264, 2, model=assign_fast_model)
        _check(lens, 1, 264, 2, model=assign_generic_model)


# ----------------------------------------------------------------------------------------------------------------
# The early (PDL) ordering in assign.cu itself: what the model above assumes of the kernel's text.

_ASSIGN_CU = Path(__file__).resolve().parents[1] / "src" / "kernels" / "split_kv_decode" / "assign.cu"
_STORE = re.compile(r"\b(desc|bin_start|chunk_start|num_chunks|d)\[[^\]]*\]\s*=(?!=)|write_header_\w+\(")


def _kernel_bodies() -> dict[str, str]:
    """name -> body text of every __global__ kernel in assign.cu (brace-matched)."""
    src = re.sub(r"//[^\n]*", "", _ASSIGN_CU.read_text())
    out = {}
    for m in re.finditer(r"__global__[^{;]*?\b(assign_\w+_kernel)\s*\(", src):
        i = src.index("{", m.end())
        depth, j = 0, i
        while True:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
            if depth == 0:
                break
        out[m.group(1)] = src[i:j]
    return out


def test_assign_source_every_cta_reaches_the_wait():
    """No early exit in either assign kernel (one CTA each): a CTA that returned before hp::pdl_wait would let the
    grid complete before its predecessor, and the attention kernel's wait (which covers only assign) would no longer
    cover the prologue's Q and K/V writes."""
    bodies = _kernel_bodies()
    assert set(bodies) == {"assign_fast_kernel", "assign_generic_kernel"}, sorted(bodies)
    for name, body in bodies.items():
        assert "hp::pdl_wait()" in body, f"{name}: no PDL wait"
        assert not re.search(r"\breturn\b", re.sub(r"\[&\]\([^)]*\)[^{]*\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", body)), \
            f"{name}: a return statement (outside a lambda) could skip the PDL wait"


def test_assign_source_no_workspace_store_before_the_wait():
    """In each kernel the text before hp::pdl_wait() stores nothing to the workspace, except the write_fixed lambda's
    definition, whose only call there is under `if (!early)` (the plain launch)."""
    for name, body in _kernel_bodies().items():
        pre = body[:body.index("hp::pdl_wait()")]
        lam = re.search(r"auto write_fixed = \[&\]\(\) \{.*?\n  \};", pre, re.S)
        if lam:
            pre = pre[:lam.start()] + pre[lam.end():]
            calls = [m.start() for m in re.finditer(r"write_fixed\(\)", pre)]
            assert all(pre[max(0, c - 20):c].rstrip().endswith("if (!early)") for c in calls), \
                f"{name}: write_fixed() called before the wait outside `if (!early)`"
        hit = _STORE.search(pre)
        assert hit is None, f"{name}: workspace store before the PDL wait: {pre[hit.start():hit.start() + 60]!r}"
