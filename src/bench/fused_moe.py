"""Fused FP8 MoE tables (fused_moe_tp8_ep1, fused_moe_tp1_ep8, fused_moe_models), the stage breakdown, and the
``hotpaths moe`` command.

On an SM90 GPU our kernel (hotpaths.kernels.fused_moe, imported lazily) and each peer (hotpaths.bench.
fused_moe_peers) run on the same inputs: output NaN-poisoned, checked against the exact fp64 reference and the
staged emulation, then timed with hotpaths.harness.bench.bench (CUDA-graph replay, L2 flushed before each replay);
the read probe times reading the weights hit once after the same flush. Without one (or when the kernel does not
build or load), every impl runs its CPU emulation instead (impl ``<impl>_emulation``, no timing, error columns
filled), so the correctness half of every table is still produced.
"""

from __future__ import annotations

import os
import sys

OP = "fused_moe"
IMPLS = ("fused", "hpc_ops", "torch_grouped_mm_bf16", "torch_scaled_grouped_mm_fp8", "triton_fused_moe",
         "flashinfer_cutlass", "fused_mma", "fused_wgmma", "fused_wgmma_ws", "fused_mma_tma")
# our kernel under each GEMM path: "fused" lets the plan choose (gemm=None: $HOTPATHS_MOE_GEMM or auto); the others
# force one path on the same inputs, so one run A/Bs them (checked like "fused": vs exact and vs emulation)
FUSED_GEMM = {"fused": None, "fused_mma": "mma", "fused_wgmma": "wgmma", "fused_wgmma_ws": "wgmma_ws",
              "fused_mma_tma": "mma_tma"}
DEFAULT_IMPLS = "fused,hpc_ops,triton_fused_moe,torch_grouped_mm_bf16"
STAGES = ("route", "gate_up", "down", "reduce", "all", "all_no_pdl")
# published H20 column of data/reported/moe_hy3_*_h20.csv per impl ("fused" is the published HPC-Ops design)
PUBLISHED_COLUMN = {"fused": "hpc_ops_us", "hpc_ops": "hpc_ops_us", "triton_fused_moe": "triton_us",
                    "flashinfer_cutlass": "cutlass_us"}
PUBLISHED_COSINE, PUBLISHED_MAX_REL_ERR = 0.99974, 0.024  # the published accuracy of the fused MoE (vs exact)
PUBLISHED_TABLE = {"tp8ep1": "moe_hy3_tp8_ep1_h20", "tp1ep8": "moe_hy3_tp1_ep8_h20"}
EXTRA_COLUMNS = ["batch", "mode", "scales", "model", "experts_hit", "weight_bytes", "read_probe_us",
                 "pct_of_read_probe", "tflops"] + [f"vs_{p}" for p in IMPLS[1:]]


def parse_impls(spec: str) -> list[str]:
    """``"fused,hpc_ops"`` -> ["fused", "hpc_ops"]; raises ValueError naming unknown impls."""
    impls = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls:
        raise ValueError(f"--impl: unknown {bad or spec!r}; expected a comma-separated subset of {', '.join(IMPLS)}")
    return list(dict.fromkeys(impls))


def kernel_module():
    """(hotpaths.kernels.fused_moe, None) on an SM90 GPU where it imports and exposes plan/run, else (None, why)."""
    from hotpaths.harness.env import sm90_skip_reason

    why = sm90_skip_reason()
    if why is not None:
        return None, why
    try:
        from hotpaths.kernels import fused_moe as km
    except Exception as e:  # a build or load failure becomes the rows' reason, not a crash
        return None, f"hotpaths.kernels.fused_moe did not load: {type(e).__name__}: {str(e)[:300]}"
    if not all(hasattr(km, n) for n in ("plan", "run")):
        return None, "hotpaths.kernels.fused_moe has no plan()/run() yet"
    return km, None


def _published(mode: str, model: str, batch: int) -> dict:
    """{impl column: us} of the published H20 table for Hy3 at this batch (empty elsewhere)."""
    if model != "hy3" or mode not in PUBLISHED_TABLE:
        return {}
    try:
        from hotpaths.harness.tables import published

        df = published(PUBLISHED_TABLE[mode])
    except (FileNotFoundError, ImportError):
        return {}
    row = df[df["batch"] == batch]
    return {} if row.empty else {c: float(row.iloc[0][c]) for c in ("hpc_ops_us", "triton_us", "cutlass_us")}


def _repro(model, mode, scales, batch, impl, over) -> str:
    flags = "".join(f" --{k} {v}" for k, v in over.items() if v is not None)
    return (f"python -m hotpaths moe --model {model} --mode {mode} --batch {batch} --scales {scales} "
            f"--impl {impl}{flags}")


