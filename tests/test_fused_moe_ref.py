"""CPU tests of the fused FP8 MoE reference: exact vs emulation, emulation vs the per-token loop, the routing plan's
invariants, every edge routing, both scale modes (I = 192 block-wise), and malformed input."""

import numpy as np
import pytest
import torch

from hotpaths.harness.check import check
from hotpaths.harness.shapes import load_shapes
from hotpaths.reference import fused_moe as fm

SMALL = dict(experts=16, hidden=256, inter=1536)   # TP8: I = 192 per rank (the Hy3 remainder block)


def _inputs(t, **kw):
    base = dict(SMALL)
    base.update(kw)
    return fm.make_moe_inputs(t, **base)


def _run(fn, inp, **extra):
    a, kw = fm.call_args(inp)
    kw.update(extra)
    return fn(*a, **kw)


@pytest.mark.parametrize("scales", fm.SCALE_MODES)
@pytest.mark.parametrize("mode", fm.PAR_MODES)
def test_emulation_equals_per_token_loop_and_unfused(scales, mode):
    inp = _inputs(13, mode=mode, scales=scales, shared=True, experts=32)
    emu = _run(fm.fused_moe_emulation, inp)
    assert emu.dtype == torch.bfloat16 and emu.shape == (13, inp["hidden"])
    assert torch.equal(emu, _run(fm.fused_moe_loop, inp))           # tiling never changes a bit
    assert torch.equal(emu, _run(fm.fused_moe_unfused, inp)["out"])  # nor does the materialized gather


@pytest.mark.parametrize("scales", fm.SCALE_MODES)
def test_emulation_close_to_exact(scales):
    inp = _inputs(64, scales=scales, hidden=512)
    emu, ref = _run(fm.fused_moe_emulation, inp), _run(fm.fused_moe_ref, inp)
    r = check(emu, ref, op="fused_moe", path=f"{scales}_vs_exact")
    assert r.passed, r
    e = fm.error_vs(emu, ref)
    assert e["cosine"] > 0.998 and e["max_rel_err"] < 0.08  # the published 0.99974 / 0.024 magnitude
    assert e["rel_l2_err"] > 1e-3  # the FP8 activations do cost something: the reference is not the emulation


def test_block_mode_at_i192_uses_a_partial_last_block():
    inp = _inputs(9, scales="block")
    assert inp["inter"] == 192
    assert tuple(inp["w2_scale"].shape) == (16, 2, 2) and tuple(inp["w13_scale"].shape) == (16, 3, 2)
    st = _run(fm.fused_moe_emulation, inp, return_stages=True)
    assert st["a_scale"].shape[1] == 2
    # the second activation group covers columns 128..191 only: its scale is their amax / 448
    p = int(st["plan"].sorted_pairs[0])
    want = st["act"][p, 128:].float().abs().max() / fm.FP8_MAX
    assert torch.isclose(st["a_scale"][p, 1], want)


def test_pertensor_quantization_rounds_to_nearest_even_and_clamps():
    v = torch.tensor([1000.0, -1000.0, 0.0, 1.125, 17.0])  # 17 sits between e4m3 16 and 18: even mantissa -> 16
    q = fm.quant_fp8(v, 1.0).float()
    assert q.tolist() == [448.0, -448.0, 0.0, 1.125, 16.0]
    s = fm.group_scales(torch.zeros(2, 192))
    assert torch.all(s == fm.GROUP_EPS) and s.shape == (2, 2)


def _plan_ok(ids, **kw):
    plan = fm.build_routing_plan(ids, **kw)
    bad = fm.check_plan(plan, ids)
    assert not bad, "\n".join(bad) + "\n" + fm.format_plan(plan)
    return plan


