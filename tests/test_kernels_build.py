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
