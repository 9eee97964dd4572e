"""Fused attention prologue: QK-Norm, RoPE, FP8 Q with per-token-per-head scales, K/V into the paged cache.

From the fused QKV projection output ``qkv [tokens, (q_heads + 2*kv_heads) * head_dim]`` (bf16):

1. split Q / K / V per head (columns: Q heads first, then K heads, then V heads);
2. on Q and K, per head, in the order ``norm_order``: RMSNorm ``y = x / sqrt(mean(x^2) + eps) * w`` (``w`` =
   q_norm_weight / k_norm_weight [head_dim]) and RoPE on the first ``rotary_dim`` elements (the rest pass
   through): ``neox`` rotates halves (element i pairs with i + rotary_dim/2), ``interleaved`` rotates adjacent
   pairs (2j, 2j+1); angles from ``cos_sin[positions[t]]`` ([max_pos, rotary_dim] fp32: cos in the first half,
   sin in the second);
3. Q out: FP8 e4m3 with a per-token, per-head scale ``amax / 448`` (an all-zero head gets scale 1; floored at the
   smallest normal fp32 so its reciprocal is finite), or FP8 with a
   static scale (``q_scale_static`` [1]; the q_scale output is then filled with it so the decode kernel reads the
   same layout), or bf16. Layout: q [tokens, q_heads, head_dim], q_scale [tokens, q_heads] fp32: what
   hotpaths.kernels.split_kv_decode.run() reads;
4. K and V into k_cache / v_cache [num_pages, page_size, kv_heads, head_dim] at ``slot_mapping[t]`` (slot = page *
   page_size + offset), FP8 ``e4m3(clamp(x * inv_scale, -448, 448))`` (round to nearest even; inv_scale =
   fp32(1 / scale), see quantize_fp8) with per-tensor scales
   k_scale / v_scale [1], or bf16 (RNE). slot -1 is a pad: its cache write is skipped, its Q row is written
   normally (the decode kernel never reads it; writing it keeps Q's layout dense and the op branch-free).

Two functions: ``attention_prologue_ref`` (exact: fp64, returns unquantized Q/K/V) and
``attention_prologue_emulation`` (what the kernel computes, bit for bit: fp32 math with every multiply and add
rounded separately, the kernel's summation order for the sum of squares, IEEE sqrt, one correctly rounded
reciprocal per scale). No rounding path differs by design (the kernel uses __fmul_rn / __fadd_rn so nvcc cannot
contract into FMAs); the GPU tests still allow 1 e4m3 ulp on Q in case a platform's conversion differs.

Quantization is defined as ``x * fp32(1 / scale)``, not ``x / scale``: the kernel then pays one reciprocal per
(token, head) for Q and one per launch for the static K/V scales instead of an IEEE division per element (a
correctly rounded fp32 division is a multi-instruction sequence and was most of the kernel's per-element work at
prefill sizes). The two definitions differ by at most one fp32 ulp before the e4m3 rounding, i.e. on the rare
element that lands within an fp32 ulp of an e4m3 rounding boundary; the payload dequantizes with ``scale`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotpaths.reference.common import check_fits, expect_tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
HEAD_DIMS = (64, 128, 256)
NORM_ORDERS = ("norm_rope", "rope_norm")
ROPE_STYLES = ("neox", "interleaved")
DEFAULT_EPS = 1e-5  # Hy3's config (rms_norm_eps); an engine that hard-codes 1e-6 computes a different op
LANE_ELEMS = 8  # elements per lane in the kernel (one 16-byte bf16 load): fixes the sum-of-squares order


@dataclass
class PrologueConfig:
    """Head counts and options derived and validated from the arguments (see validate_inputs)."""

    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    page_size: int
    num_pages: int
    norm_order: str
    rope: str
    q_mode: str       # "dynamic" (fp8, computed scales), "static" (fp8, q_scale_static), "bf16"
    kv_fp8: bool


def validate_inputs(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache, *,
                    eps=DEFAULT_EPS, norm_order="norm_rope", rope="neox", rotary_dim=None, q_dtype="fp8",
                    q_scale_static=None, k_scale=None, v_scale=None, check_values=True) -> PrologueConfig:
    """Check every argument of the op (dtypes, shapes, options; with check_values also slot and position ranges,
    which reads them on the host) and return the derived configuration.

    Raises TypeError (wrong type/dtype) or ValueError (shape, unsupported head_dim, rotary_dim, option, slot or
    position out of range), naming the argument.
    """
    expect_tensor(k_cache, "k_cache", ndim=4, layout="[num_pages, page_size, kv_heads, head_dim]")
    if k_cache.dtype not in (FP8_DTYPE, torch.bfloat16):
        raise TypeError(f"k_cache: expected dtype float8_e4m3fn or bfloat16, got {k_cache.dtype}")
    expect_tensor(v_cache, "v_cache", dtype=k_cache.dtype, ndim=4, why=" (same as k_cache)")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    num_pages, page_size, kv_heads, head_dim = (int(s) for s in k_cache.shape)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"k_cache: head_dim {head_dim} unsupported (supported: {HEAD_DIMS})")
    if kv_heads < 1 or page_size < 1:
        raise ValueError(f"k_cache: expected kv_heads >= 1 and page_size >= 1, got shape {tuple(k_cache.shape)}")
    expect_tensor(qkv, "qkv", dtype=torch.bfloat16, ndim=2, layout="[tokens, (q_heads + 2*kv_heads) * head_dim]")
    tokens, width = (int(s) for s in qkv.shape)
    if width % head_dim or width // head_dim <= 2 * kv_heads:
        raise ValueError(f"qkv: width {width} is not (q_heads + 2*{kv_heads}) * {head_dim} with q_heads >= 1")
    q_heads = width // head_dim - 2 * kv_heads
    if q_heads % kv_heads:
        raise ValueError(f"qkv: q_heads {q_heads} is not a multiple of kv_heads {kv_heads}")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        expect_tensor(w, name, dtype=torch.bfloat16, ndim=1, layout="[head_dim]")
        if w.shape[0] != head_dim:
            raise ValueError(f"{name}: expected [{head_dim}], got {tuple(w.shape)}")
    if norm_order not in NORM_ORDERS:
        raise ValueError(f"norm_order: expected one of {NORM_ORDERS}, got {norm_order!r}")
    if rope not in ROPE_STYLES:
        raise ValueError(f"rope: expected one of {ROPE_STYLES}, got {rope!r}")
    rotary_dim = head_dim if rotary_dim is None else int(rotary_dim)
    if not (16 <= rotary_dim <= head_dim) or rotary_dim % 16:
        raise ValueError(f"rotary_dim: expected a multiple of 16 in [16, {head_dim}], got {rotary_dim}")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps: expected a positive float, got {eps!r}")
    expect_tensor(cos_sin, "cos_sin", dtype=torch.float32, ndim=2, layout="[max_pos, rotary_dim]")
    if cos_sin.shape[1] != rotary_dim or cos_sin.shape[0] < 1:
        raise ValueError(f"cos_sin: expected [max_pos, {rotary_dim}] (cos half then sin half), "
                         f"got {tuple(cos_sin.shape)}")
    expect_tensor(positions, "positions", ndim=1, layout="[tokens]")
    if positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"positions: expected dtype int32 or int64, got {positions.dtype}")
    expect_tensor(slot_mapping, "slot_mapping", dtype=torch.int64, ndim=1, layout="[tokens]")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.shape[0] != tokens:
            raise ValueError(f"{name}: expected [{tokens}] (one per qkv row), got {tuple(t.shape)}")
    if q_dtype not in ("fp8", "bf16"):
        raise ValueError(f"q_dtype: expected 'fp8' or 'bf16', got {q_dtype!r}")
    if q_scale_static is not None:
        if q_dtype != "fp8":
            raise ValueError("q_scale_static: only for q_dtype='fp8'")
        expect_tensor(q_scale_static, "q_scale_static", dtype=torch.float32, ndim=1, layout="[1]")
        if q_scale_static.numel() != 1:
            raise ValueError(f"q_scale_static: expected shape [1], got {tuple(q_scale_static.shape)}")
    kv_fp8 = k_cache.dtype == FP8_DTYPE
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if kv_fp8:
            if s is None:
                raise ValueError(f"{name}: the FP8 cache needs a per-tensor scale (fp32 tensor of shape [1])")
            expect_tensor(s, name, dtype=torch.float32, ndim=1, layout="[1]")
            if s.numel() != 1:
                raise ValueError(f"{name}: expected shape [1], got {tuple(s.shape)}")
        elif s is not None:
            raise ValueError(f"{name}: given but the cache is bfloat16 (scales only apply to fp8)")
    if check_values and tokens:
        cap = num_pages * page_size
        sm = slot_mapping.detach().cpu()
        bad = (sm < -1) | (sm >= cap)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"slot_mapping[{i}] = {int(sm[i])} is out of range: expected -1 (pad) or a slot in "
                             f"[0, {cap}) (num_pages {num_pages} x page_size {page_size})")
        pos = positions.detach().cpu()
        badp = (pos < 0) | (pos >= cos_sin.shape[0])
        if bool(badp.any()):
            i = int(badp.nonzero()[0, 0])
            raise ValueError(f"positions[{i}] = {int(pos[i])} is out of range [0, {cos_sin.shape[0]}) of cos_sin")
    q_mode = "bf16" if q_dtype == "bf16" else ("static" if q_scale_static is not None else "dynamic")
    return PrologueConfig(tokens, q_heads, kv_heads, head_dim, rotary_dim, page_size, num_pages, norm_order, rope,
                          q_mode, kv_fp8)


# ----------------------------------------------------------------------------------------------------------------
# exact reference (fp64)
# ----------------------------------------------------------------------------------------------------------------


def _rope(x, cos, sin, rotary_dim: int, style: str, mul, add, sub):
    """RoPE on the last dim of x [..., D] with cos/sin [..., rotary_dim/2] (broadcast over heads)."""
    h = rotary_dim // 2
    out = x.clone()
    if style == "neox":
        a, b = x[..., :h], x[..., h:rotary_dim]
        out[..., :h] = sub(mul(a, cos), mul(b, sin))
        out[..., h:rotary_dim] = add(mul(b, cos), mul(a, sin))
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = sub(mul(a, cos), mul(b, sin))
        out[..., 1:rotary_dim:2] = add(mul(b, cos), mul(a, sin))
    return out


def attention_prologue_ref(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, *, kv_heads: int,
                           eps: float = DEFAULT_EPS, norm_order: str = "norm_rope", rope: str = "neox",
                           rotary_dim: int | None = None):
    """The exact prologue math in fp64, before any output rounding.

    Shape/Dtype: qkv [tokens, (q_heads + 2*kv_heads) * head_dim] bf16; q_norm_weight, k_norm_weight [head_dim]
    bf16; cos_sin [max_pos, rotary_dim] fp32 (cos half, sin half); positions [tokens] int32/int64.
    Returns (q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim], v [tokens, kv_heads, head_dim]), fp64.
    Raises ValueError for an unknown norm_order / rope or a width that does not split into heads.
    """
    if norm_order not in NORM_ORDERS or rope not in ROPE_STYLES:
        raise ValueError(f"norm_order/rope: expected {NORM_ORDERS} / {ROPE_STYLES}, got {norm_order!r} / {rope!r}")
    D = q_norm_weight.shape[0]
    T, W = qkv.shape
    if W % D or W // D <= 2 * kv_heads:
        raise ValueError(f"qkv: width {W} does not split into (q_heads + 2*{kv_heads}) heads of {D}")
    hq = W // D - 2 * kv_heads
    rot = D if rotary_dim is None else int(rotary_dim)
    x = qkv.double().reshape(T, hq + 2 * kv_heads, D)
    cs = cos_sin.double()[positions.long()]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    mul, add, sub = (lambda a, b: a * b), (lambda a, b: a + b), (lambda a, b: a - b)

    def norm(t, w):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    def proc(t, w):
        if norm_order == "norm_rope":
            return _rope(norm(t, w), cos, sin, rot, rope, mul, add, sub)
        return norm(_rope(t, cos, sin, rot, rope, mul, add, sub), w)

    q = proc(x[:, :hq], q_norm_weight)
    k = proc(x[:, hq:hq + kv_heads], k_norm_weight)
    v = x[:, hq + kv_heads:].clone()
    return q, k, v


# ----------------------------------------------------------------------------------------------------------------
# same-precision emulation (what the kernel computes)
# ----------------------------------------------------------------------------------------------------------------


# Correctly rounded fp32 division and square root (what __fdiv_rn / __fsqrt_rn give), computed in fp64 and rounded
# once: double rounding is harmless for /, sqrt, *, +, - from fp64 (53 >= 2*24 + 2 bits). Not torch's fp32 kernels:
# torch's CPU fp32 sqrt is not correctly rounded (it differs from IEEE in ~18% of random inputs on an x86 build).
def _div_rn(a, b) -> torch.Tensor:
    return (a.double() / (b.double() if isinstance(b, torch.Tensor) else float(b))).float()


def _sqrt_rn(a) -> torch.Tensor:
    return torch.sqrt(a.double()).float()


def inverse_scale(scale) -> torch.Tensor:
    """fp32(1 / scale), correctly rounded (what __frcp_rn gives). Shape/Dtype: scale fp32 tensor (or a float);
    returns fp32 of its shape."""
    s = scale if isinstance(scale, torch.Tensor) else torch.tensor(float(scale))
    return _div_rn(torch.ones_like(s, dtype=torch.float32), s)


def quantize_fp8(x: torch.Tensor, scale) -> torch.Tensor:
    """``e4m3(clamp(x * inv_scale, -448, 448))`` with inv_scale = inverse_scale(scale) and the product rounded once
    in fp32, then to e4m3 by round to nearest even (what __frcp_rn, __fmul_rn and cvt.rn.satfinite do).

    Shape/Dtype: x fp32 [...], scale fp32 tensor broadcastable to x (or a float). Returns float8_e4m3fn of x's shape.
    """
    return (x.float() * inverse_scale(scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _sum_squares_kernel_order(x: torch.Tensor) -> torch.Tensor:
    """fp32 sum of squares over the last dim in the kernel's order: each lane adds its 8 elements' squares in
    sequence, then a butterfly over the head's D/8 lanes (xor offsets G/2 .. 1)."""
    D = x.shape[-1]
    G = D // LANE_ELEMS
    xl = x.reshape(*x.shape[:-1], G, LANE_ELEMS)
    s = torch.zeros(xl.shape[:-1], dtype=torch.float32)
    for e in range(LANE_ELEMS):
        s = s + xl[..., e] * xl[..., e]
    idx = torch.arange(G)
    o = G // 2
    while o >= 1:
        s = s + s[..., idx ^ o]
        o //= 2
    return s[..., 0]


