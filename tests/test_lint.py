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


def _clang_format() -> str:
    """The pinned clang-format of the lint extra (the pip package puts its binary beside the venv's python)."""
    exe = Path(sys.executable).with_name("clang-format")
    assert exe.exists(), ("clang-format not installed beside this python: pip install -e .[lint] "
                          "(constraints/cpu.txt pins it; another version formats differently)")
    return str(exe)


def test_clang_format_clean():
    """Every .cu/.cuh under src/ is laid out as .clang-format says (fix: `clang-format -i` on the listed files)."""
    files = sorted(str(p.relative_to(ROOT)) for ext in ("*.cu", "*.cuh") for p in (ROOT / "src").rglob(ext))
    assert files, "no CUDA sources found under src/"
    r = subprocess.run([_clang_format(), "--style=file", "--dry-run", "-Werror", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    bad = sorted({line.split(":", 1)[0] for line in r.stderr.splitlines() if ": error:" in line})
    assert r.returncode == 0, f"not clang-format clean: {bad}\n{r.stderr[:3000]}"
