"""Build path for the CUDA kernels: one C-ABI shared library per op, compiled with nvcc, loaded with ctypes.

Why this mechanism: a plain ``extern "C"`` shared object has no dependency on the PyTorch C++ ABI, so a library
compiled on the CPU machines (torch 2.13) runs unchanged beside the H200 image's torch 2.11; the wrappers pass raw
device pointers and the current torch stream, so launches are stream-ordered and CUDA-graph capturable. The CUDA
runtime is linked statically (``-cudart static``); streams and graphs are driver objects, shared with torch.

Sources: every ``src/kernels/<op>/*.cu`` (headers ``*.cuh`` count in the cache key). Output:
``build/<op>/<hash>/lib<op>.so`` plus ``ptxas.txt`` (registers / spills report), under the repository root or
``$HOTPATHS_BUILD_DIR``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
REPO_ROOT = KERNELS_DIR.parent.parent
ARCH_FLAGS = ["-gencode", "arch=compute_90a,code=sm_90a"]
NVCC_FLAGS = ["-O3", "-std=c++17", *ARCH_FLAGS, "-Xptxas", "-v", "-lineinfo", "--expt-relaxed-constexpr",
              "-Xcompiler", "-fPIC"]
# A spilling kernel is exempted only by a line `// spills-ok(<substring>): <reason>` in its op's sources, where
# <substring> occurs in the kernel's mangled name (e.g. a template argument list such as TraitsILb1ELb1ELi2ELi4E):
# one exemption never covers the op's other kernels.
SPILLS_OK = re.compile(r"//\s*spills-ok\((?P<kernel>[^()\s]+)\):\s*(?P<reason>\S.*)$", re.M)
_SPILLS_OK_ANY = re.compile(r"//\s*spills-ok\b.*$", re.M)
COMMON_DIR = KERNELS_DIR / "common"  # headers shared by every op (launch helper, PTX wrappers); in every op's key

_loaded: dict[str, ctypes.CDLL] = {}


class KernelBuildError(RuntimeError):
    """nvcc failed, or is missing; the message carries the compiler output."""


def build_dir() -> Path:
    return Path(os.environ.get("HOTPATHS_BUILD_DIR", REPO_ROOT / "build"))


def nvcc_path() -> str:
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        raise KernelBuildError("nvcc not found on PATH (CUDA 12.4+ needed to build for sm_90a)")
    return nvcc


def sources(op: str) -> list[Path]:
    """The .cu files of one op, sorted. Raises ValueError for an unknown op."""
    d = KERNELS_DIR / op
    cu = sorted(d.glob("*.cu"))
    if not cu:
        raise ValueError(f"op={op!r}: no .cu sources under {d}")
    return cu


def define_flags(defines: tuple[str, ...] = ()) -> list[str]:
    """``-D`` flags from ``$HOTPATHS_NVCC_DEFINES`` (space-separated ``NAME`` or ``NAME=VALUE``) and ``defines``:
    diagnostic builds, e.g. ``HP_ROUTER_TRACE=1`` for the router's timeline trace. Part of the cache key, so such a
    build never replaces the production library. Raises ValueError for an entry that is not a C identifier (with an
    optional value)."""
    out = []
    for d in [*os.environ.get("HOTPATHS_NVCC_DEFINES", "").split(), *defines]:
        if not re.fullmatch(r"[A-Za-z_]\w*(=[\w.+-]*)?", d):
            raise ValueError(f"HOTPATHS_NVCC_DEFINES: {d!r} is not NAME or NAME=VALUE")
        out.append(f"-D{d}")
    return out


def _key(op: str, defines: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    for p in sorted((KERNELS_DIR / op).glob("*.cu*")) + sorted(COMMON_DIR.glob("*.cuh")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(NVCC_FLAGS + define_flags(defines)).encode())
    return h.hexdigest()[:16]


def library_path(op: str, defines: tuple[str, ...] = ()) -> Path:
    return build_dir() / op / _key(op, defines) / f"lib{op}.so"


def compile_op(op: str, *, force: bool = False, defines: tuple[str, ...] = ()) -> Path:
    """Compile one op's sources to a shared library (cached by source hash and -D flags, see define_flags).
    Returns the .so path."""
    out = library_path(op, defines)
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.so")
    cmd = [nvcc_path(), *NVCC_FLAGS, *define_flags(defines), "--shared", "-cudart", "static",
           "-I", str(KERNELS_DIR / op), "-I", str(KERNELS_DIR), "-o", str(tmp), *map(str, sources(op))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out.parent / "ptxas.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise KernelBuildError(f"nvcc failed for op={op!r} (exit {proc.returncode}):\n{' '.join(cmd)}\n"
                               f"{proc.stderr[-6000:]}")
    os.replace(tmp, out)  # atomic: concurrent builders never load a half-written file
    return out


def load(op: str) -> ctypes.CDLL:
    """Compile (if needed) and load ``lib<op>.so``; cached per process."""
    if op not in _loaded:
        _loaded[op] = ctypes.CDLL(str(compile_op(op)))
    return _loaded[op]


def stream_ptr(device=None) -> ctypes.c_void_p:
    """The current torch CUDA stream as a ``cudaStream_t`` for the C entry points."""
    import torch

    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def check_status(code: int, what: str) -> None:
    """Raise RuntimeError if a C entry point returned a non-zero cudaError_t."""
    if code != 0:
        raise RuntimeError(f"{what}: CUDA error {code} ({_error_name(code)})")


def _error_name(code: int) -> str:
    try:
        from cuda.bindings import runtime  # type: ignore

        return runtime.cudaGetErrorName(code)[1].decode()
    except Exception:  # the name is a convenience; the code is what matters
        return "see cudaError_t"


def ptr(t) -> ctypes.c_void_p:
    """Raw device pointer of a tensor (None -> NULL)."""
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


# ---- compile check used by CI (no GPU needed) -------------------------------------------------------------

def ptxas_report(text: str) -> list[dict]:
    """Parse ``-Xptxas -v`` output into rows: kernel, registers, stack, spill_stores, spill_loads."""
    rows: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = rows.setdefault(m.group(1), {"kernel": m.group(1)})
            continue
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = rows.setdefault(m.group(1), {"kernel": m.group(1)})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
    return list(rows.values())


def all_ops() -> list[str]:
    return sorted({p.parent.name for p in KERNELS_DIR.glob("*/*.cu")} - {COMMON_DIR.name})


def spill_exemptions(texts: list[str]) -> dict[str, str]:
    """``{kernel-name substring: reason}`` from the ``// spills-ok(<substring>): <reason>`` lines of some sources.

    Raises KernelBuildError for a spills-ok line not of that form (the old op-wide ``// spills-ok: <reason>``, an
    empty substring or reason), so a malformed line never exempts anything silently.
    """
    out: dict[str, str] = {}
    for text in texts:
        for m in _SPILLS_OK_ANY.finditer(text):
            ok = SPILLS_OK.match(m.group(0))
            if ok is None:
                raise KernelBuildError(f"malformed spill exemption {m.group(0).strip()!r}: write "
                                       "'// spills-ok(<kernel name substring>): <reason>'")
            out[ok.group("kernel")] = ok.group("reason").strip()
    return out


def check_spills(label: str, rows: list[dict], texts: list[str]) -> None:
    """Raise KernelBuildError naming every kernel of `rows` that spills without its own exemption in `texts`."""
    exempt = spill_exemptions(texts)
    bad = [r for r in rows if (r.get("spill_stores", 0) or r.get("spill_loads", 0))
           and not any(sub in r["kernel"] for sub in exempt)]
    if bad:
        raise KernelBuildError(f"{label}: kernels spill registers and no '// spills-ok(<kernel name substring>): "
                               f"<reason>' line names them: {bad}")


def compile_check(op: str) -> list[dict]:
    """Compile an op for sm_90a (object code only) and return its ptxas rows.

    Raises KernelBuildError if it does not compile, or if a kernel spills and no source of the op carries a
    ``// spills-ok(<substring of that kernel's mangled name>): <reason>`` line.
    """
    so = compile_op(op)
    report = (so.parent / "ptxas.txt").read_text()
    rows = ptxas_report(report)
    check_spills(f"op={op!r}", rows, [p.read_text() for p in sorted((KERNELS_DIR / op).glob("*.cu*"))])
    return rows


def report(ops: list[str] | None = None) -> str:
    """A plain-text table of every kernel's registers / stack / spills (compiling what is not cached)."""
    lines = [f"{'op':<16} {'registers':>9} {'stack':>6} {'spill_st':>8} {'spill_ld':>8}  kernel"]
    for op in ops or all_ops():
        for r in compile_check(op):
            lines.append(f"{op:<16} {r.get('registers', '?'):>9} {r.get('stack', 0):>6} {r.get('spill_stores', 0):>8} "
                         f"{r.get('spill_loads', 0):>8}  {r['kernel'][:90]}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m hotpaths.kernels._build: compile-check every op, print ptxas's report
    print(report())
