"""What every peer adapter shares (the adapters themselves live beside each op's benchmark: hotpaths.bench.<op>_peers).

A peer is something a reader would run instead of our kernel (a library, a PyTorch sequence); its adapter returns
a capturable ``fn()`` or raises ``PeerUnavailable(reason)``, and the benchmark records the reason in the table
instead of failing.
"""

from __future__ import annotations


class PeerUnavailable(RuntimeError):
    """A peer cannot run here; ``str(e)`` is the reason recorded in the table."""
