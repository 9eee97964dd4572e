"""Split-KV decode attention benchmarks: the tables of notebook 02 and the ``hotpaths decode`` subcommand.

Tables (all rows: tables.COLUMNS first, then the extra columns listed in EXTRA_COLUMNS):
- ``decode_kv_distribution`` (decode_rows): per case x KV dtype x impl: correctness vs the fp64 reference on the
  same quantized inputs (output NaN-poisoned before the first launch), then the median of CUDA-graph replays with
  L2 flushed before each (hotpaths.harness.bench). Time per layer = attention + combine: ``run()`` only; the task
  map (plan / assign) is built once per step and reported separately as impl ``assign_only``.
- ``decode_skew_sweep`` (skew_sweep_rows): constant total tokens, one request growing from 1/batch of them.
- ``decode_fixed_costs`` (overhead_rows): assign alone by batch size (the kernel API has no combine-only entry, so
  combine is not timed alone; the row says so).
- ``decode_ncu`` (ncu_rows): Nsight Compute of the dynamic kernel on two cases.
Our impls are a mode (OUR_IMPLS) optionally followed by plan settings, ``mode:token:...`` (split_impl): a variant
(``dynamic:v3b``), ``fuseall`` / ``fuseauto`` / ``fuse<N>`` (fuse_max), ``cw32`` / ``cwauto`` (combine warps),
``mt<N>`` (min_tiles), so one
run A/Bs kernel configurations beside the peers; the row's impl is the whole spec.
Without an SM90 GPU the kernel impls become ``<impl>_emulation`` rows (hotpaths.reference's same-precision
emulation over the same task map) with correctness and no timing; peers record why they did not run.

bytes = K and V read once + Q + the bf16 output (hotpaths.reference.split_kv_decode.bytes_moved); gbps = bytes /
median; pct_of_ceiling = gbps / the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from types import SimpleNamespace

import torch

from hotpaths.bench import split_kv_decode_peers as P
from hotpaths.harness import ncu
from hotpaths.harness.bench import bench, read_probe_columns, timing_floor
from hotpaths.harness.ceilings import measure, pct_of_ceiling
from hotpaths.harness.check import check
from hotpaths.harness.cli import add_op_command, emit_rows
from hotpaths.harness.env import REPO_ROOT, device_tag, sm90_skip_reason
from hotpaths.harness.runs import run_id
from hotpaths.harness.shapes import case_list_arg, expand_lengths, format_case, int_list_arg, load_shapes, parse_cases
from hotpaths.harness.tables import published
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as ref
from hotpaths.reference.split_kv_decode import DEFAULT_MIN_TILES

OP = "split_kv_decode"
OUR_IMPLS = ("dynamic", "static_count", "static_chunk", "batch_invariant")
STATIC_IMPLS = ("static_count", "static_chunk")
# Case lists: data/shapes/split_kv_decode.yaml (the six published cases, then three more skewed ones; the ncu and
# per-stage cases; the skew sweep).
SHAPES = load_shapes(OP)
ISSUE_CASES = tuple(SHAPES["issue_cases"])
NCU_CASES = tuple(SHAPES["ncu_cases"])
STAGE_CASES = tuple(SHAPES["stage_cases"])
SKEW = SHAPES["skew"]
H200_SMS = 132  # persistent grid of the emulation on CPU (the kernel defaults to the device's SM count)
DTYPE_LABEL = {"fp8": "fp8_kv", "bf16": "bf16_kv"}
# q_len: query tokens per request (MTP). hpc_ops_us: the faster of HPC-Ops' decode impls (hpc_ops_dynamic,
# hpc_ops_static) that ran in the same run on the same inputs; vs_hpc_ops = hpc_ops_us / this row's median (> 1:
# this row is faster), empty with the reason in `note` when HPC-Ops did not run.
EXTRA_COLUMNS = ["q_len", "read_probe_us", "pct_of_read_probe", "kv_bytes", "floor_us", "dynamic_vs_static",
                 "published_dynamic_vs_static", "hpc_ops_us", "vs_hpc_ops", "check_passed", "method", "note"]

_PUBLISHED_COL = {"dynamic": "hpc_dynamic_ms", "static_count": "hpc_static_ms", "static_chunk": "hpc_static_ms",
                  "static": "hpc_static_ms", "flashinfer_xqa": "flashinfer_ms", "flashinfer_tc": "flashinfer_ms",
                  "flashattention": "flashattention_ms"}


def _strip_emulation(impl: str) -> str:
    return impl[: -len("_emulation")] if impl.endswith("_emulation") else impl


def _base_impl(impl: str) -> str:
    """The mode or peer name of a row's impl (without ``_emulation`` and without a spec's plan settings)."""
    return _strip_emulation(impl).split(":")[0]


def split_impl(spec: str) -> tuple[str, dict]:
    """``"dynamic:v3b:fuseall:cw32:mt4"`` -> ("dynamic", {variant: "v3b", fuse_max: FUSE_ALL, combine_warps: 32,
    min_tiles: 4}): one of our impls (a mode of OUR_IMPLS) with plan() settings. Tokens: a variant of
    hotpaths.kernels.split_kv_decode.VARIANTS or "auto"; ``fuseall`` (fuse_max = FUSE_ALL), ``fuseauto`` (fuse_max
    "auto": fuse-all at few chunks) or ``fuse<N>``; ``cw8`` / ``cw32`` / ``cwauto`` (combine_warps); ``mt<N>``
    (min_tiles, N >= 1).

    Raises ValueError naming the spec for an unknown mode or token, or a token given twice.
    """
    mode, *tokens = spec.split(":")
    if mode not in OUR_IMPLS:
        raise ValueError(f"impl {spec!r}: {mode!r} is not one of our impls {OUR_IMPLS}")
    kw: dict = {}

    def put(key, val, tok):
        if key in kw:
            raise ValueError(f"impl {spec!r}: {key} given twice ({tok!r})")
        kw[key] = val

    for tok in tokens:
        if tok in K.VARIANTS or tok == K.AUTO:
            put("variant", tok, tok)
        elif tok == "fuseall":
            put("fuse_max", K.FUSE_ALL, tok)
        elif tok == "fuseauto":
            put("fuse_max", "auto", tok)
        elif tok == "cwauto":
            put("combine_warps", "auto", tok)
        elif tok.startswith("fuse") and tok[4:].isdigit():
            put("fuse_max", int(tok[4:]), tok)
        elif tok.startswith("cw") and tok[2:].isdigit() and int(tok[2:]) in K.COMBINE_WARPS:
            put("combine_warps", int(tok[2:]), tok)
        elif tok.startswith("mt") and tok[2:].isdigit() and int(tok[2:]) >= 1:
            put("min_tiles", int(tok[2:]), tok)
        else:
            raise ValueError(f"impl {spec!r}: unknown token {tok!r} (a variant of {K.VARIANTS + (K.AUTO,)}, fuseall, "
                             f"fuseauto, fuse<N>, cw{'/cw'.join(map(str, K.COMBINE_WARPS))}, cwauto, mt<N>)")
    return mode, kw


def _is_ours(impl: str) -> bool:
    return impl.split(":")[0] in OUR_IMPLS


def _same_case(a: str, b: str) -> bool:
    try:
        return parse_cases(a) == parse_cases(b)
    except ValueError:
        return False


def published_h20_us(case: str, impl: str, kv_dtype: str = "fp8") -> float | None:
    """The published H20 figure (us) for (case, impl) from data/reported/decode_fp8_kv_distribution_h20.csv.

    dynamic <- hpc_dynamic_ms, static_count/static_chunk <- hpc_static_ms, flashinfer_xqa/_tc <- flashinfer_ms,
    flashattention <- flashattention_ms (x1000). The published table is FP8 KV only: None for bf16, for impls or
    cases it lacks. Raises nothing.
    """
    col = _PUBLISHED_COL.get(_base_impl(impl))
    if kv_dtype not in ("fp8", "fp8_kv") or col is None:
        return None

    df = published(OP)
    for _, row in df.iterrows():
        if _same_case(str(row["case"]), case):
            v = row.get(col)
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v) * 1000, 3)
    return None


def published_dynamic_vs_static(case: str) -> float | None:
    """The published H20 dynamic-over-static speedup of ``case`` (data/reported), or None when not published."""
    df = published(OP)
    for _, row in df.iterrows():
        if _same_case(str(row["case"]), case):
            return float(row["dynamic_vs_static"])
    return None


def repro(case: str, impl: str, kv_dtype: str, *, q_heads=8, kv_heads=1, head_dim=128, page_size=64,
          q_len=1) -> str:
    """The `hotpaths decode ...` command reproducing one row."""
    return (f"hotpaths decode --cases {shlex.quote(case)} --kv-dtype {kv_dtype} --q-heads {q_heads} "
            f"--kv-heads {kv_heads} --head-dim {head_dim} --page-size {page_size} --q-len {q_len} "
            f"--impl {_strip_emulation(impl)} --check --json")


def kernel_unavailable_reason() -> str | None:
    """None when the SM90 kernels can run here, else why (no GPU / not SM90 / build failure)."""
    r = sm90_skip_reason()
    if r:
        return r
    try:
        K._load()
    except Exception as e:
        return f"kernel build/load failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return None


def emulation_task_map(lens, impl: str, *, kv_heads: int, num_ctas: int = H200_SMS, min_tiles: int = DEFAULT_MIN_TILES,
                       num_splits: int | None = None, chunk_tiles: int | None = None):
    """The host TaskMap the kernel would use for ``impl`` (via the kernel package's own host_task_map mapping)."""
    batch = len(lens)
    if impl == "static_count":
        splits = num_splits or max(1, -(-num_ctas // (batch * kv_heads)))
    else:
        splits = 1
    p = SimpleNamespace(mode=impl, num_kv_heads=kv_heads, num_ctas=num_ctas, min_tiles=min_tiles,
                        max_pairs=batch * kv_heads, splits=splits,
                        chunk_tiles=chunk_tiles or K.DEFAULT_CHUNK_TILES)
    return K.host_task_map(p, lens)


def case_numbers(cases, *, kv_dtypes=("fp8", "bf16"), q_heads=8, kv_heads=1, head_dim=128, q_len=1,
                 ceilings=None, timing_floor_us=None) -> list[dict]:
    """The two numbers per case: bytes (KV once + Q + out) and FLOPs, and the floor times.

    floor_us = bytes / measured copy bandwidth (None without a GPU); timing_floor_us = the measured time of one
    trivial graph-replayed kernel after an L2 flush (bench.timing_floor), the floor under any row.
    """
    rows = []
    copy = (ceilings or {}).get("copy_gbps")
    for case in cases:
        lens = expand_lengths(case)
        for kv in kv_dtypes:
            b = ref.bytes_moved(lens, kv_heads, head_dim, kv, q_heads, q_len)
            kvb = 2 * sum(lens) * kv_heads * head_dim * (1 if kv == "fp8" else 2)
            rows.append(dict(case=case, dtype=DTYPE_LABEL[kv], requests=len(lens), kv_tokens=sum(lens),
                             kv_mb=kvb / 2**20, bytes=b, flops=ref.flops(lens, q_heads, head_dim, q_len),
                             floor_us=(b / copy / 1e3) if copy else None, timing_floor_us=timing_floor_us))
    return rows


def _row(case, impl, kv, *, device, bytes_, kv_bytes, ceilings, timing=None, chk=None, note="", cfg=None):
    cfg = cfg or {}
    med = timing.median_us if timing is not None else None
    gbps = bytes_ / med / 1e3 if (med and bytes_) else None
    copy = (ceilings or {}).get("copy_gbps")
    row = dict(op=OP, case=case, impl=impl, dtype=DTYPE_LABEL.get(kv, kv), device=device,
               median_us=med, p10_us=timing.p10_us if timing else None, p90_us=timing.p90_us if timing else None,
               bytes=bytes_, gbps=gbps, pct_of_ceiling=pct_of_ceiling(gbps, ceilings),
               **read_probe_columns(med, bytes_ or 0),
               rel_l2_err=chk.rel_l2_err if chk else None, max_abs_err=chk.max_abs_err if chk else None,
               cosine=chk.cosine if chk else None, published_h20_us=published_h20_us(case, impl, kv),
               run_id=run_id(), repro=repro(case, impl, kv, **cfg),
               kv_bytes=kv_bytes, floor_us=(bytes_ / copy / 1e3) if (copy and bytes_) else None,
               dynamic_vs_static=None, published_dynamic_vs_static=published_dynamic_vs_static(case),
               q_len=cfg.get("q_len", 1), hpc_ops_us=None, vs_hpc_ops=None,
               check_passed=chk.passed if chk else None, method=timing.method if timing else None, note=note)
    return row


def _join_note(note: str | None, extra: str) -> str:
    return f"{note}; {extra}" if note else extra


def _fill_ratios(rows: list[dict]) -> None:
    """dynamic_vs_static: on static rows their median / dynamic's; on the dynamic row the faster static's / its.
    hpc_ops_us / vs_hpc_ops: on every row that is not HPC-Ops' own, the faster HPC-Ops decode impl that ran on the
    same (case, dtype, q_len), and its time / this row's; when none ran, the HPC-Ops rows' reason goes in the note
    of our timed rows."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["case"], r["dtype"], r.get("q_len", 1)), {})[r["impl"]] = r
    for g in groups.values():
        hpc = {i: g[i] for i in P.HPC_OPS_IMPLS if i in g}
        ran = {i: r["median_us"] for i, r in hpc.items() if r["median_us"]}
        for impl, r in g.items():
            if impl in P.HPC_OPS_IMPLS or impl == "assign_only" or not r.get("median_us"):
                continue  # not against itself, nor the assign kernel alone (a part of a step, not a step)
            if ran:
                best = min(ran, key=ran.get)
                r["hpc_ops_us"] = ran[best]
                r["vs_hpc_ops"] = ran[best] / r["median_us"]
            elif hpc:
                why = "; ".join(f"{i}: {h.get('note') or 'no time'}" for i, h in hpc.items())
                r["note"] = _join_note(r.get("note"), f"vs_hpc_ops empty ({why})")
            else:
                r["note"] = _join_note(r.get("note"), "vs_hpc_ops empty (HPC-Ops not requested: --impl "
                                                      "hpc_ops_dynamic,hpc_ops_static)")

        dyn = g.get("dynamic")
        if not dyn or not dyn["median_us"]:
            continue
        stat = [g[s]["median_us"] for s in STATIC_IMPLS if s in g and g[s]["median_us"]]
        for s in STATIC_IMPLS:
            if s in g and g[s]["median_us"]:
                g[s]["dynamic_vs_static"] = g[s]["median_us"] / dyn["median_us"]
        if stat:
            dyn["dynamic_vs_static"] = min(stat) / dyn["median_us"]


def decode_rows(cases=ISSUE_CASES, *, kv_dtypes=("fp8", "bf16"), impls=OUR_IMPLS + P.PEER_NAMES, q_heads=8,
                kv_heads=1, head_dim=128, page_size=64, q_len=1, ceilings=None, iters=100, warmup=10, seed=0,
                num_ctas=None, min_tiles=DEFAULT_MIN_TILES, num_splits=None, chunk_tiles=None, assign=True,
                log=print) -> list[dict]:
    """Rows of table ``decode_kv_distribution`` (see the module docstring).

    cases: case strings (``"1x128K+31x4K"``). impls: our modes (OUR_IMPLS) and peers
    (hotpaths.bench.split_kv_decode_peers).
    On an SM90 GPU each impl is checked (poisoned output, vs split_kv_decode_ref) then timed; a failing impl or
    peer becomes a row with its reason in ``note``. Without SM90: ``<impl>_emulation`` rows (correctness only)
    and peers' reasons. ceilings: hotpaths.harness.ceilings.measure() (measured here when None on a GPU).
    Raises CaseError for a malformed case, ValueError for an unknown impl or kv dtype.
    """
    for c in cases:
        parse_cases(c)
    bad = [i for i in impls if not _is_ours(i) and i not in P.PEER_NAMES]
    if bad:
        raise ValueError(f"impls: unknown {bad}; known: {OUR_IMPLS + P.PEER_NAMES} (ours as mode[:token...])")
    for i in impls:
        if _is_ours(i):
            split_impl(i)  # a bad spec fails here, before any input is made
    bad = [k for k in kv_dtypes if k not in DTYPE_LABEL]
    if bad:
        raise ValueError(f"kv_dtypes: expected 'fp8' and/or 'bf16', got {bad}")
    kreason = kernel_unavailable_reason()
    gpu = torch.cuda.is_available()
    if ceilings is None and gpu:
        ceilings = measure()
    device = device_tag()
    dev = "cuda" if gpu else "cpu"
    cfg = dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size, q_len=q_len)
    rows: list[dict] = []
    from hotpaths.harness.progress import progress

    for case in progress(cases, desc="decode"):
        lens = expand_lengths(case)
        for kv in kv_dtypes:
            inputs = ref.make_decode_inputs(lens, kv_dtype=kv, device=dev, seed=seed, **cfg)
            refo = ref.split_kv_decode_ref(**inputs)
            nbytes = ref.bytes_moved(lens, kv_heads, head_dim, kv, q_heads, q_len)
            kvb = 2 * sum(lens) * kv_heads * head_dim * (1 if kv == "fp8" else 2)
            path = f"{kv}_vs_exact"
            common = dict(device=device, bytes_=nbytes, kv_bytes=kvb, ceilings=ceilings, cfg=cfg)
            kargs = {k: inputs[k] for k in ("q_scale", "k_scale", "v_scale")}
            for impl in impls:
                if _is_ours(impl) and kreason is not None:
                    mode, pkw = split_impl(impl)
                    tm = emulation_task_map(lens, mode, kv_heads=kv_heads, num_ctas=num_ctas or H200_SMS,
                                            min_tiles=pkw.get("min_tiles", min_tiles), num_splits=num_splits,
                                            chunk_tiles=chunk_tiles)
                    o = ref.split_kv_decode_emulation(**inputs, task_map=tm, p_dtype=K.p_dtype_for(kv == "fp8"))
                    rows.append(_row(case, impl + "_emulation", kv, chk=check(o, refo, op=OP, path=path),
                                     note=f"emulation (no timing): {kreason}", **common))
                    continue
                if _is_ours(impl):
                    rows += _time_ours(impl, case, kv, inputs, refo, path, common, kargs, iters=iters,
                                       warmup=warmup, num_ctas=num_ctas, min_tiles=min_tiles, num_splits=num_splits,
                                       chunk_tiles=chunk_tiles, assign=assign)
                    continue
                fn, reason = P.try_make(impl, inputs)
                if fn is None:
                    rows.append(_row(case, impl, kv, note=reason, **common))
                    continue
                try:
                    out = fn()  # peers allocate their output NaN-filled, so this first call checks poisoned
                    torch.cuda.synchronize()
                    chk = check(out, refo, op=OP, path=path)
                    t = bench(fn, iters=iters, warmup=warmup)
                    note = _peer_note(impl, kv) + (f"; {fn.note}" if getattr(fn, "note", "") else "")
                    rows.append(_row(case, impl, kv, timing=t, chk=chk, note=note, **common))
                except Exception as e:
                    rows.append(_row(case, impl, kv, note=f"failed: {type(e).__name__}: "
                                     f"{str(e).splitlines()[0][:300] if str(e) else ''}", **common))
                del fn
            if log:
                done = [r for r in rows if r["case"] == case and r["dtype"] == DTYPE_LABEL[kv]]
                log(f"{case} {kv}: " + ", ".join(
                    f"{r['impl']}={r['median_us']:.1f}us" if r["median_us"] else f"{r['impl']}=-" for r in done))
            del inputs, refo
            if gpu:
                torch.cuda.empty_cache()
    _fill_ratios(rows)
    return rows


def _peer_note(impl: str, kv: str) -> str:
    q = "; Q bf16 (q_fp8*q_scale)" if kv == "fp8" else ""
    if impl == "flashinfer_xqa":
        return f"FlashInfer {P.FLASHINFER_VERSION} XQA (trtllm_batch_decode_with_kv_cache, backend xqa), clean " \
               f"cache copy{q}"
    if impl == "flashinfer_tc":
        return f"FlashInfer {P.FLASHINFER_VERSION} decode wrapper, tensor cores, CUDA graph, plan not timed{q}"
    if impl in P.HPC_OPS_IMPLS:
        return "HPC-Ops, same run, clean cache copy" + ("; Q fp8 with our per-token-per-head scales"
                                                         if kv == "fp8" else "")
    extra = "; fp8 K/V read as bf16 (2x bytes), k_scale folded into Q" if kv == "fp8" else ""
    if impl == "torch_sdpa_gathered":
        return "gather not timed; one SDPA call per distinct length" + extra
    return "packed + document block mask, torch.compile; gather and block mask not timed" + extra


def _time_ours(impl, case, kv, inputs, refo, path, common, kargs, *, iters, warmup, num_ctas, min_tiles,
               num_splits, chunk_tiles, assign):


    rows = []
    mode, spec_kw = split_impl(impl)
    kw = dict(num_kv_heads=inputs["k_cache"].shape[2], q_heads=inputs["q"].shape[1],
              head_dim=inputs["q"].shape[2], num_ctas=num_ctas, min_tiles=min_tiles, mode=mode,
              q_len=inputs["q_len"], kv_dtype=inputs["k_cache"].dtype)
    kw.update(spec_kw)
    if mode == "static_count":
        kw["num_splits"] = num_splits
    if mode in ("static_chunk", "batch_invariant"):
        kw["chunk_tiles"] = chunk_tiles
    try:
        p = K.plan(inputs["kv_lens"], **kw)
        out = torch.full(tuple(inputs["q"].shape), float("nan"), dtype=torch.bfloat16, device=inputs["q"].device)
        args = (p, inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["block_table"], inputs["kv_lens"])
        K.run(*args, q_len=inputs["q_len"], out=out, **kargs)
        torch.cuda.synchronize()
        chk = check(out, refo, op=OP, path=path)
        t = bench(lambda: K.run(*args, q_len=inputs["q_len"], out=out, check_inputs=False, **kargs),
                  iters=iters, warmup=warmup)
        note = (f"num_ctas={p.num_ctas}, splits={p.splits}, chunk_tiles={p.chunk_tiles}, min_tiles={p.min_tiles}, "
                f"variant={p.variant}, fuse_max={p.fuse_max}, combine_warps={p.combine_warps}")
        rows.append(_row(case, impl, kv, timing=t, chk=chk, note=note, **common))
        if assign and impl == "dynamic":
            ta = bench(lambda: K.assign_only(p), iters=iters, warmup=warmup)
            r = _row(case, "assign_only", kv, timing=ta, note="assign kernel alone (once per step)", **common)
            r.update(bytes=None, gbps=None, pct_of_ceiling=None, floor_us=None, read_probe_us=None,
                     pct_of_read_probe=None)
            rows.append(r)
    except Exception as e:
        rows.append(_row(case, impl, kv, note=f"failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300] if str(e) else ''}", **common))
    return rows


def skew_lengths(total_tokens: int, long_fraction: float, batch: int = 32, align: int = 64) -> list[tuple[int, int]]:
    """A case with ``batch`` requests and exactly ``total_tokens`` tokens: one long request holding about
    long_fraction of them, the others equal (lengths multiples of ``align``). Returns [(count, length)].
    Raises ValueError when total_tokens is not a multiple of batch*align or long_fraction is outside
    [1/batch, 1)."""
    if batch < 2 or total_tokens <= 0 or total_tokens % (batch * align):
        raise ValueError(f"total_tokens: expected a positive multiple of batch*align = {batch * align}, "
                         f"got {total_tokens}")
    if not (1.0 / batch - 1e-9 <= long_fraction < 1.0):
        raise ValueError(f"long_fraction: expected in [1/batch, 1), got {long_fraction}")
    short = int(total_tokens * (1 - long_fraction) / (batch - 1)) // align * align
    short = max(align, min(short, total_tokens // batch))
    long = total_tokens - (batch - 1) * short
    return [(batch, short)] if long == short else [(1, long), (batch - 1, short)]


def skew_sweep_rows(total_tokens: int = SKEW["total_tokens"], *, batch: int = SKEW["batch"],
                    long_fractions=tuple(SKEW["long_fractions"]),
                    impls=("dynamic", "static_count", "static_chunk"), kv_dtype="fp8", **kw) -> list[dict]:
    """Table ``decode_skew_sweep``: the same total KV bytes, one request taking a growing share.

    Extra columns: long_fraction (requested), long_share (actual), vs_uniform (median / the same impl's median at
    the uniform point; target for dynamic: <= 1.15). kw goes to decode_rows.
    """
    rows = []
    for f in long_fractions:
        case = format_case(skew_lengths(total_tokens, f, batch))
        lens = expand_lengths(case)
        for r in decode_rows([case], kv_dtypes=(kv_dtype,), impls=impls, assign=False, **kw):
            r.update(long_fraction=f, long_share=max(lens) / sum(lens))
            rows.append(r)
    base = {}
    for r in rows:
        if r["long_fraction"] == long_fractions[0] and r["median_us"]:
            base[r["impl"]] = r["median_us"]
    for r in rows:
        b = base.get(r["impl"])
        r["vs_uniform"] = (r["median_us"] / b) if (b and r["median_us"]) else None
    return rows


def overhead_rows(batches=tuple(SHAPES["overhead_batches"]), *, kv_len: int = 4096, kv_heads: int = 1, q_heads: int = 8,
                  head_dim: int = 128, iters: int = 100, warmup: int = 10, num_ctas=None,
                  min_tiles: int = DEFAULT_MIN_TILES,
                  stage_cases=STAGE_CASES) -> list[dict]:
    """Table ``decode_fixed_costs``: the assign kernel alone per batch size (target < 3 us up to 256 requests), the
    one-kernel timing floor, and for each of ``stage_cases`` (FP8 KV) the step (attention + combine) beside the
    attention kernel alone and the combine kernel alone (``run(..., stages=...)``), each timed the same way.
    Without SM90: rows with the reason and no timing.
    """
    reason = kernel_unavailable_reason()
    device = device_tag()
    rows = []
    for b in batches:
        case = format_case([(b, kv_len)])
        r = _row(case, "assign_only", "fp8", device=device, bytes_=None, kv_bytes=None, ceilings=None,
                 cfg=dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim))
        r.update(published_dynamic_vs_static=None, dtype=None, batch=b)
        if reason:
            r["note"] = f"not timed: {reason}"
        else:
            try:
                lens = torch.full((b,), kv_len, dtype=torch.int32, device="cuda")
                p = K.plan(lens, num_kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim, num_ctas=num_ctas,
                           min_tiles=min_tiles, mode="dynamic")
                t = bench(lambda: K.assign_only(p), iters=iters, warmup=warmup)
                r.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, method=t.method,
                         note=f"num_ctas={p.num_ctas}; target < 3 us")
            except Exception as e:
                r["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(r)
    floor = timing_floor(1) if torch.cuda.is_available() else None
    rows.append(dict(op=OP, case="-", impl="timing_floor_1_kernel", device=device,
                     median_us=floor.median_us if floor else None, p10_us=floor.p10_us if floor else None,
                     p90_us=floor.p90_us if floor else None,
                     note="one trivial kernel, graph replay after an L2 flush" if floor else "needs a CUDA GPU"))
    for case in stage_cases:
        rows.extend(_stage_rows(case, reason, device=device, kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim,
                                iters=iters, warmup=warmup, num_ctas=num_ctas, min_tiles=min_tiles))
    return rows


def _stage_rows(case, reason, *, device, kv_heads, q_heads, head_dim, iters, warmup, num_ctas, min_tiles):
    """Rows step / attention_only / combine_only for one FP8 case (see overhead_rows)."""
    notes = {"all": "attention + combine (the per-layer time of decode_kv_distribution)",
             "attention": "attention kernel alone (run(stages='attention'))",
             "combine": "combine kernel alone on the partials of the previous launch (run(stages='combine'))"}
    names = {"all": "step", "attention": "attention_only", "combine": "combine_only"}
    rows = [dict(op=OP, case=case, impl=names[st], dtype=DTYPE_LABEL["fp8"], device=device, note=notes[st])
            for st in ("all", "attention", "combine")]
    if reason:
        for r in rows:
            r["note"] = f"not timed: {reason}"
        return rows


    try:
        inp = ref.make_decode_inputs(expand_lengths(parse_cases(case)), kv_dtype="fp8", q_heads=q_heads,
                                   kv_heads=kv_heads, head_dim=head_dim, device="cuda", seed=0)
        p = K.plan(inp["kv_lens"], num_kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim, num_ctas=num_ctas,
                   min_tiles=min_tiles, kv_dtype=inp["k_cache"].dtype)
        out = torch.empty_like(inp["q"], dtype=torch.bfloat16)
        a = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
        kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out, check_inputs=False)
        K.run(*a, **kw)
        for r, st in zip(rows, ("all", "attention", "combine")):
            if st == "combine" and p.fuse_max >= K.FUSE_ALL:
                r["note"] = (f"{r['note']}; not timed: no combine kernel (fuse-all: the attention kernel merges "
                             f"every pair); variant={p.variant}, num_ctas={p.num_ctas}")
                continue
            t = bench(lambda: K.run(*a, stages=st, **kw), iters=iters, warmup=warmup)
            r.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, method=t.method,
                     note=f"{r['note']}; variant={p.variant}, num_ctas={p.num_ctas}")
        del inp
    except Exception as e:
        for r in rows:
            r["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return rows


# Child-process target for ncu: one warm-up + one profiled launch of the dynamic kernel on one case, planned exactly
# as decode_rows' dynamic row plans it (the KV dtype decides what "auto" runs: without it auto falls back to v2).
_NCU_SNIPPET = """
import torch
from hotpaths.reference.split_kv_decode import make_decode_inputs
from hotpaths.harness.shapes import expand_lengths
from hotpaths.kernels import split_kv_decode as K
inp = make_decode_inputs(expand_lengths({case!r}), kv_dtype={kv!r}, device="cuda", q_heads={q_heads},
                         kv_heads={kv_heads}, head_dim={head_dim}, page_size={page_size}, q_len={q_len})
p = K.plan(inp["kv_lens"], num_kv_heads={kv_heads}, q_heads={q_heads}, head_dim={head_dim}, num_ctas={num_ctas},
           min_tiles={min_tiles}, mode="dynamic", q_len={q_len}, kv_dtype=inp["k_cache"].dtype)
assert p.variant == {variant!r}, f"planned {{p.variant}}, the profile expected {variant!r}"
a = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], q_len={q_len})
for _ in range(2):
    K.run(*a, **kw)
torch.cuda.synchronize()
"""

NCU_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum")

# attention.cu's launch switch, mirrored: which attention_kernel<Traits<FP8, TRANSPOSED, STAGES, CPS, NT>>
# instantiation a variant launches (tests/test_decode_bench.py pins it; a kernel change that adds a configuration
# must extend this too, or the profile row says its regex matched nothing).
_V3_NT1 = {"v3s3c3": (3, 3), "v3s5": (5, 2), "v3s2c4": (2, 4), "v3bc3": (3, 3)}
_BF16_TR = {"v3b": (2, 2), "v3bs3": (3, 2), "v3bc3": (2, 3)}  # BF16 KV, <= 8 rows: (STAGES, CPS)
_V3_MTP_NT4 = {"v3m": (2, 2)}
# FP8, any row count: attention_kernel<TraitsWg<STAGES, CPS, FP8>> (one warpgroup, groups of 64 rows: NT = 8 n-tiles
# of 8); BF16 KV under v3w only (2 stages of 48 KB at its 2 CTAs per SM)
_WG = {"v3w": (3, 2), "v3wc3": (2, 3)}  # (STAGES, CPS)
_WG_BF16 = {"v3w": (2, 2)}


def attention_traits(variant: str, *, fp8: bool = True, rows: int = 8) -> tuple:
    """(FP8, TRANSPOSED, STAGES, CPS, NT) of the attention_kernel instantiation that ``variant`` launches for this
    KV dtype and ``rows`` query rows per KV head (q_len x GQA ratio). Raises ValueError for an unknown variant
    (resolve "auto" first)."""
    if variant not in K.VARIANTS:
        raise ValueError(f"variant: expected one of {K.VARIANTS}, got {variant!r}")
    if not fp8:  # BF16 KV: the transposed layout for its own configurations at <= 8 rows, v3w's warpgroup body, else
        # the row layout
        if variant in _WG_BF16:
            return (False, True, *_WG_BF16[variant], 8)
        if variant in _BF16_TR and rows <= 8:
            return (False, True, *_BF16_TR[variant], 1)
        return (False, False, 2, 2, 1)
    if variant == "v2":
        return (True, False, 4, 2, 1)
    if variant in _WG:
        return (True, True, *_WG[variant][:2], 8)
    mtp = variant in _V3_MTP_NT4
    nt = 1 if rows <= 8 else (2 if (rows <= 16 or not mtp) else 4)
    if nt == 4:
        return (True, True, *_V3_MTP_NT4[variant], 4)
    if nt == 2:
        return (True, True, 4, 2, 2)
    return (True, True, *_V3_NT1.get(variant, (4, 2)), 1)


def attention_kernel_regex(variant: str, *, fp8: bool = True, rows: int = 8) -> str:
    """A regex on the MANGLED name (ncu --kernel-name-base mangled) of the one attention_kernel<Traits<...>>
    instantiation that ``variant`` launches (attention_traits), e.g. ``attention_kernelI.*TraitsILb1ELb1ELi2ELi4ELi1EE``
    (Itanium: ``Lb1E`` = true, ``Li2E`` = 2). Only literals and ``.*``: the demangled spelling varies (true / (bool)1,
    namespaces, "> >") and ncu's regex dialect is not documented to take ``(?:)`` or ``\\s``; a profile with the
    demangled pattern matched no kernel on the H200. Raises ValueError for an unknown variant."""
    f8, tr, st, cps, nt = attention_traits(variant, fp8=fp8, rows=rows)
    if variant in (_WG if fp8 else _WG_BF16):  # its own traits type (TraitsWg<STAGES, CPS, FP8>)
        return f"attention_kernelI.*TraitsWgILi{st}ELi{cps}ELb{int(f8)}EE"
    return f"attention_kernelI.*TraitsILb{int(f8)}ELb{int(tr)}ELi{st}ELi{cps}ELi{nt}EE"


def ncu_rows(cases=NCU_CASES, *, kv_dtype="fp8", kernel_regex: str | None = None, q_heads=8, kv_heads=1,
             head_dim=128, page_size=64, q_len=1, num_ctas=None, min_tiles=DEFAULT_MIN_TILES,
             timeout_s: float = 300.0) -> list[dict]:
    """Table ``decode_ncu``: Nsight Compute of the attention kernel that decode_rows' ``dynamic`` row times (second
    launch) per case: the child plans it with the same arguments (KV dtype included, so "auto" picks the same
    variant) and asserts the variant; ncu picks that instantiation by its mangled name
    (attention_kernel_regex), unless ``kernel_regex`` overrides it.

    Columns: case, variant, kernel, duration_us, dram_throughput_pct, achieved_occupancy_pct, dram_read_mb, note; raw
    per-case tables saved as profiles_dir()/decode_ncu_<case>.csv by hotpaths.harness.ncu. Where counters are not
    readable the row says "unavailable: <reason>" (never raises).
    """
    device = device_tag()
    rows = []
    for case in cases:
        lens = expand_lengths(case)
        try:
            variant = K.resolve_variant(None)
            if variant == K.AUTO:
                num_sms = (torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available()
                           else H200_SMS)
                variant = K.choose_variant(torch.tensor(lens, dtype=torch.int32), num_kv_heads=kv_heads,
                                           kv_dtype=kv_dtype, mode="dynamic", num_ctas=num_ctas,
                                           min_tiles=min_tiles, num_sms=num_sms,
                                           rows=q_len * (q_heads // kv_heads))
            regex = kernel_regex or attention_kernel_regex(variant, fp8=kv_dtype == "fp8",
                                                           rows=q_len * (q_heads // kv_heads))
        except Exception as e:
            rows.append(dict(op=OP, case=case, impl="dynamic", dtype=DTYPE_LABEL[kv_dtype], device=device,
                             note=f"unavailable: {type(e).__name__}: {e}"))
            continue
        snippet = _NCU_SNIPPET.format(case=case, kv=kv_dtype, q_heads=q_heads, kv_heads=kv_heads,
                                      head_dim=head_dim, page_size=page_size, q_len=q_len, num_ctas=num_ctas,
                                      min_tiles=min_tiles, variant=variant)
        safe = case.replace("+", "_").replace(".", "p")
        base = dict(op=OP, case=case, impl="dynamic", dtype=DTYPE_LABEL[kv_dtype], device=device, variant=variant)
        df, why = ncu.profile_or_note(snippet, kernel_regex=regex, metrics=NCU_METRICS, kernel_name_base="mangled",
                                      out_csv=f"decode_ncu_{safe}", launch_skip=1, launch_count=1,
                                      timeout_s=timeout_s)
        if df is None:
            rows.append(dict(base, note=why))
            continue
        m = {r["metric"]: r["value"] for _, r in df.iterrows()}
        dur = m.get("gpu__time_duration.sum")
        rd = m.get("dram__bytes_read.sum")
        rows.append(dict(base, kernel=str(df["kernel"].iloc[0])[:160],
                         duration_us=dur / 1e3 if isinstance(dur, float) else None,
                         dram_throughput_pct=m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                         achieved_occupancy_pct=m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                         dram_read_mb=rd / 2**20 if isinstance(rd, float) else None,
                         # the full ncu command (with the profiled snippet) is in the .ncu.txt beside the CSV
                         note=f"ncu --clock-control none --kernel-name-base mangled, regex {regex!r}, metrics "
                              f"{', '.join(NCU_METRICS)}; profiles_dir/decode_ncu_{safe}.ncu.txt"))
    return rows


MTP_IMPLS = ("dynamic", "hpc_ops_dynamic", "hpc_ops_static", "flashinfer_xqa")  # table decode_mtp_same_run
# BF16 KV rows of that table: ours and HPC-Ops (XQA's BF16 draft-token path is not in the table: its q_len > 1 kernel is
# JIT-built on first use, minutes on the GPU machine)
MTP_IMPLS_BF16 = ("dynamic", "hpc_ops_dynamic", "hpc_ops_static")
MTP_Q_LENS = (1, 2, 3, 4)
MTP_KV_DTYPES = ("fp8", "bf16")


def mtp_rows(cases=ISSUE_CASES, *, q_lens=MTP_Q_LENS, kv_dtypes=MTP_KV_DTYPES, impls=MTP_IMPLS,
             impls_bf16=MTP_IMPLS_BF16, **kw) -> list[dict]:
    """Rows of table ``decode_mtp_same_run``: decode_rows over ``cases`` for each KV dtype of ``kv_dtypes`` ("fp8"
    with ``impls``, "bf16" with ``impls_bf16``) at each q_len of ``q_lens`` (the draft tokens of speculative
    decoding), every impl in the same process, no assign row. ``kw`` goes to decode_rows (heads, page size,
    ceilings, iters, ...). Raises what decode_rows raises, ValueError for a q_len outside 1..4 or a dtype other than
    fp8 / bf16 (before measuring anything)."""
    bad = [q for q in q_lens if not 1 <= int(q) <= 4]
    if bad:
        raise ValueError(f"q_lens: expected values in 1..4, got {bad}")
    bad = [d for d in kv_dtypes if d not in ("fp8", "bf16")]
    if bad:
        raise ValueError(f"kv_dtypes: expected 'fp8' and / or 'bf16', got {bad}")
    rows = []
    for d in kv_dtypes:
        for q in q_lens:
            rows += decode_rows(cases, kv_dtypes=(d,), impls=impls if d == "fp8" else impls_bf16, q_len=int(q),
                                assign=False, **kw)
    return rows


def mtp_summary(rows) -> list[dict]:
    """Per (KV dtype, q_len), over our ``dynamic`` rows of a decode_mtp_same_run table (rows: list of dicts or a
    DataFrame; rows without a ``dtype`` count as one dtype, None): the geometric mean and minimum of ``vs_hpc_ops``
    (the faster HPC-Ops path's time / ours, same run) with the case of the minimum, and the same for XQA (its
    ``flashinfer_xqa`` time / ours). Rows without a number are left out; a group with none gives None. Returns one
    dict per group (keys dtype, q_len, ...), by dtype then q_len."""
    import math

    import pandas as pd

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "dtype" not in df:
        df["dtype"] = None
    out = []
    for (dt, q), g in df.groupby([df["dtype"].fillna(""), "q_len"], sort=True):
        ours = g[g["impl"] == "dynamic"].set_index("case")
        xqa = g[g["impl"] == "flashinfer_xqa"].set_index("case")["median_us"]

        def stats(ratios):
            r = pd.to_numeric(ratios, errors="coerce").dropna()
            r = r[r > 0]
            if r.empty:
                return None, None, None
            return math.exp(sum(math.log(x) for x in r) / len(r)), float(r.min()), str(r.idxmin())

        hg, hm, hc = stats(ours["vs_hpc_ops"])
        xg, xm, xc = stats(pd.to_numeric(xqa, errors="coerce").reindex(ours.index) / ours["median_us"])
        out.append(dict(dtype=dt or None, q_len=int(q), cases=len(ours), geomean_vs_hpc_ops=hg, min_vs_hpc_ops=hm,
                        min_case_hpc_ops=hc, geomean_vs_xqa=xg, min_vs_xqa=xm, min_case_xqa=xc))
    return out


def stored_profile(name: str, device: str = "h200") -> tuple[dict, list[dict]]:
    """A committed JSON measurement of a decode script (data/profiles/<device>/<name>.json, written by
    studies/gpu_decode_breakdown.py or studies/gpu_ab_decode.py): (header fields, rows). Raises FileNotFoundError
    naming the expected path when it is missing."""
    path = REPO_ROOT / "data" / "profiles" / device / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored profile {name!r} for device {device!r} (expected {path})")
    data = json.loads(path.read_text())
    rows = data.pop("rows", [])
    return data, rows


# ----------------------------------------------------------------------------------------------------------------
# hotpaths decode

ALIASES = {"static": ("static_count", "static_chunk")}
DEFAULT_IMPLS = "dynamic,static"

CLI_HELP = "split-KV decode attention over a paged KV cache: error and latency per impl"
CLI_DESCRIPTION = """\
Runs each --impl on each case (AxB = A requests of KV length B, '+'-joined, K = 1024) with
fresh random inputs (unused cache slots NaN-poisoned); reports rel L2 / max abs error / cosine vs the
fp64 reference on the same quantized inputs and, on an SM90 GPU, median/p10/p90 us per layer, GB/s and
% of the measured copy ceiling. Without SM90 our impls run as emulations (no timing).""".replace("\n", " ")


def register(subparsers) -> None:
    """Add ``hotpaths decode`` to the CLI's subparsers (hotpaths.harness.cli finds it through hotpaths.bench.OPS)."""
    p = add_op_command(subparsers, "decode", func=_run, help=CLI_HELP, description=CLI_DESCRIPTION)
    p.add_argument("--cases", type=case_list_arg, default=list(SHAPES["cli_default"]),
                   help="',' or ';'-separated cases (default: cli_default of data/shapes/split_kv_decode.yaml, "
                   f"{'+'.join(SHAPES['cli_default'])})")
    p.add_argument("--kv-dtype", type=_kv_dtype_list, default=["fp8"],
                   help="KV cache dtype: fp8, bf16 or both comma-separated (default fp8)")
    p.add_argument("--q-heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=1, help="KV heads (default 1)")
    p.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    p.add_argument("--page-size", type=int, default=64, help="page size in tokens (default 64)")
    p.add_argument("--q-len", type=int_list_arg("--q-len", minimum=1), default=[1],
                   help="query tokens per request (MTP), one value or a comma-separated list, each 1-4 "
                   "(default 1); every row carries its q_len")
    p.add_argument("--impl", default=DEFAULT_IMPLS,
                   help=f"comma-separated among {', '.join(OUR_IMPLS)}, static (= both static flavours), "
                   f"assign (the task-map kernel alone), {', '.join(P.PEER_NAMES)} (default {DEFAULT_IMPLS}); "
                   "ours take plan settings as mode:token:..., tokens a variant, fuseall / fuseauto / fuse<N>, "
                   "cw32 / cwauto, mt<N> (e.g. dynamic:v3bs3:fuseauto:cwauto)")
    p.add_argument("--num-ctas", type=int, default=None, help="persistent CTAs (default: the kernel's default)")
    p.add_argument("--min-tiles", type=int, default=DEFAULT_MIN_TILES,
                   help=f"minimum-work floor in 64-token tiles (default {DEFAULT_MIN_TILES})")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 if any row of our impls is outside its tolerance (peers' errors are "
                   "reported, not gated)")


def parse_impls(spec: str) -> tuple[list[str], bool]:
    """``"dynamic,static,assign"`` -> (["dynamic", "static_count", "static_chunk"], assign=True).

    Raises ValueError naming unknown impls.
    """
    impls, assign = [], False
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "assign":
            assign = True
        elif name in ALIASES:
            impls += [i for i in ALIASES[name] if i not in impls]
        elif _is_ours(name) or name in P.PEER_NAMES:
            if _is_ours(name):
                try:
                    split_impl(name)
                except ValueError as e:
                    raise ValueError(f"--impl: {e}") from None
            if name not in impls:
                impls.append(name)
        else:
            known = OUR_IMPLS + tuple(ALIASES) + ("assign",) + P.PEER_NAMES
            raise ValueError(f"--impl: unknown {name!r}; choose among {', '.join(known)} (ours also as "
                             "mode:variant[:fuseall|fuseauto|fuse<N>][:cw32|cwauto][:mt<N>], "
                             "e.g. dynamic:v3b:fuseauto)")
    if assign and "dynamic" not in impls:
        impls.insert(0, "dynamic")  # assign is timed on the dynamic plan
    return impls, assign


def _kv_dtype_list(spec: str) -> list[str]:
    """argparse type: ``fp8``, ``bf16`` or ``fp8,bf16``."""
    import argparse

    vals = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [v for v in vals if v not in DTYPE_LABEL]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"expected fp8, bf16 or fp8,bf16, got {spec!r}")
    return list(dict.fromkeys(vals))


