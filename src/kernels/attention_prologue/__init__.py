"""Fused attention prologue on SM90: loader, public function, and the ``torch.ops.hotpaths.attention_prologue`` op.

    q, q_scale = attention_prologue(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping,
                                    k_cache, v_cache, k_scale=ks, v_scale=vs)   # K/V written into the caches
    out = split_kv_decode.run(plan, q, k_cache, v_cache, block_table, kv_lens, q_scale=q_scale, k_scale=ks, ...)

One kernel (prologue.cu) reads the QKV projection output once and writes Q (FP8 + per-token-per-head scales, or
BF16) and the paged K/V cache once; the math, layouts and precision are those of
hotpaths.reference.attention_prologue (attention_prologue_emulation is bit-exact with the kernel by design).
PDL: launched with programmatic stream serialization (it may start while its predecessor drains; it waits before
reading anything), and with ``trigger`` it lets its successor (the decode attention kernel, also PDL-launched) be
scheduled right after that wait (the successor's own wait still covers this whole grid's writes). (Deeper per-thread
queues in the one-shot kernels and reads before the wait were measured and removed: docs/ops/attention_prologue.md.)
"""

from __future__ import annotations

import ctypes
import functools

import torch

from hotpaths.reference import attention_prologue as ref
from hotpaths.reference.common import sm90_skip_reason

OP = "attention_prologue"
HEAD_DIMS = ref.HEAD_DIMS
_Q_MODE = {"dynamic": 0, "static": 1, "bf16": 2}
# Kernel variants (docs/ops/attention_prologue.md, "Kernel variants"): "baseline" one (token, head) unit per D/8
# lanes; "pair" one unit per D/16 lanes, a lane holding a neox element and its rotate-half partner (no shuffles,
# half the cos/sin loads, more bytes in flight per thread); "tokwarp2" one warp per token in that layout, cos/sin,
# position, slot and norm weights read once per token, the qkv loads two head passes ahead. Every variant writes
# the same bytes (the pair variants run the baseline for neox when rotary_dim / 16 is not a power of two). "auto"
# picks per launch by the measured crossovers (choose_variant). (Persistent-grid prefill variants with 2-3 items of
# loads queued per warp were measured slower than pair at every size and removed: docs/ops/attention_prologue.md.)
VARIANTS = ("auto", "baseline", "pair", "tokwarp2")
DEFAULT_VARIANT = "auto"
_KERNEL_CODE = {"baseline": 0, "pair": 1, "tokwarp2": 2}
# Crossovers measured on the H200 (same run, 8q/1kv and 64q/8kv, d128): the baseline's smaller units fill more SMs
# while units (tokens x heads) stay below ~4K (1-7 tokens: 5.1 vs 5.3 us; level at 64-256 tokens of 8q/1kv), the
# pair layout wins above (8q/1kv 4096 tokens 14.5 vs 18.0 us), and one warp per token wins once a token has many
# heads to share its cos/sin row and enough tokens to fill the GPU (64q/8kv 4096 / 16384 tokens: 60.2 / 214.7 vs
# 65.7 / 240.3 us) but loses at 256 tokens (23.2 vs 9.9 us) and with 10 heads per token (16.5 vs 14.5 us).
_PAIR_MIN_UNITS = 4096
_TOKWARP_MIN_HEADS = 40
_TOKWARP_MIN_TOKENS = 2048


def choose_variant(tokens: int, q_heads: int, kv_heads: int) -> str:
    """The variant "auto" runs for this launch size (the same bytes whichever runs; see the crossovers above)."""
    heads = q_heads + 2 * kv_heads
    if heads >= _TOKWARP_MIN_HEADS and tokens >= _TOKWARP_MIN_TOKENS:
        return "tokwarp2"
    return "pair" if tokens * heads >= _PAIR_MIN_UNITS else "baseline"
