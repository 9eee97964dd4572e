"""Fuzzing the fused FP8 MoE: routings with duplicate ids, -1 slots, everything on one expert, empty experts, an
expert offset (EP ranks), per-tensor and block scales, intermediate sizes incl. 192, small hidden sizes.

``check_cpu``: the host routing plan's invariants (every valid (token, slot) placed once, contiguous expert
ranges, stable order within an expert, tiles covering each range once), the plan-driven emulation equal to the
per-token loop bit for bit, and the emulation vs the exact reference within the tolerance row. ``fuzz_run`` on an
SM90 GPU: the route kernel's workspace equal to the host plan byte for byte, then the expert layer on guarded,
poisoned buffers (workspace, act, ybuf, out) checked stage by stage, each stage against the contract fed the
kernel's own previous stage (``stage_errors``): a difference of FP32 summation order is then checked where it
arises, at the bf16 act, instead of through the FP8 requant that turns a flipped act rounding into an e4m3 step.

The reference module (hotpaths.reference.fused_moe) is imported lazily: without it ``check_cpu`` raises
ModuleNotFoundError naming it.
"""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import torch

from hotpaths.harness.check import check
from hotpaths.harness.fuzzing import Draw, GuardedBuffers, unchanged

OP = "fused_moe"
ROUTINGS = ("random", "one_expert", "hot_expert", "duplicates", "skip", "half_experts", "drawn")
# The staged checks' counts (stage_failures; measured on an H100, seeds 15 and 0 of the GPU sweep, 549 cases with
# valid pairs: aq bytes off quant(kernel act) 0, aq bytes off the emulation's 0.31-2.6% of the act elements, mean
# 0.7%, end to end rel_l2 <= 1.2e-2 from 8192 act elements and up to 2.35e-2 below).
AQ_MISMATCH = 1e-4     # quant bytes of the kernel's act allowed to differ from the contract's (one e4m3 step each)
AQ_FLIPS_MAX = 0.05    # aq bytes allowed to differ from the emulation's (act roundings the requant made a step) ...
AQ_FLIPS_MIN_ELEMS = 1024  # ... asserted from this many act elements (below, a few flips are the whole fraction)
E2E_MIN_ELEMS = 8192   # act elements (valid pairs x I) from which the end-to-end row is asserted as well


def _ref():
    return importlib.import_module("hotpaths.reference.fused_moe")


def unavailable_reason() -> str | None:
    """Why this op cannot be fuzzed in this checkout (its reference module is missing), or None."""
    if importlib.util.find_spec("hotpaths.reference.fused_moe") is None:
        return "hotpaths.reference.fused_moe (the MoE reference) is not in this checkout"
    return None


def fuzz_case(draw: Draw, *, kernel: bool = False) -> dict:
    """experts 1-16 (tp8ep1: all local) or 8 ranks of 1-4 (tp1ep8: an expert offset), top-k up to 8, hidden
    64-256 (CPU) / up to 1024 (GPU), intermediate per rank 64-256 incl. 192, tokens incl. 0/1 and block_m
    boundaries; routing "drawn" = ids drawn one by one from [-1, experts_total) (duplicates and -1 included)."""
    mode = draw.choice(("tp8ep1", "tp1ep8"))
    local = draw.integer(1, 16) if mode == "tp8ep1" else draw.integer(1, 4)
    total = local * (8 if mode == "tp1ep8" else 1)
    topk = draw.integer(1, min(8, total))
    tokens = draw.choice((0, 1, 2, 7, 8, 15, 16, 17, 32, 33)) if draw.boolean() else draw.integer(0, 300 if kernel
                                                                                                   else 40)
    cfg = dict(tokens=tokens, mode=mode, experts=total, topk=topk, rank=draw.integer(0, 7) if mode == "tp1ep8" else 0,
               hidden=64 * draw.integer(1, 16 if kernel else 4), inter=draw.choice((64, 128, 192, 256)),
               scales=draw.choice(("pertensor", "block")), routing=draw.choice(ROUTINGS),
               block_m=draw.choice((8, 16, 32, 64)), spare_tokens=draw.integer(0, 5), seed=draw.integer(0, 2**16))
    if cfg["routing"] == "drawn":
        cfg["ids"] = [[draw.integer(-1, total - 1) for _ in range(topk)] for _ in range(tokens)]
    if kernel:
        cfg["kernel"] = True
    return cfg