@pytest.mark.parametrize("block_m", [1, 4, 16, 64])
def test_plan_invariants_random(block_m):
    ids = _inputs(37, experts=24)["topk_ids"]
    plan = _plan_ok(ids, num_experts=24, block_m=block_m)
    assert plan.num_valid == 37 * 8 and plan.workspace.dtype == np.int32
    assert plan.workspace.size == fm.workspace_len(24, 37 * 8, block_m)
    counts = plan.expert_counts
    assert plan.num_tiles == sum(-(-int(c) // block_m) for c in counts)
    assert plan.num_tiles <= plan.offsets["max_tiles"]


def test_plan_by_hand():
    ids = torch.tensor([[2, 0], [0, -1], [2, 2]], dtype=torch.int32)
    plan = fm.build_routing_plan(ids, num_experts=3, block_m=2, max_tokens=4)
    assert plan.header.tolist() == [5, 3, 2, 2, 0, 0, 0, 0]
    assert plan.expert_counts.tolist() == [2, 0, 3] and plan.expert_offsets.tolist() == [0, 2, 2, 5]
    assert plan.sorted_pairs.tolist() == [1, 2, 0, 4, 5, -1, -1, -1]   # max_pairs = 4 * 2
    assert plan.tiles() == [(0, 0, 0, 2), (1, 2, 2, 2), (2, 2, 4, 1)]
    assert plan.tile_expert[3:].tolist() == [-1] * (plan.offsets["max_tiles"] - 3)
    assert "expert    2" in fm.format_plan(plan)


def test_check_plan_catches_corruption():
    ids = _inputs(8, experts=8)["topk_ids"]
    plan = fm.build_routing_plan(ids, num_experts=8, block_m=4)
    o = plan.offsets["sorted_pairs"]
    plan.workspace[o], plan.workspace[o + 1] = plan.workspace[o + 1], plan.workspace[o]
    assert fm.check_plan(plan, ids)


@pytest.mark.parametrize("routing", fm.ROUTINGS)
@pytest.mark.parametrize("scales", fm.SCALE_MODES)
def test_edge_routings(routing, scales):
    inp = _inputs(11, experts=8, routing=routing, scales=scales)
    _plan_ok(inp["topk_ids"], num_experts=8, block_m=4)
    emu = _run(fm.fused_moe_emulation, inp)
    assert torch.equal(emu, _run(fm.fused_moe_loop, inp))
    assert check(emu, _run(fm.fused_moe_ref, inp), op="fused_moe", path=f"{scales}_vs_exact").passed
    if routing == "one_expert":
        plan = fm.build_routing_plan(inp["topk_ids"], num_experts=8)
        assert plan.experts_hit == 1 and plan.num_valid == 11
    if routing == "half_experts":
        assert (fm.expert_histogram(inp["topk_ids"], num_experts=8)[4:] == 0).all()


def test_duplicates_count_each_slot():
    inp = _inputs(3, experts=8)
    ids = inp["topk_ids"].clone()
    ids[:, :] = ids[:, :1]  # all 8 slots on one expert
    inp2 = dict(inp, topk_ids=ids)
    out = _run(fm.fused_moe_ref, inp2)
    one = dict(inp, topk_ids=torch.cat([ids[:, :1], torch.full_like(ids[:, 1:], -1)], 1),
               topk_weights=inp["topk_weights"].sum(1, keepdim=True).expand(-1, 8).contiguous())
    assert torch.allclose(out, _run(fm.fused_moe_ref, one), rtol=1e-6, atol=1e-7)


def test_skipped_and_zero_tokens_and_shared():
    inp = _inputs(4, experts=8, shared=True)
    inp["topk_ids"][1] = -1
    emu = _run(fm.fused_moe_emulation, inp)
    assert torch.equal(emu[1], inp["shared_out"][1])  # no valid slot: the shared expert's output alone
    z = _inputs(0, experts=8, shared=True)
    assert _run(fm.fused_moe_emulation, z).shape == (0, z["hidden"])
    plan = _plan_ok(z["topk_ids"], num_experts=8, max_tokens=4)
    assert plan.num_valid == 0 and plan.num_tiles == 0 and plan.sorted_pairs.tolist() == [-1] * 32


def test_one_token():
    inp = _inputs(1, experts=8)
    assert torch.equal(_run(fm.fused_moe_emulation, inp), _run(fm.fused_moe_loop, inp))


def test_ep_local_range():
    inp = fm.make_moe_inputs(64, mode="tp1ep8", experts=64, hidden=128, inter=128, rank=3)
    assert inp["num_experts"] == 8 and inp["expert_offset"] == 24
    ids = inp["topk_ids"]
    local = ((ids >= 24) & (ids < 32)).sum().item()
    assert 0 < local < ids.numel() / 2   # about 1/8 of the slots land here
    plan = _plan_ok(ids, num_experts=8, expert_offset=24)
    assert plan.num_valid == local
    # a token routed only elsewhere contributes nothing
    ids2 = ids.clone()
    ids2[0] = 0
    out = _run(fm.fused_moe_emulation, dict(inp, topk_ids=ids2))
    assert (out[0] == 0).all()


def test_correctness_cases_from_shapes_file():
    for case in load_shapes("fused_moe", "correctness"):
        kw = {k: case[k] for k in ("model", "mode", "experts", "hidden", "inter", "routing") if k in case}
        for t in case["tokens"]:
            inp = fm.make_moe_inputs(t, **kw)
            assert torch.equal(_run(fm.fused_moe_emulation, inp), _run(fm.fused_moe_loop, inp)), case["name"]


def test_counts():
    ids = torch.tensor([[0, 1], [1, 5], [-1, 1]], dtype=torch.int32)
    kw = dict(num_experts=4, hidden=128, inter=64)
    assert fm.experts_hit(ids, num_experts=4) == 2
    assert fm.flops(ids, **kw) == 2 * 4 * 3 * 64 * 128
    assert fm.weight_bytes(ids, **kw) == 2 * (3 * 64 * 128 + 8)
    assert fm.bytes(ids, **kw) == fm.weight_bytes(ids, **kw) + 3 * 128 * 4 + 3 * 2 * 8
    dims = fm.model_dims("hy3", "tp8ep1")
    assert (dims["experts"], dims["inter"]) == (192, 192)
    dims = fm.model_dims("dsv3", "tp1ep8")
    assert (dims["experts"], dims["inter"], dims["hidden"]) == (32, 2048, 7168)


@pytest.mark.parametrize("bad, match", [
    (dict(hidden=100), "hidden"), (dict(inter=1000), "inter"), (dict(topk=0), "topk"), (dict(topk=17), "topk"),
    (dict(model="llama"), "model"), (dict(mode="tp2"), "mode"), (dict(scales="fp4"), "scales"),
    (dict(routing="zipf"), "routing"), (dict(mode="tp1ep8", experts=12), "experts"),
])
def test_generator_rejects_bad_sizes(bad, match):
    kw = dict(SMALL)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        fm.make_moe_inputs(4, **kw)


def test_generator_refuses_what_does_not_fit():
    from hotpaths.reference.common import ResourceError
    with pytest.raises(ResourceError, match="fused_moe inputs"):
        fm.make_moe_inputs(10**12, experts=8, hidden=128, inter=1024)


def test_malformed_call_arguments():
    inp = _inputs(4, experts=8)
    a, kw = fm.call_args(inp)
    x, ids, tw, w13, w2 = a
    cases = [
        ((x.float(), ids, tw, w13, w2), {}, TypeError, "x: expected dtype"),
        ((x, ids.long(), tw, w13, w2), {}, TypeError, "topk_ids"),
        ((x, ids, tw.half(), w13, w2), {}, TypeError, "topk_weights"),
        ((x, ids, tw, w13.float(), w2), {}, TypeError, "w13"),
        ((x, ids[:2], tw[:2], w13, w2), {}, ValueError, "topk_ids: expected 4 rows"),
        ((x, ids, tw[:, :4], w13, w2), {}, ValueError, "topk_weights: expected shape"),
        ((x, ids, tw, w13, w2[:, :, :64]), {}, ValueError, "w2: expected shape"),
        ((x[:, :100], ids, tw, w13[:, :, :100], w2[:, :100]), {}, ValueError, "hidden 100"),
        ((x, ids, tw, w13, w2), {"scales": "fp4"}, ValueError, "scales"),
        ((x, ids, tw, w13, w2), {"a1_scale": None}, ValueError, "a1_scale: required"),
        ((x, ids, tw, w13, w2), {"w13_scale": torch.ones(8, 2, 2)}, ValueError, "w13_scale"),
        ((x, ids, tw, w13, w2), {"expert_offset": -1}, ValueError, "expert_offset"),
        ((x, ids - 5, tw, w13, w2), {}, ValueError, "below -1"),
        ((x, ids, tw, w13, w2), {"shared_out": x[:2]}, ValueError, "shared_out"),
    ]
    for args, over, exc, match in cases:
        k = dict(kw)
        k.update(over)
        with pytest.raises(exc, match=match):
            fm.fused_moe_emulation(*args, **k)
    with pytest.raises(ValueError, match="block"):
        fm.fused_moe_ref(*a, **dict(kw, scales="block"))
    with pytest.raises(ValueError, match="max_tokens"):
        fm.build_routing_plan(ids, num_experts=8, max_tokens=2)
    with pytest.raises(TypeError, match="int32"):
        fm.build_routing_plan(ids.long(), num_experts=8)
    with pytest.raises(ValueError, match="plan"):
        fm.fused_moe_emulation(*a, **kw, plan=fm.build_routing_plan(ids, num_experts=8, expert_offset=8))


@pytest.mark.parametrize("block_m", [1, 3, 16])
def test_emulation_independent_of_plan_shape(block_m):
    inp = _inputs(10, experts=8, scales="block")
    a, kw = fm.call_args(inp)
    plan = fm.build_routing_plan(inp["topk_ids"], num_experts=8, block_m=block_m, max_tokens=32)
    assert torch.equal(fm.fused_moe_emulation(*a, **kw, plan=plan), fm.fused_moe_emulation(*a, **kw))


def test_make_topk_ids_matches_sizes():
    ids, d = fm.make_topk_ids(100, mode="tp1ep8", rank=7)
    assert ids.shape == (100, 8) and ids.dtype == torch.int32 and d["expert_offset"] == 7 * 24
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # top-k without replacement
    hit = fm.experts_hit(ids, num_experts=24, expert_offset=168)
    assert abs(hit - fm.expected_experts_hit(100, experts_total=192, experts_local=24, topk=8)) <= 3


@pytest.mark.parametrize("scales", fm.SCALE_MODES)
def test_fp8_input_reference_isolates_the_activation_error(scales):
    inp = _inputs(32, scales=scales, hidden=512, experts=32)
    a, kw = fm.call_args(inp)
    emu = fm.fused_moe_emulation(*a, **kw)
    e_bf16 = fm.error_vs(emu, fm.fused_moe_ref(*a, **kw))
    e_fp8 = fm.error_vs(emu, fm.fused_moe_ref(*a, **kw, fp8_input=True))
    # x's rounding is ~half the error: what remains is the activation requant and the bf16 roundings
    assert e_fp8["rel_l2_err"] < 0.75 * e_bf16["rel_l2_err"] and e_fp8["cosine"] > 0.9993


# ---- the ws gate-up's split-K: CPU model of the per-CTA (item, K stage) load ----

def _hy3_ws_plan(batch):
    ids, _ = fm.make_topk_ids(batch, model="hy3", mode="tp8ep1", seed=batch)
    avg = batch * 8 / 192
    bm = next(b for b in (16, 32, 64, 128) if avg + 2 * avg ** 0.5 + 1 <= b)  # choose_block_m's rule (wgmma*)
    return fm.build_routing_plan(ids, num_experts=192, block_m=bm)


@pytest.mark.parametrize("items", [0, 1, 24, 87, 90, 131, 132, 133, 264, 276, 546, 576, 5000])
@pytest.mark.parametrize("kt", [2, 3, 32, 56])
def test_ws_split_factor_rule(items, kt):
    """The factor keeps >= 2 stages per range, no empty range, fits the partial slots, never models worse than no
    split, and is the smallest S of the best modeled cost."""
    grid, cap = 132, fm.ws_split_units(16)
    s, kps = fm.ws_split_factor(items, grid, kt, cap)
    assert 1 <= s <= fm.WS_MAX_SPLIT and fm.cdiv(kt, kps) == s and items * s <= max(cap, items)
    if s > 1:
        assert kps >= 2

    def cost(s_, kps_):
        return fm.cdiv(items * s_, grid) * (kps_ + fm.WS_SPLIT_UNIT_COST)
    legal = [(t, fm.cdiv(kt, t)) for t in range(1, 9)
             if t == 1 or (fm.cdiv(kt, t) >= 2 and fm.cdiv(kt, fm.cdiv(kt, t)) == t and items * t <= cap)]
    best = min(cost(*x) for x in legal) if items else cost(1, kt)
    assert cost(s, kps) == best and s == min(t for t, k in legal if cost(t, k) == best)
    if items == 264 and kt == 32:
        assert s == 1, "whole rounds of the grid: nothing to balance"
    if kt == 2:
        assert s == 1, "a K of 2 stages (the down GEMM at Hy3) never splits"


@pytest.mark.parametrize("split", [1, 2, 3, 4, 5, 8])
def test_ws_unit_load_covers_every_stage_once(split):
    kt, items, grid = 32, 90, 132
    r = fm.ws_unit_load(items, grid, kt, split)
    assert r["stages"].sum() == items * kt and r["units"].sum() == items * split
    assert r["cost"].max() >= r["cost"].mean() > 0 and 0 < r["balance"] <= 1
    with pytest.raises(ValueError, match="kps"):
        fm.ws_unit_load(items, grid, kt, 3, kps=8)
    with pytest.raises(ValueError):
        fm.ws_unit_load(items, 0, kt)
    with pytest.raises(ValueError, match="block_m"):
        fm.ws_split_units(8)


# Hy3 TP8 (E=192, top-8, H=4096, I=192): busiest CTA's modeled cost (K stages + a stage per unit end) no split -> split
# and the balance (mean / max) before and after, on the seeded routings (expected ~: batch 4: 33 -> 27, balance
# 0.68 -> 0.91; 16: 99 -> 81, 0.70 -> 0.93; 64: 165 -> 153, 0.83 -> 0.92; 256: 165 -> 153, 0.87 -> 0.97).
@pytest.mark.parametrize("batch,max_before,min_after", [(4, 0.72, 0.88), (16, 0.75, 0.9), (64, 0.86, 0.9),
                                                         (256, 0.9, 0.95)])
def test_ws_gate_up_split_balances_hy3(batch, max_before, min_after):
    p = _hy3_ws_plan(batch)
    before = fm.ws_gate_up_load(p, hidden=4096, inter=192, split=False)
    after = fm.ws_gate_up_load(p, hidden=4096, inter=192)
    items = p.num_tiles * 3
    assert before["grid"] == after["grid"] == 132 and before["items"] == after["items"] == items
    assert before["split"] == 1 and after["split"] > 1
    assert before["stages"].sum() == after["stages"].sum() == items * 32  # the same weight bytes, redistributed
    assert before["balance"] <= max_before, f"batch {batch}: no imbalance to fix? {before['balance']:.2f}"
    assert after["balance"] >= min_after, f"batch {batch}: split balance {after['balance']:.2f}"
    assert after["cost"].max() < before["cost"].max()
    assert after["stages"].max() < before["stages"].max()  # the busiest CTA streams fewer weight bytes


def test_ws_gate_up_load_no_split_from_whole_rounds():
    """Past the decode sizes (Hy3 batch 1024, block_m 64: 576 items, 1152 units > the 1024 partial slots) the launch
    keeps S = 1."""
    ids, _ = fm.make_topk_ids(1024, model="hy3", mode="tp8ep1", seed=1)
    p = fm.build_routing_plan(ids, num_experts=192, block_m=64)
    assert fm.ws_gate_up_load(p, hidden=4096, inter=192)["split"] == 1


# (items, grid, K stages, partial slots) -> (S, K stages per range), worked by hand from the modeled busiest-CTA cost
# ceil(items S / grid) x (kps + 1): also what splitk.cuh's splitk_factor_rounds answers (the same integers).
WS_SPLIT_CASES = [
    ((90, 132, 32, 4096), (4, 8)),    # S=1 33, S=2 34, S=3 36, S=4 27, S=5 32, S=6 35, S=7 30, S=8 30
    ((282, 132, 32, 4096), (4, 8)),   # 99, 85, 84, 81, 88, 91, 90, 90
    ((264, 132, 32, 4096), (1, 32)),  # two whole rounds: 66 against 68 at S=2
    ((34, 132, 32, 4096), (3, 11)),   # S=3 (1 round x 12) ties S=7 (2 x 6): the smaller S
    ((67, 132, 32, 4096), (3, 11)),   # S=3, 5, 7 tie at 24
    ((1, 2, 32, 4096), (2, 16)),      # 33, 17, 24, 18, ...
    ((2048, 132, 32, 4096), (1, 32)),  # S=2 fits the slots exactly but models worse (544 > 528)
    ((2049, 132, 32, 4096), (1, 32)),  # S=2 would need 4098 partial slots
    ((5, 132, 3, 4096), (2, 2)),      # ranges of 2 + 1 stages; S=3 would leave 1-stage ranges
    ((5, 132, 1, 4096), (1, 1)),      # one stage: nothing to cut
    ((0, 132, 32, 4096), (1, 32)),    # no items
    ((90, 0, 32, 4096), (1, 32)),     # no grid
]


@pytest.mark.parametrize("args,want", WS_SPLIT_CASES)
def test_ws_split_factor_hand_cases(args, want):
    assert fm.ws_split_factor(*args) == want


def test_ws_split_constants_match_the_kernel_sources():
    """The CPU model's constants are the kernels' (splitk.cuh, expert_wgmma.cu's WsTraits): a change on one side
    alone would make MoEPlan.split_factors and the model disagree only on a GPU."""
    import re
    from pathlib import Path

    src = Path(fm.__file__).resolve().parents[1] / "kernels" / "fused_moe"
    sk = (src / "splitk.cuh").read_text()
    wg = (src / "expert_wgmma.cu").read_text()
    assert int(re.search(r"constexpr int kMaxSplit = (\d+);", sk).group(1)) == fm.WS_MAX_SPLIT
    assert int(re.search(r"constexpr int kSplitUnitCost = (\d+);", sk).group(1)) == fm.WS_SPLIT_UNIT_COST
    units = re.search(r"SPLIT_UNITS = (\d+) \* (\d+) / BM;", wg)
    for bm in (16, 32, 64, 128):
        assert int(units.group(1)) * int(units.group(2)) // bm == fm.ws_split_units(bm)
    assert int(re.search(r"bool SPLIT = BM <= (\d+);", wg).group(1)) == fm.WS_SPLIT_MAX_BLOCK_M
    assert re.search(r"constexpr int kWgBK = (\d+);", wg).group(1) == str(fm.WS_STAGE_K)


def test_ws_gate_up_load_never_splits_block_m_128():
    """WsTraits<128>::SPLIT is false (the kernel ignores the workspace there): the model must not split either,
    although the rule alone would at these few items."""
    ids, _ = fm.make_topk_ids(4, model="hy3", mode="tp8ep1", seed=4)
    p = fm.build_routing_plan(ids, num_experts=192, block_m=128)
    r = fm.ws_gate_up_load(p, hidden=4096, inter=192)
    assert fm.ws_split_factor(r["items"], r["grid"], 32, fm.ws_split_units(128))[0] > 1
    assert r["split"] == 1 and r["units"].sum() == r["items"]
