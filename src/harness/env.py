"""Device facts: the device tag used in folder names, versions, and the SM90 test gate."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

from hotpaths.reference.common import device_tag, sm90_skip_reason  # noqa: F401  (re-exported for the harness)

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def has_sm90() -> bool:
    """True when the current CUDA device is compute capability 9.0 (Hopper: H100/H200/H20)."""
    if not has_cuda():
        return False
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


def requires_sm90():
    """A ``pytest.mark.skipif`` that skips GPU tests without SM90, with the reason."""
    import pytest

    reason = sm90_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) if rev else "unknown"
    except Exception:
        return os.environ.get("HOTPATHS_GIT_REV", "unknown")


def device_info() -> dict:
    """Device, versions and the things a table row needs to be reproducible."""
    info = {"python": platform.python_version(), "platform": platform.platform(), "git_revision": git_revision()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if has_cuda():
            p = torch.cuda.get_device_properties(0)
            info.update(device=torch.cuda.get_device_name(), device_tag=device_tag(), sm_count=p.multi_processor_count,
                        capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                        l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
                info["driver"] = out or None
            except Exception:
                info["driver"] = None
        else:
            info.update(device="cpu", device_tag="cpu")
    except ImportError:
        info.update(torch=None, device="cpu", device_tag="cpu")
    return info
