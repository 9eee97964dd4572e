"""Nsight Compute around one kernel launch: a fixed metric set, saved as a narrow CSV.

``profile()`` runs the target in a child process under
``ncu --clock-control none --csv --page raw --print-units base --metrics ... -k regex:<re> -s <skip> -c <count>``
and turns ncu's wide CSV into a narrow table, one row per (launch, metric)::

    kernel, launch, metric, value, unit, note

``--clock-control none`` keeps the GPU at its normal boost clocks, so durations are comparable with bench();
ncu's default cache control (flush all caches before each replay pass) is kept, which matches the cold-L2
policy of bench(). Where the counters cannot be read (ncu missing, no GPU, ERR_NVGPUCTRPERM, the profiler
library not loading as on gVisor machines, no kernel matching the regex, a timeout) the table holds ONE row
with ``metric == "unavailable"`` and ``note == "unavailable: <reason>"``, is saved like any other, and no
exception is raised: a notebook run under papermill records the fact and goes on. ``strict=True`` raises
instead (for tests and interactive debugging).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hotpaths.harness.env import has_cuda
from hotpaths.harness.runs import profiles_dir  # data/profiles/<tag>/ under reproduce, else scratch/

COLUMNS = ["kernel", "launch", "metric", "value", "unit", "note"]

DEFAULT_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",                                # kernel duration (ns)
    "dram__bytes_read.sum",                                  # HBM bytes read
    "dram__bytes_write.sum",                                 # HBM bytes written
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",    # HBM bandwidth, % of peak
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",      # SM pipes, % of peak
    "sm__warps_active.avg.pct_of_peak_sustained_active",     # achieved occupancy
    "lts__t_sector_hit_rate.pct",                            # L2 hit rate
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
)

# ncu messages that mean "counters cannot be read here" -> a readable reason.
_KNOWN_FAILURES = (
    ("ERR_NVGPUCTRPERM", "no permission to read GPU performance counters (ERR_NVGPUCTRPERM); needs root or "
                         "NVreg_RestrictProfilingToAdminUsers=0"),
    ("LibraryNotLoaded", "the profiler library did not load (LibraryNotLoaded; seen on gVisor machines)"),
    ("No kernels were profiled", "no kernel launch matched the kernel regex"),
    ("Failed to find metric", "a requested metric does not exist on this GPU/ncu version"),
    ("not supported", "profiling is not supported on this device or configuration"),
)

if TYPE_CHECKING:  # pandas is imported lazily (about half a second at CLI start-up)
    import pandas


# Where ncu lives when it is not on PATH (the CUDA toolkit; standalone Nsight Compute installs, newest first).
FALLBACK_NCU_DIRS: list[str] = ["/usr/local/cuda/bin", "/opt/nvidia/nsight-compute"]


class NcuUnavailable(RuntimeError):
    """Raised by profile(strict=True) where the other mode would record an 'unavailable' row."""


def find_ncu() -> str | None:
    """Path of the ncu executable: env HOTPATHS_NCU, then PATH, then the usual CUDA install folders."""
    env = os.environ.get("HOTPATHS_NCU")
    if env:
        return env if os.access(env, os.X_OK) else None
    hit = shutil.which("ncu")
    if hit:
        return hit
    for folder in FALLBACK_NCU_DIRS:
        for cand in sorted(Path(folder).glob("ncu"), reverse=True) + sorted(Path(folder).glob("*/ncu"), reverse=True):
            if os.access(cand, os.X_OK):
                return str(cand)
    return None


def _gpu_visible() -> tuple[bool, str]:
    try:
        if has_cuda():
            return True, ""
        return False, "no CUDA GPU visible to torch"
    except Exception:  # torch missing: ask the driver instead
        smi = shutil.which("nvidia-smi")
        if smi and subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0:
            return True, ""
        return False, "no CUDA GPU visible (no torch, nvidia-smi absent or failing)"


def ncu_available() -> tuple[bool, str]:
    """(True, "") when ncu exists and a GPU is visible, else (False, reason).

    Cheap: it does not profile anything, so a machine whose counters are locked (ERR_NVGPUCTRPERM, gVisor's
    LibraryNotLoaded) still says True here; profile() then records the reason.
    """
    if find_ncu() is None:
        return False, "ncu (Nsight Compute CLI) not found on PATH, in /usr/local/cuda/bin or /opt/nvidia"
    return _gpu_visible()


def _target_argv(target) -> list[str]:
    """argv for the profiled child: a list is used as is, a str is a Python snippet, a callable is imported."""
    if isinstance(target, (list, tuple)):
        if not target or not all(isinstance(a, str) for a in target):
            raise ValueError(f"target: expected a non-empty list of strings (argv), got {target!r}")
        return list(target)
    if isinstance(target, str):
        if not target.strip():
            raise ValueError("target: the Python snippet is empty")
        return [sys.executable, "-c", target]
    if callable(target):
        mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
        if not mod or mod == "__main__" or "<" in qual or "." in qual:
            raise ValueError(
                f"target: the callable {qual or target!r} must be a top-level function of an importable module "
                "(ncu profiles a separate process, which imports it); functions defined in a notebook cell are "
                "not importable there: pass a Python snippet string instead")
        return [sys.executable, "-c", f"import {mod} as _m; _m.{qual}()"]
    raise TypeError(f"target: expected argv list, Python snippet str or importable callable, "
                    f"got {type(target).__name__}")


KERNEL_NAME_BASES = ("function", "demangled", "mangled")


def build_command(target, *, kernel_regex: str, metrics: Sequence[str] = DEFAULT_METRICS, launch_skip: int = 0,
                  launch_count: int = 1, log_file: str | Path | None = None, ncu: str = "ncu",
                  kernel_name_base: str = "function") -> list[str]:
    """The ncu command line for ``profile()`` (exposed so a notebook can print the exact repro command).

    kernel_name_base: what the regex is matched against (ncu --kernel-name-base): "function" (the bare name, ncu's
    default), "demangled" (with template arguments: how one instantiation of a kernel template is picked) or
    "mangled".
    Raises ValueError for an empty regex/metric list, launch_skip < 0, launch_count < 1 or an unknown
    kernel_name_base.
    """
    if kernel_name_base not in KERNEL_NAME_BASES:
        raise ValueError(f"kernel_name_base: expected one of {KERNEL_NAME_BASES}, got {kernel_name_base!r}")
    if not kernel_regex:
        raise ValueError("kernel_regex: expected a regular expression matching the kernel's function name")
    re.compile(kernel_regex)  # a bad regex fails here with re.error, not inside ncu
    metrics = list(metrics)
    if not metrics or not all(isinstance(m, str) and m and "," not in m for m in metrics):
        raise ValueError(f"metrics: expected a non-empty list of metric names without commas, got {metrics!r}")
    if launch_skip < 0:
        raise ValueError(f"launch_skip: expected >= 0, got {launch_skip}")
    if launch_count < 1:
        raise ValueError(f"launch_count: expected >= 1, got {launch_count}")
    cmd = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
           "--metrics", ",".join(metrics), "--kernel-name-base", kernel_name_base, "-k", f"regex:{kernel_regex}",
           "--launch-skip", str(launch_skip), "--launch-count", str(launch_count)]
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    return cmd + _target_argv(target)


def _to_number(s: str):
    t = s.strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return float("nan")
    try:
        return float(t)
    except ValueError:
        return s.strip()


def parse_raw_csv(text: str) -> "pandas.DataFrame":
    """ncu ``--csv --page raw`` output (any ==PROF== lines and program output mixed in) -> narrow table.

    The wide CSV has a header row starting with "ID", a units row (empty first cell), then one row per
    profiled launch; metric columns are the ones with ``__`` in the name. Raises ValueError when no header
    row is found.
    """
    import pandas as pd

    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("ncu output has no CSV header row (a line starting with \"ID\")")
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(body))))
    header, rows = table[0], table[1:]
    units = [""] * len(header)
    if rows and rows[0] and rows[0][0] == "":
        units, rows = rows[0], rows[1:]
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    metric_cols = [j for j, h in enumerate(header) if "__" in h]
    out = []
    for r in rows:
        if len(r) != len(header):
            continue  # a truncated line (the program's own output interleaved); skip it
        for j in metric_cols:
            out.append({"kernel": r[name_col] if name_col is not None else "", "launch": int(_to_number(r[0])),
                        "metric": header[j], "value": _to_number(r[j]), "unit": units[j], "note": ""})
    return pd.DataFrame(out, columns=COLUMNS)


def failure_reason(output: str, returncode: int) -> str | None:
    """A readable reason when ncu's output shows the counters were not read, else None.

    Only ncu's own ``==ERROR==``/``==WARNING==`` lines are searched for the known messages, so the profiled
    program's output cannot trigger them.
    """
    tool = [ln.strip() for ln in output.splitlines() if ln.startswith(("==ERROR==", "==WARNING=="))]
    for token, reason in _KNOWN_FAILURES:
        hit = next((ln for ln in tool if token in ln), None)
        if hit is not None:
            return f"{reason} [{hit}]"
    errors = [ln for ln in tool if ln.startswith("==ERROR==")]
    if errors:
        return errors[0]
    if returncode != 0:
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:])
        return f"ncu or the profiled program exited with status {returncode}: {tail}"
    return None


def unavailable_table(reason: str, kernel_regex: str = "") -> "pandas.DataFrame":
    """The one-row table recorded instead of metrics."""
    import pandas as pd

    return pd.DataFrame([{"kernel": kernel_regex, "launch": None, "metric": "unavailable", "value": float("nan"),
                          "unit": "", "note": f"unavailable: {reason}"}], columns=COLUMNS)


def is_unavailable(df) -> bool:
    """True for the table profile() returns when it could not read counters."""
    return len(df) == 1 and df["metric"].iloc[0] == "unavailable"


def profile_or_note(target, **kwargs) -> tuple:
    """``profile(target, **kwargs)`` as ``(table, None)``, or ``(None, "unavailable: <reason>")`` where the counters
    could not be read or profile raised (a bad argument included): what a table builder writes in its row's note."""
    try:
        df = profile(target, **kwargs)
    except Exception as e:
        return None, f"unavailable: {type(e).__name__}: {e}"
    if is_unavailable(df):
        return None, str(df["note"].iloc[0])
    return df, None


