"""``torch.ops.hotpaths.fused_moe``: the fused FP8 MoE layer as a PyTorch custom op, so it composes with
torch.compile (a fake implementation gives the output's shape and dtype without running anything) and with CUDA
graphs.

``fused_moe(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, a1_scale, a2_scale, shared_out, scales,
expert_offset) -> out`` plans and runs the layer (hotpaths.kernels.fused_moe.fused_moe). Shape/Dtype: as
fused_moe.run(): x bf16 [T, H]; topk_ids int32 [T, K]; topk_weights fp32 [T, K]; w13 float8_e4m3fn [E, 2I, H];
w2 float8_e4m3fn [E, H, I]; scales "pertensor" (w13_scale, w2_scale fp32 [E], a1_scale, a2_scale fp32 [1]) or
"block" (w13_scale fp32 [E, ceil(2I/128), ceil(H/128)], w2_scale fp32 [E, ceil(H/128), ceil(I/128)], a1/a2 None);
shared_out bf16 [T, H] or None; out bf16 [T, H]. Errors: as fused_moe().
"""

from __future__ import annotations

import torch

# Filled by the package (hotpaths.kernels.fused_moe calls register() as it finishes importing), so this module does
# not import its package back: the import graph stays a tree.
_K: dict = {}


def register(fn) -> None:
    """Bind the public fused_moe() the op calls."""
    _K["fused_moe"] = fn


@torch.library.custom_op("hotpaths::fused_moe", mutates_args=())
def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, w13_scale: torch.Tensor, w2_scale: torch.Tensor, a1_scale: torch.Tensor | None,
              a2_scale: torch.Tensor | None, shared_out: torch.Tensor | None, scales: str,
              expert_offset: int) -> torch.Tensor:
    return _K["fused_moe"](x, topk_ids, topk_weights, w13, w2, scales=scales, w13_scale=w13_scale,
                           w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, expert_offset=expert_offset,
                           shared_out=shared_out)


@fused_moe.register_fake
def _(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, a1_scale, a2_scale, shared_out, scales,
      expert_offset):
    return x.new_empty(x.shape)