def _run(args) -> int:
    impls, assign = parse_impls(args.impl)
    bad = [q for q in args.q_len if not 1 <= q <= 4]
    if bad:
        print(f"hotpaths decode: error: --q-len: expected values in 1..4, got {bad}", file=sys.stderr)
        return 2
    rows = []
    for q_len in args.q_len:
        rows += decode_rows(args.cases, kv_dtypes=tuple(args.kv_dtype), impls=tuple(impls), q_heads=args.q_heads,
                            kv_heads=args.kv_heads, head_dim=args.head_dim, page_size=args.page_size, q_len=q_len,
                            iters=args.iters, seed=args.seed, num_ctas=args.num_ctas, min_tiles=args.min_tiles,
                            assign=assign, log=None)
    if not emit_rows(rows, args):
        _print_table(rows, args)
    # --check gates our kernels; a peer's accuracy (HPC-Ops / XQA FP8 are ~2-4e-2 from exact) is reported, not gated
    failed = [r for r in rows if r.get("check_passed") is False and _base_impl(r["impl"]) in OUR_IMPLS]
    if args.check and failed:
        print(f"hotpaths decode: {len(failed)} row(s) outside tolerance: "
              + ", ".join(f"{r['case']}/{r['impl']}" for r in failed), file=sys.stderr)
        return 1
    return 0


