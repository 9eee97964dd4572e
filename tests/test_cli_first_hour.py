"""What a new user meets first on a machine without a GPU: sizes that cannot fit, pipes, bad options, progress,
warnings. CLI cases run as subprocesses with a tight timeout (a missing guard used to end in the OOM killer)."""

import json
import os
import subprocess
import sys

import pytest

from hotpaths.harness.env import REPO_ROOT


def _env():
    from pathlib import Path

    import hotpaths

    env = dict(os.environ)
    # the subprocess imports the same hotpaths as this test (an editable install or a PYTHONPATH link)
    here = str(Path(hotpaths.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return env


def hp(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "hotpaths", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), **kw)


def _limit_memory():  # a guard that is missing fails the test instead of taking the machine down
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))


@pytest.mark.parametrize("args", [
    ("decode", "--cases", "1x99999999999"),
    ("decode", "--cases", "100000x4K"),
    ("decode", "--cases", "1000000000000x4K"),
    ("decode", "--cases", "1x4K", "--num-ctas", "999999999"),
    ("router", "--m", "99999999999"),
    ("router", "--m", "1", "--k", "99999999936"),
    ("router", "--m", "1", "--n", "99999999936"),
    ("prologue", "--tokens", "999999999"),
    ("moe", "--batch", "99999999"),
])
def test_sizes_that_cannot_fit_exit_2_with_the_estimate(args):
    r = hp(*args, "--json", preexec_fn=_limit_memory)
    assert r.returncode == 2, (r.returncode, r.stderr[-800:])
    assert "needs about" in r.stderr and "GiB" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_python_callers_get_the_same_guard():
    """Notebooks and scripts call the input makers directly; run in a memory-limited child all the same."""
    code = ("from hotpaths.reference.common import ResourceError\n"
            "from hotpaths.reference.router_gemm import make_router_inputs\n"
            "from hotpaths.reference.split_kv_decode import build_task_map, make_decode_inputs\n"
            "for f in (lambda: make_decode_inputs([99999999999]), lambda: make_router_inputs(99999999999, 192, 4096),\n"
            "          lambda: build_task_map([4096], 1, 10**9)):\n"
            "    try:\n"
            "        f()\n"
            "    except ResourceError as e:\n"
            "        assert 'needs about' in str(e)\n"
            "    else:\n"
            "        raise SystemExit('no ResourceError')\n"
            "try:\n"
            "    build_task_map([4096], 1, 132, min_tiles=2**40)\n"
            "except ValueError as e:\n"
            "    assert 'min_tiles' in str(e)\n"
            "else:\n"
            "    raise SystemExit('min_tiles accepted')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(),
                       preexec_fn=_limit_memory)
    assert r.returncode == 0, r.stderr[-800:]


@pytest.mark.parametrize("args,names", [
    (("router", "--m", "1,,2"), "--m"),
    (("router", "--iters", "0"), "--iters"),
    (("decode", "--iters", "0"), "--iters"),
    (("decode", "--cases", "-1x5"), "'-1x5'"),
    (("decode", "--min-tiles", "99999999999", "--cases", "1x64"), "min_tiles"),
])
def test_bad_values_exit_2_naming_the_option_or_term(args, names):
    r = hp(*args)
    assert r.returncode == 2 and names in r.stderr, r.stderr[-600:]
    assert "expected one argument" not in r.stderr and "Traceback" not in r.stderr


def test_unknown_option_shows_the_subcommand_usage():
    r = hp("env", "--bogus")
    assert r.returncode == 2
    assert r.stderr.startswith("usage: hotpaths env") and "unrecognized arguments: --bogus" in r.stderr


