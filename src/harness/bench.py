"""The one timing entry point.

CUDA: ``fn`` is captured once in a CUDA graph; each timed replay is preceded (in the same stream, outside the
timed region) by a write over a buffer twice the L2 size when ``cold_l2`` is set, so every replay starts from a
cold L2 (the policy of the published measurements: L2 flushed before each replay). Start/stop CUDA events bracket
the replay alone; the flush queued ahead keeps the GPU busy so the events time the GPU, not the CPU launch.
Statistic: median with p10/p90 over ``iters`` replays after ``warmup``.
CPU: wall clock around ``fn`` with the same statistics, labelled ``method='cpu_wall'``: not comparable with GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

_flush_buf = {}


@dataclass
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    method: str
    cold_l2: bool

    def as_row(self) -> dict:
        return {"median_us": self.median_us, "p10_us": self.p10_us, "p90_us": self.p90_us}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(samples_us: list[float], method: str, cold: bool) -> Timing:
    return Timing(statistics.median(samples_us), _quantile(samples_us, 0.1), _quantile(samples_us, 0.9),
                  len(samples_us), method, cold)


def l2_flush_buffer(device=None):
    """A device buffer of 2x the L2 size (at least 128 MiB), allocated once per device."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    if dev not in _flush_buf:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
        _flush_buf[dev] = torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device=dev)
    return _flush_buf[dev]


def flush_l2(device=None) -> None:
    l2_flush_buffer(device).fill_(1)  # a write: evicts every line and leaves none dirty for us to pay for


def bench(fn, *, cold_l2: bool = True, graph: bool = True, warmup: int = 10, iters: int = 100) -> Timing:
    """Time ``fn()`` (no arguments; its outputs preallocated). Returns Timing in microseconds.

    graph=True captures fn in a CUDA graph (fn must be capturable: no host syncs, no allocations that vary);
    graph=False times eager calls (CPU launch included: labelled ``eager``).
    """
    import torch

    if not torch.cuda.is_available():
        for _ in range(max(1, warmup // 5)):
            fn()
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return _summary(samples, "cpu_wall", False)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up outside capture: module loads, allocator, lazy init
            fn()
        torch.cuda.synchronize()
        g = None
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                fn()
        run = g.replay if g is not None else fn
        if cold_l2:
            l2_flush_buffer()
        for _ in range(warmup):
            if cold_l2:
                flush_l2()
            run()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            if cold_l2:
                flush_l2()
            starts[i].record(stream)
            run()
            ends[i].record(stream)
        torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    method = ("graph" if graph else "eager") + ("+cold_l2" if cold_l2 else "+warm_l2")
    return _summary(samples, method, cold_l2)


def timing_floor(n_kernels: int = 1, *, iters: int = 200) -> Timing | None:
    """Event-timed graph replay of ``n_kernels`` trivial kernels after an L2 flush: the floor under any result."""
    import torch

    if not torch.cuda.is_available():
        return None
    x = torch.zeros(1, device="cuda")

    def fn():
        for _ in range(n_kernels):
            x.add_(1)
    return bench(fn, iters=iters)