def make_inputs(cfg: dict) -> dict:
    """make_moe_inputs for the config (inter is per rank: the whole model's is 8x in tp8ep1), with the drawn ids
    swapped in for routing "drawn"."""
    fm = _ref()
    whole_inter = cfg["inter"] * (8 if cfg["mode"] == "tp8ep1" else 1)
    inp = fm.make_moe_inputs(cfg["tokens"], mode=cfg["mode"], experts=cfg["experts"], topk=cfg["topk"],
                             hidden=cfg["hidden"], inter=whole_inter, scales=cfg["scales"], seed=cfg["seed"],
                             routing="random" if cfg["routing"] == "drawn" else cfg["routing"], rank=cfg["rank"])
    if cfg["routing"] == "drawn":
        inp["topk_ids"] = torch.tensor(cfg["ids"], dtype=torch.int32).reshape(cfg["tokens"], cfg["topk"])
        if cfg["scales"] == "pertensor":  # the static a2_scale was calibrated on the generator's routing: redo it
            inp["a2_scale"] = _a2_scale(inp)
    return inp


def _a2_scale(inp: dict) -> torch.Tensor:
    """amax(silu(g) * u) over the local pairs of inp's routing / FP8_MAX, as make_moe_inputs calibrates it."""
    fm = _ref()
    e, off, i = inp["num_experts"], inp["expert_offset"], inp["inter"]
    loc = inp["topk_ids"].long() - off
    amax = torch.zeros(())
    for ex in torch.unique(loc[(loc >= 0) & (loc < e)]).tolist():
        tok = torch.nonzero((loc == ex).any(dim=1)).flatten()
        w = fm.dequant_weight(inp["w13"][ex], inp["w13_scale"][ex].reshape(()), dtype=torch.float32)
        amax = torch.maximum(amax, fm.silu_mul(inp["x"][tok].float() @ w.T, i).float().abs().amax())
    return (torch.clamp(amax, min=fm.GROUP_EPS) / fm.FP8_MAX).reshape(1).float()


def plan_failures(ids: np.ndarray, plan, num_experts: int, expert_offset: int) -> list[str]:
    """The plan's invariants, checked independently of the reference's own check_plan (which runs too)."""
    fm = _ref()
    bad = [f"check_plan: {b}" for b in fm.check_plan(plan, ids)]
    loc = ids.reshape(-1).astype(np.int64) - expert_offset
    valid = np.nonzero((loc >= 0) & (loc < num_experts))[0]
    nv = plan.num_valid
    placed = plan.sorted_pairs[:nv].astype(np.int64)
    if nv != len(valid) or not np.array_equal(np.sort(placed), valid):
        bad.append(f"placed pairs are not the {len(valid)} valid (token, slot) pairs once each")
        return bad
    offs = plan.expert_offsets.astype(np.int64)
    for e in range(num_experts):
        seg = placed[offs[e]:offs[e + 1]]
        if len(seg) != int((loc[valid] == e).sum()) or (len(seg) and ((loc[seg] != e).any()
                                                                       or (np.diff(seg) <= 0).any())):
            bad.append(f"expert {e}: its range is not exactly its pairs in increasing (stable) order")
            break
    return bad


def check_cpu(cfg: dict) -> dict:
    """Host plan invariants, the plan-driven emulation equal to the per-token loop bit for bit, output finite, and
    the emulation vs exact within ``<scales>_vs_exact``. Returns {failures: [str], path}. Raises ModuleNotFoundError
    without the reference module."""
    fm = _ref()
    inp = make_inputs(cfg)
    args, kw = fm.call_args(inp)
    e, off = inp["num_experts"], inp["expert_offset"]
    ids = inp["topk_ids"].numpy()
    plan = fm.build_routing_plan(inp["topk_ids"], num_experts=e, expert_offset=off,
                                 max_tokens=cfg["tokens"] + cfg["spare_tokens"], block_m=cfg["block_m"])
    fails = plan_failures(ids, plan, e, off)
    emu = fm.fused_moe_emulation(*args, **kw, plan=plan)
    loop = fm.fused_moe_loop(*args, **kw)
    if not torch.equal(emu, loop):
        d = (emu.double() - loop.double()).abs()
        fails.append(f"plan-driven emulation != per-token loop ({int((d > 0).sum())} elements, "
                     f"max {float(d.max()):.3g})")
    if not torch.isfinite(emu).all():
        fails.append("emulation output not finite")
    exact = fm.fused_moe_ref(*args, **kw)
    if cfg["tokens"] and float(exact.norm()) > 0:
        path = f"{cfg['scales']}_vs_exact"
        res = check(emu, exact, op=OP, path=path)
        if not res.passed:
            fails.append(f"emulation vs exact ({path}): {res}")
    return {"failures": fails, "path": "cpu plan + emulation vs loop and exact"}


