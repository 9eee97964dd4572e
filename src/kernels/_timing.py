"""The L2 flush and the timed replay loop, shared by the harness bench (hotpaths.harness.bench, which re-exports the
flush API) and by kernels that time candidates themselves (the router's tune-on-first-use): one flush buffer per
device, one flush mode, one loop, so a first-use choice and a table row are timed the same way. It sits below both
because the kernels may not import the harness (tests/test_architecture.py).

Flush modes (``set_flush_mode`` or $HOTPATHS_L2_FLUSH): "write" fills a buffer of 2x the L2 (at least 128 MiB),
which leaves the L2 full of dirty lines; "read" reads it (written once at allocation), which leaves it full of clean
lines. hotpaths.harness.bench's docstring says what each costs the timed kernel.
"""

from __future__ import annotations

import os

FLUSH_MODES = ("read", "write")
DEFAULT_FLUSH_MODE = "write"
_flush_mode = [None]
_flush_buf: dict = {}
_flush_sink: dict = {}


def flush_mode() -> str:
    """The L2 flush in use: set_flush_mode(), else $HOTPATHS_L2_FLUSH, else DEFAULT_FLUSH_MODE. Raises ValueError
    naming the variable for an unknown mode."""
    m = _flush_mode[0] or os.environ.get("HOTPATHS_L2_FLUSH") or DEFAULT_FLUSH_MODE
    if m not in FLUSH_MODES:
        raise ValueError(f"L2 flush mode must be one of {FLUSH_MODES}, got {m!r} (HOTPATHS_L2_FLUSH?)")
    return m


def set_flush_mode(mode: str | None) -> None:
    """Pick the L2 flush ("read" or "write"); None goes back to $HOTPATHS_L2_FLUSH / the default."""
    if mode is not None and mode not in FLUSH_MODES:
        raise ValueError(f"L2 flush mode must be one of {FLUSH_MODES}, got {mode!r}")
    _flush_mode[0] = mode


def l2_flush_buffer(device=None):
    """A uint8 device buffer of 2x the L2 size (at least 128 MiB), allocated and written once per device."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    if dev not in _flush_buf:
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20))
        buf = torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device=dev)
        buf.fill_(1)  # written once, so the "read" flush reads defined memory
        _flush_buf[dev] = buf
        _flush_sink[dev] = torch.empty((), dtype=torch.int64, device=dev)
    return _flush_buf[dev]


def flush_l2(device=None) -> None:
    """Evict the L2 on the current stream (the mode of flush_mode())."""
    import torch

    buf = l2_flush_buffer(device)
    if flush_mode() == "write":
        buf.fill_(1)  # leaves the L2 full of dirty lines of this buffer
    else:
        torch.sum(buf.view(torch.int64), dim=0, out=_flush_sink[buf.device])  # leaves it full of clean lines


def external_events_ok() -> bool:
    """Whether this torch records CUDA events as graph nodes (``Event(external=True)``); an older one cannot, and
    the timers then record on the stream around the replay (the graph launch included: ~1 us more on the H200)."""
    import torch

    try:
        torch.cuda.Event(enable_timing=True, external=True)
    except TypeError:
        return False
    return True


def time_events_in_graph(g, start, end, cold_l2: bool, iters: int) -> list[float]:
    """Replays of graph ``g`` whose first and last nodes record ``start`` and ``end`` around fn: the time from the
    start of fn's first kernel to the end of its last, without the graph launch itself (~1 us of front-end work per
    replay on the H200, paid once per graph in a serving step, not per layer). The events are re-recorded by every
    replay, so each is read before the next (the flush queued ahead keeps the GPU busy past the CPU launch).
    Returns ``iters`` samples in us."""
    samples = []
    for _ in range(iters):
        if cold_l2:
            flush_l2()
        g.replay()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples
