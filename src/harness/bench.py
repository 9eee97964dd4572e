"""The one timing entry point.

CUDA: ``fn`` is captured once in a CUDA graph; each timed replay is preceded (in the same stream, outside the
timed region) by an L2 flush over a buffer twice the L2 size when ``cold_l2`` is set, so every replay starts from a
cold L2 (the policy of the published measurements: L2 flushed before each replay). Start/stop CUDA events bracket
the work alone: they are nodes of the graph itself (first and last), so the graph launch (~1 us of GPU front-end
work per replay) is outside the timed span, as it is for every layer but the first in a serving step's graph;
with an older torch (no external events) they are recorded on the stream around the replay instead. The flush
queued ahead keeps the GPU busy so the events time the GPU, not the CPU launch. Events inside the graph give the
same floors the published decode targets state; events on the stream around the replay add about 1 us to each
(notebook 00, section 3b, has the H200 numbers of both).
Flush modes (``set_flush_mode`` or $HOTPATHS_L2_FLUSH): "write" fills the buffer, which leaves the L2 full of
*dirty* lines, so the timed kernel also pays for writing up to an L2's worth of someone else's data back to DRAM
as its reads evict them; "read" reads the buffer (written once at allocation), which leaves the L2 full of clean
lines: the data the kernel needs is still not in L2, and evicting what is costs nothing.
Statistic: median with p10/p90 over ``iters`` replays after ``warmup``.
CPU: wall clock around ``fn`` with the same statistics, labelled ``method='cpu_wall'``: not comparable with GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

# The flush and the in-graph event loop live below the harness so that the kernels' own timers share them
# (hotpaths.kernels._timing); re-exported here as the harness API.
from hotpaths.kernels._timing import (
    DEFAULT_FLUSH_MODE,
    FLUSH_MODES,
    flush_l2,
    flush_mode,
    l2_flush_buffer,
    set_flush_mode,
)
from hotpaths.kernels._timing import external_events_ok as _external_events_ok
from hotpaths.kernels._timing import time_events_in_graph as _time_events_in_graph

__all__ = ["DEFAULT_FLUSH_MODE", "FLUSH_MODES", "Timing", "bench", "flush_l2", "flush_mode", "l2_flush_buffer",
           "read_probe", "read_probe_columns", "set_flush_mode", "timing_floor"]


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


def bench(fn, *, cold_l2: bool = True, graph: bool = True, warmup: int = 10, iters: int = 100,
          events: str = "graph") -> Timing:
    """Time ``fn()`` (no arguments; its outputs preallocated). Returns Timing in microseconds.

    graph=True captures fn in a CUDA graph (fn must be capturable: no host syncs, no allocations that vary);
    graph=False times eager calls (CPU launch included: labelled ``eager``).
    events (graph=True): "graph" (default) records the start/stop events as nodes inside the graph, "stream" around
    the replay on the stream (the graph launch included: ~1 us more on the H200).
    """
    if events not in ("graph", "stream"):
        raise ValueError(f"events must be 'graph' or 'stream', got {events!r}")
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

    # events == "graph": the start/stop events are the first and last nodes of the one graph that is captured (and
    # also replayed for the warm-up): the span leaves the graph launch out.
    inner = graph and events == "graph" and _external_events_ok()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up outside capture: module loads, allocator, lazy init
            fn()
        torch.cuda.synchronize()
        g = start = end = None
        if graph:
            if inner:
                start = torch.cuda.Event(enable_timing=True, external=True)
                end = torch.cuda.Event(enable_timing=True, external=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                if inner:
                    start.record(stream)
                fn()
                if inner:
                    end.record(stream)
        run = g.replay if g is not None else fn
        if cold_l2:
            l2_flush_buffer()
        for _ in range(warmup):
            if cold_l2:
                flush_l2()
            run()
        torch.cuda.synchronize()
        if inner:
            samples = _time_events_in_graph(g, start, end, cold_l2, iters)
            torch.cuda.current_stream().wait_stream(stream)
            return _summary(samples, "graph(events in graph)+" + (f"cold_l2({flush_mode()})" if cold_l2
                                                                       else "warm_l2"), cold_l2)
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
    method = ("graph" if graph else "eager") + (f"+cold_l2({flush_mode()})" if cold_l2 else "+warm_l2")
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


_read_bufs: dict = {}


def read_probe(nbytes: int, *, iters: int = 50) -> Timing | None:
    """The read probe: time to read ``nbytes`` once from HBM after the same L2 flush ``bench`` uses, measured the
    same way (graph replay, events inside the graph, median). It answers "how fast can anything read these bytes
    under this timing convention": a memory-bound kernel's time over this is its ``pct_of_read_probe``.

    The read is ``torch.sum`` over an int64 view of a buffer of ``nbytes`` (rounded up to 8), cached per size for the
    process. None without a CUDA device or for nbytes <= 0.
    """
    import torch

    if not torch.cuda.is_available() or nbytes <= 0:
        return None
    n = -(-int(nbytes) // 8)
    key = (torch.cuda.current_device(), n)
    if key not in _read_bufs:
        buf = torch.ones(n, dtype=torch.int64, device="cuda")
        _read_bufs[key] = (buf, torch.empty((), dtype=torch.int64, device="cuda"))
    buf, sink = _read_bufs[key]
    return bench(lambda: torch.sum(buf, dim=0, out=sink), iters=iters)


def read_probe_columns(median_us: float | None, nbytes: int, *, probe: Timing | None = None) -> dict:
    """``{"read_probe_us", "pct_of_read_probe"}`` for a row whose kernel read ``nbytes`` in ``median_us``
    (100 = as fast as the probe; None where either time is missing). Pass ``probe`` to reuse a measurement."""
    probe = probe if probe is not None else (read_probe(nbytes) if median_us is not None else None)
    if probe is None or median_us is None or median_us <= 0:
        return {"read_probe_us": None if probe is None else probe.median_us, "pct_of_read_probe": None}
    return {"read_probe_us": probe.median_us, "pct_of_read_probe": 100.0 * probe.median_us / median_us}
