"""CPU tests of the GPU-run tooling: the wheel list and its checker, run_on_gpu.sh / unpack_results.sh, the
Nsight Compute helper's parsing and 'unavailable' path, and the NVRTC path's errors and options."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pandas
import pytest

from hotpaths.harness import ncu, nvrtc

ROOT = Path(__file__).resolve().parents[1]
GPU_TOOLS = ROOT / "tools" / "gpu"


def _load_check_wheels():
    spec = importlib.util.spec_from_file_location("check_wheels", GPU_TOOLS / "check_wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cw = _load_check_wheels()


# ---------------------------------------------------------------- wheel list


def test_wheels_txt_pins_the_notebook_stack_once_each_and_nothing_the_image_has():
    pins = cw.parse_wheels_txt((GPU_TOOLS / "wheels.txt").read_text())
    for need in ("papermill", "nbclient", "nbformat", "ipykernel", "jupyter-client", "jupyter-core", "pyzmq",
                 "tornado", "traitlets", "ipython"):
        assert need in pins, f"{need} missing from wheels.txt"
    assert cw.pins_already_there(pins) == []
    # The image list itself must hold what the notebooks import from it (else the bundle is incomplete).
    for there in ("torch", "numpy", "pandas", "pyyaml", "matplotlib", "tqdm", "requests", "click", "cupy-cuda13x"):
        assert there in cw.ALREADY_THERE


def test_parse_wheels_txt_rejects_duplicates_unpinned_and_flags_image_packages():
    assert cw.parse_wheels_txt("# c\n\nFoo_Bar==1.0  # why\n") == {"foo-bar": "1.0"}
    with pytest.raises(ValueError, match="pinned twice"):
        cw.parse_wheels_txt("foo-bar==1.0\nFoo_Bar==2.0\n")
    with pytest.raises(ValueError, match="line 2"):
        cw.parse_wheels_txt("a==1\nb>=2\n")
    assert cw.pins_already_there({"torch": "2.11.0", "papermill": "2.7.0"}) == ["torch"]


def _fake_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_check_bundle_finds_missing_deps_bad_versions_and_duplicates(tmp_path):
    _fake_wheel(tmp_path, "alpha", "1.0", [
        "beta>=2",                                   # carried, but pinned too old below
        "gamma",                                     # neither carried nor on the image
        "numpy",                                     # on the image
        "delta; extra == 'test'",                    # extra: skipped
        "winonly; sys_platform == 'win32'",          # other platform: skipped
        "old; python_version < '3.12'",              # older Python: skipped
    ])
    _fake_wheel(tmp_path, "beta", "1.5", [])
    problems = cw.check_bundle({"alpha": "1.0", "beta": "1.5"}, tmp_path)
    text = "\n".join(problems)
    assert "beta>=2" in text and "gamma" in text
    assert not any(w in text for w in ("numpy", "delta", "winonly", "old"))
    assert len(problems) == 2

    _fake_wheel(tmp_path, "beta", "2.0", [])         # now two versions of beta in the folder
    problems = cw.check_bundle({"alpha": "1.0", "beta": "2.0"}, tmp_path)
    assert any("2 wheels" in p for p in problems)
    assert any("no wheel" in p for p in cw.check_bundle({"zeta": "1.0"}, tmp_path))
    assert any("not pinned" in p for p in cw.check_bundle({"alpha": "1.0"}, tmp_path))


def test_downloaded_bundle_is_consistent_when_present():
    whl = ROOT / ".whl"
    if not any(whl.glob("*.whl")):
        pytest.skip("no .whl/ bundle here (built on demand by tools/gpu/build_wheels.sh)")
    pins = cw.parse_wheels_txt((GPU_TOOLS / "wheels.txt").read_text())
    assert cw.check_bundle(pins, whl) == []
    assert sum(p.stat().st_size for p in whl.glob("*.whl")) < 25 * 2**20


# ---------------------------------------------------------------- shell scripts


_FAKE_PY = """#!/bin/bash
# Stands in for python3: records each call, answers the probes run_on_gpu.sh makes, and for `-m hotpaths`
# writes one result file and exits 7 (so the test sees whose exit status the script returns).
printf '%s\\n' "$*" >> "$CALLS"
case "$*" in
  *"-m hotpaths"*) mkdir -p data/results/h200 && echo "op,case" > data/results/h200/t.csv; exit 7 ;;
  *"-m pytest"*) exit 0 ;;
  *device_tag*) echo h200 ;;
