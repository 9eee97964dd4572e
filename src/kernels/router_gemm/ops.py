"""``torch.ops.hotpaths.router_gemm``: the router GEMM as a PyTorch custom op, so it composes with torch.compile
(a fake implementation gives the output's shape and dtype without running anything) and with CUDA graphs.

The op takes the prepared weight's tensors rather than a RouterWeights object (custom ops take tensors and
scalars): ``router_gemm(x, w, w_high, w_low, impl) -> scores`` and ``router_gemm_out(x, w, w_high, w_low, impl,
out)`` writing ``out`` in place. Shape/Dtype: x bf16 [M, K]; w fp32 [N, K]; w_high, w_low bf16 [N, K] (plan()'s
split); out / returned scores fp32 [M, N]. impl: as router_gemm() minus "bf16x3_kernel" (the three-part split is
not passed). Errors: as router_gemm().
"""

from __future__ import annotations

import torch

# Filled by the package (hotpaths.kernels.router_gemm calls register() as it finishes importing), so this module
# does not import its package back: the import graph stays a tree.
_K: dict = {}


def register(*, router_gemm, weights_type) -> None:
    """Bind the public router_gemm() and the RouterWeights class the ops call."""
    _K.update(router_gemm=router_gemm, RouterWeights=weights_type)


def _weights(w: torch.Tensor, w_high: torch.Tensor, w_low: torch.Tensor):
    n, k = (int(s) for s in w.shape)
    return _K["RouterWeights"](w=w, w_high=w_high, w_low=w_low, w_mid=None, w_low2=None,
                           w_bf16=w.to(torch.bfloat16), n=n, k=k, three_part=False)


@torch.library.custom_op("hotpaths::router_gemm_out", mutates_args=("out",))
def router_gemm_out(x: torch.Tensor, w: torch.Tensor, w_high: torch.Tensor, w_low: torch.Tensor, impl: str,
                    out: torch.Tensor) -> None:
    _K["router_gemm"](x, _weights(w, w_high, w_low), impl=impl, out=out)


@router_gemm_out.register_fake
def _(x, w, w_high, w_low, impl, out) -> None:
    return None


@torch.library.custom_op("hotpaths::router_gemm", mutates_args=())
def router_gemm(x: torch.Tensor, w: torch.Tensor, w_high: torch.Tensor, w_low: torch.Tensor,
                impl: str = "dispatch") -> torch.Tensor:
    return _K["router_gemm"](x, _weights(w, w_high, w_low), impl=impl)


@router_gemm.register_fake
def _(x, w, w_high, w_low, impl="dispatch"):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)