def _fused_fn(km, inputs, out, gemm=None):
    p = km.plan(inputs["topk_ids"], num_experts=inputs["num_experts"], expert_offset=inputs["expert_offset"],
                gemm=gemm, experts_total=inputs["experts_total"], scales=inputs["scales"])
    kw = {k: inputs[k] for k in ("scales", "w13_scale", "w2_scale", "a1_scale", "a2_scale", "shared_out")}

    def fn(stages="all", pdl=True):
        return km.run(p, inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], out=out, stages=stages,
                      pdl=pdl, **kw)
    return fn


def moe_rows(batches, *, model: str = "hy3", mode: str = "tp8ep1", scales: str = "pertensor", impls=("fused",),
             experts=None, topk=None, hidden=None, inter=None, seed: int = 0, iters: int = 100, rank: int = 0,
             ceilings: dict | None = None, routing: str = "random") -> list[dict]:
    """One row per (batch, impl): tables.COLUMNS then EXTRA_COLUMNS and vs_emulation_cosine,
    vs_emulation_rel_l2, max_rel_err, cosine_vs_fp8x_ref, max_rel_err_vs_fp8x_ref, published_cosine,
    published_max_rel_err, passed, reason.

    Error columns (rel_l2_err, max_abs_err, cosine, max_rel_err) are vs the exact fp64 reference from the bf16 x;
    *_vs_fp8x_ref vs the same reference fed the FP8-quantized x (the form of the published figures: cosine 0.99974,
    max rel 0.024); vs_emulation_* vs the staged emulation. On the fused row vs_<peer> = peer median / fused median
    (speedup). ceilings:
    hotpaths.harness.ceilings.measure() output for pct_of_ceiling (copy bandwidth), or None.
    Raises ValueError on unknown impls or sizes (hotpaths.reference.fused_moe.model_dims).
    """
    import torch

    from hotpaths.bench import fused_moe_peers as peers
    from hotpaths.harness import bench as hb
    from hotpaths.harness.check import check
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id
    from hotpaths.harness.tables import COLUMNS
    from hotpaths.harness.tolerances import tolerance
    from hotpaths.reference import fused_moe as fm

    impls = parse_impls(",".join(impls)) if not isinstance(impls, str) else parse_impls(impls)
    fm.model_dims(model, mode, experts=experts, topk=topk, hidden=hidden, inter=inter)
    km, why = kernel_module()
    gpu = km is not None
    dev = "cuda" if gpu else "cpu"
    tag, rid = device_tag(), run_id()
    over = dict(experts=experts, topk=topk, hidden=hidden, inter=inter)
    rows = []
    for b in batches:
        inputs = fm.make_moe_inputs(b, model=model, mode=mode, scales=scales, seed=seed + b, device=dev,
                                    routing=routing, rank=rank, **over)
        a, kw = fm.call_args(inputs)
        c = fm.cost(inputs)
        ref = fm.fused_moe_ref(*a, **kw)
        ref8 = fm.fused_moe_ref(*a, **kw, fp8_input=True)  # the published metric's reference (FP8 x)
        emu = fm.fused_moe_emulation(*a, **kw)
        pub = _published(mode, model, b)
        probe = hb.read_probe(c["weight_bytes"]) if gpu and c["weight_bytes"] else None
        emu_cache = {}
        batch_rows = []
        for impl in impls:
            reason, timing, out = None, None, None
            label = impl
            if gpu:
                if impl in FUSED_GEMM:
                    buf = torch.full((b, inputs["hidden"]), float("nan"), dtype=torch.bfloat16, device=dev)
                    try:
                        f = _fused_fn(km, inputs, buf, FUSED_GEMM[impl])
                        out = f().clone()
                        torch.cuda.synchronize()
                        timing = hb.bench(lambda f=f: f(), iters=iters)
                    except Exception as e:
                        reason = f"failed: {type(e).__name__}: {str(e)[:300]}"
                else:
                    fn, reason = peers.try_make(impl, inputs)
                    if fn is not None:
                        try:
                            out = fn().clone()
                            torch.cuda.synchronize()
                        except Exception as e:
                            reason, out = f"failed: {type(e).__name__}: {str(e)[:300]}", None
                        if out is not None:
                            try:
                                timing = hb.bench(fn, iters=iters)
                            except Exception as e:  # not capturable: time it eagerly and say so
                                reason = f"timed eager (CPU launch included): graph capture failed: {type(e).__name__}"
                                try:
                                    torch.cuda.synchronize()
                                    timing = hb.bench(fn, iters=iters, graph=False)
                                except Exception as e2:
                                    reason = (f"failed: capture {type(e).__name__}, eager {type(e2).__name__}: "
                                              f"{e2}")[:400]
            else:
                label = f"{impl}_emulation"
                reason = why
                key = "bf16" if impl == "torch_grouped_mm_bf16" else "fp8"
                if key not in emu_cache:
                    emu_cache[key] = emu if key == "fp8" else peers.emulate(impl, inputs)
                out = emu_cache[key]
            row = dict.fromkeys(COLUMNS + EXTRA_COLUMNS)
            row.update({"op": OP, "case": f"{model}_{mode}_{scales}_b{b}", "impl": label,
                   "dtype": "bf16" if impl == "torch_grouped_mm_bf16" else f"fp8_{scales}", "device": tag,
                   "bytes": c["bytes"], "run_id": rid, "repro": _repro(model, mode, scales, b, impl, over),
                   "batch": b, "mode": mode, "scales": scales, "model": model, "experts_hit": c["experts_hit"],
                   "weight_bytes": c["weight_bytes"], "reason": reason})
            col = PUBLISHED_COLUMN.get(impl)
            row["published_h20_us"] = pub.get(col) if col else None
            for k_, v_ in pub.items():
                row[f"published_{k_.replace('_us', '')}_h20_us"] = v_
            if out is not None:
                ce = check(out, ref)
                ee = fm.error_vs(out, ref)
                cv = check(out, emu)
                e8 = fm.error_vs(out, ref8)
                row.update(rel_l2_err=ce.rel_l2_err, max_abs_err=ce.max_abs_err, cosine=ce.cosine,
                           max_rel_err=ee["max_rel_err"], vs_emulation_cosine=cv.cosine,
                           vs_emulation_rel_l2=cv.rel_l2_err, cosine_vs_fp8x_ref=e8["cosine"],
                           max_rel_err_vs_fp8x_ref=e8["max_rel_err"], published_cosine=PUBLISHED_COSINE,
                           published_max_rel_err=PUBLISHED_MAX_REL_ERR)
                if impl in FUSED_GEMM or not gpu:
                    ok = check(out, ref, tol=tolerance(OP, f"{scales}_vs_exact")).passed
                    if gpu and impl in FUSED_GEMM:
                        ok = ok and check(out, emu, tol=tolerance(OP, f"{scales}_vs_emulation")).passed
                    row["passed"] = bool(ok) if impl != "torch_grouped_mm_bf16" else None
            if timing is not None:
                med = timing.median_us
                row.update(median_us=med, p10_us=timing.p10_us, p90_us=timing.p90_us,
                           gbps=c["bytes"] / med / 1e3, tflops=c["flops"] / med / 1e6)
                row.update(hb.read_probe_columns(med, c["weight_bytes"], probe=probe))
                if ceilings and ceilings.get("copy_gbps"):
                    row["pct_of_ceiling"] = 100.0 * row["gbps"] / ceilings["copy_gbps"]
            batch_rows.append(row)
        fused = next((r for r in batch_rows if r["impl"] == "fused" and r.get("median_us")), None)
        if fused:
            for r in batch_rows:
                if r is not fused and r.get("median_us"):
                    fused[f"vs_{r['impl']}"] = r["median_us"] / fused["median_us"]
            for col in ("hpc_ops_us", "triton_us", "cutlass_us"):
                if col in pub:
                    fused[f"vs_published_{col.replace('_us', '')}_h20"] = pub[col] / fused["median_us"]
        rows += batch_rows
    return rows


