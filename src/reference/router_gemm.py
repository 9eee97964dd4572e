"""Router GEMM ``scores = x @ W.T`` with an FP32 weight split into two (or three) BF16 parts: exact reference,
same-precision emulations, error and routing metrics, input generators, and the tables of notebook 04.

The split (HPC-Ops, SGLang post): ``W_high`` = BF16 truncation of W (keep the top 16 bits of the FP32 word),
``W_low`` = BF16 round-to-nearest of ``(W - W_high) * 256``, so ``W ~ W_high + W_low / 256`` and
``x @ W.T ~ x @ W_high.T + (x @ W_low.T) / 256``: two BF16 tensor-core products with FP32 accumulation.

Error bound of the two-part split (derived; tested in tests/test_router_gemm_ref.py). Write ``|W|`` in
``[2^e, 2^(e+1))``:
- truncation: the residual ``r = W - W_high`` is exactly the low 16 mantissa bits of W, so it is exact in FP32,
  ``|r| < 2^(e-7)`` (one BF16 ulp) and ``r * 256`` is exact (power-of-two scaling, no overflow for finite W below
  the limit noted below). Rounding ``r * 256`` to BF16 (8 significant bits, unit roundoff 2^-8) leaves an error
  of at most half a BF16 ulp of ``r``: ``|W - (W_high + W_low/256)| <= 2^-8 |r| < 2^(e-15)``; more precisely,
  ``r``'s exponent is at most ``e-8`` so the error is ``<= 2^(e-16) <= 2^-16 |W|``.
- round-to-nearest high part: ``|r| <= 2^(e-8)`` (half an ulp, signed), so the same argument gives
  ``<= 2^(e-17) <= 2^-17 |W|``: one bit better, because the sign of ``r`` carries a bit that truncation wastes.
- subnormal floor: BF16 has FP32's exponent range (8 exponent bits) but only 7 stored mantissa bits, so its smallest
  subnormal is 2^-133. ``W_low`` cannot hold bits of ``r * 256`` below 2^-134 (half that), i.e. bits of ``r``
  below 2^-142: the bound becomes ``2^-16 |W| + 2^-142`` (absolute floor ~1.8e-43). Weights below ~2^-110 lose
  relative precision gradually; router weights (|W| ~ 1e-2) are 100+ binades away from this.
Why 256 = 2^8: after removing the high part's 8 significant bits, the residual is below 2^-7 |W|; scaling by 2^8
lifts it back to the magnitude of W, so W_low sits in the same binade range as W_high (far from BF16 underflow for
any realistic weight), and a power of two makes the scaling (and the 1/256 epilogue) exact.

Non-finite and huge weights: ``split_fp32_weight`` raises ValueError on Inf/NaN unless ``allow_nonfinite=True``;
then W_high carries the Inf/NaN (NaN kept NaN: plain truncation would turn a NaN whose payload sits in the low 16
bits into Inf) and W_low is 0, so the reconstruction equals W. Finite weights whose parts overflow BF16 raise
ValueError: with truncation only weights of the top binade (|W| >= 2^127 ~ 1.7e38) whose low 16 bits round the
scaled residual up to 2^128; with round-to-nearest every |W| >= 3.3961776e38 (W_high itself rounds to Inf).
Below 2^127 the truncated split never overflows: truncation cannot round up, and |r * 256| < 2 |W|. A negative
zero reconstructs as +0 (-0 + 0 = +0), harmless for a GEMM.
Measured (tests, notebook 04): over 2M random FP32 bit patterns below 2^127 the bound holds everywhere (max
error/bound 0.996 truncate, 0.998 round); the relative error reaches 2^-16 = 1.53e-5 (truncate) and 2^-17 = 7.6e-6
(round) for normal weights, and only FP32-subnormal weights (|W| < 2^-126) see more (up to 3.6% relative, i.e.
the 2^-142 absolute floor; the smallest subnormal 2^-149 splits to 0 + 0). The three-part split is exact for every
finite FP32 value, subnormals included (the scaled parts stay on BF16's grid down to 2^-133).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch

from hotpaths.reference.common import check_fits, expect_tensor

OP = "router_gemm"
SCALE_LOW = 256.0  # 2^8: the second part's scale
SCALE_LOW_3 = (256.0, 65536.0)  # BF16x3: w ~ w_high + w_mid / 2^8 + w_low / 2^16
KERNEL_N_MULTIPLE = 64
KERNEL_K_MULTIPLE = 64

# ----------------------------------------------------------------------------------------------------------------
# input checks


def _check_weight(w: torch.Tensor, name: str = "w") -> None:
    expect_tensor(w, name, dtype=torch.float32, ndim=2, layout="[N, K]", why=" (the FP32 router weight)")


def _check_x(x: torch.Tensor, k: int, name: str = "x") -> None:
    expect_tensor(x, name, dtype=torch.bfloat16, ndim=2, layout="[M, K]", why=" (router activations)")
    if x.shape[1] != k:
        raise ValueError(f"{name}: expected K={k} columns (the weight's K), got shape {tuple(x.shape)}")


def _check_part(p: torch.Tensor, shape, name: str) -> None:
    if not isinstance(p, torch.Tensor) or p.dtype != torch.bfloat16:
        raise TypeError(f"{name}: expected a torch.bfloat16 tensor, got "
                        f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
    if shape is not None and tuple(p.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (like the other parts), got {tuple(p.shape)}")


def validate_kernel_shape(n: int, k: int) -> None:
    """Raise ValueError unless the SM90 kernel supports N experts x K hidden (both multiples of 64, positive).

    The references accept any shape; this is the kernel's contract, shared so the kernel's loader, the CLI and
    the tests give the same message.
    """
    for name, v, mult in (("N (number of experts, w.shape[0])", n, KERNEL_N_MULTIPLE),
                          ("K (hidden size, w.shape[1])", k, KERNEL_K_MULTIPLE)):
        if not isinstance(v, int) or v <= 0 or v % mult:
            raise ValueError(f"{name}={v!r} not supported by the router GEMM kernel: "
                             f"expected a positive multiple of {mult}")


# ----------------------------------------------------------------------------------------------------------------
# the split


def _truncate_to_bf16(w: torch.Tensor) -> torch.Tensor:
    """BF16 truncation (round toward zero): keep the top 16 bits of each FP32 word. Exact bit masking."""
    bits = w.contiguous().view(torch.int32) & -65536  # 0xFFFF0000 as int32
    return bits.view(torch.float32).to(torch.bfloat16)  # exact: the value is already a BF16 value


def split_fp32_weight(w: torch.Tensor, *, high: str = "truncate", allow_nonfinite: bool = False):
    """Split an FP32 weight into two BF16 parts, ``w ~ w_high + w_low / 256``.

    Shape/Dtype: w fp32 [N, K] (any 2-D shape). Returns (w_high, w_low), both bf16 [N, K], contiguous.
    high: "truncate" (the published choice: drop the low 16 bits) or "round" (round-to-nearest-even).
    Error: |w - (w_high + w_low/256)| <= 2^-16 |w| + 2^-142 (truncate), 2^-17 |w| + 2^-142 (round): see the module
    docstring. Raises TypeError (w not fp32), ValueError (not 2-D, unknown ``high``, Inf/NaN without
    allow_nonfinite, or a finite weight whose parts overflow BF16).
    """
    _check_weight(w)
    if high not in ("truncate", "round"):
        raise ValueError(f"high: expected 'truncate' or 'round', got {high!r}")
    finite = torch.isfinite(w)
    all_finite = bool(finite.all())
    if not all_finite and not allow_nonfinite:
        bad = int((~finite).sum())
        raise ValueError(f"w: {bad} non-finite value(s) (Inf/NaN) in the router weight; pass allow_nonfinite=True "
                         f"to propagate them (w_high carries them, w_low is 0)")
    w = w.contiguous()
    w_high = _truncate_to_bf16(w) if high == "truncate" else w.to(torch.bfloat16)
    # W and W_high share sign and binade (or W_high is W's neighbour power of two), so the difference is exact.
    residual = w - w_high.to(torch.float32)
    w_low = (residual * SCALE_LOW).to(torch.bfloat16)
    if not all_finite:
        nan = torch.isnan(w)
        w_high = torch.where(nan, torch.full_like(w_high, float("nan")), w_high)
        w_high = torch.where(torch.isinf(w), w.to(torch.bfloat16), w_high)
        w_low = torch.where(finite, w_low, torch.zeros_like(w_low))
    overflow = finite & ~(torch.isfinite(w_high) & torch.isfinite(w_low))
    if bool(overflow.any()):
        big = float(w[overflow].abs().min())
        raise ValueError(f"w: {int(overflow.sum())} finite value(s) (smallest |w| {big:.8g}) overflow BF16 in the "
                         f"two-part split (high={high!r}); the split needs |w| well below FLT_MAX")
    return w_high, w_low


def split_fp32_weight_3(w: torch.Tensor, *, allow_nonfinite: bool = False):
    """Exact three-part split, ``w = w_high + w_mid / 2^8 + w_low / 2^16`` (BF16x3: 3 x 8 = 24 significant bits).

    w_high and w_mid are truncations (each takes the next 8 significant bits); what is left has at most 8
    significant bits, so w_low is exact. Exact for every finite FP32 value, subnormals included: the lowest FP32 bit
    2^-149 scaled by 2^16 is 2^-133, BF16's smallest subnormal. Scale factors: ``SCALE_LOW_3``.
    Shape/Dtype: w fp32 [N, K]; returns (w_high, w_mid, w_low) bf16 [N, K].
    Raises like split_fp32_weight (TypeError, ValueError on non-finite or overflowing input).
    """
    _check_weight(w)
    finite = torch.isfinite(w)
    if not bool(finite.all()) and not allow_nonfinite:
        raise ValueError(f"w: {int((~finite).sum())} non-finite value(s) (Inf/NaN) in the router weight; pass "
                         f"allow_nonfinite=True to propagate them")
    w = w.contiguous()
    w_high = _truncate_to_bf16(w)
    r1 = (w - w_high.to(torch.float32)) * SCALE_LOW_3[0]  # exact
    w_mid = _truncate_to_bf16(torch.where(finite, r1, torch.zeros_like(r1)))
    r2 = (r1 - w_mid.to(torch.float32)) * SCALE_LOW_3[0]  # exact
    w_low = torch.where(finite, r2, torch.zeros_like(r2)).to(torch.bfloat16)
    if not bool(finite.all()):
        w_high = torch.where(torch.isnan(w), torch.full_like(w_high, float("nan")), w_high)
        w_high = torch.where(torch.isinf(w), w.to(torch.bfloat16), w_high)
    overflow = finite & ~torch.isfinite(w_low)
    if bool(overflow.any()):
        raise ValueError(f"w: {int(overflow.sum())} finite value(s) overflow BF16 in the three-part split")
    # (unreachable for finite FP32 input: kept so a future change of scales cannot fail silently)
    return w_high, w_mid, w_low


def reconstruct(w_high: torch.Tensor, w_low: torch.Tensor, w_mid: torch.Tensor | None = None) -> torch.Tensor:
    """The exact value the parts represent, in float64: ``w_high + w_low/256`` or, with w_mid (BF16x3),
    ``w_high + w_mid/2^8 + w_low/2^16``. Float64 holds every such sum exactly (FP32 would round it).

    Shape/Dtype: parts bf16 [N, K] (same shape); returns fp64 [N, K]. Raises TypeError/ValueError on dtype/shape.
    """
    _check_part(w_high, None, "w_high")
    _check_part(w_low, w_high.shape, "w_low")
    hi = w_high.to(torch.float64)
    if w_mid is None:
        return hi + w_low.to(torch.float64) / SCALE_LOW
    _check_part(w_mid, w_high.shape, "w_mid")
    return hi + w_mid.to(torch.float64) / SCALE_LOW_3[0] + w_low.to(torch.float64) / SCALE_LOW_3[1]


def split_error_bound(w: torch.Tensor, *, high: str = "truncate") -> torch.Tensor:
    """The derived per-element bound on |w - reconstruct(split(w))|: 2^-16|w| (truncate) or 2^-17|w| (round), plus
    the subnormal floor 2^-142. Shape/Dtype: w fp32 [N, K]; returns fp64 [N, K]."""
    rel = 2.0 ** -16 if high == "truncate" else 2.0 ** -17
    return w.to(torch.float64).abs() * rel + 2.0 ** -142


def reconstruction_rel_error(w: torch.Tensor, *, high: str = "truncate") -> torch.Tensor:
    """Per-element relative reconstruction error |w - (w_high + w_low/256)| / |w| (0 where w == 0).

    Shape/Dtype: w fp32 [N, K]; returns fp64 [N, K]. Raises like split_fp32_weight.
    """
    hi, lo = split_fp32_weight(w, high=high)
    w64 = w.to(torch.float64)
    err = (reconstruct(hi, lo) - w64).abs()
    return torch.where(w64 != 0, err / w64.abs().clamp_min(1e-300), torch.zeros_like(err))


def split_comparison(w: torch.Tensor) -> list[dict]:
    """Truncation vs round-to-nearest for the high part: max and rms relative reconstruction error, the fraction
    of weights reconstructed exactly, and the derived bound. Shape/Dtype: w fp32 [N, K]. Returns two rows."""
    rows = []
    for high in ("truncate", "round"):
        rel = reconstruction_rel_error(w, high=high).flatten()
        rows.append({
            "high_part": high,
            "max_rel_err": float(rel.max()),
            "rms_rel_err": float(rel.square().mean().sqrt()),
            "mean_rel_err": float(rel.mean()),
            "exact_fraction": float((rel == 0).double().mean()),
            "derived_bound_rel": 2.0 ** -16 if high == "truncate" else 2.0 ** -17,
        })
    rows[1]["rms_ratio_truncate_over_round"] = rows[0]["rms_rel_err"] / max(rows[1]["rms_rel_err"], 1e-300)
    rows[1]["max_ratio_truncate_over_round"] = rows[0]["max_rel_err"] / max(rows[1]["max_rel_err"], 1e-300)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# reference and emulations of scores = x @ W.T


@contextlib.contextmanager
def _ieee_fp32_matmul():
    """Force true FP32 matmuls (no TF32 on GPU) inside emulations, restoring the caller's setting."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def _mm_fp32(x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    with _ieee_fp32_matmul():
        return x32 @ w32.t()


