"""Interactive kernel experiments: recompile the SAME src/kernels/<op>/*.cu with NVRTC through CuPy's RawModule.

The default path is the compiled build (``hotpaths.kernels._build.load(op)``: nvcc, a C-ABI shared library,
ctypes). That build takes tens of seconds per change; NVRTC recompiles a kernel with new tile sizes or stage
counts in about a second inside JupyterLab, which is what a notebook's "try it yourself" cell wants::

    from hotpaths.harness.nvrtc import compile_raw
    mod = compile_raw("probe", ["probe_copy_kernel"], defines={"PROBE_UNROLL": 8})
    k = mod.get_function("probe_copy_kernel")
    k((grid,), (256,), (dst_ptr, src_ptr, n_vec))          # CuPy launch: grid, block, args

What a .cu file needs for this path (NVRTC compiles device code only):
- Host code (the ``extern "C"`` launchers of CONTRACT.md, ``cudaLaunchKernelEx``, ``cudaGetLastError``) inside
  ``#if !defined(__CUDACC_RTC__)`` ... ``#endif``; NVRTC defines ``__CUDACC_RTC__``, nvcc does not. The
  ``#include <cuda_runtime.h>`` / ``<stdint.h>`` lines may stay: stand-in headers are supplied, and a prelude
  maps ``cudaGridDependencySynchronize()`` / ``cudaTriggerProgrammaticLaunchCompletion()`` to their PTX
  (checked with NVRTC 13.0 for sm_90a: a templated kernel in an anonymous namespace using both, cuda_bf16.h
  and int64_t compiled, and its name expression resolved).
- The ``extern "C"`` entry points are host launchers, so RawModule cannot call them: it launches the
  ``__global__`` kernels themselves. A kernel declared ``extern "C" __global__`` is found by its plain name;
  a templated kernel, or one in a (possibly anonymous) namespace, has a C++-mangled name: pass
  ``name_expressions=["my_kernel<128, 4>"]`` and call ``get_function("my_kernel<128, 4>")``.
- Tunables as macros with defaults (``#ifndef TILE_N`` / ``#define TILE_N 64`` / ``#endif``), so
  ``defines={"TILE_N": 128}`` changes them here and the nvcc build keeps the defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.+\-]+$")

NEEDS_GPU = ("CuPy RawModule path needs a CUDA GPU; the compiled build (hotpaths.kernels._build) is the default")


class NvrtcUnavailable(RuntimeError):
    """CuPy or a CUDA GPU is missing, so the NVRTC path cannot run here."""


def kernel_sources(op: str, files: Sequence[str] | None = None) -> tuple[Path, list[Path]]:
    """(folder, .cu files) of an op; files default to every ``*.cu`` in src/kernels/<op>/, sorted.

    Raises ValueError naming the op or file that does not exist.
    """
    if not op or not _IDENT.match(op):
        raise ValueError(f"op: expected a kernel folder name like 'split_kv_decode', got {op!r}")
    folder = KERNELS_DIR / op
    if not folder.is_dir():
        have = sorted(p.name for p in KERNELS_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
        raise ValueError(f"op: no kernel folder src/kernels/{op}/; have {have}")
    if files is None:
        paths = sorted(folder.glob("*.cu"))
    else:
        paths = [folder / f for f in files]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise ValueError(f"files: not in src/kernels/{op}/: {missing}")
    if not paths:
        raise ValueError(f"op: src/kernels/{op}/ has no .cu file")
    return folder, paths


# Prepended to the source: NVRTC declares no device-runtime PDL calls, so give them the PTX they lower to
# (sm_90+), letting the same kernel bodies call cudaGridDependencySynchronize() under nvcc and NVRTC.
PRELUDE = """#if defined(__CUDACC_RTC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cudaGridDependencySynchronize() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void cudaTriggerProgrammaticLaunchCompletion() {
  asm volatile("griddepcontrol.launch_dependents;" :::);
}
#endif
#endif
"""

# NVRTC has no C library headers; these stand-ins (an include folder written on first use) let the unchanged
# `#include <stdint.h>` / `<cuda_runtime.h>` lines of a kernel file compile. Host code stays behind
# `#if !defined(__CUDACC_RTC__)` in the kernel file itself.
_FIXED_WIDTH = """#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
"""
STUB_HEADERS = {
    "stdint.h": _FIXED_WIDTH,
    "cstdint": _FIXED_WIDTH,
    "cuda_runtime.h": "#pragma once\n// NVRTC: the device side of the CUDA runtime is built in; no host API here.\n",
}


def stub_include_dir() -> Path:
    """Folder holding STUB_HEADERS (under the temp dir, rewritten when its content differs)."""
    import tempfile

    d = Path(tempfile.gettempdir()) / "hotpaths_nvrtc_include"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in STUB_HEADERS.items():
        f = d / name
        if not f.exists() or f.read_text() != text:
            f.write_text(text)
    return d


def build_source(op: str, files: Sequence[str] | None = None) -> str:
    """The translation unit NVRTC compiles: PRELUDE, then the op's .cu files, each behind a ``#line`` so
    errors name the file."""
    _, paths = kernel_sources(op, files)
    parts = [PRELUDE]
    for p in paths:
        parts.append(f'#line 1 "{p.as_posix()}"\n{p.read_text()}\n')
    return "".join(parts)


def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include folder (CUDA_HOME / CUDA_PATH / /usr/local/cuda), or None (CuPy adds its own)."""
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "include" / "cuda.h").is_file():
            return str(Path(base) / "include")
    return None


