"""``torch.ops.hotpaths.attention_prologue``: the fused prologue as a PyTorch custom op (mutates the caches; returns
q and q_scale, q_scale an empty [0] fp32 tensor for bf16 Q since an op cannot return None), with a fake
implementation so it composes with torch.compile and meta tensors.

``attention_prologue(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache, eps,
norm_order, rope, rotary_dim, q_dtype, q_scale_static, k_scale, v_scale) -> (q, q_scale)``. Shape/Dtype: as
hotpaths.kernels.attention_prologue.attention_prologue(). Errors: as that function.
"""

from __future__ import annotations

import torch

from hotpaths.reference import attention_prologue as ref

# Filled by the package (hotpaths.kernels.attention_prologue calls register() as it finishes importing), so this
# module does not import its package back: the import graph stays a tree.
_K: dict = {}


def register(fn) -> None:
    """Bind the public attention_prologue() the op calls."""
    _K["attention_prologue"] = fn


@torch.library.custom_op("hotpaths::attention_prologue", mutates_args=("k_cache", "v_cache"))
def _attention_prologue_op(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
                           cos_sin: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, eps: float, norm_order: str, rope: str,
                           rotary_dim: int, q_dtype: str, q_scale_static: torch.Tensor | None,
                           k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    q, qs = _K["attention_prologue"](qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache,
                                     v_cache, eps=eps, norm_order=norm_order, rope=rope, rotary_dim=rotary_dim,
                                     q_dtype=q_dtype, q_scale_static=q_scale_static, k_scale=k_scale, v_scale=v_scale)
    return q, qs if qs is not None else torch.empty(0, dtype=torch.float32, device=q.device)


@_attention_prologue_op.register_fake
def _(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache, eps, norm_order, rope,
      rotary_dim, q_dtype, q_scale_static, k_scale, v_scale):
    T = qkv.shape[0]
    D = k_cache.shape[-1]
    Hq = qkv.shape[1] // D - 2 * k_cache.shape[2]
    if q_dtype == "bf16":
        return qkv.new_empty((T, Hq, D)), qkv.new_empty((0,), dtype=torch.float32)
    return (qkv.new_empty((T, Hq, D), dtype=ref.FP8_DTYPE), qkv.new_empty((T, Hq), dtype=torch.float32))
