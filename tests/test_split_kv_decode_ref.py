"""CPU tests of the split-KV decode references: exact attention, task maps (host builder format), emulation."""
import math

import numpy as np
import pytest
import torch

from hotpaths.harness.tolerances import rows as tolerance_rows
from hotpaths.reference import split_kv_decode as skv
from hotpaths.reference.split_kv_decode import (
    DEFAULT_MIN_TILES,
    SUPPORTED_GQA,
    batch_invariant_task_map,
    build_task_map,
    check_task_map,
    combine,
    compare_workspaces,
    decode_workspace,
    format_task_map,
    make_decode_inputs,
    partial_attention,
    split_kv_decode_emulation,
    split_kv_decode_ref,
    static_chunk_task_map,
    static_count_task_map,
    workspace_len,
)


def _err(out, ref):
    out, ref = out.float(), ref.float()
    e = out - ref
    rel = float(e.norm() / ref.norm()) if float(ref.norm()) > 0 else float(e.norm())
    cos = float(torch.nn.functional.cosine_similarity(out.reshape(1, -1), ref.reshape(1, -1)))
    return rel, float(e.abs().max()), cos


def _assert_within(out, ref, path):
    assert torch.isfinite(out.float()).all(), "NaN/Inf in output"
    rel, mx, cos = _err(out, ref)
    tol = tolerance_rows("split_kv_decode")[("split_kv_decode", path)]
    assert rel <= tol[0] and mx <= tol[1] and cos >= tol[2], (path, rel, mx, cos, tol)


# ------------------------------------------------------------------------------------------------ task map format

