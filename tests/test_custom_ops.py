"""torch.ops.hotpaths.split_kv_decode and torch.ops.hotpaths.router_gemm compose with torch.compile: a small module
calling both traces with fake tensors on CPU (shapes and dtypes from the fake implementations, nothing runs), and
on an SM90 GPU runs compiled and matches the eager result."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import hotpaths.kernels.router_gemm as rk
import hotpaths.kernels.split_kv_decode  # noqa: F401  (registers torch.ops.hotpaths.split_kv_decode)
from hotpaths.harness.env import requires_sm90
from hotpaths.reference.router_gemm import make_router_inputs, split_fp32_weight
from hotpaths.reference.split_kv_decode import make_decode_inputs

N, K = 192, 4096


class DecodeThenRoute(torch.nn.Module):
    """Attention output of one decode step, then router scores of a token batch: both ops in one graph."""

    def forward(self, q, k_cache, v_cache, block_table, kv_lens, x, w, w_high, w_low):
        o = torch.ops.hotpaths.split_kv_decode(q, k_cache, v_cache, block_table, kv_lens)
        s = torch.ops.hotpaths.router_gemm(x, w, w_high, w_low, "bf16x2_kernel")
        return o.float().sum(dim=-1), s.softmax(dim=-1)


def _inputs(device):
    d = make_decode_inputs([70, 5, 130], kv_dtype="bf16", q_heads=8, head_dim=128, page_size=16, device=device, seed=0)
    x, w = make_router_inputs(6, N, K, seed=1)
    wh, wl = (t.contiguous() for t in split_fp32_weight(w))
    return (d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["kv_lens"], x.to(device), w.to(device),
            wh.to(device), wl.to(device))


def test_ops_registered_with_schemas():
    assert "Tensor(a5!) out" in str(torch.ops.hotpaths.router_gemm_out.default._schema)
    assert "Tensor(a10!) out" in str(torch.ops.hotpaths.split_kv_decode_out.default._schema)


def test_compile_traces_both_ops_on_fake_tensors():
    real = _inputs("cpu")
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in real]
        o, s = torch.compile(DecodeThenRoute(), backend="eager", fullgraph=True)(*fake)
    q = real[0]
    assert o.shape == q.shape[:2] and o.dtype == torch.float32
    assert s.shape == (6, N) and s.dtype == torch.float32


def test_fake_out_variant_traces_without_running(monkeypatch):
    """Under fake tensors the out variant goes to its fake implementation: the real router_gemm never runs (it
    would refuse CPU input), and out keeps its shape and dtype."""
    from hotpaths.kernels.router_gemm import ops

    def real(*a, **kw):
        raise AssertionError("router_gemm_out ran its real implementation under FakeTensorMode")

    monkeypatch.setitem(ops._K, "router_gemm", real)
    x, w = make_router_inputs(3, N, K, seed=2)
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        out = torch.empty(3, N)
        torch.ops.hotpaths.router_gemm_out(fx, fw, fw.to(torch.bfloat16), fw.to(torch.bfloat16), "dispatch", out)
    assert (out.shape, out.dtype) == ((3, N), torch.float32)


def test_eager_op_without_gpu_says_why():
    """On CPU the op runs the public function, whose kernel impl refuses a non-CUDA input with the reason."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: covered by the GPU test")
    args = _inputs("cpu")
    with pytest.raises(RuntimeError, match="SM90"):
        torch.ops.hotpaths.router_gemm(*args[5:], "bf16x2_kernel")


@pytest.mark.gpu
@requires_sm90()
def test_compiled_matches_eager_on_gpu():
    args = _inputs("cuda")
    m = DecodeThenRoute()
    eo, es = m(*args)
    co, cs = torch.compile(m, fullgraph=True)(*args)
    torch.cuda.synchronize()
    assert torch.equal(co, eo)
    assert torch.allclose(cs, es, rtol=0, atol=1e-6)
    out = torch.full((6, N), float("nan"), device="cuda")
    torch.ops.hotpaths.router_gemm_out(*args[5:], "bf16x2_kernel", out)
    ref = rk.router_gemm(args[5], rk.plan(args[6]), impl="bf16x2_kernel")
    assert torch.equal(out, ref)
