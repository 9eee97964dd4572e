"""Router GEMM benchmarks: the tables of notebook 04 (emulation error and routing flips, latency by M), the tuner
that writes the dispatch table, and the ``hotpaths router`` subcommand.

``hotpaths router``: on an SM90 GPU every impl is run and timed (CUDA-graph replay, L2 flushed before each
replay); without one, the kernel and cuBLAS impls fall back to their same-precision emulations (impl column
``*_emulation``, no timing), so the correctness half of the table is still produced. Shapes and the M sweep come
from data/shapes/router_gemm.yaml.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from hotpaths.bench import router_gemm_peers as RP
from hotpaths.harness import progress as _progress
from hotpaths.harness.bench import bench, read_probe_columns
from hotpaths.harness.ceilings import pct_of_ceiling
from hotpaths.harness.check import check
from hotpaths.harness.cli import add_op_command, emit_rows
from hotpaths.harness.env import device_tag, has_sm90
from hotpaths.harness.runs import run_id
from hotpaths.harness.shapes import int_list_arg, load_shapes
from hotpaths.harness.tables import COLUMNS, published
from hotpaths.harness.tolerances import rows as tolerance_rows
from hotpaths.harness.tolerances import tolerance
from hotpaths.kernels import router_gemm as K
from hotpaths.reference import router_gemm as ref

OP = "router_gemm"
# Router weights (N experts, K hidden) by model, and the M sweep: data/shapes/router_gemm.yaml.
SHAPES: dict[str, tuple[int, int]] = {name: (int(s["n"]), int(s["k"])) for name, s in load_shapes(OP, "models").items()}
M_SWEEP: tuple[int, ...] = tuple(load_shapes(OP, "m_sweep"))

# Published (H20, SGLang post, data/reported/claims.csv): max abs error vs FP32 cuBLAS over the M sweep at
# K=4096, N=192. Used only when data/reported/claims.csv cannot be read.
PUBLISHED_MAX_ABS_VS_FP32 = {"bf16x2": 0.00177, "tf32": 0.06464}
PUBLISHED_SOURCE = "SGLang post (data/reported/claims.csv, router_gemm rows)"

# The tolerance rows of this op (hotpaths.harness.tolerances holds them with their derivation, measured by
# hotpaths.reference.router_gemm.derive_tolerances) as (rel_l2, max_abs, min_cosine) for notebook 04 and the tests.
TOLERANCE_ROWS: dict[tuple[str, str], tuple] = tolerance_rows(OP)


# ----------------------------------------------------------------------------------------------------------------
# tables of notebook 04 (emulations: error and routing flips)


def _row(**kw) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(op=OP, device=device_tag(), run_id=run_id())
    row.update(kw)
    return row


def published_max_abs() -> tuple[dict, str]:
    """The published max abs errors vs FP32 cuBLAS ({"bf16x2": .., "tf32": ..}) and where they came from: the
    claims table through hotpaths.harness.tables.published when it is available, else the constants here."""
    try:
        df = published(OP)
        claim = df["claim"].astype(str).str.lower()
        tf = df[claim.str.contains("tf32") & claim.str.contains("max abs")]
        ours = df[~claim.str.contains("tf32") & claim.str.contains("max abs")]
        if len(tf) and len(ours):
            return ({"bf16x2": float(ours["value"].iloc[0]), "tf32": float(tf["value"].iloc[0])},
                    "data/reported/claims.csv via hotpaths.harness.tables.published")
    except (OSError, KeyError, ValueError):  # claims table missing or without these rows
        pass
    return dict(PUBLISHED_MAX_ABS_VS_FP32), PUBLISHED_SOURCE + " [constants in hotpaths.bench.router_gemm]"


def error_table(ms: Sequence[int] = (1, 16, 256, 4096), n: int = 192, k: int = 4096, *, seed: int = 0,
                scales: Iterable = ("unit", "init"), impls: Iterable[str] = tuple(ref.EMULATIONS)) -> list[dict]:
    """Error of each emulation vs FP64 and vs FP32 at each M, with the published max abs errors beside.

    Rows: CONTRACT.md columns (no timing: emulations) plus m, n, k, weight_scale, max_abs_err_vs_fp32,
    max_abs_err_vs_fp64, rel_l2_err_vs_fp64 (= rel_l2_err), published_max_abs_err_vs_fp32, published_source.
    ``max_abs_err`` / ``rel_l2_err`` are vs FP64. One extra row per (scale, impl) with case "max_over_m". The
    published figures are placed on "unit"-scale rows only (they were measured on randn inputs).
    """
    pub, src = published_max_abs()
    rows = []
    for scale in scales:
        worst: dict[str, dict] = {}
        for m in ms:
            x, w = ref.make_router_inputs(m, n, k, seed=seed + m, scale=scale)
            r64 = ref.router_gemm_ref(x, w)
            f32 = ref.fp32_emulation(x, w)
            for impl in impls:
                s = f32 if impl == "ref.fp32_emulation" else ref.EMULATIONS[impl](x, w)
                e64 = ref.error_metrics(s, r64)
                e32 = ref.error_metrics(s, f32)
                path = ref._PATH_OF[impl]
                r = _row(case=f"m{m}_n{n}_k{k}_{scale}", impl=impl, dtype=f"x bf16, w fp32 ({path})",
                         rel_l2_err=e64["rel_l2_err"], max_abs_err=e64["max_abs_err"],
                         bytes=ref.bytes_moved(m, n, k, 2 if path in ("bf16x2", "fp32", "tf32") else
                                           (3 if path == "bf16x3" else 1)),
                         m=m, n=n, k=k, weight_scale=scale, max_abs_err_vs_fp32=e32["max_abs_err"],
                         max_abs_err_vs_fp64=e64["max_abs_err"], rel_l2_err_vs_fp64=e64["rel_l2_err"],
                         # the published figures come from unit-scale (randn) inputs: only those rows compare
                         published_max_abs_err_vs_fp32=pub.get(path) if scale == "unit" else None,
                         published_source=src if (path in pub and scale == "unit") else None,
                         repro=(f"python -c \"from hotpaths.bench.router_gemm import error_table; "
                                f"error_table(ms=[{m}], n={n}, k={k}, seed={seed}, scales=['{scale}'])\""))
                rows.append(r)
                wr = worst.setdefault(impl, dict(r, case=f"max_over_m_n{n}_k{k}_{scale}", m=max(ms)))
                for c in ("max_abs_err", "rel_l2_err", "max_abs_err_vs_fp32", "max_abs_err_vs_fp64",
                          "rel_l2_err_vs_fp64"):
                    wr[c] = max(wr[c], r[c])
        rows.extend(worst.values())
    return rows


def flip_table(m: int = 512, n: int = 192, k: int = 4096, *, gaps: Sequence[float | None] = (None, 1e-2, 1e-3, 1e-4,
               1e-5), seed: int = 0, topk: int = 8, scale="init",
               impls: Iterable[str] = tuple(ref.EMULATIONS)) -> list[dict]:
    """Top-k flip rate and routing weight moved of each emulation vs FP64, on natural inputs (gap None) and on
    near-tie inputs (every token's k-th/(k+1)-th FP64 gap <= gap).

    Rows: CONTRACT.md columns plus m, n, k, topk, gap, weight_scale, flip_rate, flips, weight_moved_mean,
    weight_moved_max, median_gap.
    """
    rows = []
    for gap in gaps:
        if gap is None:
            x, w = ref.make_router_inputs(m, n, k, seed=seed, scale=scale)
            case = f"natural_m{m}_n{n}_k{k}"
        else:
            x, w, _ = ref.near_tie_inputs(m, n, k, gap=gap, seed=seed, topk=topk, scale=scale)
            case = f"near_tie_{gap:g}_m{m}_n{n}_k{k}"
        r64 = ref.router_gemm_ref(x, w)
        g = ref.topk_gap(r64, topk)
        for impl in impls:
            s = ref.EMULATIONS[impl](x, w)
            e = ref.error_metrics(s, r64)
            rows.append(_row(case=case, impl=impl, dtype=f"x bf16, w fp32 ({ref._PATH_OF[impl]})",
                             rel_l2_err=e["rel_l2_err"], max_abs_err=e["max_abs_err"], m=m, n=n, k=k, topk=topk,
                             gap=gap, weight_scale=scale, median_gap=float(g.median()),
                             **ref.routing_metrics(s, r64, topk),
                             repro=(f"python -c \"from hotpaths.bench.router_gemm import flip_table; "
                                    f"flip_table(m={m}, n={n}, k={k}, gaps=[{gap!r}], seed={seed}, topk={topk}, "
                                    f"scale='{scale}')\"")))
    return rows


# Published H20 speedup ranges (claims.csv), by router shape (n, k).
PUBLISHED_RANGES = {
    (192, 4096): {"published_h20_speedup_vs_fp32": "1.30x-3.22x", "published_h20_speedup_vs_tf32": "1.25x-1.78x"},
    (768, 6144): {"published_h20_speedup_vs_sglang_default": "1.06x-2.83x (inside dispatch range)"},
    (384, 3072): {"published_h20_speedup_vs_sglang_default": "1.09x-2.46x (inside dispatch range)"},
}


def annotate_published(rows: list[dict]) -> list[dict]:
    """Add the published H20 speedup ranges (by the row's n, k) beside our rows. Returns new dicts; rows without
    n/k are left as they are. (HPC-Ops is measured in the same run: impl "hpc_ops" and the vs_hpc_ops column.)"""
    out = []
    for r in rows:
        r = dict(r)
        r.update(PUBLISHED_RANGES.get((r.get("n"), r.get("k")), {}))
        out.append(r)
    return out


# ----------------------------------------------------------------------------------------------------------------
# latency table and tuner


def _gpu_ok() -> bool:
    return has_sm90()


def _parts_of(impl: str) -> int:
    return {"bf16x3_kernel": 3, "bf16_cublas": 1, "bf16_emulation": 1, "bf16x3_emulation": 3}.get(impl, 2)


def _time(x, weights, impl, out, iters):
    return bench(lambda: K.router_gemm(x, weights, impl=impl, out=out), iters=iters)


def benchmark_rows(ms, n: int, k: int, impls=("bf16x2_kernel", "dispatch", "fp32_cublas", "tf32_cublas",
                                              "bf16_cublas", "hpc_ops"), *, case_prefix: str = "hy3", seed: int = 0,
                   ceilings: dict | None = None, iters: int = 100, topk: int = 8) -> list[dict]:
    """Latency and error rows for each M and impl (CONTRACT.md columns plus m, n, k, speedup_vs_fp32,
    speedup_vs_tf32, max_abs_err_vs_fp32, max_abs_err_vs_fp64, emulation_max_abs_err_vs_fp64, topk_flips,
    topk_flips_emulation, config, hpc_ops_us, vs_hpc_ops, note).

    impls: K.IMPLS and the peers of hotpaths.bench.router_gemm_peers ("hpc_ops": HPC-Ops' gemm_bf16xfp32, timed by
    the same bench on the same inputs, its errors vs FP64 / FP32 beside its time; without its bundle or a GPU the
    row carries the reason in `note`). hpc_ops_us / vs_hpc_ops on our rows: HPC-Ops' median at this M and its
    ratio to the row's (> 1: ours is faster); empty, with the reason in `note`, when HPC-Ops did not run.

    Inputs: make_router_inputs(m, n, k, seed=seed + m) (fresh random, "init" scale); outputs NaN-poisoned before
    the correctness run. max_abs_err / rel_l2_err / cosine are vs FP64. Timing: harness bench (CUDA graph replay,
    L2 flushed before each replay, median). ceilings: hotpaths.harness.ceilings.measure() output for
    pct_of_ceiling (copy bandwidth), or None to leave it empty.
    Without an SM90 GPU: one row per distinct emulation (impl "bf16x2_emulation", ...) with empty timing.
    Raises ValueError on an unknown impl or unsupported N/K.
    """
    bad = [i for i in impls if i not in K.IMPLS and i not in RP.PEER_NAMES]
    if bad:
        raise ValueError(f"impls: unknown {bad}; expected a subset of {K.IMPLS + RP.PEER_NAMES}")
    peers = [i for i in impls if i in RP.PEER_NAMES]
    impls = [i for i in impls if i in K.IMPLS]
    ref.validate_kernel_shape(n, k)
    gpu = _gpu_ok()
    dev = "cuda" if gpu else "cpu"
    tag, rid = device_tag(), run_id()
    _, w = ref.make_router_inputs(1, n, k, seed=seed)
    w = w.to(dev)
    weights = K.plan(w, three_part="bf16x3_kernel" in impls)
    rows = []
    for m in _progress.progress(ms, desc="router", unit="M"):
        x, _ = ref.make_router_inputs(m, n, k, seed=seed + 1 + m)
        x = x.to(dev)
        r64 = ref.router_gemm_ref(x, w)
        f32 = ref.fp32_emulation(x, w)
        emu_cache: dict[str, torch.Tensor] = {}
        base_t: dict = {}
        # Without a GPU: one row per distinct emulation, plus dispatch as its own row (the emulation of what it
        # would pick at this M, named in the note), so the table keeps every impl the user asked for.
        todo = list(impls) if gpu else list(dict.fromkeys(K.EMULATION_OF[i] for i in impls if i != "dispatch")) \
            + (["dispatch_emulation"] if "dispatch" in impls else [])
        first_row = len(rows)
        if gpu:  # the baselines the speedup columns divide by, timed once per M
            for b in ("fp32_cublas", "tf32_cublas"):
                base_t[b] = _time(x, weights, b, torch.empty(m, n, device=dev), iters)
        for impl in todo:
            emu_name = (K.EMULATION_OF[K.choose_impl(m, n, k)] if impl == "dispatch_emulation"
                        else K.EMULATION_OF.get(impl, impl))
            if emu_name not in emu_cache:
                emu_cache[emu_name] = ref.EMULATIONS[emu_name](x, w)
            timing, cfg = None, None
            if gpu:
                out = torch.full((m, n), float("nan"), device=dev)
                K.router_gemm(x, weights, impl=impl, out=out)
                torch.cuda.synchronize()
                timing = base_t[impl] if impl in base_t else _time(x, weights, impl, out, iters)
                med = timing.median_us
                if impl in ("bf16x2_kernel", "bf16x3_kernel") or K.choose_impl(m, n, k) == "bf16x2_kernel":
                    v, sp = K.tuned_config(m, n, k, parts=3 if impl == "bf16x3_kernel" else 2) or ("auto", 0)
                    cfg = dict(K.kernel_config(m, n, k, variant=v, splits=sp), tuned=v != "auto")
                else:
                    cfg = K.choose_impl(m, n, k)
            else:
                out, med = emu_cache[emu_name], None
            c = check(out, r64)
            base_impl = impl if gpu else "dispatch" if impl == "dispatch_emulation" else \
                next(i for i in impls if i != "dispatch" and K.EMULATION_OF[i] == impl)
            nbytes = ref.bytes_moved(m, n, k, _parts_of(base_impl))
            flips = int(ref.topk_sets_differ(out.cpu(), r64.cpu(), topk).sum()) if n > topk else None
            eflips = int(ref.topk_sets_differ(emu_cache[emu_name].cpu(), r64.cpu(), topk).sum()) if n > topk \
                else None
            gbps = nbytes / med / 1e3 if med else None
            row = {"op": OP, "case": f"{case_prefix}_m{m}", "impl": impl, "dtype": K.DTYPE_OF.get(base_impl, ""),
                   "device": tag, "median_us": med,
                   "p10_us": timing.p10_us if timing else None, "p90_us": timing.p90_us if timing else None,
                   "bytes": nbytes, "gbps": gbps, "pct_of_ceiling": pct_of_ceiling(gbps, ceilings),
                   **read_probe_columns(med, nbytes),
                   "rel_l2_err": c.rel_l2_err, "max_abs_err": c.max_abs_err, "cosine": c.cosine,
                   "published_h20_us": None, "run_id": rid,
                   "repro": f"hotpaths router --m {m} --n {n} --k {k} --impl {base_impl} --seed {seed} --json",
                   "m": m, "n": n, "k": k,
                   "speedup_vs_fp32": base_t["fp32_cublas"].median_us / med if med else None,
                   "speedup_vs_tf32": base_t["tf32_cublas"].median_us / med if med else None,
                   "max_abs_err_vs_fp32": ref.error_metrics(out, f32)["max_abs_err"],
                   "max_abs_err_vs_fp64": c.max_abs_err,
                   "emulation_max_abs_err_vs_fp64": ref.error_metrics(emu_cache[emu_name], r64)["max_abs_err"],
                   "topk_flips": flips, "topk_flips_emulation": eflips,
                   "config": json.dumps(cfg) if isinstance(cfg, dict) else cfg,
                   "hpc_ops_us": None, "vs_hpc_ops": None, "note": None}
            if impl == "dispatch_emulation":
                table = "measured table " + K.dispatch_path().name if K._nearest_row(m, n, k, None) else \
                    "no dispatch table for this device: the kernel by default"
                row["note"] = (f"emulation (no timing, no SM90 GPU): dispatch picks {K.choose_impl(m, n, k)} at "
                               f"M={m} ({table})")
            rows.append(row)
        ours = rows[first_row:]
        for peer in peers:
            prow = _peer_row(peer, x, w, m, n, k, r64=r64, f32=f32, emu=emu_cache.get("bf16x2_emulation"),
                             base_t=base_t, tag=tag, rid=rid, seed=seed, case_prefix=case_prefix, iters=iters,
                             topk=topk, ceilings=ceilings)
            rows.append(prow)
            if peer != "hpc_ops":
                continue
            for r in ours:
                if prow["median_us"] and r["median_us"]:
                    r["hpc_ops_us"] = prow["median_us"]
                    r["vs_hpc_ops"] = prow["median_us"] / r["median_us"]
                elif r["median_us"]:
                    r["note"] = f"vs_hpc_ops empty ({prow['note']})"
    return rows


def _peer_row(peer, x, w, m, n, k, *, r64, f32, emu, base_t, tag, rid, seed, case_prefix, iters, topk,
              ceilings) -> dict:
    """One row for a router peer at this M: timed and checked on a GPU with its bundle, else its reason."""
    nbytes = ref.bytes_moved(m, n, k, 2)
    row = {"op": OP, "case": f"{case_prefix}_m{m}", "impl": peer, "dtype": "x bf16, w fp32 as 2x bf16 (RNE hi + "
           "lo/256, HPC-Ops' split), out fp32", "device": tag, "median_us": None, "p10_us": None, "p90_us": None,
           "bytes": nbytes, "gbps": None, "pct_of_ceiling": None, **read_probe_columns(None, nbytes),
           "rel_l2_err": None, "max_abs_err": None, "cosine": None, "published_h20_us": None, "run_id": rid,
           "repro": f"hotpaths router --m {m} --n {n} --k {k} --impl {peer} --seed {seed} --json",
           "m": m, "n": n, "k": k, "speedup_vs_fp32": None, "speedup_vs_tf32": None, "max_abs_err_vs_fp32": None,
           "max_abs_err_vs_fp64": None, "emulation_max_abs_err_vs_fp64": None, "topk_flips": None,
           "topk_flips_emulation": None, "config": None, "hpc_ops_us": None, "vs_hpc_ops": None, "note": None}
    fn, reason = RP.try_make(peer, x, w)
    if fn is None:
        row["note"] = reason
        return row
    try:
        out = fn()
        torch.cuda.synchronize()
        c = check(out, r64)
        t = bench(fn, iters=iters)
    except Exception as e:
        row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        return row
    med = t.median_us
    gbps = nbytes / med / 1e3 if med else None
    row.update(median_us=med, p10_us=t.p10_us, p90_us=t.p90_us, gbps=gbps,
               pct_of_ceiling=pct_of_ceiling(gbps, ceilings),
               **read_probe_columns(med, nbytes), rel_l2_err=c.rel_l2_err, max_abs_err=c.max_abs_err, cosine=c.cosine,
               speedup_vs_fp32=base_t["fp32_cublas"].median_us / med if med and "fp32_cublas" in base_t else None,
               speedup_vs_tf32=base_t["tf32_cublas"].median_us / med if med and "tf32_cublas" in base_t else None,
               max_abs_err_vs_fp32=ref.error_metrics(out, f32)["max_abs_err"], max_abs_err_vs_fp64=c.max_abs_err,
               emulation_max_abs_err_vs_fp64=ref.error_metrics(emu, r64)["max_abs_err"] if emu is not None else None,
               topk_flips=int(ref.topk_sets_differ(out.cpu(), r64.cpu(), topk).sum()) if n > topk else None,
               note=getattr(fn, "note", None))
    return row


def accuracy_failure(got: torch.Tensor, ref64: torch.Tensor, emu_err: float, bound: float = K.ERR_BOUND, *,
                     emu_flips: int | None = None, topk: int = 8) -> str | None:
    """The tuner's accuracy gate: None when max|got - ref64| <= bound * emu_err (the BF16x2 emulation's max abs
    error vs the same FP64 reference) and, when ``emu_flips`` is given, got's top-``topk`` expert sets differ from
    FP64's on at most as many tokens as the emulation's do (emu_flips); else the reason. got: fp32 [M, N]; ref64:
    fp64 [M, N] on the same device."""
    err = float((got.double() - ref64).abs().max())
    if err > bound * emu_err:
        return (f"max abs error vs FP64 {err:.3g} is {err / max(emu_err, 1e-30):.2f}x the emulation's "
                f"({emu_err:.3g}); bound {bound}x")
    if emu_flips is not None:
        flips = int(ref.topk_sets_differ(got, ref64, topk).sum())
        if flips > emu_flips:
            return f"top-{topk} flips vs FP64 {flips} > the emulation's {emu_flips}"
    return None


def measure_crossover(shapes, ms=None, *, path: str | Path | None = None, iters: int = 30,
                      seed: int = 0, tune: bool = True) -> dict:
    """Tune the kernel and find the crossover: at each (N, K) in ``shapes`` and each M in ``ms``, time every
    kernel configuration (kernel_candidates; only the built-in one when tune=False) and FP32 cuBLAS, and write the
    dispatch table (hotpaths.kernels.router_gemm.dispatch_path() unless ``path``); returns it. Needs an SM90 GPU
    (RuntimeError otherwise).

    Every candidate is first run once on fresh random data into a NaN-poisoned output and checked against the
    BF16x2 emulation (tolerance row ("router_gemm", "bf16x2_vs_emulation")) and against FP64 (max abs error at
    most ERR_BOUND (hotpaths.kernels.router_gemm) x the emulation's, and no more top-8 flips vs FP64 than the
    emulation's); a candidate that fails
    (or raises) is not timed and cannot be selected: it is listed with the reason under the row's "failed".

    Table: {"op", "device", "run_id", "method", "shapes": [{"n", "k", "rows": [{"m", "kernel": {"variant",
    "splits"}, "bf16x2_kernel_us", "fp32_cublas_us", "choice", "candidates_us", "failed" (when any)}]}]}.
    """
    if not _gpu_ok():
        raise RuntimeError("measure_crossover needs an SM90 GPU (the table is a measurement of this device)")
    ms = M_SWEEP if ms is None else ms
    tol = tolerance(OP, "bf16x2_vs_emulation")

    table = {"op": OP, "device": device_tag(), "run_id": run_id(), "gpu": torch.cuda.get_device_name(),
             "method": f"harness bench: CUDA graph replay, L2 flushed before each replay, median of {iters}",
             "rule": "dispatch runs the faster impl at the measured M nearest (log2) to the call's M; the kernel "
                     "runs the fastest configuration measured there",
             "shapes": []}
    for n, k in shapes:
        ref.validate_kernel_shape(n, k)
        _, w = ref.make_router_inputs(1, n, k, seed=seed)
        weights = K.plan(w.cuda())
        rows = []
        for m in ms:
            x, _ = ref.make_router_inputs(m, n, k, seed=seed + 1 + m)
            x = x.cuda()
            # correctness gate: a second fresh input (not the timed one), its emulation computed once per M
            xc, _ = ref.make_router_inputs(m, n, k, seed=seed + 7919 + m)
            xc = xc.cuda()
            emu = ref.bf16x2_from_parts(xc, weights.w_high, weights.w_low)
            # accuracy gate: the kernel's max abs error vs FP64 within ERR_BOUND x the emulation's (a long
            # accumulation chain in the tensor cores' FP32 accumulators, e.g. one split over K = 6144, exceeds it)
            ref64 = xc.double() @ weights.w.double().T
            emu_err = float((emu.double() - ref64).abs().max())
            emu_flips = int(ref.topk_sets_differ(emu, ref64, 8).sum())  # the target: flips equal to these
            out = torch.empty(m, n, device="cuda")
            sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            cands = K.kernel_candidates(m, n, k, sm_count=sms) if tune else [("auto", 0)]
            cand_us = {}
            failed = {}
            for v, sp in cands:
                try:
                    got = torch.full((m, n), float("nan"), device="cuda")
                    K.router_gemm(xc, weights, impl="bf16x2_kernel", out=got, variant=v, splits=sp)
                    torch.cuda.synchronize()
                    c = check(got, emu, tol=tol)
                    if not c.passed:
                        failed[f"{v}/{sp}"] = (f"wrong result vs bf16x2 emulation: rel_l2={c.rel_l2_err:.3g} "
                                               f"max_abs={c.max_abs_err:.3g} nan={c.nan_count} inf={c.inf_count}")
                        continue
                    why = accuracy_failure(got, ref64, emu_err, emu_flips=emu_flips)
                    if why:
                        failed[f"{v}/{sp}"] = why
                        continue
                    cand_us[f"{v}/{sp}"] = bench(lambda: K.router_gemm(x, weights, impl="bf16x2_kernel", out=out,
                                                                     variant=v, splits=sp), iters=iters).median_us
                except (RuntimeError, ValueError) as e:  # e.g. a cluster that cannot be scheduled: record, skip
                    failed[f"{v}/{sp}"] = str(e)[:200]
            if not cand_us:
                raise RuntimeError(f"measure_crossover: every kernel configuration failed at M={m}, N={n}, K={k}: "
                                   f"{failed}")
            best = min(cand_us, key=cand_us.get)
            v, sp = best.split("/")
            if v == "auto":
                c = K.kernel_config(m, n, k)
                v, sp = c["variant"], c["splits"]
            t32 = _time(x, weights, "fp32_cublas", out, iters).median_us
            rows.append({"m": m, "kernel": {"variant": v, "splits": int(sp)}, "bf16x2_kernel_us": cand_us[best],
                         "fp32_cublas_us": t32,
                         "choice": "bf16x2_kernel" if cand_us[best] <= t32 else "fp32_cublas",
                         "candidates_us": {c: round(t, 2) for c, t in cand_us.items()},
                         **({"failed": failed} if failed else {})})
        table["shapes"].append({"n": n, "k": k, "rows": rows})
    p = Path(path) if path is not None else K.dispatch_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(table, indent=1) + "\n")
    K.reload_dispatch_table()
    return table


# ----------------------------------------------------------------------------------------------------------------
# hotpaths router

DEFAULT_IMPLS = "bf16x2_kernel,dispatch,fp32_cublas,tf32_cublas,bf16_cublas,hpc_ops"

CLI_HELP = "router GEMM with a two-part BF16 weight: latency and error by M"
CLI_DESCRIPTION = """\
Scores x @ W.T, x BF16 [M, K], W FP32 [N, K] split into BF16 parts (W ~ W_high + W_low/256).
Runs each --impl at each M on fresh random inputs; reports median/p10/p90 us (GPU), speedups vs FP32 and
TF32 cuBLAS, and max abs / rel L2 error vs FP64 and FP32. Without an SM90 GPU the emulations run instead
(no timing).""".replace("\n", " ")


def register(subparsers) -> None:
    """Add ``hotpaths router`` to the CLI's subparsers (hotpaths.harness.cli finds it through hotpaths.bench.OPS)."""
    p = add_op_command(subparsers, "router", func=_run, help=CLI_HELP, description=CLI_DESCRIPTION)
    p.add_argument("--m", type=int_list_arg("--m", minimum=1), default=list(M_SWEEP),
                   help="comma-separated token counts M (default: m_sweep of data/shapes/router_gemm.yaml)")
    p.add_argument("--n", type=int_list_arg("--n", minimum=64), default=[192],
                   help="number of experts N, multiples of 64, comma-separated (default 192); with --k, every "
                   "(N, K) pair of the two lists is run")
    p.add_argument("--k", type=int_list_arg("--k", minimum=64), default=[4096],
                   help="hidden size K, multiples of 64, comma-separated (default 4096)")
    p.add_argument("--shapes", type=shape_list_arg, default=None,
                   help="comma-separated N:K pairs (e.g. 128:2048,256:4096,768:7168), instead of --n/--k")
    p.add_argument("--impl", default=DEFAULT_IMPLS,
                   help=f"comma-separated impls among dispatch, bf16x2_kernel, bf16x3_kernel, fp32_cublas, "
                   f"tf32_cublas, bf16_cublas, hpc_ops (HPC-Ops' gemm_bf16xfp32, same run; needs its bundle) "
                   f"(default {DEFAULT_IMPLS})")
    p.add_argument("--tune-on-first-use", action="store_true",
                   help="SM90: for a shape the committed dispatch table lacks, `dispatch` times every kernel "
                   "candidate and FP32 cuBLAS once per M bucket (power of two) on this device and caches the "
                   "fastest under $HOTPATHS_CACHE_DIR or ~/.cache/hotpaths (tuning is never done during CUDA-graph "
                   "capture)")
    p.add_argument("--case-prefix", default="hy3", help="prefix of the case column (default hy3)")
    p.add_argument("--tune", action="store_true",
                   help="SM90 only: tune the kernel configurations and measure the dispatch crossover for every "
                   "router shape of data/shapes/router_gemm.yaml at the M sweep, writing "
                   "data/dispatch/router_gemm_<device>.json (what `dispatch` reads), then exit")


def shape_list_arg(spec: str) -> list[tuple[int, int]]:
    """argparse type: ``"192:4096,256:7168"`` -> [(192, 4096), (256, 7168)]; N and K positive multiples of 64."""
    import argparse

    out = []
    for item in (t.strip() for t in spec.split(",")):
        parts = item.split(":")
        try:
            n, k = (int(v) for v in parts)
            if len(parts) != 2:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes: expected N:K pairs like 192:4096, got {item!r}") from None
        if n <= 0 or k <= 0 or n % 64 or k % 64:
            raise argparse.ArgumentTypeError(f"--shapes: N and K must be positive multiples of 64, got {item!r}")
        out.append((n, k))
    if not out:
        raise argparse.ArgumentTypeError("--shapes: expected at least one N:K pair")
    return list(dict.fromkeys(out))


def run_shapes(args) -> list[tuple[int, int]]:
    """The (N, K) pairs a `hotpaths router` call runs: --shapes, else every pair of the --n and --k lists.
    Raises ValueError for N or K not a multiple of 64."""
    shapes = args.shapes or [(n, k) for n in args.n for k in args.k]
    for n, k in shapes:
        ref.validate_kernel_shape(n, k)
    return shapes


def _run(args) -> int:
    if args.tune:
        return _tune(args)
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    try:
        shapes = run_shapes(args)
    except ValueError as e:
        print(f"hotpaths router: error: {e}", file=sys.stderr)
        return 2
    if args.tune_on_first_use:
        K.set_tune_on_first_use(True)
    multi = len(shapes) > 1
    rows = []
    for n, k in shapes:
        prefix = f"{args.case_prefix}_n{n}_k{k}" if multi else args.case_prefix
        rows += benchmark_rows(args.m, n, k, impls, case_prefix=prefix, seed=args.seed, iters=args.iters)
    if emit_rows(rows, args):
        return 0
    head = f"{'n':>4} {'k':>5} {'m':>6} {'impl':<18} {'median_us':>10} {'vs_fp32':>8} {'vs_tf32':>8} " \
           f"{'vs_hpc':>7} {'maxabs_fp64':>12} {'maxabs_fp32':>12} {'flips':>6}  note"
    print(f"router_gemm shapes={' '.join(f'{n}:{k}' for n, k in shapes)} device={rows[0]['device'] if rows else '?'}")
    print(head)

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-".rjust(int(fmt[1:].split(".")[0].rstrip("de") or 1))
    for r in rows:
        print(f"{r['n']:>4} {r['k']:>5} {r['m']:>6} {r['impl']:<18} {f(r['median_us'], '>10.2f')} "
              f"{f(r['speedup_vs_fp32'], '>8.2f')} {f(r['speedup_vs_tf32'], '>8.2f')} {f(r['vs_hpc_ops'], '>7.2f')} "
              f"{f(r['max_abs_err_vs_fp64'], '>12.3e')} {f(r['max_abs_err_vs_fp32'], '>12.3e')} "
              f"{f(r['topk_flips'], '>6d')}  {r.get('note') or ''}")
    return 0


def _tune(args) -> int:
    table = measure_crossover(list(SHAPES.values()), args.m, iters=min(args.iters, 30), seed=args.seed)
    for s in table["shapes"]:
        print(f"N={s['n']} K={s['k']}  M: kernel us / fp32 cuBLAS us  choice  config")
        for r in s["rows"]:
            print(f"  {r['m']:>5}: {r['bf16x2_kernel_us']:8.2f} / {r['fp32_cublas_us']:8.2f}  {r['choice']:<14} "
                  f"{r['kernel']['variant']}/{r['kernel']['splits']}" + (f"  ({len(r['failed'])} candidates failed)"
                                                                         if r.get("failed") else ""))
    print(f"wrote {K.dispatch_path()}")
    return 0