def _naive_task_map(lens, H, C, F):
    """Tile-by-tile reference of the spec: pour every tile into bins of B and group runs (independent of the
    vectorized builder)."""
    batch = len(lens)
    tiles = [math.ceil(L / 64) for _ in range(H) for L in lens]
    T = sum(tiles)
    B = max(math.ceil(T / C), F) if T else F
    descs, dbins = [], []
    g = 0
    for p, n in enumerate(tiles):
        for t in range(n):
            b = g // B
            if descs and dbins[-1] == b and descs[-1][0] == p % batch and descs[-1][1] == p // batch:
                descs[-1][3] = t + 1
            else:
                descs.append([p % batch, p // batch, t, t + 1])
                dbins.append(b)
            g += 1
    return B, descs, dbins


LENGTH_SETS = [
    [], [0], [0, 0, 0], [1], [64], [65], [63, 1, 129], [131072] + [4096] * 31, [1] * 50,
    [4096] * 64, [5000, 0, 17, 640, 64 * 7 + 3],
]


@pytest.mark.parametrize("lens", LENGTH_SETS, ids=lambda l: f"b{len(l)}")
@pytest.mark.parametrize("H,C,F", [(1, 132, 4), (2, 7, 4), (3, 1, 1), (1, 78, 8)])
def test_build_task_map_matches_spec(lens, H, C, F):
    tm = build_task_map(lens, H, C, min_tiles=F)
    check_task_map(tm)
    B, descs, dbins = _naive_task_map(lens, H, C, F)
    assert tm.budget == B
    assert tm.descriptors.tolist() == descs
    assert tm.desc_bin.tolist() == dbins
    T = tm.total_tiles
    assert tm.nbins == (math.ceil(T / B) if T else 0) and tm.nbins <= C
    load = tm.per_cta_tiles()
    assert load.max(initial=0) <= B, "per-CTA load above budget"
    assert load.sum() == T
    assert (load[: tm.nbins] > 0).all() and (load[tm.nbins:] == 0).all()
    assert tm.ndesc <= len(lens) * H + C - 1 or tm.ndesc == 0


def test_every_tile_assigned_exactly_once_random():
    rng = np.random.default_rng(0)
    for trial in range(40):
        batch = int(rng.integers(0, 40))
        lens = rng.integers(0, 9000, size=batch)
        lens[rng.random(batch) < 0.2] = 0
        H, C = int(rng.integers(1, 5)), int(rng.integers(1, 140))
        tm = build_task_map(lens, H, C, min_tiles=int(rng.integers(1, 9)))
        seen = np.zeros((batch * H, max(int(tm.tiles.max(initial=0)), 1)), dtype=np.int64)
        for r, h, tb, te in tm.descriptors.tolist():
            seen[h * batch + r, tb:te] += 1
        for p in range(batch * H):
            assert (seen[p, : tm.tiles[p]] == 1).all() and (seen[p, tm.tiles[p]:] == 0).all(), (trial, p)
        assert tm.per_cta_tiles().max(initial=0) <= tm.budget


def test_task_map_layout_matches_device_header():
    """The host layout (TASK_MAP_* and workspace_len) equals task_map.cuh's, parsed from the header the kernels use."""
    import re
    from pathlib import Path

    import hotpaths.reference.split_kv_decode as ref

    hdr = (Path(__file__).resolve().parents[1] / "src/kernels/split_kv_decode/task_map.cuh").read_text()
    const = {m.group(1): int(m.group(2)) for m in re.finditer(r"constexpr int (k\w+) = (\d+);", hdr)}
    assert const == {"kHeaderInts": ref.TASK_MAP_HEADER_INTS, "kDescInts": ref.TASK_MAP_DESC_INTS}
    # task_map_len's formula, term by term, evaluated for a few sizes against the Python one
    body = re.search(r"task_map_len\(int C, int max_pairs\) \{\s*return (.*?);\s*\}", hdr, re.S).group(1)
    expr = re.sub(r"\(long long\)|LL\b", "", body)
    for C, M in ((1, 1), (5, 10), (264, 256), (528, 8192)):
        assert eval(expr, {}, dict(const, C=C, max_pairs=M)) == ref.workspace_len(C, M), (C, M)
    # the static-format capacity only replaces the descriptor count
    assert ref.workspace_len(5, 10, 40) - ref.workspace_len(5, 10) == ref.TASK_MAP_DESC_INTS * (40 - 15)


def test_workspace_layout_and_padding():
    lens = [65, 0, 300]
    H, C, M = 2, 5, 10
    tm = build_task_map(lens, H, C, max_pairs=M, min_tiles=4)  # an explicit floor: the numbers below depend on it
    ws = tm.workspace
    assert ws.dtype == np.int32 and len(ws) == workspace_len(C, M) == 8 + 6 + 4 * 15 + 20
    # T = 2 * (2 + 0 + 5) = 14, B = max(ceil(14/5), 4) = 4, nbins = 4
    assert ws[:8].tolist() == [14, 4, 4, tm.ndesc, 3, 2, 5, 4]
    parts = decode_workspace(ws, num_ctas=C, max_pairs=M)
    assert parts["bin_start"].tolist() == tm.bin_start.tolist()
    assert parts["bin_start"][-1] == tm.ndesc
    assert parts["bin_start"][tm.nbins:].tolist() == [tm.ndesc] * (C + 1 - tm.nbins)
    assert (parts["desc"][tm.ndesc:] == -1).all() and (parts["desc"][: tm.ndesc] >= 0).all()
    assert (parts["chunk_start"][6:] == -1).all() and (parts["num_chunks"][6:] == -1).all()
    assert parts["num_chunks"][:6].tolist() == tm.num_chunks.tolist()
    # pair (h=0, r=1) has kv_len 0 -> 0 chunks; pair p = h * batch + r
    assert tm.num_chunks[1] == 0 and tm.num_chunks[4] == 0
    assert compare_workspaces(ws.copy(), tm) is None
    bad = ws.copy()
    bad[8 + 6 + 4 * 1 + 2] += 1
    msg = compare_workspaces(bad, tm)
    assert msg is not None and "desc[1][2]" in msg
    with pytest.raises(ValueError, match="max_pairs"):
        build_task_map(lens, H, C, max_pairs=5)
    with pytest.raises(ValueError, match="workspace has"):
        decode_workspace(ws[:-1], num_ctas=C, max_pairs=M)


def test_empty_and_all_zero_batches():
    for lens in ([], [0, 0]):
        tm = build_task_map(lens, 2, 4)
        assert tm.ndesc == 0 and tm.nbins == 0 and tm.budget == DEFAULT_MIN_TILES and tm.total_tiles == 0
        assert (tm.bin_start == 0).all()
        assert "T=0" in format_task_map(tm)


def test_one_huge_request_spreads_over_all_ctas():
    tm = build_task_map([2 ** 20], 1, 132)
    assert tm.nbins == 132 and tm.num_chunks.tolist() == [132]
    load = tm.per_cta_tiles()
    assert load.max() - load.min() <= tm.budget and load.max() == tm.budget == 125


def test_min_tiles_floor_limits_splitting():
    tm = build_task_map([64 * 3] * 4, 1, 132, min_tiles=4)  # 12 tiles: budget 4, 3 bins, not 12
    assert tm.budget == 4 and tm.nbins == 3 and tm.ndesc == 6


def test_format_task_map_shows_bins():
    tm = build_task_map([300, 65], 1, 3, min_tiles=1)
    s = format_task_map(tm)
    assert "bin    0 [   3 tiles]: (0,0,[0,3))" in s and "bin    1 [   3 tiles]: (0,0,[3,5)) (1,0,[0,1))" in s


def test_static_maps():
    lens = [64 * 10, 64, 0]
    tm = static_count_task_map(lens, 2, 4)
    check_task_map(tm)
    assert tm.num_ctas == 2 * 3 * 4
    assert tm.descriptors[:4].tolist() == [[0, 0, 0, 3], [0, 0, 3, 6], [0, 0, 6, 9], [0, 0, 9, 10]]
    assert tm.per_cta_descs().max() == 1
    assert tm.empty_ctas == 2 * (3 + 4)  # request 1 uses 1 of 4 splits, request 2 none
    tm2 = static_chunk_task_map(lens, 2, 4)
    check_task_map(tm2)
    assert tm2.num_ctas == 2 * 3 * 3  # ceil(10 / 4) = 3 splits for everyone
    assert tm2.empty_ctas == 2 * (2 + 3)
    assert tm2.per_cta_tiles().max() == 4
    with pytest.raises(ValueError, match="num_splits"):
        static_count_task_map(lens, 1, 0)
    with pytest.raises(ValueError, match="chunk_tiles"):
        static_chunk_task_map(lens, 1, 0)


def test_batch_invariant_descriptors_independent_of_batch():
    mine = 64 * 37 + 5
    alone = batch_invariant_task_map([mine], 1, 132, chunk_tiles=8)
    check_task_map(alone)
    expect = alone.descriptors[:, 2:].tolist()
    assert expect == [[i, min(i + 8, 38)] for i in range(0, 38, 8)]
    rng = np.random.default_rng(1)
    for _ in range(10):
        others = rng.integers(0, 20000, size=int(rng.integers(1, 30))).tolist()
        pos = int(rng.integers(0, len(others) + 1))
        lens = others[:pos] + [mine] + others[pos:]
        tm = batch_invariant_task_map(lens, 1, int(rng.integers(1, 140)), chunk_tiles=8)
        check_task_map(tm)
        s, n = tm.chunk_start[pos], tm.num_chunks[pos]
        assert tm.descriptors[s:s + n, 2:].tolist() == expect
        assert tm.per_cta_tiles().max() <= tm.budget + 8 - 1
    # the dynamic map, by contrast, does depend on the batch
    d1 = build_task_map([mine], 1, 132).descriptors[:, 2:].tolist()
    d2 = build_task_map([mine, 50000], 1, 132).descriptors[:, 2:]
    assert d1 != d2[: len(d1)].tolist()


def test_batch_invariant_output_bit_identical():
    mine = 64 * 9 + 7
    a = make_decode_inputs([mine], q_heads=4, head_dim=64, kv_dtype="fp8", seed=3)
    outs = []
    for others in ([], [3000, 5], [1, 1, 7000]):
        b = make_decode_inputs([mine] + others, q_heads=4, head_dim=64, kv_dtype="fp8", seed=3)
        # same data for request 0 whatever the batch
        b["q"][:1] = a["q"]
        b["q_scale"][:1] = a["q_scale"]
        b["k_scale"], b["v_scale"] = a["k_scale"], a["v_scale"]
        npg = (mine + 63) // 64
        for cache in ("k_cache", "v_cache"):
            b[cache][b["block_table"][0, :npg].long()] = a[cache][a["block_table"][0, :npg].long()]
        tm = batch_invariant_task_map(b["kv_lens"], 1, 6, chunk_tiles=4)
        outs.append(split_kv_decode_emulation(**b, task_map=tm)[:1])
    assert all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs[1:])


def test_task_map_rejects_bad_args():
    with pytest.raises(ValueError, match="kv_lens"):
        build_task_map([5, -1], 1, 4)
    with pytest.raises(ValueError, match="num_ctas"):
        build_task_map([5], 1, 0)
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_task_map([5], 0, 4)
    with pytest.raises(ValueError, match="min_tiles"):
        build_task_map([5], 1, 4, min_tiles=0)


# ------------------------------------------------------------------------------------------------ attention

def test_split_plus_combine_equals_unsplit():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 64, generator=g)
    k = torch.randn(500, 64, generator=g)
    v = torch.randn(500, 64, generator=g)
    sc = torch.full((6,), 0.125)
    o_full, lse_full = partial_attention(q, k, v, score_scale=sc)
    parts = [(0, 64), (64, 200), (200, 201), (201, 500)]
    po, pl = zip(*(partial_attention(q, k[a:b], v[a:b], score_scale=sc) for a, b in parts))
    o = combine(torch.stack(po), torch.stack(pl))
    torch.testing.assert_close(o, o_full, rtol=2e-5, atol=2e-6)
    exact = torch.softmax((q.double() @ k.double().T) * 0.125, -1) @ v.double()
    torch.testing.assert_close(o.double(), exact, rtol=1e-4, atol=1e-5)
    lse = torch.logsumexp((q.double() @ k.double().T) * 0.125, -1)
    torch.testing.assert_close(lse_full.double(), lse, rtol=1e-5, atol=1e-5)