def router_gemm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact reference: scores = x @ w.T in float64 (x's BF16 values and w's FP32 values are exact in FP64).

    Shape/Dtype: x bf16 [M, K]; w fp32 [N, K]; returns fp64 [M, N].
    Raises TypeError (dtype), ValueError (rank or K mismatch), ResourceError when the fp64 copies would not fit.
    """
    _check_weight(w)
    _check_x(x, w.shape[1])
    m, k, n = x.shape[0], x.shape[1], w.shape[0]
    check_fits(f"router_gemm_ref m={m} n={n} k={k} (fp64 copies)", device_bytes=8 * (m * k + n * k + m * n),
               device=x.device)
    return x.to(torch.float64) @ w.to(torch.float64).t()


def fp32_emulation(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """FP32 GEMM (what FP32 cuBLAS computes, up to summation order). x bf16 [M, K]; w fp32 [N, K] -> fp32 [M, N]."""
    _check_weight(w)
    _check_x(x, w.shape[1])
    return _mm_fp32(x.to(torch.float32), w)


def bf16_emulation(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """W cast to BF16 (round-to-nearest), products exact in FP32, FP32 accumulation (BF16 cuBLAS with FP32 output).

    Shape/Dtype: x bf16 [M, K]; w fp32 [N, K]; returns fp32 [M, N]. Raises TypeError/ValueError on bad input.
    """
    _check_weight(w)
    _check_x(x, w.shape[1])
    return _mm_fp32(x.to(torch.float32), w.to(torch.bfloat16).to(torch.float32))


def round_to_tf32(t: torch.Tensor, *, mode: str = "nearest") -> torch.Tensor:
    """FP32 values rounded to TF32 (10 stored mantissa bits). mode "nearest" (ties to even) or "truncate" (what a
    tensor core does with operands that were not pre-rounded). Shape/Dtype: any fp32 tensor; returns fp32, same
    shape. Finite inputs only (Inf/NaN are passed through unchanged)."""
    if t.dtype != torch.float32:
        raise TypeError(f"t: expected torch.float32, got {t.dtype}")
    if mode not in ("nearest", "truncate"):
        raise ValueError(f"mode: expected 'nearest' or 'truncate', got {mode!r}")
    bits = t.contiguous().view(torch.int32)
    if mode == "nearest":
        lsb = (bits >> 13) & 1
        bits = bits + 0x0FFF + lsb
    out = (bits & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(t), out, t)


def tf32_emulation(x: torch.Tensor, w: torch.Tensor, *, mode: str = "nearest") -> torch.Tensor:
    """TF32 GEMM: operands rounded to TF32 (x's BF16 values are already TF32), products exact, FP32 accumulation.

    Shape/Dtype: x bf16 [M, K]; w fp32 [N, K]; returns fp32 [M, N]. mode: see round_to_tf32.
    Raises TypeError/ValueError on bad input.
    """
    _check_weight(w)
    _check_x(x, w.shape[1])
    return _mm_fp32(x.to(torch.float32), round_to_tf32(w, mode=mode))


def bf16x2_from_parts(x: torch.Tensor, w_high: torch.Tensor, w_low: torch.Tensor) -> torch.Tensor:
    """What the kernel computes: two BF16 products accumulated in FP32, ``acc_hi + acc_lo * (1/256)`` in the
    epilogue (exact up to FP32 summation order inside each product).

    Shape/Dtype: x bf16 [M, K]; w_high, w_low bf16 [N, K]; returns fp32 [M, N]. Raises TypeError/ValueError.
    """
    _check_part(w_high, None, "w_high")
    if w_high.dim() != 2:
        raise ValueError(f"w_high: expected a 2-D [N, K] tensor, got shape {tuple(w_high.shape)}")
    _check_part(w_low, w_high.shape, "w_low")
    _check_x(x, w_high.shape[1])
    x32 = x.to(torch.float32)
    acc_hi = _mm_fp32(x32, w_high.to(torch.float32))  # bf16 x bf16 products are exact in fp32
    acc_lo = _mm_fp32(x32, w_low.to(torch.float32))
    return acc_hi + acc_lo * (1.0 / SCALE_LOW)


def bf16x2_emulation(x: torch.Tensor, w: torch.Tensor, *, high: str = "truncate") -> torch.Tensor:
    """Split w (split_fp32_weight) and run bf16x2_from_parts. x bf16 [M, K]; w fp32 [N, K] -> fp32 [M, N]."""
    _check_weight(w)
    _check_x(x, w.shape[1])
    return bf16x2_from_parts(x, *split_fp32_weight(w, high=high))


def bf16x3_from_parts(x, w_high, w_mid, w_low) -> torch.Tensor:
    """Three BF16 products in FP32; epilogue ``acc_hi + (acc_mid + acc_lo/256) / 256`` (small terms first).

    Shape/Dtype: x bf16 [M, K]; parts bf16 [N, K]; returns fp32 [M, N]. Raises TypeError/ValueError.
    """
    _check_part(w_high, None, "w_high")
    if w_high.dim() != 2:
        raise ValueError(f"w_high: expected a 2-D [N, K] tensor, got shape {tuple(w_high.shape)}")
    _check_part(w_mid, w_high.shape, "w_mid")
    _check_part(w_low, w_high.shape, "w_low")
    _check_x(x, w_high.shape[1])
    x32 = x.to(torch.float32)
    acc = [_mm_fp32(x32, p.to(torch.float32)) for p in (w_high, w_mid, w_low)]
    return acc[0] + (acc[1] + acc[2] * (1.0 / 256.0)) * (1.0 / 256.0)


def bf16x3_emulation(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact three-part split then bf16x3_from_parts. x bf16 [M, K]; w fp32 [N, K] -> fp32 [M, N]."""
    _check_weight(w)
    _check_x(x, w.shape[1])
    return bf16x3_from_parts(x, *split_fp32_weight_3(w))


EMULATIONS = {
    "fp32_emulation": fp32_emulation,
    "tf32_emulation": tf32_emulation,
    "bf16_emulation": bf16_emulation,
    "bf16x2_emulation": bf16x2_emulation,
    "bf16x3_emulation": bf16x3_emulation,
}
_PATH_OF = {"fp32_emulation": "fp32", "tf32_emulation": "tf32", "bf16_emulation": "bf16",
            "bf16x2_emulation": "bf16x2", "bf16x3_emulation": "bf16x3"}


# ----------------------------------------------------------------------------------------------------------------
# metrics


def error_metrics(scores: torch.Tensor, ref: torch.Tensor) -> dict:
    """max abs error, rel L2 error (||s - r|| / ||r||) and mean abs error, computed in float64.

    Shape/Dtype: scores any float [M, N]; ref any float, same shape. NaN/Inf in scores give NaN errors.
    Raises ValueError on a shape mismatch.
    """
    if tuple(scores.shape) != tuple(ref.shape):
        raise ValueError(f"scores: expected shape {tuple(ref.shape)} like ref, got {tuple(scores.shape)}")
    d = scores.to(torch.float64) - ref.to(torch.float64)
    rn = float(torch.linalg.vector_norm(ref.to(torch.float64)))
    dn = float(torch.linalg.vector_norm(d))
    return {"max_abs_err": float(d.abs().max()) if d.numel() else 0.0,
            "rel_l2_err": dn / rn if rn > 0 else (0.0 if dn == 0 else float("inf")),
            "mean_abs_err": float(d.abs().mean()) if d.numel() else 0.0}


def _check_topk(scores, ref, k):
    if tuple(scores.shape) != tuple(ref.shape) or scores.dim() != 2:
        raise ValueError(f"scores: expected a 2-D [M, N] tensor shaped like ref {tuple(ref.shape)}, "
                         f"got {tuple(scores.shape)}")
    if not (isinstance(k, int) and 1 <= k < scores.shape[1]):
        raise ValueError(f"k: expected an int in [1, N-1] with N={scores.shape[1]}, got {k!r}")


def topk_sets_differ(scores: torch.Tensor, ref: torch.Tensor, k: int = 8) -> torch.Tensor:
    """Per token: does the top-k expert *set* of scores differ from ref's (order inside the set ignored)?

    Shape/Dtype: scores, ref float [M, N]; returns bool [M]. Raises ValueError on shape or k.
    """
    _check_topk(scores, ref, k)
    a = torch.topk(scores.to(torch.float64), k, dim=1).indices.sort(dim=1).values
    b = torch.topk(ref.to(torch.float64), k, dim=1).indices.sort(dim=1).values
    return (a != b).any(dim=1)


def topk_flip_rate(scores: torch.Tensor, ref: torch.Tensor, k: int = 8) -> float:
    """Fraction of tokens whose top-k expert set differs from the reference's. Shapes as topk_sets_differ."""
    d = topk_sets_differ(scores, ref, k)
    return float(d.double().mean()) if d.numel() else 0.0


def routing_weights(scores: torch.Tensor, k: int = 8) -> torch.Tensor:
    """Renormalized routing weights: softmax over each token's top-k scores, 0 elsewhere (dense).

    Shape/Dtype: scores float [M, N]; returns fp64 [M, N] (rows sum to 1). Raises ValueError on k.
    """
    _check_topk(scores, scores, k)
    s = scores.to(torch.float64)
    vals, idx = torch.topk(s, k, dim=1)
    g = torch.softmax(vals, dim=1)
    return torch.zeros_like(s).scatter_(1, idx, g)


def routing_weight_moved(scores: torch.Tensor, ref: torch.Tensor, k: int = 8) -> torch.Tensor:
    """Per token L1 distance between the renormalized top-k routing weights of scores and of ref (0..2).

    Shape/Dtype: scores, ref float [M, N]; returns fp64 [M]. Raises ValueError on shape or k.
    """
    _check_topk(scores, ref, k)
    return (routing_weights(scores, k) - routing_weights(ref, k)).abs().sum(dim=1)


def routing_metrics(scores: torch.Tensor, ref: torch.Tensor, k: int = 8) -> dict:
    """flip_rate, flips (count), weight_moved_mean and weight_moved_max (L1 of the routing weights)."""
    flips = topk_sets_differ(scores, ref, k)
    moved = routing_weight_moved(scores, ref, k)
    return {"flip_rate": float(flips.double().mean()), "flips": int(flips.sum()),
            "weight_moved_mean": float(moved.mean()), "weight_moved_max": float(moved.max())}


def topk_gap(ref: torch.Tensor, k: int = 8) -> torch.Tensor:
    """Per token: the k-th minus the (k+1)-th largest score. Shape/Dtype: ref float [M, N] -> fp64 [M]."""
    _check_topk(ref, ref, k)
    v = torch.topk(ref.to(torch.float64), k + 1, dim=1).values
    return v[:, k - 1] - v[:, k]


# ----------------------------------------------------------------------------------------------------------------
# inputs


def weight_std(k: int, scale) -> float:
    """The weight standard deviation for a scale name: "init" = 1/sqrt(K) (logits of std ~1 for unit-RMS
    activations: the magnitude of trained router weights, |w| ~ 1e-2 at K=4096), "unit" = 1 (torch.randn, the
    benchmark convention; reproduces the published error magnitudes), or a float."""
    if scale == "init":
        return 1.0 / math.sqrt(k)
    if scale == "unit":
        return 1.0
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        return float(scale)
    raise ValueError(f"scale: expected 'init', 'unit' or a positive float, got {scale!r}")


def make_router_inputs(m: int, n: int, k: int, *, seed: int = 0, scale="init", device="cpu"):
    """Random router inputs: x ~ N(0, 1) in BF16 (post-RMSNorm hidden states have unit RMS), w ~ N(0, std^2) in
    FP32 with std from weight_std(k, scale).

    Shape/Dtype: returns x bf16 [m, k], w fp32 [n, k] on ``device``. Raises ValueError on non-positive sizes or
    an unknown scale, ResourceError (a ValueError, with the estimate) before allocating what would not fit.
    """
    for name, v in (("m", m), ("n", n), ("k", k)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    std = weight_std(k, scale)
    # host: x drawn in fp32 then rounded to bf16, w drawn and scaled in fp32; device: the bf16 x and fp32 w
    check_fits(f"router inputs m={m} n={n} k={k}", host_bytes=m * k * (4 + 2) + n * k * 4 * 2,
               device_bytes=m * k * 2 + n * k * 4, device=device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * std
    return x.to(device), w.to(device)


def near_tie_inputs(m: int, n: int, k: int, *, gap: float, seed: int = 0, topk: int = 8, scale="init",
                    max_rounds: int = 20):
    """Router inputs whose exact (FP64) k-th and (k+1)-th scores differ by a positive gap <= ``gap`` for every
    token (target gap uniform in [0.1, 1] x gap).

    Construction, per token: take the k-th (a) and (k+1)-th (b) experts of a random x; d = w_a - w_b; zero three
    coordinates j1..j3 of x with the largest |d|, then set them one after another so x.d hits the target: each
    step leaves a residual ~2^-9 of the previous (BF16 rounding of x_j), so three steps reach ~2^-18 of the
    original gap. Tokens where the move changed which experts are k-th/(k+1)-th are redrawn.
    Shape/Dtype: returns x bf16 [m, k], w fp32 [n, k], gaps fp64 [m] (the achieved FP64 gaps).
    Raises ValueError on bad sizes, gap <= 0, or when max_rounds redraws do not succeed.
    """
    if not (gap > 0):
        raise ValueError(f"gap: expected a positive float, got {gap!r}")
    if not (isinstance(topk, int) and 1 <= topk < n):
        raise ValueError(f"topk: expected an int in [1, n-1], got {topk!r}")
    if k < 3:
        raise ValueError(f"k: expected >= 3 (three coordinates are adjusted), got {k!r}")
    x, w = make_router_inputs(m, n, k, seed=seed, scale=scale)
    g = torch.Generator().manual_seed(seed + 1_000_003)
    w64 = w.to(torch.float64)
    out = x.clone()
    todo = torch.arange(m)
    for rnd in range(max_rounds):
        if todo.numel() == 0:
            break
        xr = torch.randn(todo.numel(), k, generator=g).to(torch.bfloat16) if rnd else out[todo]
        s = xr.to(torch.float64) @ w64.t()
        order = torch.topk(s, topk + 1, dim=1).indices
        a, b = order[:, topk - 1], order[:, topk]
        d = w64[a] - w64[b]  # [t, K]
        js = torch.topk(d.abs(), 3, dim=1).indices  # [t, 3]
        target = gap * (0.1 + 0.9 * torch.rand(todo.numel(), generator=g, dtype=torch.float64))
        xf = xr.to(torch.float64)
        xf.scatter_(1, js, 0.0)
        for step in range(3):
            j = js[:, step:step + 1]
            cur = (xf * d).sum(dim=1)
            dj = d.gather(1, j).squeeze(1)
            val = xf.gather(1, j).squeeze(1) + (target - cur) / dj
            val = val.to(torch.bfloat16).to(torch.float64)  # x is BF16: the value actually used
            xf.scatter_(1, j, val.unsqueeze(1))
        xb = xf.to(torch.bfloat16)
        got = topk_gap(xb.to(torch.float64) @ w64.t(), topk)
        ok = (got > 0) & (got <= gap)
        out[todo[ok]] = xb[ok]
        todo = todo[~ok]
    if todo.numel():
        raise ValueError(f"near_tie_inputs: {todo.numel()} of {m} tokens did not reach gap <= {gap!r} after "
                         f"{max_rounds} rounds (gap too small for BF16 activations?)")
    gaps = topk_gap(router_gemm_ref(out, w), topk)
    return out, w, gaps


# ----------------------------------------------------------------------------------------------------------------
# counts


def flops(m: int, n: int, k: int, parts: int = 2) -> int:
    """Tensor-core FLOPs: ``parts`` products of 2*M*N*K each (parts=1 for FP32/TF32/BF16, 2 for BF16x2)."""
    return 2 * m * n * k * parts


def bytes_moved(m: int, n: int, k: int, parts: int = 2) -> int:
    """Minimum DRAM traffic: x (bf16) read once, the weight read once (``parts`` BF16 parts: 2 parts = 4 bytes per
    weight, the same as the FP32 weight), the FP32 scores written once."""
    return 2 * m * k + 2 * parts * n * k + 4 * m * n


# ----------------------------------------------------------------------------------------------------------------
# tolerance derivation


def derive_tolerances(ms: Sequence[int] = (1, 64, 4096), n: int = 192, k: int = 4096, *, seed: int = 0,
                      scale="init") -> dict[tuple[str, str], dict]:
    """Measure what TOLERANCE_ROWS is derived from: each emulation's rel L2 and max abs error vs FP64 (max over
    ``ms``), and the FP32 summation-order effect (blocked vs one-pass FP32 sum of the same products) standing in
    for kernel-vs-emulation differences. Returns {(op, path): {"rel_l2": .., "max_abs": ..}}."""
    meas: dict[tuple[str, str], dict] = {}

    def upd(key, e):
        cur = meas.setdefault(key, {"rel_l2": 0.0, "max_abs": 0.0})
        cur["rel_l2"] = max(cur["rel_l2"], e["rel_l2_err"])
        cur["max_abs"] = max(cur["max_abs"], e["max_abs_err"])

    for m in ms:
        x, w = make_router_inputs(m, n, k, seed=seed + m, scale=scale)
        ref = router_gemm_ref(x, w)
        for impl, fn in EMULATIONS.items():
            upd((OP, f"{_PATH_OF[impl]}_vs_exact"), error_metrics(fn(x, w), ref))
        # summation order: split K into 64-wide chunks summed in FP32 (a kernel's k-loop) vs the library's order
        hi, lo = split_fp32_weight(w)
        emu = bf16x2_from_parts(x, hi, lo)
        x32 = x.to(torch.float32).reshape(m, k // 64, 64) if k % 64 == 0 else None
        if x32 is not None:
            acc_hi = torch.zeros(m, n)
            acc_lo = torch.zeros(m, n)
            for c in range(k // 64):
                sl = slice(64 * c, 64 * c + 64)
                acc_hi += _mm_fp32(x32[:, c], hi[:, sl].to(torch.float32))
                acc_lo += _mm_fp32(x32[:, c], lo[:, sl].to(torch.float32))
            upd((OP, "bf16x2_vs_emulation"), error_metrics(acc_hi + acc_lo / SCALE_LOW, emu))
    return meas
