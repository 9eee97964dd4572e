"""CI's sm_90a compile check: every op's .cu compiles for sm_90a and no hot kernel spills unexplained."""

import shutil

import pytest

from hotpaths.kernels import _build

OPS = _build.all_ops()


def test_ops_found():
    assert "probe" in OPS


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: cannot compile-check sm_90a here")
@pytest.mark.parametrize("op", OPS)
def test_compiles_for_sm90a_without_spills(op):
    rows = _build.compile_check(op)
    assert rows, f"ptxas reported no kernels for {op}"
    for r in rows:
        assert "registers" in r, r
    report = (_build.library_path(op).parent / "ptxas.txt").read_text()
    assert "sm_90a" in report


def test_ptxas_parser():
    text = """ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooPf
    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers"""
    rows = _build.ptxas_report(text)
    assert rows == [{"kernel": "_Z3fooPf", "stack": 16, "spill_stores": 8, "spill_loads": 8, "registers": 255}]


def test_unknown_op():
    with pytest.raises(ValueError, match="no .cu sources"):
        _build.sources("no_such_op")


# Two kernels that keep 96 floats live under a 64-register cap (__launch_bounds__(1024, 1)): both spill.
_SPILLERS = r"""
template <int TAG>
__global__ void __launch_bounds__(1024, 1) spiller(const float* __restrict__ x, float* __restrict__ y, int n) {
  float v[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) v[i] = x[threadIdx.x + i * 1024];
  for (int k = 0; k < n; ++k) {
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = v[i] * v[(i + 1) % 96] + v[(i + 7) % 96];
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 96; ++i) s += v[i] * (float)(i + TAG);
  y[threadIdx.x] = s;
}
template __global__ void spiller<1>(const float*, float*, int);
template __global__ void spiller<2>(const float*, float*, int);
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: cannot produce a ptxas report here")
def test_spill_gate_is_per_kernel(tmp_path):
    """A spilling kernel fails the gate unless a spills-ok line names it; one kernel's line never covers another."""
    import subprocess

    src = tmp_path / "spill.cu"
    src.write_text(_SPILLERS)
    proc = subprocess.run([_build.nvcc_path(), *_build.NVCC_FLAGS, "-c", "-o", str(tmp_path / "spill.o"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = _build.ptxas_report(proc.stdout + proc.stderr)
    spilling = sorted(r["kernel"] for r in rows if r.get("spill_stores", 0))
    assert len(spilling) == 2 and "ILi1E" in spilling[0] and "ILi2E" in spilling[1], rows  # the premise
    with pytest.raises(_build.KernelBuildError, match="ILi2E"):  # kernel 1 exempted, kernel 2 not
        _build.check_spills("synthetic", rows, ["// spills-ok(spillerILi1E): the test's own reason\n"])
    with pytest.raises(_build.KernelBuildError, match="spiller"):  # no line at all
        _build.check_spills("synthetic", rows, [_SPILLERS])
    _build.check_spills("synthetic", rows, ["// spills-ok(spillerILi1E): one\n// spills-ok(spillerILi2E): two\n"])


def test_spill_exemption_lines():
    text = "x\n  // spills-ok(TraitsILb1E): 4 CTAs per SM cap the registers\n"
    assert _build.spill_exemptions([text]) == {"TraitsILb1E": "4 CTAs per SM cap the registers"}
    for bad in ("// spills-ok: op-wide reason\n", "// spills-ok(): no kernel\n", "// spills-ok(k1):\n"):
        with pytest.raises(_build.KernelBuildError, match="malformed"):
            _build.spill_exemptions([bad])
    rows = [{"kernel": "_Z1aPf", "registers": 40, "spill_stores": 0, "spill_loads": 0}]
    _build.check_spills("no spills", rows, [])  # nothing spills: nothing to exempt
