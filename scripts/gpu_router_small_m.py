"""The router GEMM at decode sizes (M <= 48) against the floors that bound it, in one process.

Usage (GPU machine, hotpaths importable): python scripts/gpu_router_small_m.py [--out DIR] [--ms 1,8,48]
    [--configs decode_c16w8,decode_w8,...]
1. Floors, each timed like every table here (CUDA-graph replay, events inside, L2 flushed before each replay):
   one trivial kernel; one SM-driven read of the weight's bytes (torch.sum over N x K x 2 parts of BF16: the 3.1 MB
   the kernel must read); one SM-driven copy of them (the repo's streaming probe kernel: read + write).
2. The decode configurations at each M, each checked against the BF16x2 emulation on a NaN-poisoned output first.
   (The fifth session ran this with a switch HP_ROUTER_DECODE_PUSH between the pulled and the pushed cluster
   reduction, since removed: data/profiles/h200/router_small_m_session5.txt.)
Writes router_small_m.txt / .json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    import torch

    from hotpaths.harness.bench import bench, timing_floor
    from hotpaths.harness.check import check
    from hotpaths.kernels import router_gemm as rg
    from hotpaths.kernels.probe import probe_copy
    from hotpaths.reference import router_gemm as ref

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/router_small_m"))
    ap.add_argument("--ms", default="1,8,48")
    ap.add_argument("--configs", default="decode_c16w8,decode_w8,decode_c16")
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n, k = 192, 4096
    lines, rows = [], []

    def say(s: str) -> None:
        lines.append(s)
        print(s, flush=True)

    _, w = ref.make_router_inputs(1, n, k, seed=0)
    weights = rg.plan(w.cuda())
    both = torch.cat([weights.w_high.flatten(), weights.w_low.flatten()])  # the 3.1 MB the kernel reads
    sink = torch.empty((), dtype=torch.float32, device="cuda")
    dst = torch.empty_like(both)
    floors = {"trivial_kernel": timing_floor(1).median_us,
              "read_weight_bytes": bench(lambda: torch.sum(both, dim=0, dtype=torch.float32, out=sink)).median_us,
              "copy_weight_bytes": bench(lambda: probe_copy(dst, both)).median_us}
    say(f"floors after an L2 flush ({both.numel() * 2 / 1e6:.2f} MB): " +
        ", ".join(f"{k_} {v:.2f} us" for k_, v in floors.items()))
    rows.append({"floors_us": floors, "weight_bytes": both.numel() * 2})
    for m in (int(s) for s in a.ms.split(",")):
        x, _ = ref.make_router_inputs(m, n, k, seed=1 + m)
        x = x.cuda()
        emu = ref.bf16x2_from_parts(x, weights.w_high, weights.w_low)
        out = torch.empty(m, n, device="cuda")
        for v in a.configs.split(","):
            for rep in range(2):
                try:
                    got = torch.full((m, n), float("nan"), device="cuda")
                    rg.router_gemm(x, weights, impl="bf16x2_kernel", out=got, variant=v)
                    torch.cuda.synchronize()
                    ok = check(got, emu, op="router_gemm", path="bf16x2_vs_emulation").passed
                    t = bench(lambda: rg.router_gemm(x, weights, impl="bf16x2_kernel", out=out, variant=v), iters=100)
                    say(f"M={m:3d} {v:14s} run {rep}  {t.median_us:6.2f} us (p10 {t.p10_us:.2f} p90 {t.p90_us:.2f})"
                        f"  pass={ok}")
                    rows.append({"m": m, "variant": v, "run": rep, "us": t.median_us, "passed": ok})
                except Exception as e:  # noqa: BLE001 - report and go on
                    say(f"M={m:3d} {v:14s} run {rep}  ERROR {type(e).__name__}: {e}")
    (out_dir / "router_small_m.txt").write_text("\n".join(lines) + "\n")
    (out_dir / "router_small_m.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