def stage_rows(batches, *, model: str = "hy3", mode: str = "tp8ep1", scales: str = "pertensor", experts=None,
               topk=None, hidden=None, inter=None, seed: int = 0, iters: int = 100,
               impl: str = "fused") -> list[dict]:
    """Stage breakdown of our fused pipeline (impl: "fused" or a forced GEMM path of FUSED_GEMM, e.g.
    "fused_wgmma_ws"): route, gate_up (with the fused SiLU-and-mul + FP8 requant), down, reduce, each timed alone on a
    warm plan (its inputs left by a full run), then all stages with and without PDL; ``pdl_saves_us`` on the all
    row. Without SM90 (or the kernel) one row per stage with the reason and no timing. Columns: tables.COLUMNS +
    batch, mode, scales, model, stage, pdl_saves_us, reason."""
    import torch

    from hotpaths.harness import bench as hb
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id
    from hotpaths.reference import fused_moe as fm

    km, why = kernel_module()
    tag, rid = device_tag(), run_id()
    over = dict(experts=experts, topk=topk, hidden=hidden, inter=inter)
    rows = []
    for b in batches:
        base = {"op": OP, "case": f"{model}_{mode}_{scales}_b{b}", "impl": impl, "dtype": f"fp8_{scales}",
                "device": tag, "run_id": rid, "batch": b, "mode": mode, "scales": scales, "model": model,
                "repro": _repro(model, mode, scales, b, impl, over) + " --stages"}
        if km is None:
            rows += [dict(base, stage=s, reason=why) for s in STAGES]
            continue
        inputs = fm.make_moe_inputs(b, model=model, mode=mode, scales=scales, seed=seed + b, device="cuda", **over)
        out = torch.empty(b, inputs["hidden"], dtype=torch.bfloat16, device="cuda")
        f = _fused_fn(km, inputs, out, FUSED_GEMM[impl])
        f()
        torch.cuda.synchronize()
        times = {}
        for s in STAGES:
            st, pdl = ("all", False) if s == "all_no_pdl" else (s, True)
            t = hb.bench(lambda st=st, pdl=pdl, f=f: f(stages=st, pdl=pdl), iters=iters)
            times[s] = t.median_us
            rows.append(dict(base, stage=s, median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us))
        rows[-2]["pdl_saves_us"] = times["all_no_pdl"] - times["all"]
    return rows


