"""Which timing method gives which floor: the harness bench (graph replay after a flush, events on the stream),
eager launches after the same flush, and a graph whose own event-record nodes bracket the work (the graph launch
itself outside the timed span). For 1 and 3 trivial kernels and a 3 MB copy, both flush modes.

Usage (GPU machine): PYTHONPATH=<dir with hotpaths -> src> python scripts/gpu_timing_method.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from hotpaths.harness import bench as B


def in_graph_events(fn, iters: int = 100) -> float | None:
    """Median us between event-record nodes captured inside the graph around fn (flush outside, queued ahead)."""
    try:
        s, e = torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True, external=True)
    except TypeError:
        return None
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            s.record(stream)
            fn()
            e.record(stream)
        out = []
        for _ in range(iters):
            B.flush_l2()
            g.replay()
            torch.cuda.synchronize()  # the events are re-recorded by every replay: read them each time
            out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)


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
            g = B.bench(fn, iters=200).median_us
            eg = B.bench(fn, graph=False, iters=200).median_us
            ig = in_graph_events(fn)
            line = (f"flush={mode:5s} {name:10s} graph {g:6.2f} us  eager {eg:6.2f} us  "
                    f"events-inside-graph {ig if ig is None else round(ig, 2)} us")
            print(line, flush=True)
            lines.append(line)
    B.set_flush_mode(None)
    (out_dir / "timing_method.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
