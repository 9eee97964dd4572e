"""The linter gate: `ruff check src tests` with the configuration in pyproject.toml ([tool.ruff])."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    # no skip without ruff: `make test` installs the lint extra, so a missing ruff means the gate is not running
    assert importlib.util.find_spec("ruff"), "ruff not installed: pip install -e .[lint] (constraints/cpu.txt pins it)"
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