# tensors the kernel reads or writes with 16-byte accesses (the others need only their element alignment)
_VECTOR_ARGS = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "k_cache", "v_cache", "q_out")


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from hotpaths.kernels import _build

    lib = _build.load(OP)
    vp, i, ll, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
    lib.hp_attention_prologue.argtypes = [vp, vp, vp, vp, vp, i, vp, vp, vp, vp, vp, vp, vp, vp, ll, i, i, i, i, ll,
                                          i, f, i, i, i, i, i, i, i, vp]
    lib.hp_attention_prologue.restype = i
    return lib


def _is_capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def _check_device(cfg, tensors: dict) -> torch.device:
    dev = tensors["qkv"].device
    if dev.type != "cuda":
        raise RuntimeError("attention_prologue: the kernel needs CUDA tensors on an SM90 GPU "
                           f"(qkv is on {dev}); use hotpaths.reference.attention_prologue.attention_prologue_emulation")
    reason = sm90_skip_reason()
    if reason is not None:
        raise RuntimeError(f"attention_prologue: {reason}")
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device != dev:
            raise ValueError(f"{name}: expected a tensor on {dev} (where qkv is), got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor; call .contiguous() first")
        if name in _VECTOR_ARGS and t.data_ptr() % 16:
            raise ValueError(f"{name}: expected a 16-byte aligned tensor (the kernel uses 16-byte accesses)")
    return dev


