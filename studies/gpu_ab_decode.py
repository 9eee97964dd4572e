"""A/B timing of the split-KV decode attention variants on one GPU, in one process (same inputs, same run).

Usage (repo root, GPU machine): PYTHONPATH=<dir with hotpaths -> src> python studies/gpu_ab_decode.py \
    [--variants v2,v3,...] [--kv fp8,bf16] [--cases "64x4K;1x128K+31x4K"] [--min-tiles 2] [--iters 50] [--out DIR]
Per (kv dtype, case, variant): correctness against the exact fp32 reference on the same quantized inputs (output
NaN-poisoned before the first launch; rel L2 within the tolerance table), then the median of CUDA-graph replays with
L2 flushed before each (attention + combine, as in notebook 02), GB/s and the fraction of the copy ceiling measured
in the same run, and the ratio to the first variant. Also assign alone and the 1- and 3-kernel timing floors.
Writes ab_decode.json and ab_decode.txt under --out.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from _log import Log  # noqa: I001 (a sibling module of the studies)

from hotpaths.harness.bench import bench, timing_floor
from hotpaths.harness.check import check
from hotpaths.harness.shapes import expand_lengths, parse_cases
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R

CASES = "64x0.5K;64x4K;32x0.125K+32x4K;2x32K+30x4K;1x64K+15x4K;1x128K+31x4K;1x16K+15x64;1x64K+7x4K;1x64K+31x4K"


def copy_ceiling_gbps(nbytes: int = 1 << 30) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a), graph=False, iters=10, warmup=3)
    return 2 * nbytes / (t.median_us * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="v2,v3,v3s3c3,v3s5,v3s2c4",
                    help="comma-separated plan variants, each optionally ':fuseN' (v3 fused-merge bound)")
    ap.add_argument("--kv", default="fp8")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--min-tiles", type=int, default=K.DEFAULT_MIN_TILES)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/ab_decode"))
    a = ap.parse_args()
    variants = a.variants.split(",")
    log = Log(a.out)
    out_dir, say = log.out_dir, log.say

    f1, f3 = timing_floor(1), timing_floor(3)
    ceil = copy_ceiling_gbps()
    say(f"{torch.cuda.get_device_name()} floor1 {f1.median_us:.2f} us floor3 {f3.median_us:.2f} us "
        f"copy ceiling {ceil:.0f} GB/s (torch eager copy); min_tiles {a.min_tiles}")
    rows = []
    for kv in a.kv.split(","):
        for case in a.cases.split(";"):
            lens = expand_lengths(parse_cases(case))
            inp = R.make_decode_inputs(lens, kv_dtype=kv, device="cuda", seed=0)
            ref = R.split_kv_decode_ref(**inp)
            nbytes = sum(lens) * inp["k_cache"].shape[2] * inp["k_cache"].shape[3] * inp["k_cache"].element_size() * 2
            base = None
            for v in variants:  # "name" or "name:fuseN" (v3 fused-merge bound)
                name, _, fz = v.partition(":fuse")
                p = K.plan(inp["kv_lens"], num_kv_heads=inp["k_cache"].shape[2], q_heads=inp["q"].shape[1],
                           min_tiles=a.min_tiles, variant=name, fuse_max=int(fz) if fz else None,
                           kv_dtype=inp["k_cache"].dtype)
                out = torch.full_like(inp["q"], float("nan"), dtype=torch.bfloat16)
                args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
                kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out)
                try:
                    K.run(*args, **kw)
                    torch.cuda.synchronize()
                    c = check(out, ref, op="split_kv_decode", path=kv + "_vs_exact")
                    t = bench(lambda: K.run(*args, check_inputs=False, **kw), iters=a.iters, warmup=5)
                    ta = bench(lambda: K.assign_only(p), iters=a.iters, warmup=5)
                except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                    say(f"{kv} {case} {v} ERROR {type(e).__name__}: {e}")
                    continue
                us = t.median_us
                base = us if base is None else base
                gbps = nbytes / (us * 1e3)
                row = dict(kv=kv, case=case, variant=v, us=us, p10=t.p10_us, p90=t.p90_us, assign_us=ta.median_us,
                           gbps=gbps, frac_copy=gbps / ceil, ratio_to_first=us / base, passed=c.passed,
                           rel_l2=c.rel_l2_err, max_abs=c.max_abs_err, num_ctas=p.num_ctas, mbytes=nbytes / 2**20)
                rows.append(row)
                say(f"{kv:4s} {case:16s} {v:7s} {us:7.1f} us (p10 {t.p10_us:.1f} p90 {t.p90_us:.1f}) "
                    f"{gbps:6.0f} GB/s {100 * gbps / ceil:4.0f}% x{us / base:.3f} assign {ta.median_us:.1f} "
                    f"pass={c.passed} rel={c.rel_l2_err:.2e} C={p.num_ctas}")
            del inp, ref
    (out_dir / "ab_decode.json").write_text(json.dumps(dict(floor1_us=f1.median_us, floor3_us=f3.median_us,
                                                            copy_gbps=ceil, min_tiles=a.min_tiles, rows=rows), indent=1))
    log.write("ab_decode.txt")


if __name__ == "__main__":
    main()
