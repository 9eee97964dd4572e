#!/usr/bin/env python
"""One-shot GPU check of the router GEMM's SM90 wgmma prefill variants (router_wgmma.cu) on an H200/H100.

For every wgmma variant (hotpaths.kernels.router_gemm.WGMMA_TILES), every router shape (hy3 192x4096,
longcat_chat 768x6144, longcat_lite 384x3072, deepseek_v3 256x7168) and M in (256, 1000, 2048, 4096), and every K
split kernel_candidates offers for it: run the kernel through the Python API (variant forced) into a NaN-poisoned
output, compare with the BF16x2 emulation hotpaths.reference.router_gemm.bf16x2_from_parts under the GPU tests'
tolerance row ("router_gemm", "bf16x2_vs_emulation"), then time it with hotpaths.harness.bench (CUDA graph
replay, L2 flushed before each replay, median) beside the best pre-wgmma configuration of the committed dispatch
table (data/dispatch/router_gemm_<tag>.json: the nearest measured M's fastest non-wgmma candidate), in the same run.

Each variant runs in its own subprocess under ``timeout 60`` (a hung kernel cannot eat the device session); the
parent builds the library first, then prints a summary and the targets (hy3: M=4096 < 30 us, M=2048 < 33.4 us).

Usage (repo root, hotpaths importable):   python scripts/gpu_check_router_wgmma.py [--iters 50] [--out DIR]
                                           [--variants ws128n192g,ws128n192r]  (default: every WGMMA_TILES name,
                                           the TMA + mbarrier ws* variants included)
Output: one line per case
    <variant> s=<splits> m=<M> n=<N> k=<K> PASS|FAIL max_abs=<diff vs emulation> us=<median> old=<cfg> <us>
then "SUMMARY" lines (best passing wgmma configuration vs best old per case) and a final line
"RESULT: PASS" (every case of every variant passed, no timeout) or "RESULT: FAIL (...)". Exit code 0 on PASS.
Results are also written as JSON to <out>/router_wgmma_<variant>.json (default scratch/gpu_check_router_wgmma/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MS = (256, 1000, 2048, 4096)
SHAPE_NAMES = ("hy3", "longcat_chat", "longcat_lite", "deepseek_v3")
TARGETS_US = {(4096, 192, 4096): 30.0, (2048, 192, 4096): 33.4}  # hy3: the target / HPC-Ops at M=2048
TIMEOUT_S = 60


def _best_old(m: int, n: int, k: int) -> tuple[str, int]:
    """The fastest pre-wgmma kernel configuration the committed dispatch table measured at the M nearest to m
    (log2) for (N, K); ("auto", 0) when the table or the shape is missing."""
    import math

    from hotpaths.kernels import router_gemm as rg

    path = rg.dispatch_path()
    if not path.exists():
        return "auto", 0
    for shape in json.loads(path.read_text()).get("shapes", []):
        if int(shape["n"]) != n or int(shape["k"]) != k or not shape.get("rows"):
            continue
        row = min(shape["rows"], key=lambda r: (abs(math.log2(int(r["m"])) - math.log2(m)), -int(r["m"])))
        cands = {c: t for c, t in (row.get("candidates_us") or {}).items()
                 if c.split("/")[0] not in rg.WGMMA_TILES and not c.startswith("decode")}
        if cands:
            v, s = min(cands, key=cands.get).split("/")
            return v, int(s)
        kern = row.get("kernel") or {}
        if kern.get("variant") and kern["variant"] not in rg.WGMMA_TILES and not kern["variant"].startswith("decode"):
            return kern["variant"], int(kern["splits"])
    return "auto", 0


def run_variant(variant: str, iters: int, out_dir: Path) -> int:
    """Child: every case of one variant. Returns the number of failed cases."""
    import torch

    from hotpaths.harness.bench import bench
    from hotpaths.harness.check import check
    from hotpaths.harness.tolerances import tolerance
    from hotpaths.kernels import router_gemm as rg
    from hotpaths.reference import router_gemm as ref

    tol = tolerance("router_gemm", "bf16x2_vs_emulation")
    bm, bn, bk = rg.WGMMA_TILES[variant]
    results, failed = [], 0
    for name in SHAPE_NAMES:
        n, k = ref.SHAPES[name]
        if n % bn or k % bk:
            print(f"{variant:<10} n={n:>4} k={k:>5} SKIP (N not a multiple of BN={bn})", flush=True)
            continue
        _, w = ref.make_router_inputs(1, n, k, seed=3, device="cuda")
        weights = rg.plan(w)
        for m in MS:
            x, _ = ref.make_router_inputs(m, n, k, seed=100 + m, device="cuda")
            emu = ref.bf16x2_from_parts(x, weights.w_high, weights.w_low)
            out = torch.empty(m, n, device="cuda")
            ov, os_ = _best_old(m, n, k)
            t_old = bench(lambda: rg.router_gemm(x, weights, impl="bf16x2_kernel", out=out, variant=ov, splits=os_),
                          iters=iters).median_us
            splits = [s for v, s in rg.kernel_candidates(m, n, k) if v == variant] or [1]
            for s in splits:
                rec = {"variant": variant, "splits": s, "m": m, "n": n, "k": k, "old": f"{ov}/{os_}",
                       "old_us": t_old, "us": None, "passed": False, "max_abs": None, "error": None}
                try:
                    got = torch.full((m, n), float("nan"), device="cuda")
                    rg.router_gemm(x, weights, impl="bf16x2_kernel", out=got, variant=variant, splits=s)
                    torch.cuda.synchronize()
                    c = check(got, emu, tol=tol)
                    rec.update(passed=bool(c.passed), max_abs=float(c.max_abs_err), rel_l2=float(c.rel_l2_err),
                               nan=int(c.nan_count))
                    if c.passed:  # time only what is right
                        rec["us"] = bench(lambda: rg.router_gemm(x, weights, impl="bf16x2_kernel", out=out,
                                                                 variant=variant, splits=s), iters=iters).median_us
                except (RuntimeError, ValueError) as e:
                    rec["error"] = str(e)[:300]
                failed += not rec["passed"]
                results.append(rec)
                us = f"{rec['us']:8.2f}" if rec["us"] is not None else "       -"
                mx = f"{rec['max_abs']:.2e}" if rec["max_abs"] is not None else "-"
                extra = f"  rel_l2={rec.get('rel_l2', float('nan')):.2e} nan={rec.get('nan', '-')}" \
                    if not rec["passed"] and rec["error"] is None else ""
                err = f"  ERROR {rec['error']}" if rec["error"] else ""
                print(f"{variant:<10} s={s} m={m:>5} n={n:>4} k={k:>5} {'PASS' if rec['passed'] else 'FAIL'} "
                      f"max_abs={mx} us={us} old={ov}/{os_} {t_old:8.2f}{extra}{err}", flush=True)
    (out_dir / f"router_wgmma_{variant}.json").write_text(json.dumps(results, indent=1) + "\n")
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", help="(internal) run one variant's cases in this process")
    ap.add_argument("--iters", type=int, default=50, help="timed replays per configuration (median)")
    ap.add_argument("--out", default="scratch/gpu_check_router_wgmma", help="folder for the per-variant JSON")
    ap.add_argument("--variants", help="comma-separated subset of WGMMA_TILES to check (default: all)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.variant:
        return 1 if run_variant(args.variant, args.iters, out_dir) else 0

    import torch

    from hotpaths.kernels import _build
    from hotpaths.kernels import router_gemm as rg

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("RESULT: SKIP (needs an SM90 GPU)")
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    t0 = time.time()
    rows = _build.compile_check("router_gemm")  # raises on a build failure or unexplained spills
    for r in rows:
        if "wgmma" in r["kernel"]:
            print(f"ptxas: {r.get('registers')} registers, spills {r.get('spill_stores', 0)}/"
                  f"{r.get('spill_loads', 0)}  {r['kernel'][-60:]}")
    print(f"build ok [{time.time() - t0:.0f} s]", flush=True)

    variants = list(rg.WGMMA_TILES)
    if args.variants:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in variants if v not in rg.WGMMA_TILES]
        if unknown:
            ap.error(f"--variants: unknown {unknown}; expected names from {list(rg.WGMMA_TILES)}")
    bad = []
    for v in variants:
        cmd = ["timeout", str(TIMEOUT_S), sys.executable, os.path.abspath(__file__), "--variant", v,
               "--iters", str(args.iters), "--out", str(out_dir)]
        t = time.time()
        rc = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        status = {0: "ok", 1: "FAIL (wrong results)", 124: f"TIMEOUT after {TIMEOUT_S} s (hung?)"}.get(rc,
                                                                                                   f"CRASH rc={rc}")
        print(f"== {v}: {status} [{time.time() - t:.0f} s]", flush=True)
        if rc:
            bad.append(f"{v}: {status}")

    print("SUMMARY  (m, n, k): best passing wgmma config us | best old config us | speedup")
    recs = []
    for v in variants:
        p = out_dir / f"router_wgmma_{v}.json"
        if p.exists():
            recs += json.loads(p.read_text())
    cases = sorted({(r["m"], r["n"], r["k"]) for r in recs}, key=lambda c: (c[1], c[2], c[0]))
    for case in cases:
        rs = [r for r in recs if (r["m"], r["n"], r["k"]) == case]
        ok = [r for r in rs if r["passed"] and r["us"] is not None]
        old = min(r["old_us"] for r in rs)
        if not ok:
            print(f"SUMMARY {case}: no passing wgmma configuration | old {old:.2f}")
            continue
        b = min(ok, key=lambda r: r["us"])
        tgt = TARGETS_US.get(case)
        note = f"  target < {tgt}: {'MET' if b['us'] < tgt else 'not met'}" if tgt else ""
        print(f"SUMMARY {case}: {b['variant']}/{b['splits']} {b['us']:.2f} | {rs[0]['old']} {old:.2f} | "
              f"{old / b['us']:.2f}x{note}")
    print("RESULT: PASS" if not bad else f"RESULT: FAIL ({'; '.join(bad)})")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