def _out_path(out_csv) -> Path | None:
    if out_csv is None:
        return None
    p = Path(out_csv)
    if p.parent == Path(".") and not str(out_csv).startswith("."):
        p = profiles_dir() / (p.name if p.suffix == ".csv" else p.name + ".csv")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def profile(target: Sequence[str] | str | Callable[[], object], *, kernel_regex: str,
            metrics: Sequence[str] = DEFAULT_METRICS, out_csv: str | Path | None, launch_skip: int = 0,
            launch_count: int = 1, timeout_s: float = 600.0, strict: bool = False,
            kernel_name_base: str = "function") -> "pandas.DataFrame":
    """Profile one launch of the kernels matching ``kernel_regex`` in a child process under ncu.

    target: argv list (``["python3", "script.py"]``), a Python snippet (run with this interpreter, ``-c``), or
        a top-level function of an importable module (imported and called in the child).
    kernel_regex: regular expression on the kernel's function name (e.g. ``"probe_copy"``); the child should
        warm up first and use launch_skip to skip the warm-up launches. kernel_name_base: see build_command.
    out_csv: where the table goes: a path, a bare name (-> hotpaths.harness.runs.profiles_dir()/<name>.csv:
        data/profiles/<device>/ under ``hotpaths reproduce``) or None (not saved). ncu's raw output is kept
        beside it as ``<name>.ncu.txt``.
    Returns the narrow table (COLUMNS); its ``attrs["command"]`` holds the ncu command line.
    Raises ValueError/TypeError for bad arguments (always), NcuUnavailable when strict and counters could not
    be read; otherwise an "unavailable" row is returned and saved, with a warning.
    """
    ncu = find_ncu()
    cmd_preview = build_command(target, kernel_regex=kernel_regex, metrics=metrics, launch_skip=launch_skip,
                                launch_count=launch_count, ncu=ncu or "ncu", kernel_name_base=kernel_name_base)
    out_path = _out_path(out_csv)
    raw = ""
    ok, reason = ncu_available()
    df = None
    if ok:
        with tempfile.TemporaryDirectory(prefix="hotpaths_ncu_") as tmp:
            log = Path(tmp) / "ncu.csv"
            cmd = build_command(target, kernel_regex=kernel_regex, metrics=metrics, launch_skip=launch_skip,
                                launch_count=launch_count, log_file=log, ncu=ncu, kernel_name_base=kernel_name_base)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
                raw = (log.read_text() if log.exists() else "") + "\n" + proc.stdout + "\n" + proc.stderr
                reason = failure_reason(raw, proc.returncode)
            except subprocess.TimeoutExpired:
                reason = f"ncu did not finish within {timeout_s:.0f} s"
        if reason is None:
            try:
                df = parse_raw_csv(raw)
                if df.empty:
                    reason = "ncu printed no metric rows (no kernel launch matched the kernel regex?)"
                    df = None
            except ValueError as e:
                reason = f"could not parse ncu output: {e}"
    if df is None:
        if strict:
            raise NcuUnavailable(f"Nsight Compute unavailable for regex:{kernel_regex}: {reason}")
        warnings.warn(f"ncu: recording 'unavailable: {reason}'", RuntimeWarning, stacklevel=2)
        df = unavailable_table(reason, kernel_regex)
    df.attrs["command"] = shlex.join(cmd_preview)
    if out_path is not None:
        df.to_csv(out_path, index=False, lineterminator="\n")
        if raw.strip():
            out_path.with_suffix(".ncu.txt").write_text(raw)
    return df
