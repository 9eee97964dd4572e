"""CPU tests of the fused MoE kernels' Python layer: the plan layout mirror, block_m choice, and every validation
error raised before anything is allocated or launched (no GPU, no nvcc call needed: bad input never reaches the
library)."""

from __future__ import annotations

import shutil

import pytest
import torch

from hotpaths.kernels import fused_moe as moe

FP8 = torch.float8_e4m3fn


def test_layout_mirror_matches_contract_formula():
    for e, mp, bm in [(192, 64, 8), (24, 2048, 64), (1, 0, 8), (512, 16000, 16)]:
        lay = moe.PlanLayout(e, mp, bm)
        max_tiles = -(-mp // bm) + e
        assert lay.max_tiles == max_tiles
        assert lay.length == moe.workspace_len(e, mp, bm) == 8 + e + (e + 1) + mp + 2 * max_tiles
        offs = list(lay.offsets.values())
        assert all(a[0] + a[1] == b[0] for a, b in zip(offs, offs[1:])), "fields must be contiguous, in order"
        views = lay.split(torch.arange(lay.length, dtype=torch.int32))
        assert views["tile_start"][-1].item() == lay.length - 1 and views["header"].numel() == 8


def test_choose_block_m_follows_rows_per_expert():
    assert moe.choose_block_m(4 * 8, 192) == 8        # batch 4, Hy3 TP8: < 1 row per expert
    assert moe.choose_block_m(64 * 8, 192) == 8       # batch 64: 2.7 rows, 8 holds avg + 2 sd
    assert moe.choose_block_m(128 * 8, 192) == 16     # batch 128: 5.3 rows, up to ~11 on busy experts
    assert moe.choose_block_m(256 * 8, 192) == 32     # batch 256: 10.7 rows, up to ~18
    assert moe.choose_block_m(768 * 8, 192) == 64     # batch 768: 32 rows, up to ~44
    assert moe.choose_block_m(256 * 8, 24) == 64      # EP8 local experts: ~85 rows, capped at 64
    assert moe.choose_block_m(0, 8) == 8


def test_choose_block_m_covers_most_experts_in_one_tile():
    """The property the headroom is for: under uniform random routing at least ~95% of the experts hit fit one
    tile (their weights are read once), where sizing for the plain average leaves a third or more spilling."""
    import torch

    g = torch.Generator().manual_seed(0)
    for tokens in (128, 256, 512, 768):
        e, k = 192, 8
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
        counts = torch.bincount(ids.flatten(), minlength=e)
        hit = counts[counts > 0]
        bm = moe.choose_block_m(tokens * k, e)
        assert (hit <= bm).float().mean().item() >= 0.95, (tokens, bm, hit.max().item())


def _ids(t=4, k=8, dtype=torch.int32):
    return torch.zeros(t, k, dtype=dtype)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(topk_ids=_ids(dtype=torch.int64)), TypeError, "topk_ids: expected dtype torch.int32"),
    (dict(topk_ids=torch.zeros(8, dtype=torch.int32)), ValueError, "topk_ids: expected a 2-D"),
    (dict(topk_ids=_ids(k=17)), ValueError, "topk_ids: expected top-k in 1..16"),
    (dict(topk_ids=_ids(k=0)), ValueError, "topk_ids: expected top-k"),
    (dict(topk_ids=_ids(t=8, k=4).t()), ValueError, "topk_ids: expected a contiguous"),
    (dict(num_experts=0), ValueError, "num_experts"),
    (dict(num_experts=513), ValueError, "num_experts"),
    (dict(expert_offset=-1), ValueError, "expert_offset: expected an int >= 0"),
    (dict(block_m=12), ValueError, "block_m: expected one of"),
    (dict(max_tokens=3), ValueError, "max_tokens: expected an int >= T = 4"),
    (dict(topk_ids=_ids()), ValueError, "topk_ids: expected a CUDA tensor"),
])
def test_plan_rejects_bad_input(kwargs, exc, match):
    args = dict(topk_ids=_ids(), num_experts=8)
    args.update(kwargs)
    ids = args.pop("topk_ids")
    with pytest.raises(exc, match=match):
        moe.plan(ids, **args)


def _fake_plan(t=4, k=2, e=8):
    """A plan object around CPU tensors: run() must reject bad input before touching the device."""
    return moe.MoEPlan(torch.zeros(moe.workspace_len(e, t * k, 8), dtype=torch.int32), _ids(t, k), e, 0, t, k, 8)


