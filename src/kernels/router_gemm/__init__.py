"""Router GEMM with a two-part BF16 weight on SM90: loader, public API, shape-aware dispatch, benchmark rows.

``scores = x @ W.T`` with x BF16 [M, K] and an FP32 router weight W [N, K] held as BF16 parts
(``W ~ w_high + w_low / 256``, split once by :func:`plan` with ``hotpaths.reference.router_gemm``'s split).
The kernel (router_gemm.cu) loads each activation fragment once, runs two BF16 tensor-core products into FP32
accumulators and writes ``acc_hi + acc_lo / 256``. Decode sizes (M <= 64) use a split-K kernel over every SM
with a deterministic cluster (DSMEM) reduction; prefill sizes a cp.async-pipelined tiled kernel.

``router_gemm(x, weights, impl="dispatch")`` picks between the kernel and FP32 cuBLAS by M using the crossover
table measured on the device (data/dispatch/router_gemm_<device-tag>.json, written by :func:`measure_crossover`);
without a table for the shape it runs the kernel.

Concurrency: no state is kept between calls (the global split-K variants take their workspace per call from the
caching allocator), so one ``RouterWeights`` can be used from several streams and inside CUDA graphs (capture after
one eager call, which sets the kernels' shared-memory attribute).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hotpaths.reference import router_gemm as ref

OP = "router_gemm"
IMPLS = ("dispatch", "bf16x2_kernel", "bf16x3_kernel", "fp32_cublas", "tf32_cublas", "bf16_cublas")
KERNEL_IMPLS = ("dispatch", "bf16x2_kernel", "bf16x3_kernel")
# The same-precision emulation each impl stands for (used without a GPU, and as the tight reference).
EMULATION_OF = {"dispatch": "bf16x2_emulation", "bf16x2_kernel": "bf16x2_emulation",
                "bf16x3_kernel": "bf16x3_emulation", "fp32_cublas": "fp32_emulation",
                "tf32_cublas": "tf32_emulation", "bf16_cublas": "bf16_emulation"}
DTYPE_OF = {"bf16x2_kernel": "x bf16, w fp32 as 2x bf16 (hi + lo/256), out fp32",
            "bf16x3_kernel": "x bf16, w fp32 as 3x bf16 (exact split), out fp32",
            "dispatch": "x bf16, w fp32 (bf16x2 kernel or fp32 cuBLAS by M), out fp32",
            "fp32_cublas": "x bf16->fp32, w fp32, out fp32 (cuBLAS FP32)",
            "tf32_cublas": "x bf16->fp32, w fp32, out fp32 (cuBLAS TF32)",
            "bf16_cublas": "x bf16, w bf16 (RNE), out fp32 (cuBLAS BF16)"}
# Kernel configurations: decode (split-K over a cluster, M <= 64; _n1/_n2 force 1 or 2 n8 tiles per warp), tiled
# BM x 64 with BK = 32 and 4 stages ("tiled64", "tiled128"), BK = 64 and 4 stages ("tiled64d", "tiled128d"), BK = 64
# and 6 / 5 stages ("tiled64x", "tiled128x"); wide-N tiles BM x BN (N must be a multiple of BN): "t128n96" (BK 32),
# "t128n96d" (BK 64), "t64n96d" (BK 64), "t64n192" (BK 32), "t64n192d" (BK 64); "auto" = the built-in heuristic (a
# tuned table wins).
# Tuner-only candidates (router_gemm.cu, enum Variant): the generalised decode kernel "decode_c16" (cluster of 16
# CTAs of 8 experts), "decode_c16n2" (16 CTAs of 16 experts), "decode_w8" (8 CTAs of 8 warps), "decode_c16w8"
# (16 CTAs of 8 warps), "decode_n32" / "decode_n64" (16 CTAs of 32 / 64 experts: x re-read by fewer column
# groups); tiled "t64n96" (BK 32, 4 stages), "t64n96d3" (BK 64, 3 stages: 2 CTAs per SM), "t128n96d3" (BK 64,
# 3 stages), "tiled128s3" / "tiled128s6" (BK 32, 3 / 6 stages), "tiled64s6" (BK 32, 6 stages).
# SM90 wgmma prefill variants (router_wgmma.cu; two parts only, offered to the tuner at M >= WGMMA_MIN_M):
# "wg128n96" (2 warpgroups, 128 x 96, 4 stages), "wg128n192" (2 WG, 128 x 192, 3 stages), "wg64n192" (1 WG,
# 64 x 192, 4 stages), "wg128n128" (2 WG, 128 x 128, 4 stages: the N = 256 shape); BK 64 for all. TMA + mbarrier
# pipeline (router_wgmma_ws_kernel): "ws128n192" (128 x 192, 3 stages, all free slots in flight) and
# "ws128n192m2" (the same with the W tiles multicast over a cluster pair of M tiles: K splits 1, 2, 4 only);
# "ws128n192g" (ws128n192 with split-K through a global workspace and a per-tile arrival counter instead of a
# cluster: a cluster of 4 such CTAs fits only 30 times on the H200, so 32 M tiles x 4 splits ran in two waves);
# "ws128n192m2g" (the W multicast pair with that global split-K: K splits up to 8); "ws128n192p" / "ws128n192m2p"
# (that global split-K with the K ranks paired in the cluster: each pair sums its partial tiles through distributed
# shared memory, each CTA one 64-row half, so half the partials go through the workspace and the final sums are
# spread over every pair; K splits 2, 4, 8); "ws128n192r" / "ws128n192t" (that global split-K as a reduce-scatter:
# every rank of a tile publishes the rows it does not own, waits for the others, and sums its 128 / S rows over all
# ranks; "r" is a cooperative launch, so its grid must fit in one wave; "t" takes its tile from a ticket; splits 2,
# 4, 8).
VARIANTS = {"auto": 0, "decode": 1, "tiled64": 2, "tiled128": 3, "tiled64d": 4, "tiled128d": 5, "tiled64x": 6,
            "tiled128x": 7, "decode_n1": 8, "decode_n2": 9, "t128n96": 10, "t128n96d": 11, "t64n96d": 12,
            "t64n192": 13, "t64n192d": 14, "decode_c16": 15, "decode_c16n2": 16, "decode_w8": 17,
            "decode_c16w8": 18, "decode_n32": 19, "decode_n64": 20, "t64n96": 21, "t64n96d3": 22, "t128n96d3": 23,
            "tiled128s3": 24, "tiled128s6": 25, "tiled64s6": 26, "wg128n96": 27, "wg128n192": 28, "wg64n192": 29,
            "wg128n128": 30, "ws128n192": 31, "ws128n192m2": 32, "ws128n192g": 33, "ws128n192m2g": 34,
            "ws128n192p": 35, "ws128n192m2p": 36, "ws128n192r": 37, "ws128n192t": 38}
# Decode variants the tuner times at M <= 64 (every one needs M <= 64; the C side rejects larger M).
DECODE_VARIANTS = ("decode_n1", "decode_n2", "decode_c16", "decode_c16n2", "decode_w8", "decode_c16w8",
                   "decode_n32", "decode_n64")
# Tiled variants: (BM, BN, BK) of the CTA tile, for the candidate list (mirrors tile_of() in router_gemm.cu).
TILED_TILES = {"tiled64": (64, 64, 32), "tiled64d": (64, 64, 64), "tiled64x": (64, 64, 64),
               "tiled128": (128, 64, 32), "tiled128d": (128, 64, 64), "tiled128x": (128, 64, 64),
               "t128n96": (128, 96, 32), "t128n96d": (128, 96, 64), "t64n96d": (64, 96, 64),
               "t64n192": (64, 192, 32), "t64n192d": (64, 192, 64), "t64n96": (64, 96, 32),
               "t64n96d3": (64, 96, 64), "t128n96d3": (128, 96, 64), "tiled128s3": (128, 64, 32),
               "tiled128s6": (128, 64, 32), "tiled64s6": (64, 64, 32)}
# wgmma variants: (BM, BN, BK) of the CTA tile (mirrors wgmma_tile() in router_wgmma.cuh). BF16x2 only: the C side
# refuses parts = 3 for them, so they are never candidates or tuned choices of impl="bf16x3_kernel".
WGMMA_TILES = {"wg128n96": (128, 96, 64), "wg128n192": (128, 192, 64), "wg64n192": (64, 192, 64),
               "wg128n128": (128, 128, 64), "ws128n192": (128, 192, 64), "ws128n192m2": (128, 192, 64),
               "ws128n192g": (128, 192, 64), "ws128n192m2g": (128, 192, 64), "ws128n192p": (128, 192, 64),
               "ws128n192m2p": (128, 192, 64), "ws128n192r": (128, 192, 64), "ws128n192t": (128, 192, 64)}
# CTAs per cluster along M sharing (multicasting) the W tiles (mirrors wgmma_cluster_m() in router_wgmma.cuh): the
# cluster is (CM, 1, splits) of at most 8 CTAs, and the M tiles are padded to a multiple of CM.
WGMMA_CLUSTER_M = {"ws128n192m2": 2, "ws128n192m2g": 2, "ws128n192m2p": 2}
# Split-K through a global workspace (mirrors wgmma_global_splitk()): the cluster is (CM, 1, 1), any split <= 8,
# or (CM, 1, 2) for the K-pair variants (WGMMA_PAIR_SPLITK, mirrors wgmma_pair_splitk()), splits 2, 4, 8.
WGMMA_GLOBAL_SPLITK = ("ws128n192g", "ws128n192m2g", "ws128n192p", "ws128n192m2p", "ws128n192r", "ws128n192t")
WGMMA_PAIR_SPLITK = ("ws128n192p", "ws128n192m2p")
# Reduce-scatter split-K (mirrors wgmma_reduce_scatter()): splits 2, 4, 8. WGMMA_COOPERATIVE: launched
# cooperatively, so the grid (one CTA per SM) must not exceed the device's SM count.
WGMMA_REDUCE_SCATTER = ("ws128n192r", "ws128n192t")
WGMMA_COOPERATIVE = ("ws128n192r",)
# From 65 rows up (every prefill size): with K split 8 ways even 1-2 row tiles of 128 fill 64-128 SMs, and the
# session-3 table left LongCat Chat at M = 208 on an mma.sync tile level with TF32 cuBLAS (32.6 vs 32.1 us).
WGMMA_MIN_M = 65
# The tuner's accuracy gate (the bound): a configuration whose max abs error vs FP64 exceeds ERR_BOUND x the
# BF16x2 emulation's on the gate input is not timed and cannot be chosen.
ERR_BOUND = 1.5
_VARIANT_NAMES = {v: k for k, v in VARIANTS.items()}
_SCALE = 1.0 / 256.0
DISPATCH_DIR = Path(__file__).resolve().parents[3] / "data" / "dispatch"
DEFAULT_MS = (1, 2, 4, 8, 16, 48, 96, 208, 512, 1024, 2048, 4096)


# ----------------------------------------------------------------------------------------------------------------
# loader


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from hotpaths.kernels import _build

    lib = _build.load(OP)
    vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.hp_router_gemm.argtypes = [vp, vp, vp, vp, vp, i, i, i, i, f, f, i, i, vp]
    lib.hp_router_gemm.restype = i
    lib.hp_router_gemm_ex.argtypes = [vp, vp, vp, vp, vp, i, i, i, i, f, f, i, i, vp, ctypes.c_longlong, vp]
    lib.hp_router_gemm_ex.restype = i
    lib.hp_router_gemm_workspace_bytes.argtypes = [i, i, i, i, i]
    lib.hp_router_gemm_workspace_bytes.restype = ctypes.c_longlong
    lib.hp_router_gemm_config.argtypes = [i, i, i, i, i, ctypes.POINTER(ctypes.c_int)]
    lib.hp_router_gemm_config.restype = i
    return lib


def _tile(variant: str) -> tuple[int, int, int]:
    return TILED_TILES.get(variant) or WGMMA_TILES.get(variant) or (0, 64, 0)


def kernel_config(m: int, n: int, k: int, *, variant: str = "auto", splits: int = 0) -> dict:
    """The launch configuration the kernel uses for [M, K] x [N, K]^T: variant (a VARIANTS name; decode, decode_n1
    and decode_n2 report "decode"), K splits (CTAs of one cluster), m16 tiles and n8 tiles per warp (decode).
    Raises ValueError if unsupported."""
    buf = (ctypes.c_int * 4)()
    code = _lib().hp_router_gemm_config(m, n, k, VARIANTS[variant], splits, buf)
    if code:
        raise ValueError(f"router GEMM kernel: no configuration for M={m}, N={n}, K={k}, variant={variant!r}, "
                         f"splits={splits} (N, K multiples of 64; decode needs M <= 64; the tiled variants need N "
                         f"a multiple of their BN, {_tile(variant)[1]}; splits in 0, 1, 2, 4, 8; ws128n192m2: splits <= 4; "
                         f"ws128n192p / ws128n192m2p / ws128n192r / ws128n192t: splits 0, 2, 4, 8)")
    return {"variant": _VARIANT_NAMES[buf[0]], "splits": buf[1], "mt": buf[2], "nt": buf[3]}


# ----------------------------------------------------------------------------------------------------------------
# plan


@dataclass
class RouterWeights:
    """The router weight prepared once (at load time) for every impl.

    Fields (all [N, K], contiguous): w_high, w_low bf16: the two-part split (w_low = RNE((w - w_high) * 256));
    w_mid, w_low2 bf16 (only when three_part, else None): the exact three-part split's middle and low parts
    (w = w_high + w_mid / 2^8 + w_low2 / 2^16; w_mid is a truncation, so it is NOT the two-part w_low: the BF16x2
    kernel always uses w_low); w fp32 (the original, for the cuBLAS FP32/TF32 paths); w_bf16 bf16 (RNE cast, for
    BF16 cuBLAS); n, k.
    """

    w: torch.Tensor
    w_high: torch.Tensor
    w_low: torch.Tensor
    w_mid: torch.Tensor | None
    w_low2: torch.Tensor | None
    w_bf16: torch.Tensor
    n: int
    k: int
    three_part: bool

    @property
    def device(self) -> torch.device:
        return self.w.device


def plan(w_fp32: torch.Tensor, *, three_part: bool = False) -> RouterWeights:
    """Split the FP32 router weight into BF16 parts on its device, once; the result is reused by every call
    (and is safe under CUDA graphs: nothing is allocated per call).

    Shape/Dtype: w_fp32 fp32 [N, K], contiguous, N and K positive multiples of 64 (the kernel's tiles).
    three_part=True also prepares the exact three-part split (needed by impl="bf16x3_kernel").
    Raises TypeError (not a tensor / not fp32), ValueError (not 2-D, N or K unsupported, non-contiguous,
    Inf/NaN in the weight), ResourceError (a ValueError) when the parts would not fit in memory.
    """
    from hotpaths.harness.validate import check_fits, expect_tensor

    expect_tensor(w_fp32, "w_fp32", dtype=torch.float32, ndim=2, layout="[N, K]", contiguous=True,
                  why=" (the FP32 router weight)")
    n, k = (int(s) for s in w_fp32.shape)
    ref.validate_kernel_shape(n, k)
    # the BF16 parts (high, low, plain; mid and low2 for three parts) plus the split's fp32 temporaries
    check_fits(f"router plan n={n} k={k}", device_bytes=n * k * (2 * (5 if three_part else 3) + 8),
               device=w_fp32.device)
    hi, lo = ref.split_fp32_weight(w_fp32)
    mid = lo2 = None
    if three_part:
        hi3, mid, lo2 = ref.split_fp32_weight_3(w_fp32)
        if not torch.equal(hi3, hi):  # both splits truncate the high part; the kernel shares it between them
            raise RuntimeError("plan: the two- and three-part splits disagree on w_high (reference changed?)")
        mid, lo2 = mid.contiguous(), lo2.contiguous()
    return RouterWeights(w=w_fp32, w_high=hi.contiguous(), w_low=lo.contiguous(), w_mid=mid, w_low2=lo2,
                         w_bf16=w_fp32.to(torch.bfloat16).contiguous(), n=n, k=k, three_part=three_part)


# ----------------------------------------------------------------------------------------------------------------
# dispatch table


def dispatch_path(tag: str | None = None) -> Path:
    """data/dispatch/router_gemm_<device-tag>.json (directory overridable with env HOTPATHS_DISPATCH_DIR)."""
    if tag is None:
        from hotpaths.harness.env import device_tag

        tag = device_tag()
    d = Path(os.environ.get("HOTPATHS_DISPATCH_DIR", DISPATCH_DIR))
    return d / f"{OP}_{tag}.json"


@functools.lru_cache(maxsize=None)
def _load_table(path: str) -> dict | None:
    p = Path(path)
    if not p.exists():
        return None
    return json.loads(p.read_text())


def reload_dispatch_table() -> None:
    """Forget the cached table (after measure_crossover or editing the file)."""
    _load_table.cache_clear()


def _nearest_row(m: int, n: int, k: int, table: dict | None):
    if table is None:
        table = _load_table(str(dispatch_path()))
    if not table:
        return None
    for shape in table.get("shapes", []):
        if int(shape["n"]) == n and int(shape["k"]) == k and shape.get("rows"):
            return min(shape["rows"], key=lambda r: (abs(math.log2(int(r["m"])) - math.log2(max(m, 1))), -int(r["m"])))
    return None


def tuned_config(m: int, n: int, k: int, table: dict | None = None, *, parts: int = 2) -> tuple[str, int] | None:
    """The kernel (variant, splits) measured fastest at the M nearest to m (log2) for (N, K), or None (no table,
    shape not measured, or the tuned variant cannot run this M: decode needs M <= 64).
    parts=3 (BF16x3): the wgmma variants run two parts only, so the fastest measured non-wgmma candidate of that row
    is returned instead (None when the row lists none)."""
    row = _nearest_row(m, n, k, table)
    cfg = (row or {}).get("kernel")
    if not cfg:
        return None
    variant, splits = cfg["variant"], int(cfg["splits"])
    if parts == 3 and variant in WGMMA_TILES:
        cands = [(t, c.split("/")) for c, t in (row.get("candidates_us") or {}).items()]
        cands = [(t, v, int(sp)) for t, (v, sp) in cands
                 if v not in WGMMA_TILES and v in VARIANTS and not (v.startswith("decode") and m > 64)]
        if not cands:
            return None
        _, variant, splits = min(cands)
    if variant.startswith("decode") and m > 64:
        return None
    return variant, splits


def choose_impl(m: int, n: int, k: int, table: dict | None = None) -> str:
    """The impl dispatch runs for M x (N, K): the faster of "bf16x2_kernel" and "fp32_cublas" at the measured M
    nearest to m (log scale; ties to the larger M) for the measured (N, K); "bf16x2_kernel" when the table or
    the shape is absent. ``table`` defaults to the device's file (dispatch_path())."""
    row = _nearest_row(m, n, k, table)
    return row["choice"] if row else "bf16x2_kernel"


# ----------------------------------------------------------------------------------------------------------------
# the op


@contextlib.contextmanager
def _allow_tf32(flag: bool):
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = flag
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _bf16_mm_fp32_out(x: torch.Tensor, wb: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    try:  # cuBLAS BF16 GEMM writing FP32 (torch >= 2.9 on CUDA)
        r = torch.mm(x, wb.t(), out_dtype=torch.float32)
    except (TypeError, RuntimeError):  # older torch: the same numbers via FP32 operands (slower)
        with _allow_tf32(False):
            r = torch.mm(x.float(), wb.float().t())
    out.copy_(r)
    return out


def _validate(x, weights, impl, out):
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if not isinstance(weights, RouterWeights):
        raise TypeError(f"weights: expected RouterWeights from plan(w_fp32), got {type(weights).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected dtype torch.bfloat16 (router activations), got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != weights.k:
        raise ValueError(f"x: expected a 2-D [M, K={weights.k}] tensor, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError("x: expected a contiguous [M, K] tensor; call .contiguous() first")
    if x.device != weights.device:
        raise ValueError(f"x: expected device {weights.device} (the weights' device), got {x.device}")
    if impl == "bf16x3_kernel" and not weights.three_part:
        raise ValueError("impl='bf16x3_kernel' needs plan(w, three_part=True)")
    m = int(x.shape[0])
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            raise TypeError(f"out: expected a torch.float32 tensor, got "
                            f"{out.dtype if isinstance(out, torch.Tensor) else type(out).__name__}")
        if tuple(out.shape) != (m, weights.n) or not out.is_contiguous() or out.device != x.device:
            raise ValueError(f"out: expected a contiguous fp32 [{m}, {weights.n}] tensor on {x.device}, got "
                             f"shape {tuple(out.shape)} on {out.device} (contiguous={out.is_contiguous()})")
    return m


def _run_kernel(x, weights, out, *, parts, variant="auto", splits=0):
    if parts == 3 and variant in WGMMA_TILES:
        raise ValueError(f"variant={variant!r}: the wgmma variants run the two-part weight only "
                         f"(impl='bf16x2_kernel'); for impl='bf16x3_kernel' pick one of {sorted(TILED_TILES)}")
    if x.device.type != "cuda":
        raise RuntimeError(f"the router GEMM kernel needs an SM90 CUDA device; x is on {x.device} (use the "
                           f"emulations in hotpaths.reference.router_gemm on CPU)")
    for name, t in (("x", x), ("out", out)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: expected a 16-byte aligned data pointer (vector loads/stores); got a view "
                             f"at offset {t.data_ptr() % 16} mod 16: pass a fresh tensor or .clone()")
    from hotpaths.kernels._build import check_status, ptr, stream_ptr

    m, n, k = int(x.shape[0]), weights.n, weights.k
    if variant == "auto" and splits == 0:  # the configuration tuned on this device, when there is one
        variant, splits = tuned_config(m, n, k, parts=parts) or ("auto", 0)
    # BF16x3: (high, mid, low) with the kernel's epilogue acc0 + (acc1 + acc2 / 256) / 256
    p1, p2 = (weights.w_mid, weights.w_low2) if parts == 3 else (weights.w_low, None)
    if variant in WGMMA_COOPERATIVE:  # the whole grid must be resident at once (one CTA per SM)
        cfg = kernel_config(m, n, k, variant=variant, splits=splits)
        cm = WGMMA_CLUSTER_M.get(variant, 1)
        grid = -(-m // (WGMMA_TILES[variant][0] * cm)) * cm * (n // WGMMA_TILES[variant][1]) * cfg["splits"]
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        if grid > sms:
            raise ValueError(f"variant={variant!r}: its cooperative grid of {grid} CTAs (M={m}, N={n}, splits="
                             f"{cfg['splits']}) exceeds one wave of {sms} SMs on {x.device}; use fewer splits or "
                             f"'ws128n192t' (ticketed, any grid)")
    # Global split-K variants (ws128n192g/m2g, ws128n192p/m2p) with K split: a per-call workspace from the caching
    # allocator (a graph's private pool under capture), its counters zeroed by the launcher (a memset node).
    nws = _lib().hp_router_gemm_workspace_bytes(m, n, k, VARIANTS[variant], splits)
    ws = torch.empty(nws, dtype=torch.uint8, device=x.device) if nws > 0 else None
    with torch.cuda.device(x.device):
        code = _lib().hp_router_gemm_ex(ptr(x), ptr(weights.w_high), ptr(p1), ptr(p2), ptr(out), m, n, k,
                                        parts, _SCALE, _SCALE, VARIANTS[variant], splits,
                                        ptr(ws), max(nws, 0), stream_ptr(x.device))
    if code == 1:  # cudaErrorInvalidValue: a shape/config the C side refuses
        kernel_config(m, n, k, variant=variant, splits=splits)  # raises the descriptive ValueError
    check_status(code, f"hp_router_gemm(M={m}, N={n}, K={k}, parts={parts}, variant={variant})")
    return out


def router_gemm(x: torch.Tensor, weights: RouterWeights, *, impl: str = "dispatch", out: torch.Tensor | None = None,
                variant: str = "auto", splits: int = 0) -> torch.Tensor:
    """Router scores ``x @ W.T`` in FP32.

    Shape/Dtype: x bf16 [M, K] contiguous, 16-byte aligned, on the weights' device; weights from plan(W [N, K]);
    out (optional) fp32 [M, N] contiguous. Returns fp32 [M, N] (``out`` when given). M == 0 returns an empty
    [0, N] tensor.
    impl: "dispatch" (kernel or FP32 cuBLAS by the measured crossover), "bf16x2_kernel", "bf16x3_kernel"
    (needs plan(..., three_part=True)), "fp32_cublas", "tf32_cublas", "bf16_cublas" (baselines via torch).
    variant / splits: force a kernel configuration (experiments); "auto"/0 = the configuration tuned on this
    device (dispatch table), else the built-in heuristic.
    Raises TypeError (wrong dtype / type), ValueError (shape, contiguity, device, alignment, impl),
    RuntimeError (a kernel impl on a non-CUDA device, or a CUDA error).
    """
    m = _validate(x, weights, impl, out)
    if out is None:
        out = torch.empty(m, weights.n, dtype=torch.float32, device=x.device)
    if m == 0:
        return out
    if impl == "dispatch":
        impl = choose_impl(m, weights.n, weights.k)
    if impl == "bf16x2_kernel":
        return _run_kernel(x, weights, out, parts=2, variant=variant, splits=splits)
    if impl == "bf16x3_kernel":
        return _run_kernel(x, weights, out, parts=3, variant=variant, splits=splits)
    if impl == "bf16_cublas":
        return _bf16_mm_fp32_out(x, weights.w_bf16, out)
    with _allow_tf32(impl == "tf32_cublas"):
        return torch.matmul(x.float(), weights.w.t(), out=out)


# ----------------------------------------------------------------------------------------------------------------
# measurement


def _gpu_ok() -> bool:
    try:
        from hotpaths.harness.env import has_sm90

        return has_sm90()
    except Exception:
        return False


def _parts_of(impl: str) -> int:
    return {"bf16x3_kernel": 3, "bf16_cublas": 1, "bf16_emulation": 1, "bf16x3_emulation": 3}.get(impl, 2)


def _time(x, weights, impl, out, iters):
    from hotpaths.harness.bench import bench

    return bench(lambda: router_gemm(x, weights, impl=impl, out=out), iters=iters)


def benchmark_rows(ms, n: int, k: int, impls=("bf16x2_kernel", "dispatch", "fp32_cublas", "tf32_cublas",
                                              "bf16_cublas"), *, case_prefix: str = "hy3", seed: int = 0,
                   ceilings: dict | None = None, iters: int = 100, topk: int = 8) -> list[dict]:
    """Latency and error rows for each M and impl (CONTRACT.md columns plus m, n, k, speedup_vs_fp32,
    speedup_vs_tf32, max_abs_err_vs_fp32, max_abs_err_vs_fp64, emulation_max_abs_err_vs_fp64, topk_flips,
    topk_flips_emulation, config).

    Inputs: make_router_inputs(m, n, k, seed=seed + m) (fresh random, "init" scale); outputs NaN-poisoned before
    the correctness run. max_abs_err / rel_l2_err / cosine are vs FP64. Timing: harness bench (CUDA graph replay,
    L2 flushed before each replay, median). ceilings: hotpaths.harness.ceilings.measure() output for
    pct_of_ceiling (copy bandwidth), or None to leave it empty.
    Without an SM90 GPU: one row per distinct emulation (impl "bf16x2_emulation", ...) with empty timing, and a
    "dispatch_emulation" row (the emulation of the impl dispatch would pick, named in its ``note``).
    Raises ValueError on an unknown impl or unsupported N/K.
    """
    from hotpaths.harness.check import check
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id

    bad = [i for i in impls if i not in IMPLS]
    if bad:
        raise ValueError(f"impls: unknown {bad}; expected a subset of {IMPLS}")
    ref.validate_kernel_shape(n, k)
    gpu = _gpu_ok()
    dev = "cuda" if gpu else "cpu"
    tag, rid = device_tag(), run_id()
    _, w = ref.make_router_inputs(1, n, k, seed=seed)
    w = w.to(dev)
    weights = plan(w, three_part="bf16x3_kernel" in impls)
    rows = []
    from hotpaths.harness.progress import progress

    for m in progress(ms, desc="router", unit="M"):
        x, _ = ref.make_router_inputs(m, n, k, seed=seed + 1 + m)
        x = x.to(dev)
        r64 = ref.router_gemm_ref(x, w)
        f32 = ref.fp32_emulation(x, w)
        emu_cache: dict[str, torch.Tensor] = {}
        base_t: dict = {}
        # Without a GPU: one row per distinct emulation, plus dispatch as its own row (the emulation of what it
        # would pick at this M, named in the note), so the table keeps every impl the user asked for.
        todo = list(impls) if gpu else list(dict.fromkeys(EMULATION_OF[i] for i in impls if i != "dispatch")) \
            + (["dispatch_emulation"] if "dispatch" in impls else [])
        if gpu:  # the baselines the speedup columns divide by, timed once per M
            for b in ("fp32_cublas", "tf32_cublas"):
                base_t[b] = _time(x, weights, b, torch.empty(m, n, device=dev), iters)
        for impl in todo:
            emu_name = EMULATION_OF[choose_impl(m, n, k)] if impl == "dispatch_emulation" else EMULATION_OF.get(impl, impl)
            if emu_name not in emu_cache:
                emu_cache[emu_name] = ref.EMULATIONS[emu_name](x, w)
            timing, cfg = None, None
            if gpu:
                out = torch.full((m, n), float("nan"), device=dev)
                router_gemm(x, weights, impl=impl, out=out)
                torch.cuda.synchronize()
                timing = base_t[impl] if impl in base_t else _time(x, weights, impl, out, iters)
                med = timing.median_us
                if impl in ("bf16x2_kernel", "bf16x3_kernel") or choose_impl(m, n, k) == "bf16x2_kernel":
                    v, sp = tuned_config(m, n, k, parts=3 if impl == "bf16x3_kernel" else 2) or ("auto", 0)
                    cfg = dict(kernel_config(m, n, k, variant=v, splits=sp), tuned=v != "auto")
                else:
                    cfg = choose_impl(m, n, k)
            else:
                out, med = emu_cache[emu_name], None
            c = check(out, r64)
            base_impl = impl if gpu else "dispatch" if impl == "dispatch_emulation" else \
                next(i for i in impls if i != "dispatch" and EMULATION_OF[i] == impl)
            nbytes = ref.bytes_moved(m, n, k, _parts_of(base_impl))
            flips = int(ref.topk_sets_differ(out.cpu(), r64.cpu(), topk).sum()) if n > topk else None
            eflips = int(ref.topk_sets_differ(emu_cache[emu_name].cpu(), r64.cpu(), topk).sum()) if n > topk \
                else None
            gbps = nbytes / med / 1e3 if med else None
            cop = (ceilings or {}).get("copy_gbps")
            row = {"op": OP, "case": f"{case_prefix}_m{m}", "impl": impl, "dtype": DTYPE_OF.get(base_impl, ""),
                   "device": tag, "median_us": med,
                   "p10_us": timing.p10_us if timing else None, "p90_us": timing.p90_us if timing else None,
                   "bytes": nbytes, "gbps": gbps, "pct_of_ceiling": 100 * gbps / cop if gbps and cop else None,
                   "rel_l2_err": c.rel_l2_err, "max_abs_err": c.max_abs_err, "cosine": c.cosine,
                   "published_h20_us": None, "run_id": rid,
                   "repro": f"hotpaths router --m {m} --n {n} --k {k} --impl {base_impl} --seed {seed} --json",
                   "m": m, "n": n, "k": k,
                   "speedup_vs_fp32": base_t["fp32_cublas"].median_us / med if med else None,
                   "speedup_vs_tf32": base_t["tf32_cublas"].median_us / med if med else None,
                   "max_abs_err_vs_fp32": ref.error_metrics(out, f32)["max_abs_err"],
                   "max_abs_err_vs_fp64": c.max_abs_err,
                   "emulation_max_abs_err_vs_fp64": ref.error_metrics(emu_cache[emu_name], r64)["max_abs_err"],
                   "topk_flips": flips, "topk_flips_emulation": eflips,
                   "config": json.dumps(cfg) if isinstance(cfg, dict) else cfg}
            if impl == "dispatch_emulation":
                row["note"] = (f"emulation (no timing, no SM90 GPU): dispatch picks {choose_impl(m, n, k)} at M={m} "
                               f"({'measured table ' + dispatch_path().name if _nearest_row(m, n, k, None) else 'no dispatch table for this device: the kernel by default'})")
            rows.append(row)
    return rows


def kernel_candidates(m: int, n: int, k: int, *, sm_count: int = 132) -> list[tuple[str, int]]:
    """Kernel configurations worth timing at M x (N, K) with the two-part weight (BF16x2): every decode variant
    (DECODE_VARIANTS, M <= 64) and each tiled variant whose BN divides N, with K splits 1, 2, 4, 8 while the grid
    stays under ~4 CTAs per SM and each split keeps >= 4 k-steps; at M >= WGMMA_MIN_M also each wgmma variant whose
    BN divides N and BK divides K, with splits 1, 2, 4, 8 while the grid stays under ~2 CTAs per SM (they run one
    CTA per SM) and each split keeps >= 4 k-tiles (ws128n192m2: its M tiles padded to pairs, splits * 2 <= 8, the
    portable cluster size; the K-pair and reduce-scatter variants: splits 2, 4, 8, the smallest always; the
    cooperative ws128n192r only while its grid fits in one wave of ``sm_count`` SMs).
    Raises ValueError for an unsupported shape (N, K not multiples of 64, M < 1)."""
    if n % 64 or k % 64 or m < 1:
        raise ValueError(f"kernel_candidates: unsupported M={m}, N={n}, K={k} (N, K multiples of 64, M >= 1)")
    out = [(v, 0) for v in DECODE_VARIANTS] if m <= 64 else []
    for v, (bm, bn, bk) in TILED_TILES.items():
        if n % bn:
            continue
        base = -(-m // bm) * (n // bn)
        for s in (1, 2, 4, 8):
            if (s == 1 or base * s <= 4 * 132) and (k // bk) // s >= 4:
                out.append((v, s))
    if m >= WGMMA_MIN_M:
        for v, (bm, bn, bk) in WGMMA_TILES.items():
            if n % bn or k % bk:
                continue
            cm = WGMMA_CLUSTER_M.get(v, 1)
            base = -(-m // (bm * cm)) * cm * (n // bn)
            s_min = 2 if v in WGMMA_PAIR_SPLITK + WGMMA_REDUCE_SCATTER else 1  # the smallest split is always offered
            for s in (1, 2, 4, 8):
                if s < s_min or (v in WGMMA_COOPERATIVE and base * s > sm_count):
                    continue
                csize = 2 * cm if v in WGMMA_PAIR_SPLITK else cm if v in WGMMA_GLOBAL_SPLITK else s * cm
                if (s == s_min or base * s <= 2 * 132) and (k // bk) // s >= 4 and csize <= 8:
                    out.append((v, s))
    return out


def accuracy_failure(got: torch.Tensor, ref64: torch.Tensor, emu_err: float, bound: float = ERR_BOUND, *,
                     emu_flips: int | None = None, topk: int = 8) -> str | None:
    """The tuner's accuracy gate: None when max|got - ref64| <= bound * emu_err (the BF16x2 emulation's max abs
    error vs the same FP64 reference) and, when ``emu_flips`` is given, got's top-``topk`` expert sets differ from
    FP64's on at most as many tokens as the emulation's do (emu_flips); else the reason. got: fp32 [M, N]; ref64:
    fp64 [M, N] on the same device."""
    err = float((got.double() - ref64).abs().max())
    if err > bound * emu_err:
        return (f"max abs error vs FP64 {err:.3g} is {err / max(emu_err, 1e-30):.2f}x the emulation's "
                f"({emu_err:.3g}); bound {bound}x")
    if emu_flips is not None:
        flips = int(ref.topk_sets_differ(got, ref64, topk).sum())
        if flips > emu_flips:
            return f"top-{topk} flips vs FP64 {flips} > the emulation's {emu_flips}"
    return None


def measure_crossover(shapes, ms=DEFAULT_MS, *, path: str | Path | None = None, iters: int = 30,
                      seed: int = 0, tune: bool = True) -> dict:
    """Tune the kernel and find the crossover: at each (N, K) in ``shapes`` and each M in ``ms``, time every
    kernel configuration (kernel_candidates; only the built-in one when tune=False) and FP32 cuBLAS, and write the
    dispatch table (dispatch_path() unless ``path``); returns it. Needs an SM90 GPU (RuntimeError otherwise).

    Every candidate is first run once on fresh random data into a NaN-poisoned output and checked against the
    BF16x2 emulation (tolerance row ("router_gemm", "bf16x2_vs_emulation")) and against FP64 (max abs error at
    most ERR_BOUND x the emulation's, and no more top-8 flips vs FP64 than the emulation's); a candidate that fails
    (or raises) is not timed and cannot be selected: it is listed with the reason under the row's "failed".

    Table: {"op", "device", "run_id", "method", "shapes": [{"n", "k", "rows": [{"m", "kernel": {"variant",
    "splits"}, "bf16x2_kernel_us", "fp32_cublas_us", "choice", "candidates_us", "failed" (when any)}]}]}.
    """
    if not _gpu_ok():
        raise RuntimeError("measure_crossover needs an SM90 GPU (the table is a measurement of this device)")
    from hotpaths.harness.bench import bench
    from hotpaths.harness.check import check
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id
    from hotpaths.harness.tolerances import tolerance

    tol = tolerance(OP, "bf16x2_vs_emulation")

    table = {"op": OP, "device": device_tag(), "run_id": run_id(), "gpu": torch.cuda.get_device_name(),
             "method": f"harness bench: CUDA graph replay, L2 flushed before each replay, median of {iters}",
             "rule": "dispatch runs the faster impl at the measured M nearest (log2) to the call's M; the kernel "
                     "runs the fastest configuration measured there",
             "shapes": []}
    for n, k in shapes:
        ref.validate_kernel_shape(n, k)
        _, w = ref.make_router_inputs(1, n, k, seed=seed)
        weights = plan(w.cuda())
        rows = []
        for m in ms:
            x, _ = ref.make_router_inputs(m, n, k, seed=seed + 1 + m)
            x = x.cuda()
            # correctness gate: a second fresh input (not the timed one), its emulation computed once per M
            xc, _ = ref.make_router_inputs(m, n, k, seed=seed + 7919 + m)
            xc = xc.cuda()
            emu = ref.bf16x2_from_parts(xc, weights.w_high, weights.w_low)
            # accuracy gate: the kernel's max abs error vs FP64 within ERR_BOUND x the emulation's (a long
            # accumulation chain in the tensor cores' FP32 accumulators, e.g. one split over K = 6144, exceeds it)
            ref64 = xc.double() @ weights.w.double().T
            emu_err = float((emu.double() - ref64).abs().max())
            emu_flips = int(ref.topk_sets_differ(emu, ref64, 8).sum())  # the target: flips equal to these
            out = torch.empty(m, n, device="cuda")
            sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            cands = kernel_candidates(m, n, k, sm_count=sms) if tune else [("auto", 0)]
            cand_us = {}
            failed = {}
            for v, sp in cands:
                try:
                    got = torch.full((m, n), float("nan"), device="cuda")
                    router_gemm(xc, weights, impl="bf16x2_kernel", out=got, variant=v, splits=sp)
                    torch.cuda.synchronize()
                    c = check(got, emu, tol=tol)
                    if not c.passed:
                        failed[f"{v}/{sp}"] = (f"wrong result vs bf16x2 emulation: rel_l2={c.rel_l2_err:.3g} "
                                               f"max_abs={c.max_abs_err:.3g} nan={c.nan_count} inf={c.inf_count}")
                        continue
                    why = accuracy_failure(got, ref64, emu_err, emu_flips=emu_flips)
                    if why:
                        failed[f"{v}/{sp}"] = why
                        continue
                    cand_us[f"{v}/{sp}"] = bench(lambda: router_gemm(x, weights, impl="bf16x2_kernel", out=out,
                                                                     variant=v, splits=sp), iters=iters).median_us
                except (RuntimeError, ValueError) as e:  # e.g. a cluster that cannot be scheduled: record, skip
                    failed[f"{v}/{sp}"] = str(e)[:200]
            if not cand_us:
                raise RuntimeError(f"measure_crossover: every kernel configuration failed at M={m}, N={n}, K={k}: "
                                   f"{failed}")
            best = min(cand_us, key=cand_us.get)
            v, sp = best.split("/")
            if v == "auto":
                c = kernel_config(m, n, k)
                v, sp = c["variant"], c["splits"]
            t32 = _time(x, weights, "fp32_cublas", out, iters).median_us
            rows.append({"m": m, "kernel": {"variant": v, "splits": int(sp)}, "bf16x2_kernel_us": cand_us[best],
                         "fp32_cublas_us": t32,
                         "choice": "bf16x2_kernel" if cand_us[best] <= t32 else "fp32_cublas",
                         "candidates_us": {c: round(t, 2) for c, t in cand_us.items()},
                         **({"failed": failed} if failed else {})})
        table["shapes"].append({"n": n, "k": k, "rows": rows})
    p = Path(path) if path is not None else dispatch_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(table, indent=1) + "\n")
    reload_dispatch_table()
    return table


__all__ = ["IMPLS", "RouterWeights", "plan", "router_gemm", "choose_impl", "kernel_config", "benchmark_rows",
           "accuracy_failure", "measure_crossover", "kernel_candidates", "tuned_config", "dispatch_path",
           "reload_dispatch_table", "EMULATION_OF"]