def _norm_fp32(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    D = x.shape[-1]
    ss = _sum_squares_kernel_order(x)
    ms = ss * torch.tensor(1.0 / D, dtype=torch.float32)  # 1/D is exact (D a power of two)
    inv = _div_rn(torch.ones_like(ms), _sqrt_rn(ms + torch.tensor(eps, dtype=torch.float32)))
    return (x * inv[..., None]) * w.float()


def attention_prologue_emulation(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache,
                                 v_cache, *, eps: float = DEFAULT_EPS, norm_order: str = "norm_rope",
                                 rope: str = "neox", rotary_dim: int | None = None, q_dtype: str = "fp8",
                                 q_scale_static=None, k_scale=None, v_scale=None):
    """What the kernel writes, computed on the CPU in the kernel's precision (fp32, each op rounded once).

    Shape/Dtype: as the kernel's public function (hotpaths.kernels.attention_prologue.attention_prologue);
    k_cache / v_cache are not modified (copies are returned).
    Returns (q [tokens, q_heads, head_dim] float8_e4m3fn or bf16, q_scale [tokens, q_heads] fp32 or None (bf16 Q),
    k_cache', v_cache') with the cache copies holding the new K/V at their slots (pads skipped).
    Raises TypeError/ValueError as validate_inputs.
    """
    cfg = validate_inputs(qkv, q_norm_weight, k_norm_weight, cos_sin, positions, slot_mapping, k_cache, v_cache,
                          eps=eps, norm_order=norm_order, rope=rope, rotary_dim=rotary_dim, q_dtype=q_dtype,
                          q_scale_static=q_scale_static, k_scale=k_scale, v_scale=v_scale)
    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    T, Hq, Hk, D, rot = cfg.tokens, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.rotary_dim
    x = cpu(qkv).float().reshape(T, Hq + 2 * Hk, D)
    cs = cpu(cos_sin)[cpu(positions).long()] if T else torch.zeros(0, rot)
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    mul, add, sub = torch.mul, torch.add, torch.sub  # fp32 tensors: each op rounds once, no fusion on the CPU

    def proc(t, w):
        if norm_order == "norm_rope":
            return _rope(_norm_fp32(t, w, eps), cos, sin, rot, rope, mul, add, sub)
        return _norm_fp32(_rope(t, cos, sin, rot, rope, mul, add, sub), w, eps)

    q = proc(x[:, :Hq], cpu(q_norm_weight))
    k = proc(x[:, Hq:Hq + Hk], cpu(k_norm_weight))
    v = x[:, Hq + Hk:]
    if cfg.q_mode == "bf16":
        q_out, q_scale = q.to(torch.bfloat16), None
    elif cfg.q_mode == "static":
        s = cpu(q_scale_static).float().reshape(())
        q_out, q_scale = quantize_fp8(q, s), s.expand(T, Hq).clone()
    else:
        amax = q.abs().amax(-1) if T else torch.zeros(0, Hq)
        # floored at the smallest normal fp32 so 1/scale stays finite (only a head with amax < 448 * 2^-126 sees it)
        q_scale = torch.where(amax > 0, _div_rn(amax, FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny),
                              torch.ones_like(amax))
        q_out = quantize_fp8(q, q_scale[..., None])
    kc, vc = cpu(k_cache).clone(), cpu(v_cache).clone()
    if cfg.kv_fp8:
        kq, vq = quantize_fp8(k, cpu(k_scale).float()), quantize_fp8(v, cpu(v_scale).float())
    else:
        kq, vq = k.to(torch.bfloat16), v.to(torch.bfloat16)
    sm = cpu(slot_mapping)
    keep = (sm >= 0).nonzero().flatten()
    if keep.numel():
        s = sm[keep]
        kc.view(-1, Hk, D)[s] = kq[keep]
        vc.view(-1, Hk, D)[s] = vq[keep]
    return q_out.contiguous(), None if q_scale is None else q_scale.contiguous(), kc, vc


# ----------------------------------------------------------------------------------------------------------------
# counts, inputs
# ----------------------------------------------------------------------------------------------------------------


def bytes(tokens: int, q_heads: int, kv_heads: int, head_dim: int, *, q_dtype: str = "fp8", kv_dtype: str = "fp8",
          rotary_dim: int | None = None, pads: int = 0) -> int:  # noqa: A001 - the op template's name
    """Bytes the one pass moves: read QKV (bf16) once, positions (8), slot (8) and the cos/sin row (4 x rotary_dim)
    per token, write Q (+ fp32 scales) once and the cache (K and V) once for every non-pad token. The norm weights
    (2 x head_dim x 2 B) are counted once."""
    rot = head_dim if rotary_dim is None else rotary_dim
    read = tokens * ((q_heads + 2 * kv_heads) * head_dim * 2 + 8 + 8 + 4 * rot) + 4 * head_dim
    qb = q_heads * head_dim * (1 if q_dtype == "fp8" else 2) + (4 * q_heads if q_dtype == "fp8" else 0)
    kvb = 2 * kv_heads * head_dim * (1 if kv_dtype == "fp8" else 2)
    return int(read + tokens * qb + (tokens - pads) * kvb)


def flops(tokens: int, q_heads: int, kv_heads: int, head_dim: int, *, rotary_dim: int | None = None,
          q_dtype: str = "fp8", kv_dtype: str = "fp8") -> int:
    """Arithmetic per call (a count for the notebook, not a bound: the op is memory-bound). Per normed head: 2D
    (sum of squares) + 2D (scale, weight) + a few; RoPE: 6 per rotated pair x rotary_dim/2... = 3 x rotary_dim;
    FP8 quantization: 2 per element (amax compare, divide); V: 1 per element when quantized."""
    rot = head_dim if rotary_dim is None else rotary_dim
    nh = q_heads + kv_heads
    per = nh * (4 * head_dim + 3 * rot + 4)
    q8 = q_heads * head_dim * 2 if q_dtype == "fp8" else 0
    kv8 = 2 * kv_heads * head_dim if kv_dtype == "fp8" else 0
    return int(tokens * (per + q8 + kv8))


def make_cos_sin(max_pos: int, rotary_dim: int, *, base: float = 10000.0) -> torch.Tensor:
    """The usual RoPE table: cos_sin[p] = [cos(p * f_0..f_{r/2-1}), sin(...)], f_j = base^(-2j / rotary_dim).

    Shape/Dtype: returns [max_pos, rotary_dim] fp32."""
    inv = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).float().contiguous()


