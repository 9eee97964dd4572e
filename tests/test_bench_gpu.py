"""GPU tests of the timing harness (hotpaths.harness.bench; skipped without an SM90 GPU, with the reason)."""

from __future__ import annotations

import pytest
import torch

from hotpaths.harness.env import requires_sm90

pytestmark = [pytest.mark.gpu, requires_sm90()]


@pytest.mark.parametrize("events", ["graph", "stream"])
def test_bench_captures_fn_once_and_replays_it(events):
    """fn runs 3 times eagerly (lazy init) and is captured once: the graph replayed for the warm-up is the one timed
    (with events="graph" its first and last nodes are the timing events); every warm-up and timed replay runs fn's
    kernel (the counter it increments says so)."""
    from hotpaths.harness.bench import bench

    x = torch.zeros(1 << 20, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        x.add_(1.0)

    t = bench(fn, warmup=3, iters=20, events=events)
    torch.cuda.synchronize()
    assert len(calls) == 4
    assert float(x[0]) == 3 + 3 + 20
    assert t.median_us > 0 and t.p10_us <= t.median_us <= t.p90_us
    assert t.method.startswith("graph(events in graph)+cold_l2" if events == "graph" else "graph+cold_l2")


def test_events_in_graph_leave_the_graph_launch_out():
    """The same one-kernel graph timed both ways in one process: events inside the graph give the smaller span
    (the graph launch, ~1 us on the H200, is outside it)."""
    from hotpaths.harness.bench import bench

    x = torch.zeros(1024, device="cuda")
    inner = bench(lambda: x.add_(1.0), iters=100).median_us
    outer = bench(lambda: x.add_(1.0), iters=100, events="stream").median_us
    assert 0 < inner < outer
