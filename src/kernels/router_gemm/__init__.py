"""Router GEMM with a two-part BF16 weight on SM90: loader, public API, shape-aware dispatch (benchmark
rows and the tuner: hotpaths.bench.router_gemm).

``scores = x @ W.T`` with x BF16 [M, K] and an FP32 router weight W [N, K] held as BF16 parts
(``W ~ w_high + w_low / 256``, split once by :func:`plan` with ``hotpaths.reference.router_gemm``'s split).
The kernel (router_gemm.cu) loads each activation fragment once, runs two BF16 tensor-core products into FP32
accumulators and writes ``acc_hi + acc_lo / 256``. Decode sizes (M <= 128) use a split-K kernel over every SM
with a deterministic cluster (DSMEM) reduction; prefill sizes a cp.async-pipelined tiled kernel.

``router_gemm(x, weights, impl="dispatch")`` picks between the kernel and FP32 cuBLAS by M using the crossover
table measured on the device (data/dispatch/router_gemm_<device-tag>.json, written by
``hotpaths.bench.router_gemm.measure_crossover``). For a shape that table lacks it uses the choice tuned on first
use (first_use.py: every candidate and FP32 cuBLAS timed as the bench does, once per device, (N, K) and M bucket, cached
under ~/.cache/hotpaths; tuning only when enabled and never during CUDA-graph capture), else the kernel's built-in
heuristic. docs/ops/router_gemm_dispatch.md says why.

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

from hotpaths.kernels import _build, _timing
from hotpaths.kernels._build import check_status, ptr, stream_ptr
from hotpaths.kernels.router_gemm import first_use as _fu
from hotpaths.reference import router_gemm as ref
from hotpaths.reference.common import check_fits, device_tag, expect_tensor

OP = "router_gemm"
IMPLS = ("dispatch", "bf16x2_kernel", "bf16x3_kernel", "fp32_cublas", "tf32_cublas", "bf16_cublas", "bf16x2_cublas")
# The same-precision emulation each impl stands for (used without a GPU, and as the tight reference).
EMULATION_OF = {"dispatch": "bf16x2_emulation", "bf16x2_kernel": "bf16x2_emulation",
                "bf16x3_kernel": "bf16x3_emulation", "fp32_cublas": "fp32_emulation",
                "tf32_cublas": "tf32_emulation", "bf16_cublas": "bf16_emulation",
                "bf16x2_cublas": "bf16x2_emulation"}
DTYPE_OF = {"bf16x2_kernel": "x bf16, w fp32 as 2x bf16 (hi + lo/256), out fp32",
            "bf16x3_kernel": "x bf16, w fp32 as 3x bf16 (exact split), out fp32",
            "dispatch": "x bf16, w fp32 (bf16x2 kernel or fp32 cuBLAS by M), out fp32",
            "fp32_cublas": "x bf16->fp32, w fp32, out fp32 (cuBLAS FP32)",
            "tf32_cublas": "x bf16->fp32, w fp32, out fp32 (cuBLAS TF32)",
            "bf16_cublas": "x bf16, w bf16 (RNE), out fp32 (cuBLAS BF16)",
            "bf16x2_cublas": "x bf16, w fp32 as 2x bf16 (hi + lo/256), out fp32 (one cuBLAS BF16 GEMM on [hi; lo])"}
# Kernel variants: router_variants.cuh (an X-macro list) is the one place that names them; the library reports it
# through hp_router_variant_count / _name / _info, and the views below (VARIANTS, DECODE_VARIANTS, TILED_TILES,
# WGMMA_TILES, WGMMA_GLOBAL_SPLITK, WGMMA_PAIR_SPLITK, WGMMA_REDUCE_SCATTER, WGMMA_COOPERATIVE, VARIANT_PARTS) are
# built from that report when first used (module attributes resolved lazily: importing this module compiles
# nothing). "auto" = the built-in heuristic (a tuned table wins).
FAMILIES = ("auto", "decode", "tiled", "wgmma", "ws")  # index = hp_router::Family
SPLITK_KINDS = ("cluster", "global", "pair", "scatter")  # index = hp_router::SplitK
# From 65 rows up (every prefill size): with K split 8 ways even 1-2 row tiles of 128 fill 64-128 SMs.
WGMMA_MIN_M = 65
# The decode kernel's largest M (hp_router::kDecodeMaxM): 64 rows per CTA, row blocks (grid z) past 64.
DECODE_MAX_M = 128
# The tuner's accuracy gate (the project's accuracy target): a configuration whose max abs error vs FP64 exceeds ERR_BOUND x the
# BF16x2 emulation's on the gate input is not timed and cannot be chosen.
ERR_BOUND = 1.5
_SCALE = 1.0 / 256.0
DISPATCH_DIR = Path(__file__).resolve().parents[3] / "data" / "dispatch"


# ----------------------------------------------------------------------------------------------------------------
# loader


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
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
    lib.hp_router_variant_count.argtypes = []
    lib.hp_router_variant_count.restype = i
    lib.hp_router_variant_name.argtypes = [i]
    lib.hp_router_variant_name.restype = ctypes.c_char_p
    lib.hp_router_variant_info.argtypes = [i, ctypes.POINTER(ctypes.c_int)]
    lib.hp_router_variant_info.restype = i
    return lib


def load_traced_library() -> ctypes.CDLL:
    """The router library built with HP_ROUTER_TRACE=1: router_wgmma_ws_kernel records a per-CTA timeline into the
    buffer set by ``hp_router_set_trace(void*)`` (kTraceWords = 9 int64 per CTA; see router_wgmma.cu). A separate
    cached build, loaded beside (never instead of) the one the op runs; call its hp_router_gemm_ex directly.
    Raises hotpaths.kernels._build.KernelBuildError if it cannot be built."""
    from hotpaths.kernels import _build

    lib = ctypes.CDLL(str(_build.compile_op(OP, defines=("HP_ROUTER_TRACE=1",))))
    prod = _lib()
    for name in ("hp_router_gemm_ex", "hp_router_gemm_workspace_bytes"):
        getattr(lib, name).argtypes = getattr(prod, name).argtypes
        getattr(lib, name).restype = getattr(prod, name).restype
    lib.hp_router_set_trace.argtypes = [ctypes.c_void_p]
    lib.hp_router_set_trace.restype = ctypes.c_int
    return lib


@dataclass(frozen=True)
class VariantInfo:
    """One kernel variant as the library reports it (router_variants.cuh): id, name, family (FAMILIES), tile
    (BM, BN, BK; zeros for decode), parts (the most weight parts it runs: 2 or 3), splitk (SPLITK_KINDS)."""

    id: int
    name: str
    family: str
    tile: tuple[int, int, int]
    parts: int
    splitk: str


@functools.lru_cache(maxsize=None)
def variant_table() -> dict[str, VariantInfo]:
    """Every kernel variant by name, in id order, read from the compiled library (compiles it on first use).
    Raises hotpaths.kernels._build.KernelBuildError if it cannot be built, RuntimeError on a malformed report."""
    lib = _lib()
    out = {}
    buf = (ctypes.c_int * 6)()
    for vid in range(lib.hp_router_variant_count()):
        name = lib.hp_router_variant_name(vid)
        if name is None or lib.hp_router_variant_info(vid, buf):
            raise RuntimeError(f"router GEMM library: no name / facts for variant id {vid}")
        fam, bm, bn, bk, parts, splitk = list(buf)
        out[name.decode()] = VariantInfo(vid, name.decode(), FAMILIES[fam], (bm, bn, bk), parts, SPLITK_KINDS[splitk])
    return out


def _views() -> dict:
    t = variant_table()
    wg = {v.name: v.tile for v in t.values() if v.family in ("wgmma", "ws")}
    return {
        "VARIANTS": {v.name: v.id for v in t.values()},
        # the decode variants the tuner times at M <= DECODE_MAX_M ("decode" itself picks its n8 tiles by
        # shape, and decode_n1 / decode_n2 time both of its choices)
        "DECODE_VARIANTS": tuple(v.name for v in t.values() if v.family == "decode" and v.name != "decode"),
        "TILED_TILES": {v.name: v.tile for v in t.values() if v.family == "tiled"},
        # BF16x2 only: never candidates or tuned choices of impl="bf16x3_kernel"
        "WGMMA_TILES": wg,
        # split-K through a global workspace: a one-CTA cluster, or (1, 1, 2) for the K pairs
        "WGMMA_GLOBAL_SPLITK": tuple(v for v in wg if t[v].splitk != "cluster"),
        "WGMMA_PAIR_SPLITK": tuple(v for v in wg if t[v].splitk == "pair"),  # splits 2, 4, 8
        "WGMMA_REDUCE_SCATTER": tuple(v for v in wg if t[v].splitk == "scatter"),  # splits 2, 4, 8
        # launched cooperatively (the reduce-scatter's grid barrier): the grid must fit in one wave of the SMs
        "WGMMA_COOPERATIVE": tuple(v for v in wg if t[v].splitk == "scatter"),
        "VARIANT_PARTS": {v.name: v.parts for v in t.values()},
    }


_VIEW_NAMES = ("VARIANTS", "DECODE_VARIANTS", "TILED_TILES", "WGMMA_TILES", "WGMMA_GLOBAL_SPLITK",
               "WGMMA_PAIR_SPLITK", "WGMMA_REDUCE_SCATTER", "WGMMA_COOPERATIVE", "VARIANT_PARTS")


def __getattr__(name: str):
    if name in _VIEW_NAMES:
        return _views()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _variant_id(variant: str) -> int:
    t = variant_table()
    if variant not in t:
        raise ValueError(f"variant: unknown {variant!r}; expected one of {list(t)}")
    return t[variant].id


def _tile(variant: str) -> tuple[int, int, int]:
    v = variant_table().get(variant)
    return v.tile if v and v.tile[1] else (0, 64, 0)


def kernel_config(m: int, n: int, k: int, *, variant: str = "auto", splits: int = 0) -> dict:
    """The launch configuration the kernel uses for [M, K] x [N, K]^T: variant (a VARIANTS name; decode, decode_n1
    and decode_n2 report "decode"), K splits (decode: CTAs of one cluster), m16 tiles and n8 tiles per warp
    (decode). Raises ValueError if unsupported."""
    buf = (ctypes.c_int * 4)()
    code = _lib().hp_router_gemm_config(m, n, k, _variant_id(variant), splits, buf)
    if code:
        raise ValueError(f"router GEMM kernel: no configuration for M={m}, N={n}, K={k}, variant={variant!r}, "
                         f"splits={splits} (N, K multiples of 64; decode needs M <= {DECODE_MAX_M}; the tiled "
                         f"variants need N a multiple of their BN, {_tile(variant)[1]}; splits in 0, 1, 2, 4, 8 "
                         f"(tiled: also 16); "
                         f"{' / '.join(_views()['WGMMA_PAIR_SPLITK'] + _views()['WGMMA_REDUCE_SCATTER'])}: "
                         f"splits 0, 2, 4, 8)")
    names = {v.id: v.name for v in variant_table().values()}
    return {"variant": names[buf[0]], "splits": buf[1], "mt": buf[2], "nt": buf[3]}


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
    expect_tensor(w_fp32, "w_fp32", dtype=torch.float32, ndim=2, layout="[N, K]", contiguous=True,
                  why=" (the FP32 router weight)")
    n, k = (int(s) for s in w_fp32.shape)
    ref.validate_kernel_shape(n, k)
    # the BF16 parts (high, low, plain; mid and low2 for three parts) plus the split's fp32 temporaries
    check_fits(f"router plan n={n} k={k}", device_bytes=n * k * (2 * (5 if three_part else 3) + 12),
               device=w_fp32.device)
    hi, lo = ref.split_fp32_weight(w_fp32)
    mid = lo2 = None
    if three_part:
        hi3, mid, lo2 = ref.split_fp32_weight_3(w_fp32)
        if not torch.equal(hi3, hi):  # both splits truncate the high part; the kernel shares it between them
            raise RuntimeError("plan: the two- and three-part splits disagree on w_high (reference changed?)")
        mid, lo2 = mid.contiguous(), lo2.contiguous()
    # w_high and w_low as the two halves of one [2N, K] buffer: impl="bf16x2_cublas" runs both products as one GEMM
    # over it (_stacked_parts) with no copy
    cat = torch.cat([hi, lo]).contiguous()
    return RouterWeights(w=w_fp32, w_high=cat[:n], w_low=cat[n:], w_mid=mid, w_low2=lo2,
                         w_bf16=w_fp32.to(torch.bfloat16).contiguous(), n=n, k=k, three_part=three_part)


# ----------------------------------------------------------------------------------------------------------------
# dispatch table


def dispatch_path(tag: str | None = None) -> Path:
    """data/dispatch/router_gemm_<device-tag>.json (directory overridable with env HOTPATHS_DISPATCH_DIR)."""
    if tag is None:
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


def _sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
        if torch.cuda.is_available() else 132


def _runnable_at(variant: str, splits: int, m: int, n: int, k: int) -> str | None:
    """``variant`` itself, or for a reduce-scatter (cooperative: its whole grid resident at once, else the launch is
    refused) whose grid at this M exceeds one wave, the same tile with the global-workspace split, which runs any
    grid; None when the build has no such twin. A table row tuned at a smaller M than the call's (the nearest-M
    rule rounds both ways: N=768 M=300 runs the M=208 row) must still run."""
    info = variant_table()
    i = info[variant]
    if i.splitk != "scatter":
        return variant
    s = int(splits) or kernel_config(m, n, k, variant=variant)["splits"]
    if -(-m // i.tile[0]) * (n // i.tile[1]) * s <= _sm_count():
        return variant
    return next((v for v, j in info.items() if j.family == i.family and j.tile == i.tile and j.splitk == "global"),
                None)


def tuned_config(m: int, n: int, k: int, table: dict | None = None, *, parts: int = 2) -> tuple[str, int] | None:
    """The kernel (variant, splits) measured fastest at the M nearest to m (log2) for (N, K), or None (no table,
    shape not measured, or the tuned variant cannot run this M: decode needs M <= DECODE_MAX_M). A reduce-scatter
    pick whose grid would exceed one wave at this M runs as its global-split twin with the same splits
    (_runnable_at).
    parts=3 (BF16x3): when the tuned variant runs two parts only (VARIANT_PARTS), the fastest measured candidate
    of that row that runs three is returned instead (None when the row lists none). A variant this build does not
    have (a table written by another build) gives None."""
    row = _nearest_row(m, n, k, table)
    cfg = (row or {}).get("kernel")
    if not cfg and row is None and table is None and parts == 2:  # a shape the table lacks: the first-use choice
        c = first_use_tuner().cached(m, n, k)
        return (c.variant, c.splits) if c and c.impl == "bf16x2_kernel" else None
    if not cfg:
        return None
    variant, splits = cfg["variant"], int(cfg["splits"])
    info = variant_table()
    if variant not in info:  # a table from a build with other variants: the heuristic runs instead
        return None
    if parts > info[variant].parts:
        cands = [(t, c.split("/")) for c, t in (row.get("candidates_us") or {}).items()]
        cands = [(t, v, int(sp)) for t, (v, sp) in cands
                 if v in info and info[v].parts >= parts and not (v.startswith("decode") and m > DECODE_MAX_M)]
        if not cands:
            return None
        _, variant, splits = min(cands)
    if variant.startswith("decode") and m > DECODE_MAX_M:
        return None
    variant = _runnable_at(variant, splits, m, n, k)
    return (variant, splits) if variant else None


def choose_impl(m: int, n: int, k: int, table: dict | None = None) -> str:
    """The impl dispatch runs for M x (N, K): the faster of "bf16x2_kernel" and "fp32_cublas" at the measured M
    nearest to m (log scale; ties to the larger M) for the measured (N, K); for a shape the table lacks, the choice
    cached by tune-on-first-use (never tunes here); else "bf16x2_kernel". ``table`` defaults to the device's file
    (dispatch_path())."""
    row = _nearest_row(m, n, k, table)
    if row:
        return row["choice"]
    c = first_use_tuner().cached(m, n, k) if table is None else None
    return c.impl if c else "bf16x2_kernel"


# ----------------------------------------------------------------------------------------------------------------
# tune on first use (shapes the committed table lacks)

_TUNER: _fu.FirstUseTuner | None = None


def first_use_cache_path(tag: str | None = None) -> Path:
    """<cache dir>/router_gemm_<device-tag>.json ($HOTPATHS_CACHE_DIR, else ~/.cache/hotpaths)."""
    return _fu.cache_dir() / f"{OP}_{tag or device_tag()}.json"


def _is_capturing() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _fu_inputs(ctx: dict, m: int):
    """The tuning input x [m, K] (fixed seed, made once per M bucket) and its FP64 / BF16x2-emulation outputs."""
    if m not in ctx["x"]:
        w = ctx["weights"]
        g = torch.Generator(device=w.device).manual_seed(7919 + m)
        x = torch.randn(m, w.k, generator=g, device=w.device).to(torch.bfloat16)
        ref64 = x.double() @ w.w.double().T
        emu = ref.bf16x2_from_parts(x, w.w_high, w.w_low)
        ctx["x"][m] = (x, ref64, float((emu.double() - ref64).abs().max()))
    return ctx["x"][m]


def _fu_run(choice: _fu.Choice, m: int, n: int, k: int, ctx: dict):
    x, _, _ = _fu_inputs(ctx, m)
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    w = ctx["weights"]
    if choice.impl in (_fu.CUBLAS, _fu.BF16X2_CUBLAS):
        return lambda: router_gemm(x, w, impl=choice.impl, out=out)
    return lambda: _run_kernel(x, w, out, parts=2, variant=choice.variant, splits=choice.splits)


def _fu_gate(out: torch.Tensor, m: int, n: int, k: int, ctx: dict) -> str | None:
    """The tuner's accuracy gate: finite, and max abs error vs FP64 within ERR_BOUND x the BF16x2 emulation's."""
    _, ref64, emu_err = _fu_inputs(ctx, m)
    torch.cuda.synchronize(out.device)
    if not bool(torch.isfinite(out).all()):
        return "non-finite output"
    err = float((out.double() - ref64).abs().max())
    if err > ERR_BOUND * emu_err:
        return f"max abs error vs FP64 {err:.3g} > {ERR_BOUND} x the emulation's {emu_err:.3g}"
    return None


def _graph_timer(fn, reps: int = 15, warmup: int = 3) -> float:
    """Median us of ``reps`` replays of fn captured in a CUDA graph, each after an L2 flush, timed by events that
    are the graph's first and last nodes: the convention of the harness bench that the tables and the committed
    dispatch table use, with its flush buffer, flush mode and replay loop (hotpaths.kernels._timing). Events on
    the stream around an eager launch can time the host too: when the Python launch path (tens of us) outlasts
    the flush queued ahead, the start event fires before the kernel is launched, and candidates a few us apart
    are ordered by host noise (docs/ops/router_gemm_dispatch.md has the sweep's numbers).
    fn must be capturable (no host syncs); it runs once eagerly before capture (lazy initialisation, the kernels'
    shared-memory attributes). Raises RuntimeError when capture fails (the candidate is then skipped)."""
    dev = torch.cuda.current_device()
    _timing.l2_flush_buffer(dev)
    inner = _timing.external_events_ok()
    kw = {"external": True} if inner else {}
    start, end = torch.cuda.Event(enable_timing=True, **kw), torch.cuda.Event(enable_timing=True, **kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # an eager launch on the capture stream first: lazy init (cuBLAS handles, workspaces) outside capture
        torch.cuda.synchronize(dev)
        # capture_begin / _end rather than torch.cuda.graph(): its entry empties the allocator's cache (and may run
        # the garbage collector), a cost paid per candidate here, thousands of times over a sweep of shapes
        g = torch.cuda.CUDAGraph()
        g.capture_begin()
        try:
            if inner:
                start.record(stream)
            fn()
            if inner:
                end.record(stream)
        finally:
            g.capture_end()
        if inner:
            ts = _timing.time_events_in_graph(g, start, end, True, warmup + reps)[warmup:]
        else:  # an older torch: events on the stream around the replay (adds the graph launch, ~1 us)
            ts = []
            for i in range(warmup + reps):
                _timing.flush_l2(dev)
                start.record(stream)
                g.replay()
                end.record(stream)
                end.synchronize()
                if i >= warmup:
                    ts.append(start.elapsed_time(end) * 1e3)
    torch.cuda.current_stream().wait_stream(stream)
    ts.sort()
    return ts[len(ts) // 2]


def first_use_tuner() -> _fu.FirstUseTuner:
    """This device's tune-on-first-use cache (created on first use; follows $HOTPATHS_CACHE_DIR changes)."""
    global _TUNER
    path = first_use_cache_path()
    if _TUNER is None or _TUNER.path != path:
        sms = _sm_count()
        enabled = _TUNER.enabled if _TUNER is not None else None
        _TUNER = _fu.FirstUseTuner(path, candidates=lambda m, n, k: kernel_candidates(m, n, k, sm_count=sms),
                                   run=_fu_run, timer=_graph_timer, gate=_fu_gate, is_capturing=_is_capturing,
                                   enabled=enabled)
    return _TUNER


def set_tune_on_first_use(flag: bool = True) -> None:
    """Enable (or disable) tuning a shape the committed table lacks on its first dispatch call (also
    $HOTPATHS_ROUTER_TUNE_ON_FIRST_USE=1). Cached choices are used either way."""
    first_use_tuner().enabled = bool(flag)


def _has_table_shape(n: int, k: int) -> bool:
    table = _load_table(str(dispatch_path()))
    return bool(table) and any(int(s["n"]) == n and int(s["k"]) == k and s.get("rows")
                               for s in table.get("shapes", []))


def dispatch_choice(m: int, weights: RouterWeights) -> tuple[str, str, int]:
    """(impl, variant, splits) that impl="dispatch" runs for M rows on these weights: the committed table for its
    shapes (variant "auto": the tuned configuration is looked up at launch); otherwise the tune-on-first-use
    choice (tuning now when enabled and not capturing, on these weights); otherwise ("bf16x2_kernel", "auto", 0)."""
    n, k = weights.n, weights.k
    if _has_table_shape(n, k):
        return choose_impl(m, n, k), "auto", 0
    c = first_use_tuner().choose(m, n, k, ctx={"weights": weights, "x": {}})
    if c is None:
        return "bf16x2_kernel", "auto", 0
    return c.impl, (c.variant or "auto"), c.splits


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


def _stacked_parts(weights: RouterWeights) -> torch.Tensor:
    """[w_high; w_low] bf16 [2N, K]: a view when the halves are adjacent in one buffer (plan()'s layout, also as
    passed through the torch.ops path), else a copy (parts assembled separately)."""
    hi, lo = weights.w_high, weights.w_low
    if (hi.is_contiguous() and lo.is_contiguous() and hi.untyped_storage().data_ptr() == lo.untyped_storage().data_ptr()
            and lo.data_ptr() == hi.data_ptr() + hi.numel() * hi.element_size()):
        return torch.as_strided(hi, (2 * weights.n, weights.k), (weights.k, 1))
    return torch.cat([hi, lo])


def _bf16x2_cublas(x: torch.Tensor, weights: RouterWeights, out: torch.Tensor) -> torch.Tensor:
    """BF16x2 through cuBLAS: one BF16 GEMM of x against [w_high; w_low] ([2N, K]) accumulating and writing FP32,
    then acc_hi + acc_lo / 256 in one elementwise kernel. The kernel's arithmetic (two BF16 products in FP32, the
    1/256 in the epilogue) with cuBLAS's tiles, which the measurements put ahead of ours from M ~ 100 up at the
    N the TMA family cannot tile (docs/ops/router_gemm_dispatch.md); a dispatch candidate like FP32 cuBLAS, gated
    by the same accuracy bound. The split-K reduction is kept in FP32 (no reduced-precision BF16 reduction).
    Shape/Dtype: x bf16 [M, K]; out fp32 [M, N]; returns out."""
    n = weights.n
    wc = _stacked_parts(weights)
    flag = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    try:
        try:  # BF16 operands, FP32 accumulation and output (torch >= 2.9)
            acc = torch.mm(x, wc.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # older torch or no such kernel on this device: the same sums in FP32
            with _allow_tf32(False):
                acc = torch.mm(x.float(), wc.float().t())
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
    return torch.add(acc[:, :n], acc[:, n:], alpha=_SCALE, out=out)


def _validate(x, weights, impl, out):
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if not isinstance(weights, RouterWeights):
        raise TypeError(f"weights: expected RouterWeights from plan(w_fp32), got {type(weights).__name__}")
    expect_tensor(x, "x", dtype=torch.bfloat16, ndim=2, layout=f"[M, K={weights.k}]", device=weights.device,
                  contiguous=True, why=" (router activations)")
    if x.shape[1] != weights.k:
        raise ValueError(f"x: expected a 2-D [M, K={weights.k}] tensor, got shape {tuple(x.shape)}")
    if impl == "bf16x3_kernel" and not weights.three_part:
        raise ValueError("impl='bf16x3_kernel' needs plan(w, three_part=True)")
    m = int(x.shape[0])
    if out is not None:
        expect_tensor(out, "out", dtype=torch.float32, ndim=2, layout=f"[{m}, {weights.n}]", device=x.device,
                      contiguous=True)
        if tuple(out.shape) != (m, weights.n):
            raise ValueError(f"out: expected a contiguous fp32 [{m}, {weights.n}] tensor on {x.device}, got "
                             f"shape {tuple(out.shape)}")
    return m


def _run_kernel(x, weights, out, *, parts, variant="auto", splits=0):
    info = variant_table()
    if variant not in info:
        raise ValueError(f"variant: unknown {variant!r}; expected one of {list(info)}")
    if parts > info[variant].parts:
        three = sorted(v for v, i in info.items() if i.parts >= 3 and v != "auto")
        raise ValueError(f"variant={variant!r} runs the two-part weight only (impl='bf16x2_kernel'); for "
                         f"impl='bf16x3_kernel' pick one of {three}")
    if x.device.type != "cuda":
        raise RuntimeError(f"the router GEMM kernel needs an SM90 CUDA device; x is on {x.device} (use the "
                           f"emulations in hotpaths.reference.router_gemm on CPU)")
    for name, t in (("x", x), ("out", out)):  # vector loads / stores
        expect_tensor(t, name, align=16)
    m, n, k = int(x.shape[0]), weights.n, weights.k
    if variant == "auto" and splits == 0:  # the configuration tuned on this device, when there is one
        variant, splits = tuned_config(m, n, k, parts=parts) or ("auto", 0)
    # BF16x3: (high, mid, low) with the kernel's epilogue acc0 + (acc1 + acc2 / 256) / 256
    p1, p2 = (weights.w_mid, weights.w_low2) if parts == 3 else (weights.w_low, None)
    if variant in _views()["WGMMA_COOPERATIVE"]:  # the whole grid must be resident at once (one CTA per SM)
        cfg = kernel_config(m, n, k, variant=variant, splits=splits)
        bm, bn, _ = info[variant].tile
        grid = -(-m // bm) * (n // bn) * cfg["splits"]
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        if grid > sms:
            any_grid = next((v for v, i in info.items() if i.family == "ws" and i.splitk == "global"
                             and i.tile == info[variant].tile), "a global split-K variant")
            raise ValueError(f"variant={variant!r}: its cooperative grid of {grid} CTAs (M={m}, N={n}, splits="
                             f"{cfg['splits']}) exceeds one wave of {sms} SMs on {x.device}; use fewer splits or "
                             f"{any_grid!r} (any grid)")
    # Global split-K variants (WGMMA_GLOBAL_SPLITK) with K split: a per-call workspace from the caching allocator
    # (a graph's private pool under capture), its counters zeroed by the launcher (a memset node).
    vid = info[variant].id
    nws = _lib().hp_router_gemm_workspace_bytes(m, n, k, vid, splits)
    ws = torch.empty(nws, dtype=torch.uint8, device=x.device) if nws > 0 else None
    with torch.cuda.device(x.device):
        code = _lib().hp_router_gemm_ex(ptr(x), ptr(weights.w_high), ptr(p1), ptr(p2), ptr(out), m, n, k,
                                        parts, _SCALE, _SCALE, vid, splits,
                                        ptr(ws), max(nws, 0), stream_ptr(x.device))
    if code == 1:  # cudaErrorInvalidValue: a shape/config the C side refuses
        kernel_config(m, n, k, variant=variant, splits=splits)  # raises the descriptive ValueError
    check_status(code, f"router_gemm kernel (M={m}, N={n}, K={k}, parts={parts}, variant={variant})")
    return out


def router_gemm(x: torch.Tensor, weights: RouterWeights, *, impl: str = "dispatch", out: torch.Tensor | None = None,
                variant: str = "auto", splits: int = 0) -> torch.Tensor:
    """Router scores ``x @ W.T`` in FP32.

    Shape/Dtype: x bf16 [M, K] contiguous, 16-byte aligned, on the weights' device; weights from plan(W [N, K]);
    out (optional) fp32 [M, N] contiguous. Returns fp32 [M, N] (``out`` when given). M == 0 returns an empty
    [0, N] tensor.
    impl: "dispatch" (kernel or FP32 cuBLAS by the measured crossover), "bf16x2_kernel", "bf16x3_kernel"
    (needs plan(..., three_part=True)), "fp32_cublas", "tf32_cublas", "bf16_cublas" (baselines via torch),
    "bf16x2_cublas" (the two-part weight through one cuBLAS BF16 GEMM; a dispatch candidate at unseen shapes).
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
        impl, v, sp = dispatch_choice(m, weights)
        if impl == "bf16x2_kernel" and variant == "auto" and splits == 0:
            variant, splits = v, sp
    if impl == "bf16x2_kernel":
        return _run_kernel(x, weights, out, parts=2, variant=variant, splits=splits)
    if impl == "bf16x3_kernel":
        return _run_kernel(x, weights, out, parts=3, variant=variant, splits=splits)
    if impl == "bf16_cublas":
        return _bf16_mm_fp32_out(x, weights.w_bf16, out)
    if impl == "bf16x2_cublas":
        return _bf16x2_cublas(x, weights, out)
    with _allow_tf32(impl == "tf32_cublas"):
        return torch.matmul(x.float(), weights.w.t(), out=out)


# ----------------------------------------------------------------------------------------------------------------
# tuning candidates (timed by hotpaths.bench.router_gemm.measure_crossover)


def kernel_candidates(m: int, n: int, k: int, *, sm_count: int = 132) -> list[tuple[str, int]]:
    """Kernel configurations worth timing at M x (N, K) with the two-part weight (BF16x2): every decode variant
    (DECODE_VARIANTS, M <= DECODE_MAX_M) and each tiled variant whose BN divides N, with K splits 1, 2, 4, 8 while
    the grid stays under ~4 CTAs per SM (16 while under ~2) and each split keeps >= 4 k-steps; at M >= WGMMA_MIN_M
    also each wgmma variant whose BN divides N and BK divides K, with splits 1, 2, 4, 8 while the grid stays under
    ~2 CTAs per SM (they run one CTA per SM) and each split keeps >= 4 k-tiles (the K-pair and reduce-scatter
    variants: splits 2, 4, 8, the smallest always; the cooperative ones only while the grid fits in one wave of
    ``sm_count`` SMs).
    Raises ValueError for an unsupported shape (N, K not multiples of 64, M < 1)."""
    if n % 64 or k % 64 or m < 1:
        raise ValueError(f"kernel_candidates: unsupported M={m}, N={n}, K={k} (N, K multiples of 64, M >= 1)")
    views = _views()
    out = [(v, 0) for v in views["DECODE_VARIANTS"]] if m <= DECODE_MAX_M else []
    for v, (bm, bn, bk) in views["TILED_TILES"].items():
        if n % bn:
            continue
        base = -(-m // bm) * (n // bn)
        for s in (1, 2, 4, 8, 16):
            # 16 ranks (a non-portable cluster) only where they still fit in ~2 CTAs per SM: small grids at M 65-256
            if (s == 1 or base * s <= (2 if s == 16 else 4) * 132) and (k // bk) // s >= 4:
                out.append((v, s))
    if m >= WGMMA_MIN_M:
        two_ranks = views["WGMMA_PAIR_SPLITK"] + views["WGMMA_REDUCE_SCATTER"]
        for v, (bm, bn, bk) in views["WGMMA_TILES"].items():
            if n % bn or k % bk:
                continue
            base = -(-m // bm) * (n // bn)
            s_min = 2 if v in two_ranks else 1  # the smallest split is always offered
            for s in (1, 2, 4, 8):
                if s < s_min or (v in views["WGMMA_COOPERATIVE"] and base * s > sm_count):
                    continue
                csize = 2 if v in views["WGMMA_PAIR_SPLITK"] else 1 if v in views["WGMMA_GLOBAL_SPLITK"] else s
                if (s == s_min or base * s <= 2 * 132) and (k // bk) // s >= 4 and csize <= 8:
                    out.append((v, s))
    return out


__all__ = ["IMPLS", "RouterWeights", "plan", "router_gemm", "choose_impl", "kernel_config",
           "variant_table", "VariantInfo", "load_traced_library",
           "kernel_candidates", "tuned_config", "dispatch_path", "dispatch_choice", "set_tune_on_first_use",
           "first_use_tuner", "first_use_cache_path",
           "reload_dispatch_table", "EMULATION_OF"]

# torch.ops.hotpaths.router_gemm (torch.compile / CUDA graphs): registered when this package is imported
from hotpaths.kernels.router_gemm import ops as _ops  # noqa: E402

_ops.register(router_gemm=router_gemm, weights_type=RouterWeights)
