"""What every op's peers share: the CUDA check and the importers of the two measuring bundles that are not on any
package index of the GPU machine (PeerUnavailable itself is hotpaths.harness.peers', re-exported here).

- HPC-Ops (``import hpc``): the folder holding the ``hpc`` package is $HOTPATHS_HPC_OPS_DIR (tools/gpu/peers_env.sh
  exports it), else <repo>/.peers/hpc_ops. Prebuilt for sm_90a + torch 2.11 only: elsewhere the import fails and
  the reason names that.
- FlashInfer 0.7.2 (``import flashinfer``): the folder holding the unpacked package is $HOTPATHS_FLASHINFER_072_DIR,
  else <repo>/.peers/flashinfer-0.7.2; $HOTPATHS_TVM_FFI_DIR (its tvm-ffi dependency) goes on sys.path first.

Both importers raise PeerUnavailable with a reason that a table row can carry; neither raises anything else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hotpaths.harness.peers import PeerUnavailable as PeerUnavailable  # the one class every benchmark catches

FLASHINFER_VERSION = "0.7.2"


def short_error(e: BaseException) -> str:
    """``TypeName: last non-empty line`` of an exception, at most 300 characters of message (for a table note)."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {(lines[-1] if lines else '')[:300]}"


def need_cuda(tensor=None) -> None:
    """Raise PeerUnavailable unless a CUDA GPU is present and ``tensor`` (when given) lives on it."""
    import torch

    if not torch.cuda.is_available():
        raise PeerUnavailable("not available: needs a CUDA GPU (this machine is CPU-only)")
    if tensor is not None and tensor.device.type != "cuda":
        raise PeerUnavailable(f"not available: inputs are on {tensor.device}, the peer times CUDA tensors")


def _repo_root() -> Path:
    from hotpaths.harness.env import REPO_ROOT

    return REPO_ROOT


def hpc_ops_dir() -> Path:
    """$HOTPATHS_HPC_OPS_DIR (the folder holding the ``hpc`` package), else <repo>/.peers/hpc_ops."""
    d = os.environ.get("HOTPATHS_HPC_OPS_DIR")
    return Path(d) if d else _repo_root() / ".peers" / "hpc_ops"


def import_hpc_ops():
    """The ``hpc`` module of HPC-Ops from hpc_ops_dir(). Raises PeerUnavailable (package absent, or its import
    fails: it loads only beside the torch build it was compiled for, on an SM90 GPU machine)."""
    d = hpc_ops_dir()
    if not (d / "hpc" / "__init__.py").exists():
        raise PeerUnavailable(f"not available: no HPC-Ops package at {d}/hpc (set HOTPATHS_HPC_OPS_DIR, e.g. by "
                              "sourcing tools/gpu/peers_env.sh; it is prebuilt for sm_90a + torch 2.11 only)")
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    try:
        import hpc  # type: ignore
    except Exception as e:
        raise PeerUnavailable(f"not available: import hpc failed: {short_error(e)}") from None
    return hpc


def flashinfer_072_dir() -> Path:
    """$HOTPATHS_FLASHINFER_072_DIR (the folder holding the unpacked 0.7.2 ``flashinfer`` package), else
    <repo>/.peers/flashinfer-0.7.2."""
    d = os.environ.get("HOTPATHS_FLASHINFER_072_DIR")
    return Path(d) if d else _repo_root() / ".peers" / f"flashinfer-{FLASHINFER_VERSION}"


def import_flashinfer_072():
    """FlashInfer 0.7.2 from flashinfer_072_dir() in JIT mode (arch 9.0a, JIT caches under /tmp unless set).
    Raises PeerUnavailable (package absent, import failure, or another version found first on sys.path)."""
    d = flashinfer_072_dir()
    if not (d / "flashinfer" / "__init__.py").exists():
        raise PeerUnavailable(f"not available: no FlashInfer {FLASHINFER_VERSION} at {d}/flashinfer (set "
                              "HOTPATHS_FLASHINFER_072_DIR, e.g. by sourcing tools/gpu/peers_env.sh)")
    for p in (os.environ.get("HOTPATHS_TVM_FFI_DIR"), str(d)):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("MAX_JOBS", "16")
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/hotpaths_flashinfer_ws")
    os.environ.setdefault("TVM_FFI_CACHE_DIR", "/tmp/hotpaths_tvm_ffi_cache")
    try:
        import flashinfer  # type: ignore
    except Exception as e:
        raise PeerUnavailable(f"not available: import flashinfer failed: {short_error(e)}") from None
    ver = str(getattr(flashinfer, "__version__", "?"))
    if not ver.startswith(FLASHINFER_VERSION):
        raise PeerUnavailable(f"not available: imported flashinfer {ver} from {getattr(flashinfer, '__file__', '?')}"
                              f", expected {FLASHINFER_VERSION}")
    return flashinfer


def import_peer_attr(module: str, name: str, *, hint: str):
    """``module.name`` of a peer package, imported now. Raises PeerUnavailable naming the module, the error and
    ``hint`` (where to get the package) when the import or the attribute fails."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except Exception as e:
        raise PeerUnavailable(f"not available: import {module}.{name} failed ({short_error(e)}); {hint}") from None


def run_once(call, what: str):
    """Run a peer's ``call()`` once outside capture and timing (JIT builds, plan-time and layout checks happen
    here) and synchronize, so a launch or layout error becomes the row's reason instead of a crash during timing.
    Returns ``call``. Raises PeerUnavailable (the call's own, or ``not available: <what> failed: <error>``)."""
    import torch

    try:
        call()
        torch.cuda.synchronize()
    except PeerUnavailable:
        raise
    except Exception as e:
        raise PeerUnavailable(f"not available: {what} failed: {short_error(e)}") from None
    return call


def make_or_reason(makers: dict, name: str, *args, **kw):
    """``(makers[name](*args, **kw), None)`` or ``(None, reason)``: never raises, so one failing peer becomes a
    table row, not a crash. An unknown name's reason lists the known ones."""
    if name not in makers:
        return None, f"not available: unknown peer {name!r}; known: {', '.join(makers)}"
    try:
        return makers[name](*args, **kw), None
    except PeerUnavailable as e:
        return None, str(e)
    except Exception as e:
        return None, f"not available: {short_error(e)}"