def test_combine_rows_without_keys_are_zero():
    po = torch.randn(2, 3, 8)
    pl = torch.tensor([[float("-inf"), 0.5, float("-inf")], [float("-inf"), float("-inf"), 1.0]])
    out = combine(po, pl)
    assert (out[0] == 0).all()
    torch.testing.assert_close(out[1], po[0, 1])
    torch.testing.assert_close(out[2], po[1, 2])
    with pytest.raises(ValueError, match="partial_o"):
        combine(po[:0], pl[:0])


CONFIGS = [(g, d, ps, ql) for g, d, ps, ql in [
    (1, 64, 16, 1), (2, 128, 32, 2), (4, 64, 64, 3), (8, 128, 64, 1), (8, 128, 128, 4), (12, 64, 16, 2),
    (16, 128, 32, 1), (16, 64, 128, 3), (8, 64, 64, 2), (2, 64, 16, 4),
]]


@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("g,d,ps,ql", CONFIGS, ids=lambda c: str(c))
def test_emulation_vs_exact(kv_dtype, g, d, ps, ql):
    lens = [1, 0, 63, 64, 65, 2, 333]
    kvh = 2 if g in (2, 12) else 1
    inp = make_decode_inputs(lens, q_heads=g * kvh, kv_heads=kvh, head_dim=d, page_size=ps, q_len=ql,
                             kv_dtype=kv_dtype, seed=g + d + ps + ql)
    ref = split_kv_decode_ref(**inp)
    assert torch.isfinite(ref).all()
    maps = [build_task_map(lens, kvh, 5, min_tiles=1), static_count_task_map(lens, kvh, 3),
            batch_invariant_task_map(lens, kvh, 4, chunk_tiles=2)]
    for tm in maps:
        out = split_kv_decode_emulation(**inp, task_map=tm)
        assert out.dtype == torch.bfloat16
        _assert_within(out, ref, f"{kv_dtype}_vs_exact")
        assert (out[ql:2 * ql] == 0).all(), "kv_len 0 must give zeros"


