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


def _arch_flags() -> list[str]:
    try:
        from hotpaths.kernels._build import ARCH_FLAGS

        return list(ARCH_FLAGS)
    except Exception:  # a checkout without the kernels package
        return ["-gencode", "arch=compute_90a,code=sm_90a"]


def nvcc_info() -> dict:
    """The nvcc the kernel build would use: ``{"nvcc": path or None, "nvcc_version": "13.0" or None,
    "nvcc_sm90a": bool}`` (whether nvcc accepts the kernels' sm_90a target flags)."""
    import re
    import shutil

    path = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    out = {"nvcc": path, "nvcc_version": None, "nvcc_sm90a": False}
    if path is None:
        return out
    try:
        ver = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
        m = re.search(r"release (\d+\.\d+)", ver)
        out["nvcc_version"] = m.group(1) if m else None
        # a dry run validates the target without compiling (--list-gpu-arch omits the "a" variants)
        dry = subprocess.run([path, "--dryrun", *_arch_flags(), "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=20)
        out["nvcc_sm90a"] = dry.returncode == 0
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def build_info() -> dict:
    """nvcc_info() plus ``kernels_buildable`` (bool) and ``kernels_build_note``: why not, or what running needs."""
    info = nvcc_info()
    if info["nvcc"] is None:
        note = "no: nvcc not found on PATH or in /usr/local/cuda/bin (install the CUDA toolkit, 12.4+)"
    elif not info["nvcc_sm90a"]:
        note = f"no: nvcc {info['nvcc_version'] or '?'} at {info['nvcc']} cannot target sm_90a (needs CUDA 12.4+)"
    else:
        note = "yes (sm_90a); running them needs an SM90 GPU" + ("" if has_sm90() else ", which this machine lacks")
    info["kernels_buildable"] = info["nvcc"] is not None and info["nvcc_sm90a"]
    info["kernels_build_note"] = note
    return info