def _good(t=4, k=2, e=8, h=128, i=64, mode="pertensor"):
    d = dict(x=torch.zeros(t, h, dtype=torch.bfloat16), w13=torch.zeros(e, 2 * i, h, dtype=FP8),
             w2=torch.zeros(e, h, i, dtype=FP8), topk_weights=torch.zeros(t, k))
    if mode == "pertensor":
        d.update(w13_scale=torch.ones(e), w2_scale=torch.ones(e), a1_scale=torch.ones(1), a2_scale=torch.ones(1))
    else:
        d.update(w13_scale=torch.ones(e, 1, 1), w2_scale=torch.ones(e, 1, 1))
    return d


@pytest.mark.parametrize("change,exc,match", [
    (dict(x=torch.zeros(4, 128, dtype=torch.float16)), TypeError, "x: expected dtype torch.bfloat16"),
    (dict(x=torch.zeros(5, 128, dtype=torch.bfloat16)), ValueError, "x: expected T = 4"),
    (dict(w13=torch.zeros(8, 128, 128, dtype=torch.bfloat16)), TypeError, "w13: expected dtype"),
    (dict(w13=torch.zeros(7, 128, 128, dtype=FP8)), ValueError, "w13: expected 8 experts"),
    (dict(w13=torch.zeros(8, 128, 64, dtype=FP8)), ValueError, "w13: expected"),
    (dict(w13=torch.zeros(8, 96, 128, dtype=FP8), w2=torch.zeros(8, 128, 48, dtype=FP8)), ValueError,
     "multiples of 64"),
    (dict(w2=torch.zeros(8, 64, 128, dtype=FP8)), ValueError, "w2: expected shape"),
    (dict(topk_weights=torch.zeros(4, 3)), ValueError, "topk_weights: expected shape"),
    (dict(topk_weights=torch.zeros(4, 2, dtype=torch.bfloat16)), TypeError, "topk_weights: expected dtype"),
    (dict(w13_scale=torch.ones(7)), ValueError, "w13_scale: expected shape"),
    (dict(a2_scale=None), ValueError, "a2_scale: required"),
    (dict(a1_scale=torch.ones(1, dtype=torch.float64)), TypeError, "a1_scale: expected dtype"),
    (dict(scales="rowwise"), ValueError, "scales: expected one of"),
    (dict(shared_out=torch.zeros(4, 64, dtype=torch.bfloat16)), ValueError, "shared_out: expected shape"),
    (dict(out=torch.zeros(4, 128)), TypeError, "out: expected dtype"),
    (dict(stages="everything"), ValueError, "stages: expected"),
    ({}, ValueError, "x: expected a CUDA tensor"),
])
def test_run_rejects_bad_input(change, exc, match):
    args = _good()
    args.update(change)
    with pytest.raises(exc, match=match):
        moe.run(_fake_plan(), **args)


def test_run_block_mode_shapes_and_no_static_activation_scales():
    args = _good(mode="block")
    args["w13_scale"] = torch.ones(8, 2, 1)  # ceil(2I/128) = 1 for I = 64
    with pytest.raises(ValueError, match=r"w13_scale: expected shape \(8, 1, 1\)"):
        moe.run(_fake_plan(), scales="block", **args)
    args = _good(mode="block")
    with pytest.raises(ValueError, match="a1_scale: block scales"):
        moe.run(_fake_plan(), scales="block", a1_scale=torch.ones(1), **args)
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):  # valid otherwise: only the device is wrong
        moe.run(_fake_plan(), scales="block", **_good(mode="block"))


def test_run_rejects_a_non_plan():
    with pytest.raises(TypeError, match="plan: expected a MoEPlan"):
        moe.run(object(), **_good())


def test_torch_library_op_registered_with_fake():
    op = torch.ops.hotpaths.fused_moe
    assert op.default._schema.name == "hotpaths::fused_moe"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = _good(t=3)
        out = op(g["x"][:3].clone(), _ids(3, 2), torch.zeros(3, 2), g["w13"], g["w2"], g["w13_scale"],
                 g["w2_scale"], g["a1_scale"], g["a2_scale"], None, "pertensor", 0)
        assert out.shape == (3, 128) and out.dtype == torch.bfloat16