def test_exact_ref_matches_dense_attention_and_mtp_mask():
    lens = [5, 70]
    inp = make_decode_inputs(lens, q_heads=4, kv_heads=2, head_dim=64, page_size=16, q_len=3, kv_dtype="bf16",
                             seed=7)
    out = split_kv_decode_ref(**inp)
    for r, L in enumerate(lens):
        pages = inp["block_table"][r, : (L + 15) // 16].long()
        k = inp["k_cache"][pages].reshape(-1, 2, 64)[:L].double()
        v = inp["v_cache"][pages].reshape(-1, 2, 64)[:L].double()
        for i in range(3):
            lim = L - (2 - i)
            for j in range(4):
                qv = inp["q"][r * 3 + i, j].double()
                p = torch.softmax((k[:lim, j // 2] @ qv) / 8.0, 0)
                torch.testing.assert_close(out[r * 3 + i, j].double(), p @ v[:lim, j // 2], rtol=1e-6, atol=1e-6)


def test_mtp_rows_without_keys_are_zero():
    inp = make_decode_inputs([2, 0, 1], q_heads=2, head_dim=64, q_len=4, kv_dtype="fp8", seed=1)
    ref = split_kv_decode_ref(**inp)
    emu = split_kv_decode_emulation(**inp, task_map=build_task_map(inp["kv_lens"], 1, 4))
    # request 0 (kv_len 2): tokens 0, 1 see no key; request 2 (kv_len 1): tokens 0-2 see none
    for out in (ref, emu):
        assert torch.isfinite(out.float()).all()
        for row in (0, 1, 4, 5, 6, 7, 8, 9, 10):
            assert (out[row] == 0).all(), row
        assert (out[2].float().abs() > 0).any() and (out[11].float().abs() > 0).any()


def test_nan_poison_never_reaches_output():
    for kv_dtype in ("bf16", "fp8"):
        inp = make_decode_inputs([1, 65, 127, 0], q_heads=8, head_dim=128, page_size=64, kv_dtype=kv_dtype, seed=2)
        kc = inp["k_cache"].float()
        assert torch.isnan(kc).any(), "unused slots must be poisoned"
        # unused block-table entries point at a poisoned page
        assert torch.isnan(kc[inp["block_table"][0, 1].long()]).all()
        ref = split_kv_decode_ref(**inp)
        emu = split_kv_decode_emulation(**inp, task_map=build_task_map(inp["kv_lens"], 1, 3))
        assert torch.isfinite(ref).all() and torch.isfinite(emu.float()).all()
        assert (ref[3] == 0).all() and (emu[3] == 0).all()


def test_quantizers():
    q = torch.randn(5, 3, 64).to(torch.bfloat16)
    q[2, 1] = 0
    qf, qs = skv.quantize_q_fp8(q)
    assert qf.dtype == torch.float8_e4m3fn and qs.shape == (5, 3) and qs.dtype == torch.float32
    deq = qf.float() * qs[..., None]
    assert torch.isfinite(deq).all() and (deq[2, 1] == 0).all()
    assert float((deq - q.float()).norm() / q.float().norm()) < 0.04  # e4m3: 3 mantissa bits
    assert torch.allclose(qf.float().abs().amax(-1)[qs != 1], torch.tensor(448.0))
    c = torch.randn(4, 16, 1, 64)
    cf, cs = skv.quantize_kv_fp8(c)
    assert cs.shape == (1,) and float(cf.float().abs().max()) == 448.0
    with pytest.raises(ValueError, match="NaN"):
        skv.quantize_kv_fp8(torch.full((1, 16, 1, 64), float("nan")))


# ------------------------------------------------------------------------------------------------ bad input

def _strided(cache):
    """Same values, last dim strided (every other byte of a wider buffer)."""
    big = torch.zeros(*cache.shape[:-1], 2 * cache.shape[-1], dtype=torch.uint8)
    big[..., ::2] = cache.view(torch.uint8)
    return big[..., ::2].view(cache.dtype)


def _inp(**kw):
    return make_decode_inputs([70, 5], q_heads=8, head_dim=64, page_size=16, seed=0, **kw)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda d: d.update(q=d["q"].float()), TypeError, "q must be bfloat16"),
    (lambda d: d.update(k_cache=d["k_cache"].float()), TypeError, "k_cache must be"),
    (lambda d: d.update(block_table=d["block_table"].long()), TypeError, "block_table must be int32"),
    (lambda d: d.update(kv_lens=d["kv_lens"].long()), TypeError, "kv_lens must be int32"),
    (lambda d: d.update(k_cache=_strided(d["k_cache"])), ValueError, "k_cache must be contiguous"),
    (lambda d: d.update(block_table=d["block_table"][:, :2].contiguous()), ValueError, "block_table too short"),
    (lambda d: d.update(kv_lens=torch.tensor([70, -1], dtype=torch.int32)), ValueError, ">= 0"),
    (lambda d: d.update(q=d["q"][:, :6].contiguous(), q_scale=d["q_scale"][:, :6].contiguous()), ValueError,
     "GQA ratio"),
    (lambda d: d.update(q_len=5), ValueError, "q_len"),
    (lambda d: d.update(q_len=2), ValueError, "batch\\*q_len"),
    (lambda d: d.update(q_scale=None), ValueError, "q_scale"),
    (lambda d: d.update(k_scale=1.0), ValueError, "k_scale must be an fp32 tensor"),
    (lambda d: d.update(block_table=torch.full_like(d["block_table"], 999)), ValueError, "page index"),
])
def test_malformed_inputs_rejected(mutate, exc, match):
    d = _inp()
    mutate(d)
    with pytest.raises(exc, match=match):
        split_kv_decode_ref(**d)
    with pytest.raises(exc, match=match):
        split_kv_decode_emulation(**d, task_map=build_task_map([70, 5], 1, 4))


def test_unsupported_configs_rejected():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        make_decode_inputs([5], q_heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="head_dim"):
        make_decode_inputs([5], head_dim=96)
    with pytest.raises(ValueError, match="page_size"):
        make_decode_inputs([5], page_size=8)
    with pytest.raises(ValueError, match="kv_dtype"):
        make_decode_inputs([5], kv_dtype="fp16")
    d = make_decode_inputs([5, 9], kv_dtype="bf16", head_dim=64)
    with pytest.raises(ValueError, match="q_scale given"):
        split_kv_decode_ref(**{**d, "q_scale": torch.ones(2, 8)})
    with pytest.raises(ValueError, match="task_map was built"):
        split_kv_decode_emulation(**d, task_map=build_task_map([5, 10], 1, 4))


def test_supported_gqa_list_is_the_published_one():
    assert SUPPORTED_GQA == (1, 2, 4, 8, 12, 16)


def test_flops_and_bytes():
    assert skv.flops([10], 8, 128) == 4 * 8 * 128 * 10
    assert skv.flops([3, 0], 2, 64, q_len=2) == 4 * 2 * 64 * (2 + 3)
    lens = [131072] + [4096] * 31
    b = skv.bytes_moved(lens, 1, 128, "fp8", 8, 1)
    kv = 2 * sum(lens) * 128
    assert b == kv + 32 * 8 * 128 + 32 * 8 * 4 + 32 * 8 * 128 * 2
    assert skv.bytes_moved(lens, 1, 128, "bf16", 8, 1) == 2 * kv + 32 * 8 * 128 * 4
    with pytest.raises(ValueError, match="kv_dtype"):
        skv.bytes_moved(lens, 1, 128, "int4")
