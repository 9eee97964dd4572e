"""Run identity and output locations.

Under ``hotpaths reproduce`` the environment carries HOTPATHS_RUN_ID and HOTPATHS_RESULTS_DIR (a temporary folder
moved into data/results/<device>/ on success); interactive runs write to scratch/results/<device>/ so exploring in
JupyterLab never overwrites the committed tables.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotpaths.harness.env import REPO_ROOT, device_tag


def run_id() -> str:
    return os.environ.get("HOTPATHS_RUN_ID", "interactive")


def under_reproduce() -> bool:
    return "HOTPATHS_RESULTS_DIR" in os.environ


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