def test_choose_block_m_wgmma_tiles():
    assert moe.choose_block_m(256 * 8, 192, "wgmma") == 32    # batch 256, Hy3 TP8: 10.7 rows, up to ~18
    assert moe.choose_block_m(1024 * 8, 192, "wgmma") == 64   # 42.7 rows, up to ~57
    assert moe.choose_block_m(4096 * 8, 192, "wgmma") == 64   # 171 rows: 64-row tiles hold ~192, 128-row 256
    assert moe.choose_block_m(16384 * 8, 192, "wgmma") == 128  # 683 rows: ~704 against ~768, not enough fewer
    assert moe.choose_block_m(4096 * 8, 192, "wgmma_ws") == 128  # the rows model is the cp.async kernel's only
    assert moe.choose_block_m(4 * 8, 192, "wgmma") == 16      # the smallest wgmma tile
    with pytest.raises(ValueError, match="gemm"):
        moe.choose_block_m(64, 8, "auto")


@pytest.mark.parametrize("gemm,base", [("wgmma_ws", "wgmma"), ("mma_tma", "mma")])
def test_new_gemm_paths_share_their_family_tiles(gemm, base):
    """The warp-specialized / TMA-fed kernels take the tiles of the kernel family they vary (up to the largest tile,
    past which only the cp.async wgmma kernel weighs 64-row tiles: test_choose_block_m_wgmma_tiles)."""
    for pairs in (4 * 8, 64 * 8, 256 * 8, 1024 * 8, 2048 * 8):
        assert moe.choose_block_m(pairs, 192, gemm) == moe.choose_block_m(pairs, 192, base)
    assert moe.resolve_gemm(gemm, 4 * 8, 192) == gemm  # never rewritten by the auto rule


def test_resolve_gemm_auto_env_and_explicit(monkeypatch):
    monkeypatch.delenv(moe.GEMM_ENV, raising=False)
    assert moe.resolve_gemm(None, 4 * 8, 192) == "wgmma_ws"        # 0.17 rows per expert: decode
    assert moe.resolve_gemm(None, 1024 * 8, 192) == "wgmma_ws"     # 42.7 rows per expert
    assert moe.resolve_gemm(None, 1536 * 8, 192) == "wgmma"        # 64 rows per expert: the threshold
    assert moe.resolve_gemm("auto", 1535 * 8, 192) == "wgmma_ws"   # just below it
    assert moe.resolve_gemm("auto", 256 * 8, 24) == "wgmma"        # TP1/EP8 batch 256 (85 per local expert)
    assert moe.resolve_gemm("auto", 4096 * 8, 192) == "wgmma"
    assert moe.resolve_gemm("auto", 4 * 8, 192, block_m=128) == "wgmma_ws"  # a wgmma tile: the wgmma family
    assert moe.resolve_gemm("auto", 4096 * 8, 192, block_m=8) == "mma"      # only mma has 8-pair tiles
    assert moe.resolve_gemm("mma", 4096 * 8, 192) == "mma"
    monkeypatch.setenv(moe.GEMM_ENV, "wgmma")
    assert moe.resolve_gemm(None, 4 * 8, 192) == "wgmma"
    assert moe.resolve_gemm("mma", 4 * 8, 192) == "mma"         # an explicit argument wins over the environment
    monkeypatch.setenv(moe.GEMM_ENV, "cublas")
    with pytest.raises(ValueError, match=r"\$HOTPATHS_MOE_GEMM: expected one of"):
        moe.resolve_gemm(None, 32, 8)
    with pytest.raises(ValueError, match="gemm: expected one of"):
        moe.resolve_gemm("tma", 32, 8)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gemm="tma"), "gemm: expected one of"),
    (dict(gemm="mma", block_m=128), r"block_m: expected one of \(8, 16, 32, 64\) for gemm='mma'"),
    (dict(gemm="wgmma", block_m=8), r"block_m: expected one of \(16, 32, 64, 128\) for gemm='wgmma'"),
    (dict(gemm="wgmma_ws", block_m=8), r"block_m: expected one of \(16, 32, 64, 128\) for gemm='wgmma_ws'"),
    (dict(gemm="mma_tma", block_m=128), r"block_m: expected one of \(8, 16, 32, 64\) for gemm='mma_tma'"),
])
def test_plan_rejects_bad_gemm_choice(kwargs, match):
    with pytest.raises(ValueError, match=match):
        moe.plan(_ids(), num_experts=8, **kwargs)