# A/B of one plan or run knob of our kernel (``hotpaths moe --ab KNOB=V1,V2``): a choice among the kernel's own
# options is measured in one process, the variants alternated round by round so clock and thermal drift hit
# each alike, outputs compared bit for bit with the first variant's. A knob sets a plan()
# argument (gemm, route, block_m), a PDL edge over its rule (plan(pdl_edges=...): down_pdl, reduce_pdl) or an
# environment variable read when the layer is run and captured (reduce, act_quant).
AB_COLUMNS = ["batch", "mode", "scales", "model", "knob", "variant", "plan", "rounds_us", "bit_identical", "method",
              "reason"]
AB_KNOBS = {"gemm": "plan", "route": "plan", "block_m": "plan", "down_pdl": "edge", "reduce_pdl": "edge",
            "reduce": "env", "act_quant": "env"}


def parse_ab(spec: str) -> tuple[str, list[str]]:
    """``"reduce_pdl=on,off"`` -> ("reduce_pdl", ["on", "off"]); raises ValueError naming the knob or value that is
    not known (values: on/off for the PDL edges, the kernel's names for the others, tile rows for block_m)."""
    from hotpaths.kernels import fused_moe as km

    knob, sep, vals = spec.partition("=")
    knob = knob.strip()
    values = list(dict.fromkeys(v.strip() for v in vals.split(",") if v.strip()))
    if knob not in AB_KNOBS or not sep:
        raise ValueError(f"--ab: expected KNOB=V1,V2 with KNOB one of {sorted(AB_KNOBS)}, got {spec!r}")
    allowed = {"gemm": km.GEMMS, "route": km.ROUTES, "down_pdl": ("on", "off"), "reduce_pdl": ("on", "off"),
               "reduce": tuple(km.REDUCES), "act_quant": km.ACT_QUANTS,
               "block_m": tuple(str(b) for b in sorted(set(km.BLOCK_MS) | set(km.WGMMA_BLOCK_MS)))}[knob]
    bad = [v for v in values if v not in allowed]
    if bad or len(values) < 2:
        raise ValueError(f"--ab {knob}: expected 2 or more distinct values from {list(allowed)}, got {vals!r}")
    return knob, values