def make_prologue_inputs(tokens: int, *, q_heads: int = 8, kv_heads: int = 1, head_dim: int = 128,
                         page_size: int = 64, rotary_dim: int | None = None, kv_dtype: str = "fp8",
                         q_dtype: str = "fp8", norm_order: str = "norm_rope", rope: str = "neox",
                         eps: float = DEFAULT_EPS, pad_every: int = 0, max_pos: int = 8192, extra_pages: int = 2,
                         pos_dtype=torch.int64, device="cpu", seed: int = 0) -> dict:
    """Random inputs for one call: qkv ~ N(0, 1) bf16 (with a per-head offset so amax varies), norm weights around
    1, positions uniform in [0, max_pos), slots a random permutation of the cache's slots (so writes scatter over
    pages), every pad_every-th token a pad (-1). The caches are poisoned (e4m3 NaN 0x7F / bf16 NaN) so a slot the
    op should not write is visible. k_scale / v_scale are fixed per-tensor scales sized for the K (normed, |k| <~
    4 x weight) and V (|v| <~ 5) ranges.

    Returns a dict whose keys are the op's arguments (qkv, q_norm_weight, k_norm_weight, cos_sin, positions,
    slot_mapping, k_cache, v_cache, eps, norm_order, rope, rotary_dim, q_dtype, k_scale, v_scale).
    Raises ValueError for an unsupported configuration or a kv_dtype / q_dtype that is not fp8/bf16.
    """
    if kv_dtype not in ("fp8", "bf16") or q_dtype not in ("fp8", "bf16"):
        raise ValueError(f"kv_dtype/q_dtype: expected 'fp8' or 'bf16', got {kv_dtype!r} / {q_dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} unsupported (supported: {HEAD_DIMS})")
    if tokens < 0 or q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"tokens {tokens}, q_heads {q_heads}, kv_heads {kv_heads}: expected tokens >= 0 and "
                         "q_heads a positive multiple of kv_heads")
    rot = head_dim if rotary_dim is None else rotary_dim
    H = q_heads + 2 * kv_heads
    num_pages = -(-tokens // page_size) + extra_pages
    # qkv drawn in fp32 then bf16, the two caches, cos/sin: refused before anything is allocated
    check_fits(f"prologue inputs ({tokens} tokens, {H} heads of {head_dim})",
               host_bytes=tokens * H * head_dim * 6 + 2 * num_pages * page_size * kv_heads * head_dim * 2
               + max_pos * rot * 4, device=device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, head_dim, generator=g) * (0.5 + torch.rand(1, H, 1, generator=g) * 2)
    qkv = x.reshape(tokens, H * head_dim).to(torch.bfloat16)
    qw = (1 + 0.2 * torch.randn(head_dim, generator=g)).to(torch.bfloat16)
    kw = (1 + 0.2 * torch.randn(head_dim, generator=g)).to(torch.bfloat16)
    positions = torch.randint(0, max_pos, (tokens,), generator=g).to(pos_dtype)
    slots = torch.randperm(num_pages * page_size, generator=g)[:tokens].to(torch.int64)
    if pad_every > 0:
        slots[::pad_every] = -1
    shape = (num_pages, page_size, kv_heads, head_dim)
    if kv_dtype == "fp8":
        k_cache = torch.full(shape, 0x7F, dtype=torch.uint8).view(FP8_DTYPE)
        v_cache = torch.full(shape, 0x7F, dtype=torch.uint8).view(FP8_DTYPE)
        k_scale = torch.tensor([6.0 / FP8_MAX])
        v_scale = torch.tensor([float(x[:, q_heads + kv_heads:].abs().max()) / FP8_MAX if tokens else 1.0])
    else:
        k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
        v_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
        k_scale = v_scale = None
    dev = torch.device(device)
    mv = lambda t: None if t is None else t.to(dev).contiguous()  # noqa: E731
    return dict(qkv=mv(qkv), q_norm_weight=mv(qw), k_norm_weight=mv(kw), cos_sin=mv(make_cos_sin(max_pos, rot)),
                positions=mv(positions), slot_mapping=mv(slots), k_cache=mv(k_cache), v_cache=mv(v_cache),
                eps=eps, norm_order=norm_order, rope=rope, rotary_dim=rot, q_dtype=q_dtype,
                k_scale=mv(k_scale), v_scale=mv(v_scale))


def written_mask(slot_mapping, num_pages: int, page_size: int) -> torch.Tensor:
    """[num_pages, page_size] bool (CPU): the slots the op writes. slot_mapping: int64 [T], negative for a pad token
    (skipped), else a flat slot < num_pages * page_size (a larger one raises IndexError)."""
    m = torch.zeros(num_pages * page_size, dtype=torch.bool)
    sm = slot_mapping.detach().cpu()
    m[sm[sm >= 0]] = True
    return m.view(num_pages, page_size)


def measure_emulation_error(*, tokens: int = 64, seed: int = 0) -> dict:
    """Worst emulation-vs-exact error per output path over both orders, both RoPE styles, head_dim 64/128/256 with
    full and partial rotary, GQA 8:1 and 4:2: the measurement the tolerance rows (hotpaths.harness.tolerances,
    op attention_prologue) are derived from. Returns {path: (rel_l2, max_abs)} with paths fp8_q / bf16_q (Q
    dequantized vs exact) and fp8_kv / bf16_kv (K and V rows read back from the cache, dequantized, vs exact)."""
    worst: dict = {}

    def upd(path, got, want):
        d = (got - want)
        rel = float(d.norm() / want.norm())
        mx = float(d.abs().max())
        r0, m0 = worst.get(path, (0.0, 0.0))
        worst[path] = (max(r0, rel), max(m0, mx))

    for order in NORM_ORDERS:
        for style in ROPE_STYLES:
            for D, rot in ((64, 64), (64, 32), (128, 128), (128, 64), (256, 256), (256, 96)):
                for hq, hk in ((8, 1), (4, 2)):
                    for dt in ("fp8", "bf16"):
                        inp = make_prologue_inputs(tokens, q_heads=hq, kv_heads=hk, head_dim=D, rotary_dim=rot,
                                                   kv_dtype=dt, q_dtype=dt, norm_order=order, rope=style,
                                                   seed=seed + D + rot)
                        args = [inp[k] for k in ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions",
                                                 "slot_mapping", "k_cache", "v_cache")]
                        kw = {k: inp[k] for k in ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale",
                                                  "v_scale")}
                        q, qs, kc, vc = attention_prologue_emulation(*args, **kw)
                        qr, kr, vr = attention_prologue_ref(*args[:5], kv_heads=hk, eps=inp["eps"], norm_order=order,
                                                            rope=style, rotary_dim=rot)
                        qd = q.double() if qs is None else q.double() * qs.double()[..., None]
                        upd(f"{dt}_q", qd, qr)
                        sm = inp["slot_mapping"]
                        for cache, want, s in ((kc, kr, inp["k_scale"]), (vc, vr, inp["v_scale"])):
                            got = cache.view(-1, hk, D)[sm].double() * (1.0 if s is None else float(s))
                            upd(f"{dt}_kv", got, want)
    return worst
