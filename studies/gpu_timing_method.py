"""Which timing method gives which floor: graph replay after a flush with the events on the stream around the
replay, eager launches after the same flush, and (the harness default since session 3) a graph whose own
event-record nodes bracket the work (the graph launch itself outside the timed span). For 1 and 3 trivial kernels and a 3 MB copy, both flush modes.

Usage (GPU machine): PYTHONPATH=<dir with hotpaths -> src> python studies/gpu_timing_method.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from hotpaths.harness import bench as B


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/timing_method"))
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(1, device="cuda")
    a3, b3 = torch.randn(3 << 18, device="cuda"), torch.empty(3 << 18, device="cuda")

    def three():
        for _ in range(3):
            x.add_(1)
    jobs = {"1 trivial": lambda: x.add_(1), "3 trivial": three, "copy 3 MB": lambda: b3.copy_(a3)}
    lines = []
    for mode in ("write", "read"):
        B.set_flush_mode(mode)
        for name, fn in jobs.items():
            g = B.bench(fn, iters=200, events="stream").median_us
            eg = B.bench(fn, graph=False, iters=200).median_us
            ig = B.bench(fn, iters=200).median_us
            line = (f"flush={mode:5s} {name:10s} graph {g:6.2f} us  eager {eg:6.2f} us  "
                    f"events-inside-graph {ig:.2f} us")
            print(line, flush=True)
            lines.append(line)
    B.set_flush_mode(None)
    (out_dir / "timing_method.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