esac
exit 0
"""


def test_run_on_gpu_runs_hotpaths_then_gpu_tests_and_packs_results(tmp_path):
    """run_on_gpu.sh on CPU with a fake python: it links hotpaths -> src, passes its arguments to
    `python -m hotpaths`, runs the GPU tests when asked, returns hotpaths' exit status and packs the results."""
    repo = _tool_copy(tmp_path)
    (repo / "src").mkdir()
    fake = tmp_path / "fakepy"
    fake.write_text(_FAKE_PY)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PYTHON=str(fake), CALLS=str(calls), OUT=str(tmp_path / "out"), SITE=str(tmp_path / "site"),
               HP_LINK_DIR=str(tmp_path / "hp"), JK_PREFIX=str(tmp_path / "jk"), GPU_TESTS="1")
    r = subprocess.run(["bash", str(repo / "tools/gpu/run_on_gpu.sh"), "env", "--json"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 7, r.stdout + r.stderr
    lines = calls.read_text().splitlines()
    assert "-m hotpaths env --json" in lines
    assert any(c.startswith("-m pytest -m gpu tests") for c in lines)
    assert lines.index("-m hotpaths env --json") < next(i for i, c in enumerate(lines) if "-m pytest" in c)
    assert (tmp_path / "hp" / "hotpaths").resolve() == (repo / "src").resolve()
    with tarfile.open(tmp_path / "out" / "hotpaths_results.tar.gz") as tf:
        assert "data/results/h200/t.csv" in tf.getnames()
    assert "hotpaths exited 7" in (tmp_path / "out" / "run.log").read_text()


@pytest.mark.parametrize("script", ["build_wheels.sh", "unpack_results.sh"])
def test_scripts_parse(script):
    """Syntax of the scripts whose behaviour needs a network or a GPU (unpack_results.sh also runs below)."""
    r = subprocess.run(["bash", "-n", str(GPU_TOOLS / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _tool_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copytree(GPU_TOOLS, repo / "tools" / "gpu")
    return repo


def test_unpack_results_round_trip_and_refuses_paths_outside(tmp_path):
    repo = _tool_copy(tmp_path)
    src = tmp_path / "src"
    (src / "data/results/h200").mkdir(parents=True)
    (src / "data/results/h200/ceilings.csv").write_text("op\nx\n")
    (src / "papermill_runs/h200").mkdir(parents=True)
    (src / "papermill_runs/h200/manifest.json").write_text("{}\n")
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tf:
        tf.add(src / "data", arcname="data")
        tf.add(src / "papermill_runs", arcname="papermill_runs")
    r = subprocess.run(["bash", str(repo / "tools/gpu/unpack_results.sh"), str(good)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (repo / "data/results/h200/ceilings.csv").read_text() == "op\nx\n"
    assert (repo / "papermill_runs/h200/manifest.json").exists()

    for bad_name in ("etc/passwd", "data/results/../../escape.txt"):
        bad = tmp_path / "bad.tar.gz"
        with tarfile.open(bad, "w:gz") as tf:
            tf.add(src / "data/results/h200/ceilings.csv", arcname=bad_name)
        r = subprocess.run(["bash", str(repo / "tools/gpu/unpack_results.sh"), str(bad)], capture_output=True,
                           text=True)
        assert r.returncode == 1 and "refusing" in r.stderr
    assert not (tmp_path / "escape.txt").exists() and not (repo / "etc").exists()
    r = subprocess.run(["bash", str(repo / "tools/gpu/unpack_results.sh")], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def test_run_on_gpu_packs_results_and_keeps_the_exit_status(tmp_path):
    # The script runs here without .whl/, so it needs the notebook stack importable with an empty PYTHONPATH: true in
    # the project's environment (make setup), not on the GPU machine, whose stack is carried as wheels.
    probe = subprocess.run([sys.executable, "-c", "import papermill, ipykernel"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": ""})
    if probe.returncode:
        pytest.skip("papermill / ipykernel not importable without PYTHONPATH (run in the project's environment)")
    repo = _tool_copy(tmp_path)
    # A stand-in hotpaths: writes one table and fails, like a notebook failing after writing something.
    (repo / "src/harness").mkdir(parents=True)
    (repo / "src/__init__.py").write_text("")
    (repo / "src/harness/__init__.py").write_text("")
    (repo / "src/harness/env.py").write_text("def device_tag():\n    return 'h200'\n")
    (repo / "src/__main__.py").write_text(textwrap.dedent("""\
        import pathlib, sys
        d = pathlib.Path("data/results/h200"); d.mkdir(parents=True)
        (d / "t.csv").write_text("args," + " ".join(sys.argv[1:]) + "\\n")
        sys.exit(5)
        """))
    # A carried peer bundle (.carry/peers/, here a stand-in HPC-Ops) is unpacked by peers_env.sh, which exports
    # the folder the peer adapters read (the decode / router / prologue peer rows).
    (repo / ".carry/peers").mkdir(parents=True)
    src = tmp_path / "peer_src" / "hpc_ops" / "hpc"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("marker = 'peer'\n")
    with tarfile.open(repo / ".carry/peers/hpc_ops_sm90a_test.tar.gz", "w:gz") as tf:
        tf.add(src.parent, arcname="hpc_ops")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "HP_LINK_DIR": str(tmp_path / "hp"),
           "JK_PREFIX": str(tmp_path / "jk"), "SITE": str(tmp_path / "site"), "PYTHONPATH": "",
           "PEERS_DIR": str(tmp_path / "peers")}
    r = subprocess.run(["bash", str(repo / "tools/gpu/run_on_gpu.sh"), "reproduce", "--only", "00"],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 5, r.stdout + r.stderr
    assert (tmp_path / "jk/share/jupyter/kernels/python3/kernel.json").exists()
    with tarfile.open(out / "hotpaths_results.tar.gz") as tf:
        assert tf.extractfile("data/results/h200/t.csv").read() == b"args,reproduce --only 00\n"
    log = (out / "run.log").read_text()
    assert "python3 -m hotpaths reproduce --only 00" in log and "exited 5" in log
    assert (tmp_path / "peers/hpc_ops/hpc/__init__.py").read_text() == "marker = 'peer'\n"
    assert f"[peers_env] hpc_ops={tmp_path / 'peers' / 'hpc_ops'}" in log


# ---------------------------------------------------------------- Nsight Compute helper

RAW = textwrap.dedent("""\
    ==PROF== Connected to process 4242 (/usr/bin/python3.12)
    ==PROF== Profiling "probe_copy_kernel": 0%....50%....100% - 9 passes
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","gpu__time_duration.sum","launch__registers_per_thread"
    "","","","","","","","","","","","byte","nsecond","register/thread"
    "0","4242","python3.12","127.0.0.1","probe_copy_kernel","1","7","(256, 1, 1)","(528, 1, 1)","0","9.0","1,073,741,824","502,112","32"
    "1","4242","python3.12","127.0.0.1","probe_copy_kernel","1","7","(256, 1, 1)","(528, 1, 1)","0","9.0","1,073,741,824","498,000.5","32"
    ==PROF== Disconnected from process 4242
    """)


def test_parse_raw_csv_gives_a_narrow_table_with_units():
    df = ncu.parse_raw_csv(RAW)
    assert list(df.columns) == ncu.COLUMNS
    assert len(df) == 6 and sorted(df["launch"].unique()) == [0, 1]
    t = df[(df.metric == "gpu__time_duration.sum") & (df.launch == 1)].iloc[0]
    assert t.value == pytest.approx(498000.5) and t.unit == "nsecond" and t.kernel == "probe_copy_kernel"
    b = df[(df.metric == "dram__bytes_read.sum") & (df.launch == 0)].iloc[0]
    assert b.value == 2**30 and b.unit == "byte"
    with pytest.raises(ValueError, match="header"):
        ncu.parse_raw_csv("==PROF== nothing\n")


def test_failure_reason_reads_ncu_lines_only():
    assert "ERR_NVGPUCTRPERM" in ncu.failure_reason("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1)
    assert "LibraryNotLoaded" in ncu.failure_reason("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1)
    assert "matched" in ncu.failure_reason("==WARNING== No kernels were profiled.", 0)
    # The profiled program printing such words is not a profiler failure.
    assert ncu.failure_reason("fp8 not supported in this path\n" + RAW, 0) is None
    assert "status 7" in ncu.failure_reason("Traceback...\nboom", 7)


def test_build_command_validates_and_imports_callables():
    cmd = ncu.build_command("print(1)", kernel_regex="probe", launch_skip=2, launch_count=1)
    assert cmd[:3] == ["ncu", "--clock-control", "none"] and "regex:probe" in cmd
    assert cmd[cmd.index("--launch-skip") + 1] == "2" and cmd[-2:] == ["-c", "print(1)"]
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(ncu.DEFAULT_METRICS)
    with pytest.raises(ValueError, match="launch_count"):
        ncu.build_command("x", kernel_regex="k", launch_count=0)
    with pytest.raises(ValueError, match="kernel_regex"):
        ncu.build_command("x", kernel_regex="")
    with pytest.raises(ValueError, match="metrics"):
        ncu.build_command("x", kernel_regex="k", metrics=[])

    def local():
        pass

    with pytest.raises(ValueError, match="top-level function"):
        ncu.build_command(local, kernel_regex="k")
    cmd = ncu.build_command(ncu.find_ncu, kernel_regex="k")
    assert cmd[-1] == "import hotpaths.harness.ncu as _m; _m.find_ncu()"


def _hide_ncu(monkeypatch, tmp_path):
    empty = tmp_path / "emptybin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("HOTPATHS_NCU", raising=False)
    monkeypatch.setattr(ncu, "FALLBACK_NCU_DIRS", [])


def test_profile_without_ncu_records_unavailable(monkeypatch, tmp_path):
    _hide_ncu(monkeypatch, tmp_path)
    ok, reason = ncu.ncu_available()
    assert not ok and "not found" in reason
    out = tmp_path / "p" / "probe.csv"
    with pytest.warns(RuntimeWarning, match="unavailable"):
        df = ncu.profile("print(1)", kernel_regex="probe_copy", out_csv=out)
    assert ncu.is_unavailable(df)
    assert df["note"].iloc[0].startswith("unavailable: ncu (Nsight Compute CLI) not found")
    saved = pandas.read_csv(out)
    assert saved["metric"].tolist() == ["unavailable"] and "not found" in saved["note"].iloc[0]
    with pytest.raises(ncu.NcuUnavailable, match="not found"):
        ncu.profile("print(1)", kernel_regex="probe_copy", out_csv=None, strict=True)


FAKE_NCU = """#!{python}
# Stand-in for ncu: writes the given text to --log-file (or stdout) and exits with the given status.
import sys
args = sys.argv[1:]
text = open({payload!r}).read()
if "--log-file" in args:
    open(args[args.index("--log-file") + 1], "w").write(text)
else:
    sys.stdout.write(text)
sys.exit({rc})
"""


def _fake_ncu(monkeypatch, tmp_path, payload: str, rc: int):
    _hide_ncu(monkeypatch, tmp_path)
    (tmp_path / "payload.txt").write_text(payload)
    exe = tmp_path / "emptybin" / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, payload=str(tmp_path / "payload.txt"), rc=rc))
    exe.chmod(0o755)
    monkeypatch.setattr(ncu, "_gpu_visible", lambda: (True, ""))


def test_profile_or_note_returns_the_reason_instead_of_a_table(monkeypatch, tmp_path):
    _hide_ncu(monkeypatch, tmp_path)
    with pytest.warns(RuntimeWarning, match="unavailable"):
        df, why = ncu.profile_or_note("print(1)", kernel_regex="probe_copy", out_csv=None)
    assert df is None and why.startswith("unavailable: ncu (Nsight Compute CLI) not found")
    df, why = ncu.profile_or_note("print(1)", kernel_regex="", out_csv=None)  # a bad argument raises inside
    assert df is None and why.startswith("unavailable: ValueError: kernel_regex")


def test_profile_parses_ncu_output_through_the_log_file(monkeypatch, tmp_path):
    _fake_ncu(monkeypatch, tmp_path, RAW, 0)
    df = ncu.profile(["true"], kernel_regex="probe_copy", out_csv=tmp_path / "r" / "probe.csv")
    assert not ncu.is_unavailable(df) and len(df) == 6
    assert (tmp_path / "r" / "probe.csv").exists() and (tmp_path / "r" / "probe.ncu.txt").exists()
    assert "--clock-control none" in df.attrs["command"]


def test_profile_records_counter_permission_error(monkeypatch, tmp_path):
    _fake_ncu(monkeypatch, tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n", 1)
    with pytest.warns(RuntimeWarning):
        df = ncu.profile(["true"], kernel_regex="probe", out_csv=None)
    assert ncu.is_unavailable(df) and "ERR_NVGPUCTRPERM" in df["note"].iloc[0]


def test_profile_bare_name_goes_to_profiles_dir(monkeypatch, tmp_path):
    _hide_ncu(monkeypatch, tmp_path)
    monkeypatch.setenv("HOTPATHS_PROFILES_DIR", str(tmp_path / "profiles"))
    with pytest.warns(RuntimeWarning):
        ncu.profile("print(1)", kernel_regex="k", out_csv="probe_copy")
    assert (tmp_path / "profiles" / "probe_copy.csv").exists()


# ---------------------------------------------------------------- NVRTC path

TOY_CU = """// toy kernel for the NVRTC path
#if !defined(__CUDACC_RTC__)
#include <cuda_runtime.h>
#endif
#ifndef TILE
#define TILE 64
#endif
extern "C" __global__ void toy_kernel(float* y) { y[threadIdx.x] = TILE; }
"""


@pytest.fixture
def toy_kernels(monkeypatch, tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "toy.cu").write_text(TOY_CU)
    (tmp_path / "toy" / "toy.cuh").write_text("#pragma once\n")
    monkeypatch.setattr(nvrtc, "KERNELS_DIR", tmp_path)
    return tmp_path / "toy"


def test_nvrtc_without_cupy_gives_the_clear_error(monkeypatch, toy_kernels):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(nvrtc.NvrtcUnavailable, match="CuPy RawModule path needs a CUDA GPU; the compiled build"):
        nvrtc.compile_raw("toy", ["toy_kernel"], defines={"TILE": 128})


class _FakeRawModule:
    last = None

    def __init__(self, *, code, options, backend, name_expressions):
        self.code, self.options, self.backend, self.name_expressions = code, options, backend, name_expressions
        self.compiled = False
        _FakeRawModule.last = self

    def compile(self):
        self.compiled = True

    def get_function(self, name):
        if name not in ("toy_kernel", "tile<128>"):
            raise Exception(f"CUDA_ERROR_NOT_FOUND: {name}")
        return name


def _fake_cupy(ndev: int):
    runtime = type("rt", (), {"getDeviceCount": staticmethod(lambda: ndev)})
    cuda = type("cuda", (), {"runtime": runtime})
    return type("cupy", (), {"cuda": cuda, "RawModule": _FakeRawModule})


def test_nvrtc_without_gpu_gives_the_clear_error(monkeypatch, toy_kernels):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(0))
    with pytest.raises(nvrtc.NvrtcUnavailable, match="needs a CUDA GPU"):
        nvrtc.compile_raw("toy", ["toy_kernel"])


def test_nvrtc_compiles_the_same_source_with_defines(monkeypatch, toy_kernels):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    mod = nvrtc.compile_raw("toy", ["toy_kernel"], defines={"TILE": 128, "USE_PDL": True},
                            name_expressions=["tile<128>"])
    assert mod is _FakeRawModule.last and mod.compiled and mod.backend == "nvrtc"
    assert TOY_CU in mod.code and f'#line 1 "{(toy_kernels / "toy.cu").as_posix()}"' in mod.code
    for opt in ("-std=c++17", "--gpu-architecture=sm_90a", f"-I{toy_kernels}", "-DTILE=128", "-DUSE_PDL=1"):
        assert opt in mod.options
    assert f"-I{nvrtc.stub_include_dir()}" in mod.options and "griddepcontrol.wait" in mod.code
    assert "typedef long long int64_t;" in (nvrtc.stub_include_dir() / "stdint.h").read_text()
    assert mod.name_expressions == ["tile<128>"]
    with pytest.raises(KeyError, match="typo_kernel"):
        nvrtc.compile_raw("toy", ["typo_kernel"])


def test_nvrtc_rejects_bad_arguments(toy_kernels):
    with pytest.raises(ValueError, match="no kernel folder"):
        nvrtc.compile_raw("nope")
    with pytest.raises(ValueError, match="macro name"):
        nvrtc.nvrtc_options("toy", {"1BAD": 1})
    with pytest.raises(ValueError, match="defines"):
        nvrtc.nvrtc_options("toy", {"TILE": "64 -DEVIL=1"})
    with pytest.raises(ValueError, match="arch"):
        nvrtc.nvrtc_options("toy", arch="hopper")
    with pytest.raises(ValueError, match="not in src/kernels/toy"):
        nvrtc.build_source("toy", ["missing.cu"])