def ab_rows(batches, knob: str, values, *, model: str = "hy3", mode: str = "tp8ep1", scales: str = "pertensor",
            experts=None, topk=None, hidden=None, inter=None, seed: int = 0, iters: int = 100,
            rounds: int = 3) -> list[dict]:
    """One row per (batch, value of ``knob``): median_us = the median over ``rounds`` alternated rounds of each
    round's median, rounds_us the rounds, ``plan`` the GEMM path and tile rows the plan ran, ``bit_identical``
    whether its output equals the first value's (every knob here changes timing only). The first value's row also
    has vs_<value> = that value's median / its own. Without SM90 one row per value with the reason and no timing.
    Columns: tables.COLUMNS + batch, mode, scales, model, knob, variant, plan, rounds_us, bit_identical, reason."""
    import contextlib
    import statistics

    import torch

    from hotpaths.harness import bench as hb
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id
    from hotpaths.harness.tables import COLUMNS
    from hotpaths.reference import fused_moe as fm

    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    knob, values = parse_ab(f"{knob}={','.join(values)}")
    km, why = kernel_module()
    tag, rid = device_tag(), run_id()
    over = dict(experts=experts, topk=topk, hidden=hidden, inter=inter)
    from hotpaths.kernels import fused_moe as kmod  # the names only: imports without a GPU

    env_var = {"reduce": kmod.REDUCE_ENV, "act_quant": kmod.ACT_QUANT_ENV}.get(knob)

    @contextlib.contextmanager
    def knob_env(v):
        if env_var is None:
            yield
            return
        old = os.environ.get(env_var)
        os.environ[env_var] = v
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(env_var, None)
            else:
                os.environ[env_var] = old

    rows = []
    for b in batches:
        base = dict.fromkeys(COLUMNS + AB_COLUMNS)
        base.update({"op": OP, "case": f"{model}_{mode}_{scales}_b{b}", "impl": "fused", "dtype": f"fp8_{scales}",
                     "device": tag, "run_id": rid, "batch": b, "mode": mode, "scales": scales, "model": model,
                     "knob": knob, "repro": _repro(model, mode, scales, b, "fused", over) + f" --ab {knob}="
                     + ",".join(values)})
        if km is None:
            rows += [dict(base, variant=v, reason=why) for v in values]
            continue
        inputs = fm.make_moe_inputs(b, model=model, mode=mode, scales=scales, seed=seed + b, device="cuda", **over)
        kw = {k: inputs[k] for k in ("scales", "w13_scale", "w2_scale", "a1_scale", "a2_scale", "shared_out")}
        fns, outs, plans = {}, {}, {}
        for v in values:
            pkw = {}
            if AB_KNOBS[knob] == "plan":
                pkw[knob] = int(v) if knob == "block_m" else v
            elif AB_KNOBS[knob] == "edge":
                pkw["pdl_edges"] = {knob[:-len("_pdl")]: v == "on"}
            p = km.plan(inputs["topk_ids"], num_experts=inputs["num_experts"], expert_offset=inputs["expert_offset"],
                        experts_total=inputs["experts_total"], scales=inputs["scales"], **pkw)
            buf = torch.full((b, inputs["hidden"]), float("nan"), dtype=torch.bfloat16, device="cuda")

            def fn(p=p, buf=buf, inp=inputs):
                return km.run(p, inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], out=buf, **kw)
            with knob_env(v):
                outs[v] = fn().clone()
            torch.cuda.synchronize()
            fns[v], plans[v] = fn, f"{p.gemm}/bm{p.block_m}"
        times = {v: [] for v in values}
        for _ in range(rounds):
            for v in values:
                with knob_env(v):  # read while the graph is captured: the replays keep that launch
                    times[v].append(hb.bench(fns[v], iters=iters).median_us)
        first = values[0]
        batch_rows = []
        for v in values:
            med = statistics.median(times[v])
            batch_rows.append(dict(base, variant=v, plan=plans[v], median_us=med, p10_us=min(times[v]),
                                   p90_us=max(times[v]), rounds_us=" ".join(f"{t:.2f}" for t in times[v]),
                                   bit_identical=bool(torch.equal(outs[v].view(torch.int16),
                                                                  outs[first].view(torch.int16))),
                                   method=f"graph(events in graph)+cold_l2(write), {rounds} alternated rounds, "
                                          f"median of round medians (p10/p90: fastest/slowest round)"))
        for r in batch_rows[1:]:
            batch_rows[0][f"vs_{r['variant']}"] = r["median_us"] / batch_rows[0]["median_us"]
        rows += batch_rows
        del inputs, fns, outs
        torch.cuda.empty_cache()
    return rows


# Nsight Compute of one layer: the child builds the inputs and the plan as stage_rows does (plan.update launches the
# route kernels), then runs the layer once; ncu profiles every launch of our kernels (their mangled names start with
# the hp_moe namespace; torch's own reduce_kernel does not match), each alone after ncu's cache flush.
_NCU_SNIPPET = """
import torch
from hotpaths.kernels import fused_moe as km
from hotpaths.reference import fused_moe as fm
inputs = fm.make_moe_inputs({batch}, model={model!r}, mode={mode!r}, scales={scales!r}, seed={seed}, device="cuda")
out = torch.empty({batch}, inputs["hidden"], dtype=torch.bfloat16, device="cuda")
p = km.plan(inputs["topk_ids"], num_experts=inputs["num_experts"], expert_offset=inputs["expert_offset"],
            experts_total=inputs["experts_total"], scales=inputs["scales"])
kw = {{k: inputs[k] for k in ("scales", "w13_scale", "w2_scale", "a1_scale", "a2_scale", "shared_out")}}
km.run(p, inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], out=out, **kw)
torch.cuda.synchronize()
print("gemm", p.gemm, "block_m", p.block_m)
"""
NCU_KERNELS = "_ZN6hp_moe"  # regex on the mangled name: every kernel of the op
NCU_MAX_LAUNCHES = 12   # a layer launches 4-6 of them (route kernels, x quantization, two GEMMs, reduce)
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__warps_active.avg.pct_of_peak_sustained_active", "lts__t_sector_hit_rate.pct",
               "launch__registers_per_thread", "launch__grid_size", "launch__block_size")


