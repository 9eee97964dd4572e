"""The bottom layer every other one may import (it imports only the standard library, numpy and torch):
the one tensor validator, the case grammar of the articles, and the memory-fit guard.

- ``expect_tensor(t, name, ...)``: every public entry point checks its tensors here, so bad input always gets the
  same kind of message: ``<argument>: expected <what>, got <what it was>``.
- Case grammar: ``AxB`` = A requests of KV length B, joined with ``+``; a ``K`` suffix multiplies by 1024 and may
  follow a decimal (``0.125K`` = 128). Examples: ``64x0.5K``, ``1x128K+31x4K``, ``32x0.125K+32x4K``, ``1x16K+15x64``.
- ``check_fits(what, host_bytes=, device_bytes=, device=)``: refuse, before anything is allocated, a size that will
  not fit in host or device memory (``ResourceError``, a ValueError, so the CLI exits 2 with the estimate).
"""

from __future__ import annotations

import os
import re

_TERM = re.compile(r"^(?P<count>\d+)x(?P<num>\d+(?:\.\d+)?)(?P<k>[kK]?)$")


class CaseError(ValueError):
    """A malformed case string; the message says which term and what was expected."""


def parse_cases(spec: str) -> list[tuple[int, int]]:
    """Parse ``"1x128K+31x4K"`` into ``[(1, 131072), (31, 4096)]`` (count, KV length in tokens).

    Raises CaseError naming the bad term: not ``<count>x<length>[K]``, a zero count, or a length that is not a
    whole number of tokens. KV length 0 is allowed (``4x0``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise CaseError(f"case {spec!r}: expected terms like '64x4K' joined with '+', got an empty string")
    out = []
    for term in spec.replace(" ", "").split("+"):
        m = _TERM.match(term)
        if not m:
            raise CaseError(f"case {spec!r}: term {term!r} is not <count>x<length>[K] "
                            "(e.g. '31x4K', '32x0.125K', '15x64')")
        count = int(m.group("count"))
        if count == 0:
            raise CaseError(f"case {spec!r}: term {term!r} has a zero request count")
        length = float(m.group("num")) * (1024 if m.group("k") else 1)
        if length != int(length):
            raise CaseError(f"case {spec!r}: term {term!r} gives {length} tokens, not a whole number")
        out.append((count, int(length)))
    return out


def expand_lengths(cases) -> list[int]:
    """One KV length per request, in order. Accepts a case string or parsed ``[(count, length)]``.

    Raises CaseError for a malformed case string, ResourceError when the list itself (8 bytes per request) would
    not fit in host memory (``1000000000000x4K``).
    """
    if isinstance(cases, str):
        cases = parse_cases(cases)
    check_fits(f"case {format_case(cases)}", host_bytes=8 * sum(count for count, _ in cases))
    return [length for count, length in cases for _ in range(count)]


def format_case(cases) -> str:
    """Inverse of parse_cases, in the articles' style (``4096`` -> ``4K``, ``128`` -> ``0.125K``, ``64`` -> ``64``)."""
    def fmt(n: int) -> str:
        # multiples of 1/8 K from 128 tokens up print as K; shorter lengths print as tokens
        return f"{n / 1024:g}K" if n >= 128 and (n * 8) % 1024 == 0 else str(n)
    return "+".join(f"{c}x{fmt(n)}" for c, n in cases)