@pytest.mark.parametrize("gemm", ["wgmma", "wgmma_ws"])
def test_wgmma_plan_never_splits_k(gemm):
    p = moe.MoEPlan(torch.zeros(moe.workspace_len(8, 8, 16), dtype=torch.int32), _ids(4, 2), 8, 0, 4, 2, 16, gemm)
    assert p.split_factors(128, 64) == (1, 1)


def test_resolve_route_auto_env_and_explicit(monkeypatch):
    monkeypatch.delenv(moe.ROUTE_ENV, raising=False)
    assert moe.resolve_route(None, 64 * 8) == "small"                            # decode: one pair per thread
    assert moe.resolve_route(None, moe.ROUTE_SMALL_AUTO_PAIRS) == "small"       # auto's last plan size
    assert moe.resolve_route(None, moe.ROUTE_SMALL_AUTO_PAIRS + 1) == "one"
    assert moe.resolve_route("small", moe.ROUTE_SMALL_MAX_PAIRS) == "small"     # the kernel's capacity
    assert moe.resolve_route(None, moe.ROUTE_MULTI_MIN_PAIRS - 1) == "one"
    assert moe.resolve_route("auto", moe.ROUTE_MULTI_MIN_PAIRS) == "multi"      # the threshold
    assert moe.resolve_route("auto", 4096 * 8) == "multi"
    assert moe.resolve_route("one", 16384 * 8) == "one"                          # explicit: never rewritten
    assert moe.resolve_route("one", 8) == "one"
    assert moe.resolve_route("multi", 0) == "multi"
    assert moe.resolve_route("small", 0) == "small"
    with pytest.raises(ValueError, match="route: 'small' takes plans of at most 1024 pairs"):
        moe.resolve_route("small", moe.ROUTE_SMALL_MAX_PAIRS + 1)
    monkeypatch.setenv(moe.ROUTE_ENV, "multi")
    assert moe.resolve_route(None, 8) == "multi"
    assert moe.resolve_route("one", 8) == "one"                                  # the argument wins
    monkeypatch.setenv(moe.ROUTE_ENV, "atomic")
    with pytest.raises(ValueError, match=r"\$HOTPATHS_MOE_ROUTE: expected one of"):
        moe.resolve_route(None, 8)
    with pytest.raises(ValueError, match="route: expected one of"):
        moe.resolve_route("many", 8)


def test_plan_rejects_bad_route():
    with pytest.raises(ValueError, match="route: expected one of"):
        moe.plan(_ids(), num_experts=8, route="many")


def test_reduce_variant_env(monkeypatch):
    monkeypatch.delenv(moe.REDUCE_ENV, raising=False)
    assert moe.reduce_variant() == moe.REDUCES["auto"] == 0
    monkeypatch.setenv(moe.REDUCE_ENV, "Wide")
    assert moe.reduce_variant() == 2
    monkeypatch.setenv(moe.REDUCE_ENV, "narrow")
    assert moe.reduce_variant() == 1
    monkeypatch.setenv(moe.REDUCE_ENV, "fast")
    with pytest.raises(ValueError, match=r"\$HOTPATHS_MOE_REDUCE: expected one of"):
        moe.reduce_variant()


@pytest.mark.parametrize("gemm", moe.GEMMS[1:])
def test_act_quant_fused_rule(monkeypatch, gemm):
    """The gate-up epilogue writes aq (no pre-pass launch for the down GEMM) exactly on the per-tensor wgmma paths,
    unless $HOTPATHS_MOE_ACT_QUANT = prepass; a bad value names the variable."""
    p = moe.MoEPlan(torch.zeros(moe.workspace_len(8, 8, 16), dtype=torch.int32), _ids(4, 2), 8, 0, 4, 2, 16,
                    gemm=gemm)
    monkeypatch.delenv(moe.ACT_QUANT_ENV, raising=False)
    assert moe.act_quant_fused(p, "pertensor") == (gemm in moe.WGMMA_GEMMS)
    assert not moe.act_quant_fused(p, "block")
    monkeypatch.setenv(moe.ACT_QUANT_ENV, "Prepass")
    assert not moe.act_quant_fused(p, "pertensor")
    monkeypatch.setenv(moe.ACT_QUANT_ENV, "fused")
    assert moe.act_quant_fused(p, "pertensor") == (gemm in moe.WGMMA_GEMMS)
    monkeypatch.setenv(moe.ACT_QUANT_ENV, "never")
    with pytest.raises(ValueError, match=r"\$HOTPATHS_MOE_ACT_QUANT: expected one of"):
        moe.act_quant_fused(p, "pertensor")


