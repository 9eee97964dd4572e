"""``torch.ops.hotpaths.split_kv_decode``: decode attention as a PyTorch custom op, so it composes with
torch.compile (a fake implementation gives the output's shape and dtype without running anything) and with CUDA
graphs.

``split_kv_decode(q, k_cache, v_cache, block_table, kv_lens, q_scale, k_scale, v_scale, q_len, sm_scale) -> out``
plans and runs the dynamic schedule (hotpaths.kernels.split_kv_decode.split_kv_decode); ``split_kv_decode_out(...,
out)`` writes ``out`` in place. Shape/Dtype: as split_kv_decode.run(): q [batch*q_len, q_heads, 128] bf16 or fp8
(with q_scale fp32 [batch*q_len, q_heads]); k_cache, v_cache [pages, page_size, kv_heads, 128] bf16 or fp8 (with
k_scale, v_scale fp32 [1]); block_table [batch, max_pages] int32; kv_lens [batch] int32; out bf16 like q.
sm_scale <= 0 means 1/sqrt(head_dim). Errors: as split_kv_decode().
"""

from __future__ import annotations

import torch

# Filled by the package (hotpaths.kernels.split_kv_decode calls register() as it finishes importing), so this
# module does not import its package back: the import graph stays a tree.
_K: dict = {}


def register(fn) -> None:
    """Bind the public split_kv_decode() the ops call."""
    _K["split_kv_decode"] = fn


def _scale(sm_scale: float) -> float | None:
    return None if sm_scale <= 0 else sm_scale


@torch.library.custom_op("hotpaths::split_kv_decode_out", mutates_args=("out",))
def split_kv_decode_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        kv_lens: torch.Tensor, q_scale: torch.Tensor | None, k_scale: torch.Tensor | None,
                        v_scale: torch.Tensor | None, q_len: int, sm_scale: float, out: torch.Tensor) -> None:
    _K["split_kv_decode"](q, k_cache, v_cache, block_table, kv_lens, q_len=q_len, q_scale=q_scale, k_scale=k_scale,
                      v_scale=v_scale, sm_scale=_scale(sm_scale), out=out)


@split_kv_decode_out.register_fake
def _(q, k_cache, v_cache, block_table, kv_lens, q_scale, k_scale, v_scale, q_len, sm_scale, out) -> None:
    return None


@torch.library.custom_op("hotpaths::split_kv_decode", mutates_args=())
def split_kv_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    kv_lens: torch.Tensor, q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None, q_len: int = 1, sm_scale: float = 0.0) -> torch.Tensor:
    return _K["split_kv_decode"](q, k_cache, v_cache, block_table, kv_lens, q_len=q_len, q_scale=q_scale,
                             k_scale=k_scale, v_scale=v_scale, sm_scale=_scale(sm_scale))


@split_kv_decode.register_fake
def _(q, k_cache, v_cache, block_table, kv_lens, q_scale=None, k_scale=None, v_scale=None, q_len=1, sm_scale=0.0):
    return q.new_empty(q.shape, dtype=torch.bfloat16)
