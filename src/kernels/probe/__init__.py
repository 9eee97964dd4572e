"""The bandwidth probe: the smallest kernel that proves the build path (used by notebook 00)."""

from __future__ import annotations

import ctypes

from hotpaths.kernels import _build

OP = "probe"


def _lib():
    lib = _build.load(OP)
    lib.hp_probe_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p]
    lib.hp_probe_copy.restype = ctypes.c_int
    return lib


def probe_copy(dst, src, *, grid: int | None = None, pdl: bool = False):
    """Copy ``src`` into ``dst`` with the hand-written streaming kernel, on the current stream.

    Shape/Dtype: src, dst: any shape and dtype, same number of bytes, contiguous, on one CUDA device,
    16-byte aligned. Returns dst.
    Raises ValueError on a device, size, contiguity or alignment mismatch.
    """
    import torch

    for name, t in (("src", src), ("dst", dst)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got {getattr(t, 'device', type(t))}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: expected 16-byte alignment, data_ptr % 16 = {t.data_ptr() % 16}")
    nbytes = src.numel() * src.element_size()
    if dst.numel() * dst.element_size() != nbytes:
        raise ValueError(f"dst: expected {nbytes} bytes like src, got {dst.numel() * dst.element_size()}")
    if dst.device != src.device:
        raise ValueError(f"dst: expected device {src.device}, got {dst.device}")
    if grid is None:
        grid = 4 * torch.cuda.get_device_properties(src.device).multi_processor_count
    code = _lib().hp_probe_copy(_build.ptr(dst), _build.ptr(src), nbytes, int(grid), int(pdl),
                                _build.stream_ptr(src.device))
    _build.check_status(code, "hp_probe_copy")
    return dst