@pytest.mark.parametrize("gemm", moe.GEMMS[1:])
@pytest.mark.parametrize("block_m", (16, 64, 128))
def test_down_pdl_rule(gemm, block_m):
    """The down GEMM launches without PDL exactly at 64-row wgmma tiles, and never with PDL when run() has it off."""
    if block_m not in (moe.WGMMA_BLOCK_MS if gemm in moe.WGMMA_GEMMS else moe.BLOCK_MS):
        pytest.skip(f"block_m {block_m} is not a {gemm} tile")
    p = moe.MoEPlan(torch.zeros(moe.workspace_len(8, 8, block_m), dtype=torch.int32), _ids(4, 2), 8, 0, 4, 2,
                    block_m, gemm=gemm)
    assert moe.down_pdl(p, True) == (not (gemm in moe.WGMMA_GEMMS and block_m == 64))
    assert not moe.down_pdl(p, False)


@pytest.mark.parametrize("edge", moe.PDL_EDGES)
def test_pdl_edges_override_the_rules(edge):
    """plan(pdl_edges=...) forces an edge on or off over its rule (the A/B knob); run's pdl=False still wins, and
    the other edge keeps its rule."""
    rule = {"down": moe.down_pdl, "reduce": moe.reduce_pdl}
    other = next(e for e in moe.PDL_EDGES if e != edge)
    for gemm, block_m in (("wgmma", 64), ("wgmma_ws", 16)):  # down's rule: off at 64-row wgmma tiles, on at 16
        base = moe.MoEPlan(torch.zeros(moe.workspace_len(8, 8, block_m), dtype=torch.int32), _ids(4, 2), 8, 0, 4,
                           2, block_m, gemm=gemm)
        for value in (True, False):
            p = moe.MoEPlan(base.workspace, base.topk_ids, 8, 0, 4, 2, block_m, gemm=gemm, pdl_edges={edge: value})
            assert rule[edge](p, True) is value
            assert rule[edge](p, False) is False
            assert rule[other](p, True) == rule[other](base, True)


def test_plan_rejects_bad_pdl_edges():
    for bad in ({"gate_up": False}, {"down": "off"}, {"reduce": 0}):
        with pytest.raises(ValueError, match=r"pdl_edges: expected \{edge: bool\}"):
            moe.plan(_ids(4, 2), num_experts=8, pdl_edges=bad)


def test_plan_default_route_is_one_cta():
    p = moe.MoEPlan(torch.zeros(moe.workspace_len(8, 8, 8), dtype=torch.int32), _ids(4, 2), 8, 0, 4, 2, 8)
    assert p.route == "one" and p.route_scratch() is None



def test_resolve_gemm_threshold_follows_the_scale_format(monkeypatch):
    """Told the FP8 format, auto keeps the ws kernel up to WS_MAX_ROWS_BY_SCALES rows per expert (per-tensor 96,
    block-wise 64, the measured crossovers); untold, the block-wise threshold serves both; a bad format is named."""
    monkeypatch.delenv(moe.GEMM_ENV, raising=False)
    assert moe.WS_MAX_ROWS_BY_SCALES["block"] == moe.WS_MAX_ROWS < moe.WS_MAX_ROWS_BY_SCALES["pertensor"]
    # Hy3 TP8 (E = 192): batch 2048 = 85.3 rows, batch 2304 = 96 rows, batch 1536 = 64 rows
    assert moe.resolve_gemm("auto", 2048 * 8, 192, scales="pertensor") == "wgmma_ws"
    assert moe.resolve_gemm("auto", 2048 * 8, 192, scales="block") == "wgmma"
    assert moe.resolve_gemm("auto", 2048 * 8, 192) == "wgmma"
    assert moe.resolve_gemm("auto", 2303 * 8, 192, scales="pertensor") == "wgmma_ws"
    assert moe.resolve_gemm("auto", 2304 * 8, 192, scales="pertensor") == "wgmma"
    assert moe.resolve_gemm("auto", 1535 * 8, 192, scales="block") == "wgmma_ws"
    assert moe.resolve_gemm("auto", 1536 * 8, 192, scales="block") == "wgmma"
    assert moe.resolve_gemm("wgmma", 4 * 8, 192, scales="pertensor") == "wgmma"  # explicit paths stay
    # TP1/EP8 batch 2048 (85 expected rows per local expert): the ws kernel's 128-row tiles per-tensor only
    assert moe.plan_shape(2048 * 8, 24, experts_total=192, scales="pertensor") == ("wgmma_ws", 128)
    assert moe.plan_shape(2048 * 8, 24, experts_total=192, scales="block") == ("wgmma", 128)
    for bad in ("fp8", "Block", ""):
        with pytest.raises(ValueError, match="scales: expected None or one of"):
            moe.resolve_gemm("auto", 32, 8, scales=bad)
    with pytest.raises(ValueError, match="scales: expected None or one of"):
        moe.plan(_ids(), num_experts=8, scales="blockwise")


