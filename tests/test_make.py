"""The Makefile a new user runs: the CPU torch index, JupyterLab in the default environment, `make lab` headless."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotpaths.harness.env import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make_n(*args):
    r = subprocess.run(["make", "-n", "-B", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_setup_installs_cpu_torch_and_jupyterlab(tmp_path):
    out = make_n("setup", f"VENV={tmp_path}/v")
    torch_line = next(l for l in out.splitlines() if "torch==2.13.0" in l)
    if os.uname().sysname == "Linux" and os.uname().machine == "x86_64":  # PyPI's wheel here would bundle CUDA
        assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line
    assert '-e ".[dev,lab,lint]"' in out and "-c constraints/cpu.txt" in out
    # a GPU box that brings its own CUDA torch: no CPU index
    gpu = make_n("setup", f"VENV={tmp_path}/v", "TORCH_SPEC=torch", "VENV_FLAGS=--system-site-packages")
    assert "download.pytorch.org" not in gpu and '"torch"' in gpu


@pytest.mark.parametrize("uid,root_flag", [("0", True), ("1000", False)])
def test_lab_is_headless_and_allows_root_only_as_root(uid, root_flag):
    line = next(l for l in make_n("lab", f"RUN_UID={uid}").splitlines() if "jupyter lab" in l)
    assert "--no-browser" in line and "--ip=127.0.0.1" in line
    assert ("--allow-root" in line) == root_flag


def test_make_lab_starts_and_prints_the_url(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "jupyter-lab").exists():
        # CI runs `make test`, whose setup installs the lab extra: there a missing JupyterLab is a failure
        assert not os.environ.get("CI"), "JupyterLab is not installed although `make setup` installs it"
        pytest.skip("JupyterLab not installed in this environment (`make setup` installs it)")
    proc = subprocess.Popen(["make", "lab", f"VENV={venv}", "LAB_PORT=18765", "-o", f"{venv}/.installed"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)})
    seen = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "http://127.0.0.1:18765/lab?token=" in line:
                break
    finally:
        os.killpg(proc.pid, 15)  # make and the server it started (its own session)
        proc.wait(timeout=30)
    text = "".join(seen)
    assert "http://127.0.0.1:18765/lab?token=" in text, text[-2000:]
    assert "Running as root is not recommended" not in text


def test_environment_yml_target_regenerates_it():
    line = next(l for l in make_n("environment.yml").splitlines() if "environment_yml.py" in l)
    assert line.endswith("> environment.yml")