def parse_int_list(spec: str, name: str, *, minimum: int = 0) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; raises CaseError naming the option on bad input (an empty item included) or a
    value below ``minimum``."""
    items = spec.split(",")
    if any(not v.strip() for v in items):  # '1,,2' or a trailing comma: a typo, not a request for fewer values
        raise CaseError(f"{name} {spec!r}: empty item; expected comma-separated integers, e.g. '1,2,4'")
    try:
        vals = [int(v) for v in items]
    except ValueError:
        raise CaseError(f"{name} {spec!r}: expected comma-separated integers, e.g. '1,2,4'") from None
    if not vals or any(v < minimum for v in vals):
        raise CaseError(f"{name} {spec!r}: expected integers >= {minimum}")
    return vals

def expect_tensor(t, name: str, *, dtype=None, ndim: int | None = None, layout: str = "",
                  device_type: str | None = None, device=None, contiguous: bool = False, align: int = 0,
                  why: str = "") -> None:
    """Raise unless ``t`` is a torch.Tensor with the given dtype, number of dimensions, device and contiguity.

    name: the argument's name, first in every message. dtype: one torch.dtype or a tuple of accepted ones.
    layout: a shape hint for the message (``"[N, K]"``). why: a short reason appended to the dtype expectation
    (``" (the FP32 router weight)"``). device_type: ``"cuda"``/``"cpu"``; device: an exact torch.device (e.g. the
    plan's). align: required alignment of the data pointer in bytes (16 for vector loads / cp.async), 0 for none.
    Raises TypeError (not a tensor, wrong dtype) or ValueError (dimensions, device, contiguity, alignment).
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if isinstance(dtype, (tuple, list)) and t.dtype not in dtype:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtype]}{why}, got {t.dtype}")
    if dtype is not None and not isinstance(dtype, (tuple, list)) and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}{why}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D {layout + ' ' if layout else ''}tensor, "
                         f"got shape {tuple(t.shape)}")
    if device_type is not None and t.device.type != device_type:
        raise ValueError(f"{name}: expected a {device_type.upper() if device_type == 'cuda' else device_type} tensor, "
                         f"got device {t.device}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous {layout + ' ' if layout else ''}tensor; "
                         "call .contiguous() first")
    if align and t.data_ptr() % align:
        raise ValueError(f"{name}: expected a {align}-byte aligned data pointer, got data_ptr % {align} = "
                         f"{t.data_ptr() % align} (a view at an offset): pass a fresh tensor or .clone()")


def device_tag(device: str = "auto") -> str:
    """Folder name for results and dispatch tables: ``h200``, ``h100``, ``h20`` ... from the GPU name, or ``cpu``
    (``device="cpu"``, or no CUDA device). Lives here so kernels can name their per-device tables without the
    harness."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "h20", "h800", "a100", "l40s", "l4", "b200", "gh200"):
        if tag in name.replace("nvidia", "").replace(" ", "").replace("-", ""):
            return tag
    return "".join(ch for ch in name.replace("nvidia", "") if ch.isalnum()) or "gpu"


def sm90_skip_reason() -> str | None:
    """None on an SM90 (Hopper) CUDA device, else why the SM90 kernels cannot run here (the same sentence the GPU
    tests skip with and the kernels' public functions raise with)."""
    import torch

    if not torch.cuda.is_available():
        return "needs an SM90 (Hopper) CUDA GPU; this machine has none (CPU-only torch or no device)"
    if torch.cuda.get_device_capability() != (9, 0):
        sm = "".join(map(str, torch.cuda.get_device_capability()))
        return f"needs an SM90 (Hopper) GPU; found {torch.cuda.get_device_name()} (sm_{sm})"
    return None


class ResourceError(ValueError):
    """A request that would not fit in host or device memory; the message carries the estimate and what is free."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None (then only device memory is checked)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_available_bytes(device=None) -> int | None:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info) plus what torch's caching allocator holds free; None
    when the device is not CUDA or CUDA is absent."""
    import torch

    if device is None or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return int(free + max(cached, 0))


# Headroom kept free: the guard refuses a request above this fraction of what is available, so a run that would
# fit only with the last byte (and then die in a later allocation or in the driver) is refused too.
FIT_FRACTION = float(os.environ.get("HOTPATHS_FIT_FRACTION", "0.9"))


def check_fits(what: str, *, host_bytes: int = 0, device_bytes: int = 0, device=None) -> None:
    """Raise ResourceError unless ``host_bytes`` fit in available host memory and ``device_bytes`` in the free
    memory of ``device`` (a torch device or string; ignored when not CUDA, and then counted as host memory).

    what: the request in the user's words (``"decode case 100000x4K (fp8)"``), first in the message.
    """
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda":
        host_bytes, device_bytes = host_bytes + device_bytes, 0
    if device_bytes:
        avail = device_available_bytes(dev)
        if avail is not None and device_bytes > FIT_FRACTION * avail:
            raise ResourceError(f"{what}: needs about {_gib(device_bytes)} of GPU memory on {dev}, "
                                f"{_gib(avail)} is free; use a smaller size")
    if host_bytes:
        avail = host_available_bytes()
        if avail is not None and host_bytes > FIT_FRACTION * avail:
            raise ResourceError(f"{what}: needs about {_gib(host_bytes)} of host memory, {_gib(avail)} is "
                                "available; use a smaller size")
