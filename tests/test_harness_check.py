import math

import pytest
import torch

from hotpaths.harness.check import assert_close, check
from hotpaths.harness.tolerances import TOLERANCES, Tolerance, tolerance


def _pair(n=4096, noise=1e-4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=torch.float64)
    return (ref + noise * torch.randn(n, generator=g, dtype=torch.float64)).float(), ref


def test_metrics_values():
    out, ref = _pair()
    r = check(out, ref, tol=Tolerance(rel_l2=1e-3))
    assert r.passed and 5e-5 < r.rel_l2_err < 2e-4 and r.cosine > 0.99999
    assert r.max_abs_err == pytest.approx(float((out.double() - ref).abs().max()))


def test_catches_one_wrong_value():
    out, ref = _pair()
    out[123] += 0.5
    r = check(out, ref, tol=Tolerance(rel_l2=1e-2, max_abs=1e-2))
    assert not r.passed and r.max_abs_err > 0.49


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_inf_never_pass(bad):
    out, ref = _pair()
    out[7] = bad
    r = check(out, ref, tol=Tolerance(rel_l2=1e9, max_abs=1e9))
    assert not r.passed and (r.nan_count + r.inf_count) == 1 and math.isnan(r.rel_l2_err)


def test_assert_close_reports_topk():
    out, ref = _pair()
    out[42] = 99.0
    with pytest.raises(AssertionError) as e:
        assert_close(out.reshape(64, 64), ref.reshape(64, 64), tol=Tolerance(rel_l2=1e-3))
    assert "(0, 42)" in str(e.value) and "FAIL" in str(e.value)


def test_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        check(torch.zeros(3), torch.zeros(4))


def test_tolerance_table_lookup():
    assert tolerance("probe", "exact").rel_l2 == 0.0
    with pytest.raises(KeyError, match="known paths"):
        tolerance("split_kv_decode", "no_such_path")
    for (op, path), t in TOLERANCES.items():
        assert t.rel_l2 >= 0 and (t.max_abs is None or t.max_abs >= 0), (op, path)


def test_expect_tensor_messages():
    from hotpaths.reference.common import expect_tensor

    t = torch.zeros(2, 3)
    expect_tensor(t, "x", dtype=torch.float32, ndim=2, device_type="cpu", contiguous=True)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
        expect_tensor([1], "x")
    with pytest.raises(TypeError, match=r"w: expected dtype torch.bfloat16 \(why\), got torch.float32"):
        expect_tensor(t, "w", dtype=torch.bfloat16, why=" (why)")
    with pytest.raises(ValueError, match=r"x: expected a 1-D \[batch\] tensor, got shape \(2, 3\)"):
        expect_tensor(t, "x", ndim=1, layout="[batch]")
    with pytest.raises(ValueError, match="x: expected a CUDA tensor, got device cpu"):
        expect_tensor(t, "x", device_type="cuda")
    with pytest.raises(ValueError, match="x: expected a contiguous tensor"):
        expect_tensor(t.t(), "x", contiguous=True)
