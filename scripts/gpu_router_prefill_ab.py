"""A/B of router GEMM prefill configurations in one process (hy3: N=192, K=4096; M = 1024, 2048, 4096).

Usage (GPU machine, hotpaths importable): python scripts/gpu_router_prefill_ab.py [--configs ws128n192g/4,...]
    [--out DIR]
Each configuration runs into a NaN-poisoned output and is checked against the BF16x2 emulation, then timed with
hotpaths.harness.bench (CUDA graph, events inside it, L2 flushed before each replay, median of 40). Writes
router_prefill_ab.txt / .json to --out. (An earlier form of this script A/B'd an L2 prefetch of the x tiles, run
per process through an environment switch: no gain at any distance, data/profiles/h200/router_prefetch_ab.txt.)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

CONFIGS = "ws128n192g/4,ws128n192g/8,ws128n192m2g/4,ws128n192m2g/8,ws128n192/2,wg128n96/2,wg128n192/4"
MS = (1024, 2048, 4096)


def main() -> None:
    import torch

    from hotpaths.harness.bench import bench
    from hotpaths.harness.check import check
    from hotpaths.kernels import router_gemm as rg
    from hotpaths.reference import router_gemm as ref

    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/router_prefill_ab"))
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfgs = [(c.split("/")[0], int(c.split("/")[1])) for c in a.configs.split(",")]
    g = torch.Generator().manual_seed(0)
    w = rg.plan((torch.randn(192, 4096, generator=g) * 0.02).cuda())
    rows, lines = [], []
    for m in MS:
        x = torch.randn(m, 4096, generator=g).to(torch.bfloat16).cuda()
        emu = ref.bf16x2_from_parts(x, w.w_high, w.w_low)
        for v, s in cfgs:
            out = torch.full((m, 192), float("nan"), device="cuda")
            try:
                rg.router_gemm(x, w, impl="bf16x2_kernel", out=out, variant=v, splits=s)
                torch.cuda.synchronize()
                ok = check(out, emu, op="router_gemm", path="bf16x2_vs_emulation").passed
                t = bench(lambda: rg.router_gemm(x, w, impl="bf16x2_kernel", out=out, variant=v, splits=s),
                          iters=40)
            except Exception as e:  # noqa: BLE001 - report and go on
                lines.append(f"{m:5d} {v}/{s}: ERROR {type(e).__name__}: {e}")
                continue
            rows.append(dict(m=m, cfg=f"{v}/{s}", us=t.median_us, p10=t.p10_us, p90=t.p90_us, passed=ok))
            lines.append(f"{m:5d} {v + '/' + str(s):16s} {t.median_us:7.1f} us (p10 {t.p10_us:.1f} p90 "
                         f"{t.p90_us:.1f}) pass={ok}")
            print(lines[-1], flush=True)
    (out_dir / "router_prefill_ab.txt").write_text("\n".join(lines) + "\n")
    (out_dir / "router_prefill_ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