def test_plan_shape_is_plans_choice():
    """plan_shape is plan()'s (gemm, block_m) choice: the auto rule's path, then its tile for the rows per expert;
    an explicit block_m is checked against the path's tiles. Under EP without experts_total every pair counts (an
    EP8 rank of Hy3 at batch 256: 85 rows per local expert by the capacity), so the rank takes 128-row cp.async
    wgmma tiles; with experts_total it sizes for the 10.7 rows it expects, the tiles of a TP8 layer with those
    rows."""
    assert moe.plan_shape(256 * 8, 192) == ("wgmma_ws", 32)
    assert moe.plan_shape(256 * 8, 24) == ("wgmma", 128)
    assert moe.plan_shape(256 * 8, 24, experts_total=192) == moe.plan_shape(256 * 8, 192) == ("wgmma_ws", 32)
    assert moe.plan_shape(1024 * 8, 24, experts_total=192) == ("wgmma_ws", 64)   # 42.7 expected rows per expert
    assert moe.plan_shape(4096 * 8, 24, experts_total=192) == ("wgmma", 64)      # 171: the cp.async kernel's
    assert moe.plan_shape(256 * 8, 192, experts_total=192) == moe.plan_shape(256 * 8, 192)  # no EP: no change
    assert moe.plan_shape(16 * 8, 192, gemm="mma") == ("mma", 8)
    assert moe.plan_shape(16 * 8, 192, block_m=64) == ("wgmma_ws", 64)
    with pytest.raises(ValueError, match="block_m"):
        moe.plan_shape(16 * 8, 192, gemm="wgmma", block_m=8)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: cannot build the fused_moe library")
def test_library_host_queries_match_the_python_mirrors():
    """The library loads on any machine (its host queries need no GPU): the split workspace's flag count equals
    WS_SPLIT_FLAGS (checked at load), its size is flags + a slot of 256 threads x block_m / 2 fp32 partials per CTA
    where gate-up units may be cut, 0 at 128-row tiles (never cut) and -1 for a tile the kernel has not."""
    lib = moe._lib()
    for bm in (16, 32, 64):
        assert lib.hp_moe_ws_split_ints(bm) == moe.WS_SPLIT_FLAGS * (1 + 256 * bm // 2)
    assert lib.hp_moe_ws_split_ints(128) == 0
    assert lib.hp_moe_ws_split_ints(8) == -1
    assert moe.c_workspace_len(192, 64, 16) == moe.workspace_len(192, 64, 16)


def test_expected_local_pairs_and_bad_experts_total():
    """max_pairs x E / experts_total; None means no expert parallelism. experts_total below E, or not an int, is
    rejected naming the argument, by plan() too before anything is allocated."""
    assert moe.expected_local_pairs(2048, 24) == 2048.0
    assert moe.expected_local_pairs(2048, 24, 192) == 256.0
    for bad in (23, 0, 192.0, True, "192"):
        with pytest.raises(ValueError, match="experts_total"):
            moe.expected_local_pairs(2048, 24, bad)
        with pytest.raises(ValueError, match="experts_total"):
            moe.plan(_ids(), num_experts=8, experts_total=bad if bad != 23 else 7)


def test_expected_tile_rows_matches_sampled_routing():
    """expected_tile_rows is E[ceil(n / bm) bm] for n ~ Poisson(avg): checked against sampled counts, and its bounds
    (never below avg, never above avg + bm)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for avg in (3.0, 42.7, 64.0, 170.7, 682.7):
        n = rng.poisson(avg, 200_000)
        for bm in (64, 128):
            sampled = float((np.ceil(n / bm) * bm).mean())
            got = moe.expected_tile_rows(avg, bm)
            assert abs(got - sampled) <= 0.01 * sampled, (avg, bm, got, sampled)
            assert avg <= got <= avg + bm
    assert moe.expected_tile_rows(0.0, 64) == 0.0
