"""One tensor check for every public entry point, so bad input always gets the same kind of message:
``<argument>: expected <what>, got <what it was>``."""

from __future__ import annotations


def expect_tensor(t, name: str, *, dtype=None, ndim: int | None = None, layout: str = "", device_type: str | None = None,
                  contiguous: bool = False, why: str = "") -> None:
    """Raise unless ``t`` is a torch.Tensor with the given dtype, number of dimensions, device type and contiguity.

    name: the argument's name, first in every message. layout: a shape hint for the message (``"[N, K]"``).
    why: a short reason appended to the dtype expectation (``" (the FP32 router weight)"``).
    Raises TypeError (not a tensor, wrong dtype) or ValueError (dimensions, device, contiguity).
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}{why}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D {layout + ' ' if layout else ''}tensor, got shape {tuple(t.shape)}")
    if device_type is not None and t.device.type != device_type:
        raise ValueError(f"{name}: expected a {device_type.upper() if device_type == 'cuda' else device_type} tensor, "
                         f"got device {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous {layout + ' ' if layout else ''}tensor; call .contiguous() first")