def _print_table(rows, args) -> None:
    def f(v, spec):
        if v is None or v != v:
            return "-".rjust(int(spec.split(".")[0]))
        return format(v, spec)
    print(f"split_kv_decode kv={','.join(args.kv_dtype)} q_heads={args.q_heads} kv_heads={args.kv_heads} "
          f"d={args.head_dim} page={args.page_size} q_len={','.join(map(str, args.q_len))}")
    print(f"{'case':<20} {'impl':<26} {'dtype':<8} {'q':>2} {'median_us':>10} {'p10':>8} {'p90':>8} {'GB/s':>8} "
          f"{'%ceil':>6} {'vs_hpc':>7} {'rel_l2':>9} {'max_abs':>9}  note")
    for r in rows:
        print(f"{r['case']:<20} {r['impl']:<26} {str(r.get('dtype') or '-'):<8} {r.get('q_len') or 1:>2} "
              f"{f(r.get('median_us'), '10.2f')} {f(r.get('p10_us'), '8.2f')} "
              f"{f(r.get('p90_us'), '8.2f')} {f(r.get('gbps'), '8.0f')} {f(r.get('pct_of_ceiling'), '6.1f')} "
              f"{f(r.get('vs_hpc_ops'), '7.2f')} {f(r.get('rel_l2_err'), '9.2e')} {f(r.get('max_abs_err'), '9.2e')}  "
              f"{r.get('note') or ''}")
