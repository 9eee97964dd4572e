"""Tune on first use: the router GEMM's dispatch for a shape the committed table does not hold.

The committed dispatch table (data/dispatch/router_gemm_<device>.json) covers the router shapes of
data/shapes/router_gemm.yaml at the M sweep. For any other (N, K), the first call at an M bucket (the next power of
two >= M) times every candidate on this device -- the kernel configurations of ``kernel_candidates`` at the
bucket's M (the largest M of the bucket, so a configuration that fits it fits every M below) and FP32 cuBLAS --
with the caller's timer (the kernel package passes one that times as the bench does: graph replay, L2 flushed,
median), times the leaders a second time (CONFIRM_MARGIN, CONFIRM_MAX), keeps the fastest that passes the accuracy
gate, and caches the choice per device in a JSON file ($HOTPATHS_CACHE_DIR, else ~/.cache/hotpaths;
``router_gemm_<device-tag>.json``) that records the timing METHOD: a file timed another way is retuned. FP32 cuBLAS
is always a candidate, so a tuned choice is never slower than it was measured to be.

Capture safety: nothing is tuned while the current stream is being captured into a CUDA graph (timing would launch
work into the graph); such a call returns None and the caller falls back to the built-in heuristic, and the next
eager call tunes. Tuning is off unless enabled (``HOTPATHS_ROUTER_TUNE_ON_FIRST_USE=1`` or
``hotpaths.kernels.router_gemm.set_tune_on_first_use(True)``, which ``hotpaths router --tune-on-first-use`` calls);
cached choices are used whether or not tuning is enabled.

This module holds the logic only (no CUDA, no kernel import): the candidates, the runner, the timer, the accuracy
gate and the capture test are passed in, so the CPU tests drive it with fakes.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "HOTPATHS_CACHE_DIR"
ENABLE_ENV = "HOTPATHS_ROUTER_TUNE_ON_FIRST_USE"
CUBLAS = "fp32_cublas"
# The two-part weight through one cuBLAS BF16 GEMM: timed beside the kernels and FP32 cuBLAS, gated like the kernels.
BF16X2_CUBLAS = "bf16x2_cublas"
# How candidates are timed. Stored in the cache file: entries timed another way (an older build's eager launches)
# are dropped and retuned, since their order can be wrong (docs/ops/router_gemm_dispatch.md).
METHOD = ("graph replay, events in the graph, L2 flushed before each replay, median; leaders within "
          "CONFIRM_MARGIN re-timed, ranked by the mean of both medians")
# The second pass: the candidates within this fraction of the fastest (at most CONFIRM_MAX) are timed again and
# ranked by the mean of their two medians, so one lucky median does not decide a choice that is cached for good.
CONFIRM_MARGIN = 0.10
CONFIRM_MAX = 4


def cache_dir() -> Path:
    """$HOTPATHS_CACHE_DIR, else ~/.cache/hotpaths."""
    d = os.environ.get(CACHE_ENV)
    return Path(d) if d else Path.home() / ".cache" / "hotpaths"


def m_bucket(m: int) -> int:
    """The power of two >= m the choice for m is tuned and cached at (1, 2, 4, ..., 4096, 8192 ...).
    Raises ValueError for m < 1."""
    if m < 1:
        raise ValueError(f"m: expected >= 1, got {m}")
    return 1 << (int(m) - 1).bit_length()


@dataclass(frozen=True)
class Choice:
    """What dispatch runs: impl "bf16x2_kernel" (with variant, splits), or "fp32_cublas" / "bf16x2_cublas"
    (variant "", splits 0)."""

    impl: str
    variant: str = ""
    splits: int = 0


class FirstUseTuner:
    """Per-device cache of tuned choices by (N, K, M bucket), filled on first use.

    candidates(m, n, k) -> [(variant, splits)]: kernel configurations to time (FP32 cuBLAS is added).
    run(choice, m, n, k, ctx) -> callable: a no-argument launch of that choice on tuning inputs of M = m (built
        once per tuning, outside the timing), returning the output; it may raise (ValueError / RuntimeError: the
        choice cannot run, recorded and skipped).
    timer(fn) -> float: microseconds per launch of fn.
    gate(out, m, n, k, ctx) -> str | None: None when the output passes the accuracy gate, else the reason.
    is_capturing() -> bool: whether the current stream is being captured (no tuning then).
    method: how timer() times (stored in the file; a file written under another method is ignored and rewritten).
    extra_impls: impls other than the kernel and FP32 cuBLAS timed as candidates (gated like the kernels).
    """

    def __init__(self, path: Path, *, candidates: Callable, run: Callable, timer: Callable, gate: Callable,
                 is_capturing: Callable[[], bool], enabled: bool | None = None, method: str = METHOD,
                 extra_impls: tuple[str, ...] = (BF16X2_CUBLAS,)):
        self.path = Path(path)
        self.extra_impls = tuple(extra_impls)
        self.method = method
        self.candidates, self.run, self.timer, self.gate = candidates, run, timer, gate
        self.is_capturing = is_capturing
        self.enabled = (os.environ.get(ENABLE_ENV, "") not in ("", "0")) if enabled is None else bool(enabled)
        self._entries: dict | None = None
        self._lock = threading.Lock()
        self.tunings = 0  # how many (N, K, bucket) were tuned by this object (tests, logs)

    @staticmethod
    def key(n: int, k: int, m: int) -> str:
        return f"n{n}_k{k}_m{m_bucket(m)}"

    def _load(self) -> dict:
        if self._entries is None:
            try:
                data = json.loads(self.path.read_text())
                # choices timed by another method are not trusted: start empty, the file is rewritten
                self._entries = dict(data.get("entries", {})) if data.get("method") == self.method else {}
            except (OSError, ValueError, AttributeError):  # absent or unreadable: start empty (rewritten)
                self._entries = {}
        return self._entries

    def cached(self, m: int, n: int, k: int) -> Choice | None:
        """The cached choice for (N, K, bucket of M), or None. Never tunes."""
        e = self._load().get(self.key(n, k, m))
        return Choice(e["impl"], e.get("variant", ""), int(e.get("splits", 0))) if e else None

    def choose(self, m: int, n: int, k: int, ctx=None) -> Choice | None:
        """The cached choice; else, when enabled and not capturing, tune now (and cache); else None. ``ctx`` is
        handed to run() and gate() (the caller's weights)."""
        c = self.cached(m, n, k)
        if c is not None or not self.enabled or self.is_capturing():
            return c
        with self._lock:
            c = self.cached(m, n, k)
            return c if c is not None else self._tune(m, n, k, ctx)

    def _tune(self, m: int, n: int, k: int, ctx) -> Choice:
        mb = m_bucket(m)
        cands = [Choice("bf16x2_kernel", v, int(s)) for v, s in self.candidates(mb, n, k)] + \
            [Choice(i) for i in self.extra_impls] + [Choice(CUBLAS)]
        times: dict[str, float] = {}
        failed: dict[str, str] = {}
        fns: dict[str, Callable] = {}
        for c in cands:
            name = _name(c)
            try:
                fn = self.run(c, mb, n, k, ctx)
                why = self.gate(fn(), mb, n, k, ctx) if c.impl != CUBLAS else None
                if why:
                    failed[name] = why
                    continue
                times[name] = float(self.timer(fn))
                fns[name] = fn
            except (RuntimeError, ValueError) as e:
                failed[name] = f"{type(e).__name__}: {str(e)[:160]}"
        if CUBLAS not in times:
            raise RuntimeError(f"router GEMM tune on first use: FP32 cuBLAS failed at M={mb}, N={n}, K={k}: "
                               f"{failed.get(CUBLAS)}")
        confirm = self._confirm(times, fns, failed)
        rank = {c: (t + confirm[c]) / 2 if c in confirm else t for c, t in times.items()}
        best = min(rank, key=rank.get)
        choice = next(c for c in cands if _name(c) == best)
        entry = {"impl": choice.impl, "variant": choice.variant, "splits": choice.splits, "m_bucket": mb,
                 "us": round(rank[best], 3), "fp32_cublas_us": round(rank[CUBLAS], 3),
                 "candidates_us": {c: round(t, 3) for c, t in sorted(times.items(), key=lambda kv: kv[1])},
                 "confirm_us": {c: round(t, 3) for c, t in sorted(confirm.items(), key=lambda kv: kv[1])}}
        if failed:
            entry["failed"] = failed
        self._load()[self.key(n, k, m)] = entry
        self.tunings += 1
        self._save()
        return choice

    def _confirm(self, times: dict[str, float], fns: dict[str, Callable], failed: dict[str, str]) -> dict:
        """The second timing of the leaders: every candidate within CONFIRM_MARGIN of the fastest first-pass
        median (the CONFIRM_MAX fastest), and FP32 cuBLAS whenever it is within the margin, timed again. A
        leader that raises now is dropped from the ranking (moved to ``failed``); cuBLAS keeps its first time."""
        best = min(times.values())
        leaders = [c for c in sorted(times, key=times.get) if times[c] <= best * (1 + CONFIRM_MARGIN)]
        again = leaders[:CONFIRM_MAX] + ([CUBLAS] if CUBLAS in leaders[CONFIRM_MAX:] else [])
        out: dict[str, float] = {}
        for c in again:
            try:
                out[c] = float(self.timer(fns[c]))
            except (RuntimeError, ValueError) as e:
                if c != CUBLAS:
                    failed[c] = f"{type(e).__name__} on re-timing: {str(e)[:160]}"
                    del times[c]
        return out

    def _save(self) -> None:
        """Write the cache atomically (a temporary file renamed over it): a concurrent reader sees the old or the
        new file, never half of one. An unwritable folder keeps the choices in memory only."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = {"op": "router_gemm", "method": self.method,
                    "rule": "fastest of kernel_candidates at the M bucket (next power of two) and FP32 cuBLAS, "
                            "accuracy-gated; tuned on first use", "entries": self._entries}
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            pass


def _name(c: Choice) -> str:
    return f"{c.variant}/{c.splits}" if c.impl == "bf16x2_kernel" else c.impl