def nvrtc_options(op: str, defines: Mapping[str, object] | None = None, *, arch: str = "sm_90a",
                  extra: Sequence[str] = ()) -> tuple[str, ...]:
    """NVRTC options: C++17, the target arch, include paths (the op's folder, CUDA), ``-DNAME=VALUE``.

    defines: macro name -> int, float, bool (1/0) or a token string (letters, digits, ``_.+-``).
    Raises ValueError naming a bad macro name or value (spaces or quotes would change the meaning of the
    command line) or a bad arch.
    """
    if not re.match(r"^(sm|compute)_\d+[a-z]?$", arch):
        raise ValueError(f"arch: expected like 'sm_90a', got {arch!r}")
    folder, _ = kernel_sources(op)
    opts = ["-std=c++17", f"--gpu-architecture={arch}", f"-I{folder}", f"-I{stub_include_dir()}", "-DHOTPATHS_NVRTC=1"]
    inc = cuda_include_dir()
    if inc:
        opts.append(f"-I{inc}")  # after the stubs: cuda/std/*, cuda_fp16.h, cuda_bf16.h, cuda_fp8.h
    for name, value in (defines or {}).items():
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ValueError(f"defines: macro name must be a C identifier, got {name!r}")
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif isinstance(value, str) and _VALUE.match(value):
            text = value
        else:
            raise ValueError(f"defines[{name!r}]: expected an int, float, bool or a token string, got {value!r}")
        opts.append(f"-D{name}={text}")
    return tuple(opts) + tuple(extra)


def _require_cupy_gpu():
    try:
        import cupy
    except ImportError as e:
        raise NvrtcUnavailable(f"{NEEDS_GPU} (CuPy is not installed: {e})") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver
        raise NvrtcUnavailable(f"{NEEDS_GPU} (no CUDA device: {e})") from None
    if n < 1:
        raise NvrtcUnavailable(f"{NEEDS_GPU} (no CUDA device)")
    return cupy


def compile_raw(op: str, kernel_names: Sequence[str] = (), *, defines: Mapping[str, object] | None = None,
                name_expressions: Sequence[str] | None = None, files: Sequence[str] | None = None,
                arch: str = "sm_90a", options: Sequence[str] = ()):
    """Compile src/kernels/<op>/*.cu with NVRTC now and return the ``cupy.RawModule``.

    kernel_names: ``extern "C" __global__`` kernels to look up now, so a typo fails here with the list of
        names rather than at the first launch.
    name_expressions: C++ names of templated or namespaced kernels (``"tile_kernel<128, 4>"``); each is
        looked up too, and ``mod.get_function(expr)`` returns it.
    defines: tunables as ``-DNAME=VALUE`` (see nvrtc_options).
    Returns the RawModule; ``mod.get_function(name)`` gives a ``cupy.RawKernel`` launched as
    ``k(grid, block, args, shared_mem=...)`` on CuPy's current stream (``cupy.cuda.ExternalStream(
    torch.cuda.current_stream().cuda_stream)`` shares torch's).
    Raises NvrtcUnavailable without CuPy or a GPU, ValueError for bad arguments, and CuPy's CompileException
    with NVRTC's log for a compile error; KeyError naming the kernel when a requested name is absent.
    """
    source = build_source(op, files)
    opts = nvrtc_options(op, defines, arch=arch, extra=options)
    names = list(kernel_names)
    exprs = list(name_expressions or [])
    if not all(isinstance(n, str) and n for n in names + exprs):
        raise ValueError("kernel_names / name_expressions: expected non-empty strings")
    cupy = _require_cupy_gpu()
    mod = cupy.RawModule(code=source, options=opts, backend="nvrtc", name_expressions=exprs or None)
    mod.compile()
    for n in names + exprs:
        try:
            mod.get_function(n)
        except Exception as e:
            raise KeyError(f"kernel {n!r} not found in src/kernels/{op}/ as compiled by NVRTC ({e}); "
                           "extern \"C\" __global__ kernels by plain name, templated/namespaced ones through "
                           "name_expressions") from None
    return mod
