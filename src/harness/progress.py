"""Progress bars for long sweeps: one tick per case, on stderr, only for a person watching a terminal.

Benchmark loops wrap their per-case iterable in ``progress(...)``; the bar is off when stderr is not a terminal
(pipes, CI logs, notebooks under papermill) or when the command got ``--quiet``, so ``--json`` output and tables
are never interleaved with it.
"""

from __future__ import annotations

import sys

QUIET = False  # set by the CLI's --quiet


def enabled() -> bool:
    try:
        return not QUIET and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


def progress(iterable, *, desc: str, total: int | None = None, unit: str = "case"):
    """``iterable`` itself when progress is off, else a tqdm bar over it (on stderr, cleared when done)."""
    if not enabled():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience
        return iterable
    if total is None:
        try:
            total = len(iterable)
        except TypeError:
            total = None
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