def ncu_stage(kernel: str, gemm_seen: int) -> str:
    """The pipeline stage of a profiled kernel from its name as ncu reports it (``route_hist_kernel(const int *,
    ...)``, ``void quant_rows_kernel<0>(...)``); ``gemm_seen`` = expert GEMM launches before this one in the layer
    (the first is gate-up, the second down)."""
    if "route" in kernel:
        return "route"
    if "quant_rows" in kernel:
        return "quant_x"
    if "reduce" in kernel:
        return "reduce"
    if "expert_" in kernel:
        return "gate_up" if gemm_seen == 0 else "down"
    return "other"


def ncu_rows(batches=(64, 4096), *, model: str = "hy3", mode: str = "tp8ep1", scales: str = "pertensor",
             seed: int = 0, timeout_s: float = 300.0) -> list[dict]:
    """Table ``fused_moe_ncu``: Nsight Compute (``--clock-control none``, metric set NCU_METRICS) of every kernel of
    one layer per batch, planned as the benchmark plans ``fused`` (auto GEMM path, experts_total), each launch
    profiled alone after ncu's cache flush (so the plan look-ups and x come from DRAM, where in the pipeline the
    previous stage has just written them to L2). One row per launch: batch, stage, kernel (as ncu names it, cut at
    160 characters; the regex matches the mangled name), duration_us, dram_read_mb, dram_write_mb, dram_pct, sm_pct,
    occupancy_pct, l2_hit_pct, registers, grid, block; raw tables as profiles_dir()/fused_moe_ncu_b<batch>.csv.
    Where counters cannot be read (no GPU, no ncu, no permission) one row per batch says why in ``note`` (never
    raises)."""
    from hotpaths.harness import ncu
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id

    tag, rid = device_tag(), run_id()
    rows = []
    for b in batches:
        base = {"op": OP, "case": f"{model}_{mode}_{scales}_b{b}", "impl": "fused", "dtype": f"fp8_{scales}",
                "device": tag, "run_id": rid, "batch": b, "mode": mode, "scales": scales, "model": model}
        snippet = _NCU_SNIPPET.format(batch=int(b), model=model, mode=mode, scales=scales, seed=seed + int(b))
        df, why = ncu.profile_or_note(snippet, kernel_regex=NCU_KERNELS, metrics=NCU_METRICS,
                                      kernel_name_base="mangled", out_csv=f"fused_moe_ncu_b{b}",
                                      launch_count=NCU_MAX_LAUNCHES, timeout_s=timeout_s)
        if df is None:
            rows.append(dict(base, note=why))
            continue
        gemms = 0
        for launch, g in df.groupby("launch", sort=True):
            m = {r["metric"]: r["value"] for _, r in g.iterrows()}
            kernel = str(g["kernel"].iloc[0])
            stage = ncu_stage(kernel, gemms)
            gemms += stage in ("gate_up", "down")

            def num(key, scale=1.0):
                v = m.get(key)
                return v * scale if isinstance(v, (int, float)) else None

            rows.append(dict(base, launch=int(launch), stage=stage, kernel=kernel[:160],
                             duration_us=num("gpu__time_duration.sum", 1e-3),
                             dram_read_mb=num("dram__bytes_read.sum", 2**-20),
                             dram_write_mb=num("dram__bytes_write.sum", 2**-20),
                             dram_pct=num("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                             sm_pct=num("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                             occupancy_pct=num("sm__warps_active.avg.pct_of_peak_sustained_active"),
                             l2_hit_pct=num("lts__t_sector_hit_rate.pct"),
                             registers=num("launch__registers_per_thread"), grid=num("launch__grid_size"),
                             block=num("launch__block_size"),
                             note=f"ncu --clock-control none --kernel-name-base mangled, regex {NCU_KERNELS!r}; "
                                  f"profiles_dir/fused_moe_ncu_b{b}.ncu.txt"))
    return rows


def table_rows(table: str, *, scales: str = "pertensor", batches=None, impls=IMPLS, seed: int = 0, iters: int = 100,
               ceilings: dict | None = None) -> list[dict]:
    """The rows of one named table from data/shapes/fused_moe.yaml (its model/mode and batch list, or the batches
    given). Raises ValueError for an unknown table."""
    from hotpaths.harness.shapes import load_shapes

    spec = load_shapes(OP, "tables")
    if table not in spec:
        raise ValueError(f"table: expected one of {sorted(spec)}, got {table!r}")
    t = spec[table]
    bs = list(batches) if batches is not None else t["batches"]
    if "models" in t:
        rows = []
        for model in t["models"]:
            for mode in t["modes"]:
                rows += moe_rows(bs, model=model, mode=mode, scales=scales, impls=impls, seed=seed, iters=iters,
                                 ceilings=ceilings)
        return rows
    return moe_rows(bs, model=t["model"], mode=t["mode"], scales=scales, impls=impls, seed=seed, iters=iters,
                    ceilings=ceilings)


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------

def gemm_path_choice(df):
    """Per (scales, batch) of a table holding forced GEMM paths (impls fused_<path> for the paths of GEMMS, with
    model, mode, batch, median_us): the path ``plan(gemm="auto")`` takes at that batch (plan_shape on the pairs the
    rank expects), the fastest one measured, each path's time (<path>_us) and auto's time over the fastest (NaN
    when auto's path was not timed). Batches with fewer than two timed paths are left out. Returns a pandas
    DataFrame."""
    import pandas as pd

    from hotpaths.kernels.fused_moe import GEMMS, plan_shape  # plain Python: imports without a GPU
    from hotpaths.reference import fused_moe as fm

    paths = [g for g in GEMMS if g != "auto"]
    timed = df[df["impl"].isin([f"fused_{g}" for g in paths]) & df["median_us"].notna()]
    out = []
    for (scales, model, mode, batch), g in timed.groupby(["scales", "model", "mode", "batch"], sort=True):
        t = {str(i)[len("fused_"):]: float(u) for i, u in zip(g["impl"], g["median_us"])}
        if len(t) < 2:
            continue
        d = fm.model_dims(model, mode)
        pick = plan_shape(int(batch) * d["topk"], d["experts"], gemm="auto", experts_total=d["experts_total"],
                          scales=scales)[0]
        best = min(t, key=t.get)
        out.append({"scales": scales, "batch": int(batch), "auto_pick": pick, "faster": best,
                    **{f"{p}_us": t.get(p, float("nan")) for p in paths},
                    "auto_over_faster": t[pick] / t[best] if pick in t else float("nan")})
    return pd.DataFrame(out)


def register(subparsers) -> None:
    """Add ``hotpaths moe`` to the CLI's subparsers (hotpaths.harness.cli finds it through hotpaths.bench.OPS)."""
    from hotpaths.harness.cli import add_op_command
    from hotpaths.harness.shapes import int_list_arg
    from hotpaths.reference.fused_moe import MODELS, PAR_MODES, SCALE_MODES

    p = add_op_command(
        subparsers, "moe", func=_run, help="fused FP8 MoE layer: latency and error per impl and batch",
        description="Runs each --impl on one MoE layer of --model in --mode (tp8ep1: every expert, intermediate/8 "
        "per rank; tp1ep8: experts/8 per rank) at each --batch, with FP8 weights in --scales format, on fresh "
        "seeded inputs (uniform top-k routing over all experts). Reports error vs the exact fp64 reference "
        "(rel L2, max abs, cosine, max relative) and vs the staged emulation, the experts hit and weight bytes "
        "read, and on an SM90 GPU median/p10/p90 us (CUDA-graph replay, L2 flushed), the read-probe time for "
        "the weights hit, TFLOP/s and speedups vs each peer. Without SM90 every impl runs its emulation "
        "(impl <name>_emulation, no timing).")
    p.add_argument("--model", choices=sorted(MODELS), default="hy3", help="model shape (default hy3)")
    p.add_argument("--mode", choices=PAR_MODES, default="tp8ep1", help="parallel mode (default tp8ep1)")
    p.add_argument("--batch", type=int_list_arg("--batch", minimum=0), default=[4, 16, 64],
                   help="comma-separated token counts (default 4,16,64)")
    p.add_argument("--scales", choices=SCALE_MODES, default="pertensor",
                   help="FP8 scale format: pertensor (static) or block (128x128 weights, 1x128 activations)")
    p.add_argument("--experts", type=int, default=None, help="override the model's total experts")
    p.add_argument("--topk", type=int, default=None, help="override top-k (1-16)")
    p.add_argument("--hidden", type=int, default=None, help="override hidden (a multiple of 64)")
    p.add_argument("--inter", type=int, default=None,
                   help="override the whole-model intermediate (per rank: /8 in tp8ep1; a multiple of 64)")
    p.add_argument("--rank", type=int, default=0, help="EP rank in tp1ep8 (default 0)")
    p.add_argument("--impl", default=DEFAULT_IMPLS, help=f"comma-separated among {', '.join(IMPLS)} "
                   f"(default {DEFAULT_IMPLS})")
    p.add_argument("--ep", type=int, default=None, metavar="N",
                   help="expert parallelism over N processes (hotpaths.bench.fused_moe_ep): N GPUs over NCCL with the "
                   "fused kernel, or on a machine without CUDA N gloo processes with the emulation (CPU wall time, "
                   "small shape unless given); prints dispatch / compute / combine per batch (tokens per rank) "
                   "beside the single-GPU layer; exits 2 with fewer than N GPUs. Ignores --mode, --rank, --impl")
    p.add_argument("--stages", action="store_true", help="SM90: also print the stage breakdown of our kernel")
    p.add_argument("--ab", default=None, metavar="KNOB=V1,V2",
                   help=f"A/B one knob of our kernel instead of the impls: {', '.join(AB_KNOBS)} (e.g. "
                   "reduce_pdl=on,off, gemm=auto,wgmma); the values alternated over --rounds in one process, "
                   "outputs compared bit for bit with the first value's. Ignores --impl and --stages")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds of --ab (default 3)")
    p.add_argument("--check", action="store_true", help="exit with status 1 if a checked row is outside its tolerance")


def _run(args) -> int:
    if args.ep is not None:
        from hotpaths.bench.fused_moe_ep import run_ep

        return run_ep(args.ep, args.batch, model=args.model, scales=args.scales, experts=args.experts,
                      topk=args.topk, hidden=args.hidden, inter=args.inter, seed=args.seed, iters=args.iters,
                      as_json=args.json, save=args.save)
    impls = parse_impls(args.impl)
    if args.iters < 1:
        raise ValueError(f"--iters: expected >= 1, got {args.iters}")
    over = dict(experts=args.experts, topk=args.topk, hidden=args.hidden, inter=args.inter)
    if args.ab is not None:
        knob, values = parse_ab(args.ab)
        rows = ab_rows(args.batch, knob, values, model=args.model, mode=args.mode, scales=args.scales,
                       seed=args.seed, iters=args.iters, rounds=args.rounds, **over)
        return _emit(rows, args)
    rows = moe_rows(args.batch, model=args.model, mode=args.mode, scales=args.scales, impls=impls, seed=args.seed,
                    iters=args.iters, rank=args.rank, **over)
    if args.stages:
        for impl in [i for i in impls if i in FUSED_GEMM] or ["fused"]:
            rows += stage_rows(args.batch, model=args.model, mode=args.mode, scales=args.scales, seed=args.seed,
                               iters=args.iters, impl=impl, **over)
    return _emit(rows, args)


def _emit(rows, args) -> int:
    """Save (--save), print (--json or the text table) and the exit status (--check: 1 if a checked row failed,
    or an --ab variant's output was not bit-identical to the first's)."""
    from hotpaths.harness import tables

    if args.save:
        tables.save(rows, args.save)
    try:
        if args.json:
            print(tables.json_lines(rows))
        else:
            _print_table(rows)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: stop quietly, and keep the interpreter's final flush from complaining
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    bad = [r for r in rows if r.get("passed") is False or r.get("bit_identical") is False]
    if args.check and bad:
        print(f"hotpaths moe: {len(bad)} row(s) outside tolerance or not bit-identical: "
              + ", ".join(f"{r['case']}/{r['impl']}" + (f"/{r['knob']}={r['variant']}" if r.get("knob") else "")
                          for r in bad), file=sys.stderr)
        return 1
    return 0


def _print_table(rows) -> None:
    def f(v, spec):
        return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)
    print(f"{'batch':>6} {'impl':<34} {'median_us':>10} {'%probe':>7} {'hit':>4} {'cosine':>9} {'max_rel':>8}  note")
    for r in rows:
        name = r["impl"] + (f"[{r['stage']}]" if r.get("stage") else "") + (
            f"[{r['knob']}={r['variant']} {r.get('plan') or ''}".rstrip() + "]" if r.get("knob") else "")
        note = r.get("reason") or ""
        print(f"{r['batch']:>6} {name:<34} {f(r.get('median_us'), '10.2f')} {f(r.get('pct_of_read_probe'), '7.1f')} "
              f"{r.get('experts_hit', '-')!s:>4} {f(r.get('cosine'), '9.6f')} {f(r.get('max_rel_err'), '8.4f')}  "
              f"{note[:80]}")
