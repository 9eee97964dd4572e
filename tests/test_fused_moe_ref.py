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


@pytest.mark.parametrize("units,kt,ctas,split", [(90, 32, 264, True), (282, 32, 264, True), (24, 32, 264, True),
                                                  (3008, 2, 132, False), (1, 32, 264, True), (0, 32, 132, True),
                                                  (540, 32, 132, True), (5, 12, 264, False)])
def test_step_ranges_partition_the_steps(units, kt, ctas, split):
    """The warp-specialized GEMM's split (host mirror): the ranges tile [0, units x K stages) in CTA order with no
    gap or overlap; with cuts every busy CTA gets at least min_steps and the busy CTAs' shares differ by at most
    one step; without cuts every range starts and ends on a unit boundary; each cut unit has exactly one finisher
    (the CTA holding its first step, before its writers) and no CTA writes more than one partial."""
    r = fm.step_ranges(units, kt, ctas, split=split)
    busy = r[r[:, 1] > r[:, 0]]
    total = units * kt
    assert r.shape == (ctas, 2)
    if total == 0:
        assert len(busy) == 0
        return
    assert busy[0, 0] == 0 and busy[-1, 1] == total and (busy[1:, 0] == busy[:-1, 1]).all()
    sizes = busy[:, 1] - busy[:, 0]
    if split:
        assert sizes.max() - sizes.min() <= 1
        assert sizes.min() >= min(8, total)
    else:
        assert (busy % kt == 0).all()
    cuts = fm.cut_units(r, kt)
    writers = [c for ctas_ in cuts.values() for c in ctas_[1:]]
    assert len(writers) == len(set(writers)), "a CTA writes at most one partial"
    for unit, (fin, *ws) in cuts.items():
        first = unit * kt
        assert r[fin, 0] <= first < r[fin, 1] and all(fin < w for w in ws)
        assert all(first < r[w, 0] < first + kt for w in ws)
    if not split:
        assert cuts == {}


def test_step_ranges_balance_the_gate_up_at_decode_batches():
    """Hy3 TP8 batch 16 (~94 experts hit, 3 gate-up units of 32 stages each; two CTAs per SM of 132): whole units
    give some CTAs 2 units and others 1 (the longest CTA streams 2x the mean's bytes); cut ranges give each CTA 34
    or 35 stages."""
    whole = fm.step_ranges(282, 32, 264, split=False)
    cut = fm.step_ranges(282, 32, 264, split=True)
    w_sizes, c_sizes = whole[:, 1] - whole[:, 0], cut[:, 1] - cut[:, 0]
    assert w_sizes.max() == 64 and c_sizes.max() == 35 and c_sizes.min() == 34
    with pytest.raises(ValueError):
        fm.step_ranges(4, 0, 132, split=True)


def test_e4m3_steps_counts_roundings():
    """One e4m3 rounding apart is 1 step (normal and subnormal), equal values 0, two roundings 2; the distance is
    in the expected value's binade."""
    f8 = fm.FP8_DTYPE
    exp = torch.tensor([1.0, 1.0, -3.0, 2.0 ** -8, 448.0, 0.0, 1.0]).to(f8)
    got = torch.tensor([1.125, 1.0, -3.25, 2.0 ** -9, 416.0, 2.0 ** -9, 1.25]).to(f8)
    assert fm.e4m3_steps(got, exp).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0]
    # every adjacent pair of positive e4m3 values is at most one step apart, measured from either side
    vals = torch.arange(1, 127, dtype=torch.uint8).view(f8).float()  # 2**-9 .. 448, ascending
    assert (vals[1:] > vals[:-1]).all()
    up = fm.e4m3_steps(vals[1:], vals[:-1])
    assert torch.allclose(up, torch.ones_like(up))
    assert (fm.e4m3_steps(vals[:-1], vals[1:]) <= 1.0).all()