def test_closed_pipe_ends_quietly():
    """`hotpaths router --json | head -1`: the reader is gone before the first write."""
    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        r = subprocess.run([sys.executable, "-m", "hotpaths", "router", "--m", "1,2", "--json"], stdout=wfd,
                           stderr=subprocess.PIPE, text=True, timeout=90, env=_env())
    finally:
        os.close(wfd)
    assert r.returncode == 0, r.stderr[-600:]
    assert "BrokenPipeError" not in r.stderr and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_env_reports_nvcc_and_whether_kernels_build(monkeypatch):
    r = hp("env", "--no-measure", "--json")
    assert r.returncode == 0
    info = json.loads(r.stdout)
    for key in ("nvcc", "nvcc_version", "nvcc_sm90a", "kernels_buildable", "kernels_build_note"):
        assert key in info
    # buildable exactly when an nvcc that targets sm_90a was found, and the note's answer agrees
    assert info["kernels_buildable"] is bool(info["nvcc"] and info["nvcc_sm90a"])
    assert info["kernels_build_note"].startswith("yes" if info["kernels_buildable"] else "no:")
    if info["nvcc"]:
        assert info["nvcc_version"] and info["nvcc_version"][0].isdigit()
    # without nvcc the answer is "no" and says why
    import shutil
    from pathlib import Path

    from hotpaths.harness import env

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(env, "Path", lambda p: Path("/nonexistent/nvcc"))
    b = env.build_info()
    assert b["nvcc"] is None and b["kernels_buildable"] is False and "nvcc not found" in b["kernels_build_note"]


def test_cpu_router_table_keeps_dispatch_as_an_emulation_row():
    from hotpaths.bench.router_gemm import benchmark_rows

    rows = benchmark_rows([1, 48], 192, 4096, ["bf16x2_kernel", "dispatch", "fp32_cublas"])
    disp = [r for r in rows if r["impl"] == "dispatch_emulation"]
    assert [r["m"] for r in disp] == [1, 48]
    for r in disp:
        assert r["median_us"] is None and "dispatch picks" in r["note"] and "--impl dispatch" in r["repro"]
        # the row measures what dispatch picked (bf16x2 with no table for this device): the same error as that
        # impl's own emulation row at this M, and small against the fp32 result
        picked = next(x for x in rows if x["impl"] == "bf16x2_emulation" and x["m"] == r["m"])
        assert "picks bf16x2_kernel" in r["note"]
        assert r["max_abs_err"] == picked["max_abs_err"] and 0 <= r["max_abs_err"] < 1e-3


def test_sweeps_report_progress_per_case(monkeypatch):
    from hotpaths.bench import router_gemm
    from hotpaths.bench import split_kv_decode as decode_bench
    from hotpaths.harness import progress

    seen = []

    def spy(it, *, desc, total=None, unit="case"):
        seen.append(desc)
        return it
    monkeypatch.setattr(progress, "progress", spy)
    decode_bench.decode_rows(["2x64"], kv_dtypes=("bf16",), impls=("dynamic",), q_heads=8, kv_heads=1,
                             head_dim=64, assign=False, log=None)
    router_gemm.benchmark_rows([1], 64, 64, ["fp32_cublas"])
    assert seen == ["decode", "router"]


def test_progress_only_on_a_terminal_and_not_with_quiet(monkeypatch):
    import io

    from hotpaths.harness import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stderr", Tty())
    monkeypatch.setattr(progress, "QUIET", False)
    items = [1, 2, 3]
    assert list(progress.progress(items, desc="x")) == items and progress.progress(items, desc="x") is not items
    monkeypatch.setattr(progress, "QUIET", True)
    assert progress.progress(items, desc="x") is items
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(progress, "QUIET", False)
    assert progress.progress(items, desc="x") is items
    # a piped run prints no bar and accepts --quiet on every command
    r = hp("router", "--m", "1", "--json", "--quiet")
    assert r.returncode == 0 and r.stderr == ""


def test_cpu_flex_check_prints_no_compile_advice():
    """The eager flex_attention CPU check used to print torch's "use torch.compile" advice in every test run."""
    code = ("import warnings; warnings.simplefilter('error')\n"
            "from hotpaths.reference.split_kv_decode import make_decode_inputs\n"
            "from hotpaths.bench import split_kv_decode_peers as peers\n"
            "inp = make_decode_inputs([1, 63, 200], q_heads=8, kv_heads=2, head_dim=64, page_size=16,\n"
            "                         kv_dtype='bf16')\n"
            "peers.make_flex_attention_decode(inp, allow_cpu=True, compile=False)()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr[-800:]
    assert "torch.compile" not in r.stderr


def test_pytest_filters_only_torchs_own_jit_deprecation():
    import tomllib

    cfg = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    filters = cfg["tool"]["pytest"]["ini_options"].get("filterwarnings", [])
    assert any("torch.jit.script_method" in f and f.endswith(":torch.jit._script") for f in filters)
    assert all(not f.startswith("ignore::") for f in filters)  # narrow: a message and a module, never a category