def fuzz_run(cfg: dict) -> dict:
    """On an SM90 GPU (cfg drawn with kernel=True): route kernel workspace equal to the host plan, then the layer
    on guarded, poisoned buffers, stage by stage (``stage_errors``, ``stage_failures``). Elsewhere: ``check_cpu``.
    Returns {failures: [str], path, metrics} (metrics on the GPU path only)."""
    from hotpaths.reference.common import sm90_skip_reason

    if not cfg.get("kernel") or sm90_skip_reason() is not None:
        return check_cpu(cfg)
    from hotpaths.kernels import fused_moe as K

    fm = _ref()
    dev = torch.device("cuda")
    inp = make_inputs(cfg)
    g = GuardedBuffers()
    d = {k: (g.adopt(k, v.to(dev)) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    e, off, T, H, inter = inp["num_experts"], inp["expert_offset"], cfg["tokens"], cfg["hidden"], cfg["inter"]
    max_tokens = T + cfg["spare_tokens"]
    p = K.plan(d["topk_ids"], num_experts=e, expert_offset=off, max_tokens=max(max_tokens, 1),
               block_m=cfg["block_m"], gemm=cfg.get("gemm"))  # gemm: a forced GEMM path (sanitizer cases)
    p.workspace = g.alloc("workspace", tuple(p.workspace.shape), torch.int32, dev, fill=-7)
    mp = max(p.max_pairs, 1)
    p._bufs[(H, inter)] = (g.alloc("act", (mp, inter), torch.bfloat16, dev, fill=float("nan")),
                           g.alloc("ybuf", (mp, H), torch.bfloat16, dev, fill=float("nan")))
    p.update(d["topk_ids"])
    before = {n: d[n].clone() for n in ("x", "topk_ids", "topk_weights", "w13", "w2")}
    out = g.alloc("out", (T, H), torch.bfloat16, dev, fill=float("nan"))
    K.run(p, d["x"], d["w13"], d["w2"], d["topk_weights"], scales=cfg["scales"], w13_scale=d["w13_scale"],
          w2_scale=d["w2_scale"], a1_scale=d["a1_scale"], a2_scale=d["a2_scale"], shared_out=d["shared_out"],
          out=out)
    torch.cuda.synchronize()
    fails = g.violations()
    for n, t in before.items():
        fails += unchanged(t, d[n], name=n)
    host = fm.build_routing_plan(inp["topk_ids"], num_experts=e, expert_offset=off, max_tokens=max(max_tokens, 1),
                                 block_m=cfg["block_m"])
    got = p.workspace.cpu().numpy()
    if not np.array_equal(got, host.workspace):
        fails.append(f"route kernel workspace != host plan at {int((got != host.workspace).sum())} int32 entries")
    args, kw = fm.call_args(inp)
    st = fm.fused_moe_emulation(*args, **kw, return_stages=True)
    act, ybuf = (t.cpu() for t in p._bufs[(H, inter)])
    aq, asc = (t.cpu() for t in p.quant_buffers(H, inter)[2:])
    m = stage_errors(inp, host, st, act, aq, asc, ybuf, out.cpu())
    if T:
        fails += stage_failures(m, cfg["scales"])
    return {"failures": fails, "path": f"kernel block_m {cfg['block_m']} staged", "metrics": m}


def _down_from(aq8: torch.Tensor, a_sc: torch.Tensor, inp: dict, plan, scales: str) -> torch.Tensor:
    """The contract's down GEMM on given FP8 activations (by sorted position [nvalid, I]): ybuf bf16 [T*K, H] by
    pair, rows of pairs not placed 0."""
    fm = _ref()
    sp = torch.from_numpy(plan.sorted_pairs[:plan.num_valid].astype(np.int64))
    y = fm.grouped_scaled_gemm(aq8, a_sc, inp["w2"], inp["w2_scale"], scales, plan.expert_counts)
    ybuf = torch.zeros(inp["topk_ids"].numel(), inp["hidden"], dtype=torch.bfloat16)
    ybuf[sp] = y.to(torch.bfloat16)
    return ybuf


def stage_errors(inp: dict, plan, st: dict, act, aq, asc, ybuf, out) -> dict:
    """The layer stage by stage against the contract, each stage fed the kernel's own previous stage, so no
    difference is amplified by a later rounding (all CPU tensors):
    act_*: gate-up act (bf16, by sorted position) vs the emulation's: the only place the two FP32 summation orders
    differ before the FP8 requant; aq_*: aq bytes vs quant(kernel act) (quant bytes that differ, and by how many
    e4m3 steps at most); down_*: kernel ybuf vs the contract's down GEMM on the kernel's aq; reduce_bits: kernel out
    vs the contract's combine of the kernel's ybuf, elements that differ (0: bit-exact); e2e_*: out vs the end-to-end
    emulation; aq_flips: fraction of aq bytes that differ from the emulation's (the act roundings the FP8 requant
    turned into an e4m3 step, which is what the end-to-end error is made of); act_elems: nvalid x I."""
    fm = _ref()
    scales, nv, i = inp["scales"], plan.num_valid, inp["inter"]
    sp = torch.from_numpy(plan.sorted_pairs[:nv].astype(np.int64))
    ka = act[:nv]
    m = {"act_elems": nv * i, "act_nan": int(torch.isnan(ka.float()).sum())}
    m["act_rel_l2"], m["act_cosine"] = _errors(ka, st["act"][sp])
    if scales == "pertensor":
        eq, m["scale_mismatch"] = fm.quant_fp8(ka, inp["a2_scale"].float().reshape(())), 0
    else:
        eq, es = fm.quant_groups(ka)
        m["scale_mismatch"] = int((asc[:nv] != es).sum())
    got8, exp8 = aq[:nv].view(fm.FP8_DTYPE).float(), eq.float()
    diff = got8 != exp8
    steps = float(fm.e4m3_steps(got8[diff], exp8[diff]).max()) if diff.any() else 0.0
    m.update(aq_mismatch=int(diff.sum()), aq_max_steps=steps,
             aq_flips=float((got8 != st["aq"][sp].float()).float().mean()) if nv else 0.0)
    a_sc = inp["a2_scale"].float() if scales == "pertensor" else asc[:nv]
    yk = _down_from(aq[:nv].view(fm.FP8_DTYPE), a_sc, inp, plan, scales)
    vp = torch.sort(sp).values
    m["down_rel_l2"], m["down_cosine"] = _errors(ybuf[vp], yk[vp])
    yk[vp] = ybuf[vp]  # the kernel's ybuf on the placed pairs, zeros elsewhere: what the combine reads
    red = fm.weighted_reduce(yk, inp["topk_ids"], inp["topk_weights"], inp["expert_offset"], inp["num_experts"],
                             inp["shared_out"])
    m["reduce_bits"] = int((red.view(torch.int16) != out.view(torch.int16)).sum())
    m["e2e_rel_l2"], m["e2e_cosine"] = _errors(out, st["out"])
    m["out_nan"] = int(torch.isnan(out.float()).sum())
    return m


def _errors(got: torch.Tensor, exp: torch.Tensor) -> tuple[float, float]:
    """(rel_l2, cosine) of got vs exp; (0, 1) where exp is empty or all zero (nothing to compare against)."""
    if not exp.numel() or float(exp.float().norm()) == 0:
        return 0.0, 1.0
    r = check(got, exp)
    return r.rel_l2_err, r.cosine


def stage_failures(m: dict, scales: str) -> list[str]:
    """The stage checks of ``stage_errors``' metrics against the tolerance rows ``act_vs_emulation``,
    ``<scales>_down_vs_emulation`` (aq: at most one e4m3 step on at most AQ_MISMATCH of the bytes, and at most
    AQ_FLIPS_MAX of them off the emulation's from AQ_FLIPS_MIN_ELEMS act elements; reduce: bit-exact) and, where the
    act sample is large enough for the statistics the row was measured on (E2E_MIN_ELEMS), ``<scales>_vs_emulation``
    end to end. A regression test of a small layer asserts the end-to-end metrics itself (e2e_rel_l2,
    e2e_cosine)."""
    from hotpaths.harness.tolerances import tolerance

    bad = []
    if m["act_nan"] or m["out_nan"]:
        bad.append(f"NaN left in act ({m['act_nan']}) or out ({m['out_nan']})")
    t = tolerance(OP, "act_vs_emulation")
    if m["act_rel_l2"] > t.rel_l2 or m["act_cosine"] < t.min_cosine:
        bad.append(f"gate-up act vs emulation: rel_l2 {m['act_rel_l2']:.3e}, cosine {m['act_cosine']:.6f} "
                   f"(limit {t.rel_l2:g}, {t.min_cosine})")
    if m["scale_mismatch"]:
        bad.append(f"act group scales: {m['scale_mismatch']} differ from the contract's amax * fp32(1/448)")
    if m["aq_max_steps"] > 1.0001 or m["aq_mismatch"] > max(1, AQ_MISMATCH * m["act_elems"]):
        bad.append(f"aq vs quant(kernel act): {m['aq_mismatch']} of {m['act_elems']} bytes differ, by up to "
                   f"{m['aq_max_steps']:.2f} e4m3 steps")
    if m["act_elems"] >= AQ_FLIPS_MIN_ELEMS and m["aq_flips"] > AQ_FLIPS_MAX:
        bad.append(f"aq vs the emulation's: {100 * m['aq_flips']:.2f}% of {m['act_elems']} bytes differ (limit "
                   f"{100 * AQ_FLIPS_MAX:g}%): more act roundings flipped than summation order alone explains")
    t = tolerance(OP, f"{scales}_down_vs_emulation")
    if m["down_rel_l2"] > t.rel_l2 or m["down_cosine"] < t.min_cosine:
        bad.append(f"down ybuf vs the contract on the kernel's aq: rel_l2 {m['down_rel_l2']:.3e}, cosine "
                   f"{m['down_cosine']:.6f} (limit {t.rel_l2:g}, {t.min_cosine})")
    if m["reduce_bits"]:
        bad.append(f"out vs the contract's combine of the kernel's ybuf: {m['reduce_bits']} elements differ")
    t = tolerance(OP, f"{scales}_vs_emulation")
    if m["act_elems"] >= E2E_MIN_ELEMS and (m["e2e_rel_l2"] > t.rel_l2 or m["e2e_cosine"] < t.min_cosine):
        bad.append(f"out vs end-to-end emulation: rel_l2 {m['e2e_rel_l2']:.3e}, cosine {m['e2e_cosine']:.6f} "
                   f"(limit {t.rel_l2:g}, {t.min_cosine}; {m['act_elems']} act elements)")
    return bad


SANITIZE_CASES = [
    dict(tokens=1, mode="tp8ep1", experts=16, topk=8, rank=0, hidden=256, inter=192, scales="block",
         routing="random", block_m=16, spare_tokens=0, seed=0, kernel=True),
    dict(tokens=32, mode="tp8ep1", experts=8, topk=4, rank=0, hidden=512, inter=192, scales="block",
         routing="duplicates", block_m=16, spare_tokens=3, seed=1, kernel=True),
    dict(tokens=33, mode="tp1ep8", experts=32, topk=8, rank=3, hidden=256, inter=128, scales="pertensor",
         routing="skip", block_m=32, spare_tokens=0, seed=2, kernel=True),
    dict(tokens=17, mode="tp8ep1", experts=4, topk=2, rank=0, hidden=128, inter=64, scales="pertensor",
         routing="one_expert", block_m=8, spare_tokens=1, seed=3, kernel=True),
    # 10 K stages per gate-up unit: the warp-specialized GEMM cuts units across CTAs (partials, flags, the finisher)
    dict(tokens=5, mode="tp8ep1", experts=16, topk=4, rank=0, hidden=1280, inter=128, scales="pertensor",
         routing="random", block_m=16, spare_tokens=0, seed=4, kernel=True),
    # the cp.async wgmma kernel (auto takes it from 64 pairs per expert): 128-row tiles of two warpgroups (~300 rows
    # per expert: partial last tiles), a ring refilled one stage behind the tensor cores and wrapped by the gate-up's
    # 16 K stages per item, down items of 2 K stages (I = 192), more down items than SMs (two per CTA on some)
    dict(tokens=600, mode="tp8ep1", experts=4, topk=2, rank=0, hidden=2048, inter=192, scales="pertensor",
         routing="random", block_m=128, spare_tokens=0, seed=5, kernel=True, gemm="wgmma"),
    dict(tokens=600, mode="tp8ep1", experts=4, topk=2, rank=0, hidden=2048, inter=192, scales="block",
         routing="random", block_m=128, spare_tokens=0, seed=6, kernel=True, gemm="wgmma"),
]