def attention_prologue(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache, *,
                       eps: float = ref.DEFAULT_EPS, norm_order: str = "norm_rope", rope: str = "neox",
                       rotary_dim: int | None = None, q_dtype: str = "fp8", q_scale_static=None, k_scale=None,
                       v_scale=None, q_out=None, q_scale_out=None, pdl: bool = True, trigger: bool = True,
                       check_inputs: bool | None = None, variant: str = DEFAULT_VARIANT):
    """QK-Norm -> RoPE (or RoPE -> norm) -> Q in FP8/BF16 + K/V into the paged cache, in one kernel.

    Shape/Dtype: qkv [tokens, (q_heads + 2*kv_heads) * head_dim] bf16 (Q heads, then K, then V); q_norm_weight,
    k_norm_weight [head_dim] bf16; cos_sin [max_pos, rotary_dim] fp32 (cos half, sin half); positions [tokens]
    int32/int64; slot_mapping [tokens] int64 (page * page_size + offset, -1 = pad: no cache write, Q still
    written); k_cache, v_cache [num_pages, page_size, kv_heads, head_dim] float8_e4m3fn (with k_scale, v_scale
    fp32 [1]) or bf16, written in place; q_scale_static fp32 [1] (FP8 Q with a fixed scale) or None (computed
    amax/448 per token and head). head_dim 64/128/256; rotary_dim a multiple of 16 <= head_dim (default head_dim).
    Returns (q [tokens, q_heads, head_dim] float8_e4m3fn or bf16 (q_dtype), q_scale [tokens, q_heads] fp32 for
    FP8 Q, else None): the layout hotpaths.kernels.split_kv_decode.run() reads. q_out / q_scale_out: preallocated
    outputs (CUDA-graph capture).
    pdl: launch with programmatic stream serialization; trigger: let the next PDL kernel be scheduled right after
    this kernel's own PDL wait (False: never). variant: one of VARIANTS (the same bytes; launch shape only;
    "auto": choose_variant).
    check_inputs (default: True unless a CUDA graph is being captured) reads slot_mapping and positions on the
    host to reject out-of-range values; without it the kernel skips out-of-range slots and clamps positions.
    Raises TypeError/ValueError naming the argument (dtype, shape, unsupported head_dim / rotary_dim / option,
    slot or position out of range, misaligned or non-contiguous tensor) before anything is launched; RuntimeError
    without an SM90 GPU or on a CUDA error.
    """
    if check_inputs is None:
        check_inputs = not _is_capturing()
    if not isinstance(trigger, bool):
        raise TypeError(f"trigger: expected a bool, got {trigger!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    cfg = ref.validate_inputs(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache,
                              eps=eps, norm_order=norm_order, rope=rope, rotary_dim=rotary_dim, q_dtype=q_dtype,
                              q_scale_static=q_scale_static, k_scale=k_scale, v_scale=v_scale,
                              check_values=check_inputs)
    T, Hq, D = cfg.tokens, cfg.q_heads, cfg.head_dim
    kernel = choose_variant(T, cfg.q_heads, cfg.kv_heads) if variant == "auto" else variant
    if T * (cfg.q_heads + 2 * cfg.kv_heads) >= 2 ** 31:
        raise ValueError(f"qkv: {T} tokens x {cfg.q_heads + 2 * cfg.kv_heads} heads >= 2^31 (head units are indexed "
                         "in 32 bits); split the batch")
    q_torch_dtype = torch.bfloat16 if cfg.q_mode == "bf16" else ref.FP8_DTYPE
    dev = _check_device(cfg, dict(qkv=qkv, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, cos_sin=cos_sin,
                                  positions=positions, slot_mapping=slot_mapping, k_cache=k_cache, v_cache=v_cache,
                                  q_scale_static=q_scale_static, k_scale=k_scale, v_scale=v_scale, q_out=q_out,
                                  q_scale_out=q_scale_out))
    if q_out is not None and (q_out.dtype != q_torch_dtype or tuple(q_out.shape) != (T, Hq, D)):
        raise ValueError(f"q_out: expected {q_torch_dtype} [{T}, {Hq}, {D}], got {q_out.dtype} {tuple(q_out.shape)}")
    if q_scale_out is not None:
        if cfg.q_mode == "bf16":
            raise ValueError("q_scale_out: given but q_dtype is 'bf16' (no scales)")
        if q_scale_out.dtype != torch.float32 or tuple(q_scale_out.shape) != (T, Hq):
            raise ValueError(f"q_scale_out: expected float32 [{T}, {Hq}], got {q_scale_out.dtype} "
                             f"{tuple(q_scale_out.shape)}")
    if q_out is None:
        q_out = torch.empty((T, Hq, D), dtype=q_torch_dtype, device=dev)
    if q_scale_out is None and cfg.q_mode != "bf16":
        q_scale_out = torch.empty((T, Hq), dtype=torch.float32, device=dev)
    from hotpaths.kernels._build import check_status, ptr, stream_ptr

    lib = _lib()
    with torch.cuda.device(dev):
        code = lib.hp_attention_prologue(
            ptr(qkv), ptr(q_norm_weight), ptr(k_norm_weight), ptr(cos_sin), ptr(positions),
            int(positions.dtype == torch.int64), ptr(slot_mapping), ptr(k_cache), ptr(v_cache), ptr(q_out),
            ptr(q_scale_out), ptr(q_scale_static), ptr(k_scale), ptr(v_scale), T, cfg.q_heads, cfg.kv_heads, D,
            cfg.rotary_dim, cfg.num_pages * cfg.page_size, int(cos_sin.shape[0]), float(eps),
            int(cfg.norm_order == "rope_norm"), int(cfg.rope == "interleaved"), _Q_MODE[cfg.q_mode],
            int(cfg.kv_fp8), int(bool(pdl)), int(trigger), _KERNEL_CODE[kernel], stream_ptr(dev))
        check_status(code, f"attention_prologue (tokens={T}, q_heads={cfg.q_heads}, kv_heads={cfg.kv_heads}, "
                            f"head_dim={D}, rotary_dim={cfg.rotary_dim}, q_mode={cfg.q_mode}, kv_fp8={cfg.kv_fp8}, "
                            f"variant={kernel})")
    return q_out, q_scale_out


# registers torch.ops.hotpaths.attention_prologue (ops.py), bound to the function above
from hotpaths.kernels.attention_prologue import ops as _ops  # noqa: E402

_ops.register(attention_prologue)
