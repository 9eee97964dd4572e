"""Run identity, output locations, and the write rules that keep a re-run from churning git.

Under ``hotpaths reproduce`` the environment carries HOTPATHS_RUN_ID and HOTPATHS_RESULTS_DIR (a temporary folder
moved into data/results/<device>/ on success); interactive runs write to scratch/results/<device>/ so exploring in
JupyterLab never overwrites the committed tables.

Writes go through ``write_stable``: the file is written aside and renamed over the old one (a run killed midway
leaves the previous file whole), and not written at all when it differs from the old one only in run ids (so a
second ``make reproduce`` with unchanged numbers leaves ``git status`` clean).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hotpaths.harness.env import REPO_ROOT, device_tag

# reproduce's run ids: <UTC time>-<device tag>-<profile>, e.g. 20261201T011438Z-cpu-quick
RUN_ID_RE = re.compile(rb"\d{8}T\d{6}Z-[A-Za-z0-9_]+-[A-Za-z0-9_]+")


def run_id() -> str:
    return os.environ.get("HOTPATHS_RUN_ID", "interactive")


def results_dir() -> Path:
    d = os.environ.get("HOTPATHS_RESULTS_DIR")
    p = Path(d) if d else REPO_ROOT / "scratch" / "results" / device_tag()
    p.mkdir(parents=True, exist_ok=True)
    return p


def profiles_dir() -> Path:
    d = os.environ.get("HOTPATHS_PROFILES_DIR")
    p = Path(d) if d else REPO_ROOT / "scratch" / "profiles" / device_tag()
    p.mkdir(parents=True, exist_ok=True)
    return p


def without_run_ids(data: bytes) -> bytes:
    """``data`` with every reproduce run id replaced by a placeholder: two outputs that differ only there carry the
    same numbers."""
    return RUN_ID_RE.sub(b"<run_id>", data)


def same_but_run_ids(a: bytes, b: bytes) -> bool:
    return a == b or without_run_ids(a) == without_run_ids(b)


def atomic_write_many(items: list[tuple[Path, bytes]]) -> None:
    """Write every (path, bytes) aside first, then rename each over its target: a failure or a kill before the
    renames leaves all old files whole, and no half-written file is ever visible under a target name."""
    tmps = []
    try:
        for path, data in items:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmps.append((tmp, path))
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in tmps:
            os.replace(tmp, path)
    finally:
        for tmp, _ in tmps:
            if tmp.exists():
                tmp.unlink()


def write_stable(items: list[tuple[Path, bytes]]) -> bool:
    """Write a group of files that belong together (a table's CSV and Markdown twin) atomically, unless every one
    of them already holds the same bytes up to run ids. Returns True when written."""
    def unchanged(path: Path, data: bytes) -> bool:
        return path.exists() and same_but_run_ids(path.read_bytes(), data)

    if all(unchanged(Path(p), d) for p, d in items):
        return False
    atomic_write_many(items)
    return True
