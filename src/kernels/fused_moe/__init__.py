"""Fused low-latency FP8 MoE on SM90: route -> gate-up (+SiLU-and-mul) -> down -> top-k reduce, PDL-chained.

Public API (plan once per decode step, run per layer):
    ``plan(topk_ids, *, num_experts, expert_offset=0, max_tokens=None, block_m=None, gemm=None, scales=None)
    -> MoEPlan``
    ``run(plan, x, w13, w2, topk_weights, *, scales, w13_scale, w2_scale, a1_scale, a2_scale, shared_out, out)``
    ``fused_moe(x, topk_ids, topk_weights, w13, w2, *, ...)`` = plan + run; ``torch.ops.hotpaths.fused_moe``.
The staged math the kernels follow is hotpaths.reference.fused_moe's emulation (the contract in its docstring);
the plan's layout is plan_layout.cuh, mirrored once here (``PlanLayout``) and built on the host by
hotpaths.reference.fused_moe.build_routing_plan (compared byte for byte in tests/test_fused_moe_gpu.py).

Intermediate buffers, kept in the plan (allocated on first use per (H, I), reused: CUDA-graph safe):
``act`` bf16 [max_pairs, I] indexed by SORTED position (a tile's rows are contiguous for the down GEMM);
the activation pre-pass outputs ``xq`` e4m3 [max_tokens, H] and ``aq`` e4m3 [max_pairs, I] (+ fp32 1x128 group scales
[rows, ceil(cols/128)] in block mode): the GEMMs stream these fp8 rows (``MoEPlan.quant_buffers``);
``ybuf`` bf16 [max_pairs, H] indexed by the ORIGINAL pair index p = t*K + k (the reduce reads a token's slots
contiguously). Rows of pairs that are not routed here are never written. Per GEMM, a split-K workspace (int32
counters that are 0 between launches, then fp32 partials; ``MoEPlan.splitk_workspace``; mma path only).

GEMM paths, one numerics contract (``MoEPlan.gemm``): ``"mma"`` (expert_gemm.cu: mma.sync m16n8k32, tiles of
8-64 pairs, split-K; the decode sizes), ``"wgmma"`` (expert_wgmma.cu: warpgroup MMA with the tile's pairs as N,
tiles of 16-128 pairs; many pairs per expert) and ``"wgmma_ws"`` (expert_wgmma.cu's warp-specialized kernel: a
producer warp feeding the weights by TMA and the token rows by cp.async through an mbarrier ring, two consumer
warpgroups; same tiles as wgmma). ``plan(gemm="auto")`` picks wgmma_ws or wgmma by the average rows per expert
and, when ``plan(scales=...)`` gives it, the FP8 format (``resolve_gemm``); ``$HOTPATHS_MOE_GEMM`` (any name of
``GEMMS``) is the default when ``gemm`` is not given, so one process can be switched without code changes.
``"mma_tma"`` is the mma.sync GEMM fed the same way (TMA weight boxes through a deep mbarrier ring that runs across
work units; the decode sizes).

Route paths, one plan (``MoEPlan.route``, fixed at plan time from max_pairs so a captured graph replays the same
launches at any live token count): ``"small"`` (route.cu's decode-size kernel: one CTA, one pair per thread; auto
up to ROUTE_SMALL_AUTO_PAIRS pairs), ``"one"`` (the one-CTA kernel over warp segments, below ROUTE_MULTI_MIN_PAIRS)
and ``"multi"`` (per-chunk expert histograms, then every CTA places its chunk at its (expert, chunk) offset: the
large batches); ``plan(route="auto")`` picks by max_pairs (``resolve_route``; default ``$HOTPATHS_MOE_ROUTE``).
The reduce takes its wide kernel (a GPU-covering grid of warps, 256 B in flight per lane) from 256 tokens;
``$HOTPATHS_MOE_REDUCE`` = narrow / wide forces one (the same bits either way). Per-tensor on the wgmma paths the
gate-up epilogue writes ``aq`` beside ``act``, so the down GEMM's activation pre-pass is not launched
(``act_quant_fused``; ``$HOTPATHS_MOE_ACT_QUANT`` = prepass keeps it).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from dataclasses import dataclass, field

import torch

from hotpaths.reference.common import check_fits, expect_tensor
from hotpaths.reference.fused_moe import PlanSize

OP = "fused_moe"
BLOCK_MS = (8, 16, 32, 64)   # pairs per tile the mma.sync kernels are instantiated for
WGMMA_BLOCK_MS = (16, 32, 64, 128)  # pairs per tile the wgmma kernels are instantiated for
GEMMS = ("auto", "mma", "wgmma", "wgmma_ws", "mma_tma")
MMA_GEMMS = ("mma", "mma_tma")       # the paths with mma.sync tiles (BLOCK_MS) and split-K
WGMMA_GEMMS = ("wgmma", "wgmma_ws")  # the paths with warpgroup-MMA tiles (WGMMA_BLOCK_MS)
_GEMM_SUFFIX = {"mma": "", "mma_tma": "_tma", "wgmma": "_wg", "wgmma_ws": "_ws"}  # C entry points per path
GEMM_ENV = "HOTPATHS_MOE_GEMM"  # default of plan(gemm=None)
# "auto" takes the warp-specialized TMA-fed wgmma kernel (wgmma_ws) below this many expected pairs per local expert
# (expected_local_pairs / E: under expert parallelism plan(experts_total=...) counts the ~1/EP of the pairs that land
# on the rank), the cp.async wgmma kernel from it. Measured on the H200 (Hy3, layer us, wgmma / wgmma_ws, both at the
# tile the expected rows give; wgmma_ws with its producer warps, expert_wgmma.cu WsTraits::PRODUCERS): per-tensor TP8
# (E = 192) batch 1024 (42.7 pairs per expert, 64-row tiles) 273.5 / 218.0, 1536 (64) 339.2 / 321.0, 2048 (85) 356.6
# / 354.4, 4096 (171) 649.0 / 663.6; TP1/EP8 (E = 24 of 192) 1024 (42.7) 198.9 / 182.4, 2048 (85) 257.4 / 243.4;
# block-wise TP8 1024 294.8 / 245.2, 2048 389.8 / 408.9, 4096 735.9 / 760.9, TP1/EP8 2048 286.8 / 304.7. At exactly 64
# expected rows (two H200 calls each, wgmma / wgmma_ws): per-tensor DSv3 TP8 2048 785.2 / 730.1 and 785.7 / 727.8,
# Qwen3 TP8 1024 224.8 / 218.5 and 224.5 / 216.7, Hy3 TP8 1536 338.1 / 320.5 and 336.9 / 320.4; block-wise Hy3 TP8
# 1536 365.5 / 379.9 and 365.8 / 377.9; at 128 rows (Qwen3 TP8 2048) per-tensor 349.3 / 374.3. So the crossover lies
# between 85 and 128 per-tensor and between 43 and 64 block-wise: WS_MAX_ROWS_BY_SCALES when the plan is told the
# format (``plan(scales=...)``; ``fused_moe`` and the bench pass it), WS_MAX_ROWS (the block-wise one, safe for both)
# when it is not. The producer warps keep weight boxes and token rows in flight across work units, which pays while
# the streams are the cost; with many rows per tile the tile math is, and the cp.async kernel's two full consumer
# warpgroups win; block mode's per-stage scale loads ride in the producer's ring, so its crossover comes earlier.
WS_MAX_ROWS_BY_SCALES = {"pertensor": 96.0, "block": 64.0}
WS_MAX_ROWS = min(WS_MAX_ROWS_BY_SCALES.values())  # format unknown: the lower threshold is safe for both
# The cp.async wgmma kernel's cost per computed tile row at 64-row tiles (two CTAs per SM) over 128-row tiles (one
# CTA of two warpgroups): 1.16-1.17 at Hy3 TP8 4096 and 16384 tokens, both formats (H200, docs/ops/fused_moe.md).
WG64_ROW_COST = 1.17
WS_SPLIT_FLAGS = 512  # kWsMaxCtas of expert_wgmma.cu: the flags at the head of MoEPlan.ws_split_workspace()
MAX_EXPERTS = 512            # the route kernels keep 32 x E counters in shared memory
ROUTES = ("auto", "small", "one", "multi")
ROUTE_ENV = "HOTPATHS_MOE_ROUTE"  # default of plan(route=None)
# "auto" takes the multi-CTA route from this many pairs (max_tokens x K; Hy3 TP8: batch >= 512). The one-CTA kernel
# passes every pair through one SM: on the H200, 8.4 / 11.4 / 24.7 / 77.2 us at 512 / 2048 / 8192 / 32768 pairs;
# the multi-CTA path pays a second launch (a few us) and scales with the grid.
ROUTE_MULTI_MIN_PAIRS = 4096
# the decode-size route kernel (one pair per thread) takes plans up to ROUTE_SMALL_MAX_PAIRS (the library's
# hp_moe_route_small_max_pairs); auto takes it up to ROUTE_SMALL_AUTO_PAIRS. Measured on the H200 (layer us, small /
# one): Hy3 TP8 per-tensor batch 4 44.8 / 46.2, 64 132.1 / 133.4, 128 (1024 pairs) 142.0 / 141.4.
ROUTE_SMALL_MAX_PAIRS = 1024
ROUTE_SMALL_AUTO_PAIRS = 512
REDUCES = {"auto": 0, "narrow": 1, "wide": 2}  # hp_moe_reduce's variant argument
PDL_EDGES = ("down", "reduce")  # launches whose PDL edge a rule decides (down_pdl, reduce_pdl): plan(pdl_edges=...)
REDUCE_ENV = "HOTPATHS_MOE_REDUCE"
# Per-tensor on the wgmma paths the gate-up epilogue writes aq (e4m3(act / a2_scale)) beside act, so the down GEMM's
# activation pre-pass is not launched when run() runs both GEMMs ("fused"); "prepass" keeps the separate pass (A/B).
ACT_QUANTS = ("auto", "fused", "prepass")
ACT_QUANT_ENV = "HOTPATHS_MOE_ACT_QUANT"
MAX_TOPK = 16
SCALE_MODES = ("pertensor", "block")
STAGES = ("route", "gate_up", "down", "reduce")
_FP8 = getattr(torch, "float8_e4m3fn", None)


# ----------------------------------------------------------------------------------------------------------------
# plan layout (mirror of plan_layout.cuh: header[8], counts[E], offsets[E+1], sorted[max_pairs], tile_expert,
# tile_start [max_tiles each])

@dataclass(frozen=True)
class PlanLayout:
    num_experts: int
    max_pairs: int
    block_m: int
    HEADER = 8

    @property
    def max_tiles(self) -> int:
        return -(-self.max_pairs // self.block_m) + self.num_experts

    @property
    def offsets(self) -> dict[str, tuple[int, int]]:
        """(start, length) in int32 units of every field, in layout order."""
        e, mp, mt = self.num_experts, self.max_pairs, self.max_tiles
        fields = (("header", self.HEADER), ("expert_counts", e), ("expert_offsets", e + 1), ("sorted_pairs", mp),
                  ("tile_expert", mt), ("tile_start", mt))
        out, pos = {}, 0
        for name, n in fields:
            out[name] = (pos, n)
            pos += n
        return out

    @property
    def length(self) -> int:
        start, n = self.offsets["tile_start"]
        return start + n

    def split(self, ws: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of a workspace tensor by field name."""
        return {k: ws[s:s + n] for k, (s, n) in self.offsets.items()}


def workspace_len(num_experts: int, max_pairs: int, block_m: int) -> int:
    """int32 elements of the routing-plan workspace (same formula as the reference module and the C query)."""
    return PlanLayout(num_experts, max_pairs, block_m).length


# ----------------------------------------------------------------------------------------------------------------
# loader

@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from hotpaths.kernels import _build

    lib = _build.load(OP)
    vp, i = ctypes.c_void_p, ctypes.c_int
    lib.hp_moe_workspace_len.argtypes = [i, i, i]
    lib.hp_moe_workspace_len.restype = ctypes.c_longlong
    lib.hp_moe_ws_split_ints.argtypes = [i]
    lib.hp_moe_ws_split_ints.restype = ctypes.c_longlong
    lib.hp_moe_ws_split_flags.restype = i
    if lib.hp_moe_ws_split_flags() != WS_SPLIT_FLAGS:
        raise RuntimeError(f"fused_moe library: {lib.hp_moe_ws_split_flags()} split flags, "
                           f"the Python mirror WS_SPLIT_FLAGS = {WS_SPLIT_FLAGS}")
    lib.hp_moe_item_rows.argtypes = [i, i]
    lib.hp_moe_item_rows.restype = i
    lib.hp_moe_route.argtypes = [vp, vp, vp, i, i, i, i, i, i, vp]
    lib.hp_moe_route.restype = i
    lib.hp_moe_route_ctas.argtypes = [i]
    lib.hp_moe_route_ctas.restype = i
    lib.hp_moe_route_small.argtypes = [vp, vp, i, i, i, i, i, i, vp]
    lib.hp_moe_route_small.restype = i
    lib.hp_moe_route_small_max_pairs.restype = i
    if lib.hp_moe_route_small_max_pairs() != ROUTE_SMALL_MAX_PAIRS:
        raise RuntimeError(f"fused_moe library: the small route takes {lib.hp_moe_route_small_max_pairs()} pairs, "
                           f"the Python mirror ROUTE_SMALL_MAX_PAIRS = {ROUTE_SMALL_MAX_PAIRS}")
    lib.hp_moe_splitk_ints.argtypes = [i, i, i]
    lib.hp_moe_splitk_ints.restype = ctypes.c_longlong
    gemm = [vp, vp, vp, vp, vp, vp, vp, i, i, i, i, i, i, i, i, vp, vp, vp, vp]
    for name in (f"hp_moe_{g}{sfx}" for g in ("gate_up", "down") for sfx in _GEMM_SUFFIX.values()):
        getattr(lib, name).argtypes = gemm
        getattr(lib, name).restype = i
    lib.hp_moe_quant.argtypes = [vp, vp, vp, vp, vp, i, i, i, i, i, vp]
    lib.hp_moe_quant.restype = i
    lib.hp_moe_split_factor.argtypes = [i, i, i, i, i, i, i, i, i]
    lib.hp_moe_split_factor.restype = ctypes.c_longlong
    lib.hp_moe_reduce.argtypes = [vp, vp, vp, vp, vp, i, i, i, i, i, i, i, vp]
    lib.hp_moe_reduce.restype = i
    return lib


def c_workspace_len(num_experts: int, max_pairs: int, block_m: int) -> int:
    """The library's own answer (hp_moe_workspace_len): tests compare it with ``workspace_len``."""
    return int(_lib().hp_moe_workspace_len(num_experts, max_pairs, block_m))


def _require_sm90(device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("fused_moe kernels need an SM90 GPU; CUDA is not available")
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        raise RuntimeError(f"fused_moe kernels are built for sm_90a; {device} is sm_{major}{minor}")


def _check(code: int, what: str) -> None:
    from hotpaths.kernels import _build

    _build.check_status(code, what)


def _stream(device):
    from hotpaths.kernels import _build

    return _build.stream_ptr(device)


def _ptr(t):
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def _aligned(t: torch.Tensor, name: str) -> None:
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: expected 16-byte alignment, data_ptr % 16 = {t.data_ptr() % 16}")


def _cuda(t: torch.Tensor, name: str, device: torch.device | None) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")


def _fits(what: str, nbytes: int, device) -> None:
    """check_fits, except while a CUDA graph is being captured (the memory query is not a capturable call, and a
    size that fitted at warm-up fits at capture)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    check_fits(what, device_bytes=nbytes, device=device)


def choose_block_m(max_pairs: int, num_experts: int, gemm: str = "mma") -> int:
    """Pairs per tile: the smallest instantiated tile of the GEMM path (mma*: 8..64, wgmma*: 16..128) holding
    avg + 2 sqrt(avg) + 1 rows, avg = max_pairs / E; past the largest, on the cp.async wgmma path, 64 where its
    tiles hold enough fewer rows to pay its higher cost per row (WG64_ROW_COST, ``expected_tile_rows``).

    An expert whose rows spill past one tile reads its weights once per tile, and with random routing an expert's
    rows scatter around the average (roughly Poisson: sd sqrt(avg)), so sizing for the average alone (avg 5.3 at
    Hy3 TP8 batch 128, avg 32 at batch 768) would give 10-50% of the experts hit a second tile. The headroom keeps
    that to a few percent; an over-sized tile costs shared memory only, since the GEMMs skip the unoccupied n8
    blocks of a tile (no MMA or quantization work for them). Under EP, max_pairs is the pairs the rank expects
    (``expected_local_pairs``; ``plan_shape`` passes it), not the plan's capacity.
    """
    if gemm not in (*MMA_GEMMS, *WGMMA_GEMMS):
        raise ValueError(f"gemm: expected one of {(*MMA_GEMMS, *WGMMA_GEMMS)}, got {gemm!r}")
    sizes = WGMMA_BLOCK_MS if gemm in WGMMA_GEMMS else BLOCK_MS
    avg = max_pairs / max(num_experts, 1)
    need = avg + 2.0 * math.sqrt(avg) + 1.0 if avg > 0 else 0.0
    for bm in sizes:
        if need <= bm:
            return bm
    if gemm == "wgmma" and WG64_ROW_COST * expected_tile_rows(avg, 64) < expected_tile_rows(avg, 128):
        return 64
    return sizes[-1]


def expected_tile_rows(avg: float, block_m: int) -> float:
    """Rows an expert's tiles hold (ceil(n / block_m) x block_m) on average when its rows n are Poisson(avg): the
    tensor work of the wgmma kernel, which runs every tile at N = block_m. Used where an expert needs several tiles:
    at 171 rows (Hy3 TP8, 4096 tokens) 64-row tiles hold ~192 rows, 128-row tiles 256."""
    if avg <= 0:
        return 0.0
    hi = int(avg + 12.0 * math.sqrt(avg) + 20)
    logp, total = -avg, 0.0  # log of the Poisson pmf at n = 0
    for n in range(hi + 1):
        if n:
            logp += math.log(avg / n)
        total += math.exp(logp) * -(-n // block_m) * block_m
    return total


def _named_choice(value: str | None, arg: str, env: str, choices) -> str:
    """``value``, or (None) ``$env`` lower-cased, else "auto"; ValueError naming the argument or the variable when it
    is not one of ``choices``."""
    src = arg
    if value is None:
        value, src = os.environ.get(env, "auto").strip().lower() or "auto", f"${env}"
    if value not in choices:
        raise ValueError(f"{src}: expected one of {tuple(choices)}, got {value!r}")
    return value


def _check_scales(scales, *, hint: bool = False) -> None:
    """ValueError naming ``scales`` unless it is one of SCALE_MODES (or None, for a plan's hint)."""
    if hint and scales is None:
        return
    if scales not in SCALE_MODES:
        raise ValueError(f"scales: expected {'None or ' if hint else ''}one of {SCALE_MODES}, got {scales!r}")


def resolve_gemm(gemm: str | None, max_pairs: int, num_experts: int, block_m: int | None = None,
                 scales: str | None = None) -> str:
    """The GEMM path of a plan: ``gemm`` None -> ``$HOTPATHS_MOE_GEMM`` or "auto"; "auto" -> "mma" for an mma-only
    tile (block_m 8), else "wgmma_ws" while the average rows per expert (max_pairs / E) stay below the threshold of
    the scale format (WS_MAX_ROWS_BY_SCALES[scales]; WS_MAX_ROWS when scales is None) and "wgmma" from there.
    Raises ValueError on an unknown name (the environment variable's included) or scale format."""
    _check_scales(scales, hint=True)
    gemm = _named_choice(gemm, "gemm", GEMM_ENV, GEMMS)
    if gemm != "auto":
        return gemm
    if block_m in BLOCK_MS and block_m not in WGMMA_BLOCK_MS:
        return "mma"
    limit = WS_MAX_ROWS if scales is None else WS_MAX_ROWS_BY_SCALES[scales]
    return "wgmma_ws" if max_pairs / max(num_experts, 1) < limit else "wgmma"


def expected_local_pairs(max_pairs: int, num_experts: int, experts_total: int | None = None) -> float:
    """The pairs a rank of num_experts local experts expects out of max_pairs when the router picks uniformly among
    experts_total experts (all ranks; None: num_experts, no expert parallelism): max_pairs x E / experts_total.
    Raises ValueError when experts_total is not an int >= num_experts."""
    if experts_total is None:
        return float(max_pairs)
    if isinstance(experts_total, bool) or not isinstance(experts_total, int) or experts_total < num_experts:
        raise ValueError(f"experts_total: expected an int >= num_experts = {num_experts}, got {experts_total!r}")
    return max_pairs * num_experts / experts_total


def plan_shape(max_pairs: int, num_experts: int, *, gemm: str | None = None, block_m: int | None = None,
               experts_total: int | None = None, scales: str | None = None) -> tuple[str, int]:
    """(GEMM path, block_m) of a plan of capacity max_pairs over num_experts local experts: ``plan``'s choice, without
    a device (resolve_gemm, then choose_block_m unless block_m is given), both on the expected local pairs
    (``expected_local_pairs``: under EP8 about 1/8 of max_pairs land on the rank; without experts_total every pair
    counts, which sizes an EP8 rank's tiles for 8x its expected rows); scales, when given, picks the path's
    threshold for that FP8 format (``resolve_gemm``). Raises ValueError on a bad gemm, block_m, experts_total or
    scales."""
    pairs = expected_local_pairs(max_pairs, num_experts, experts_total)
    gemm = resolve_gemm(gemm, pairs, num_experts, block_m, scales)
    sizes = WGMMA_BLOCK_MS if gemm in WGMMA_GEMMS else BLOCK_MS
    if block_m is None:
        block_m = choose_block_m(pairs, num_experts, gemm)
    if block_m not in sizes:
        raise ValueError(f"block_m: expected one of {sizes} for gemm={gemm!r}, got {block_m!r}")
    return gemm, block_m


def resolve_route(route: str | None, max_pairs: int) -> str:
    """The route path of a plan: ``route`` None -> ``$HOTPATHS_MOE_ROUTE`` or "auto"; "auto" -> "small" up to
    ROUTE_SMALL_AUTO_PAIRS pairs (max_tokens x K), "multi" from ROUTE_MULTI_MIN_PAIRS, else "one". Raises ValueError
    on an unknown name (the environment variable's included) and on "small" for a plan larger than it takes
    (ROUTE_SMALL_MAX_PAIRS)."""
    route = _named_choice(route, "route", ROUTE_ENV, ROUTES)
    if route == "small" and max_pairs > ROUTE_SMALL_MAX_PAIRS:
        raise ValueError(f"route: 'small' takes plans of at most {ROUTE_SMALL_MAX_PAIRS} pairs (max_tokens x top-k), "
                         f"got {max_pairs}; use 'one', 'multi' or 'auto'")
    if route != "auto":
        return route
    if max_pairs <= ROUTE_SMALL_AUTO_PAIRS:
        return "small"
    return "multi" if max_pairs >= ROUTE_MULTI_MIN_PAIRS else "one"


def act_quant_fused(p: "MoEPlan", scales: str) -> bool:
    """Whether run() has the gate-up epilogue write aq itself (per-tensor, wgmma paths; not with
    ``$HOTPATHS_MOE_ACT_QUANT`` = prepass). Raises ValueError on an unknown value of the variable."""
    choice = _named_choice(None, "act_quant", ACT_QUANT_ENV, ACT_QUANTS)
    return choice != "prepass" and scales == "pertensor" and p.gemm in WGMMA_GEMMS


def down_pdl(p: "MoEPlan", pdl: bool) -> bool:
    """Whether the down GEMM launches dependent on the gate-up (PDL). Not at 64-row wgmma tiles: there the
    early start of the down grid costs more than the overlap gains (H200, Hy3 TP8, the down launch alone without
    PDL: per-tensor 4096 563.5 -> 544.5 us, block-wise 631.8 -> 620.0, ws 1024 215.0 -> 211.6; at 128-row tiles
    it loses, 16384 1925.6 -> 1972.0, and at 16-row tiles it is level). ``plan(pdl_edges={"down": ...})``
    overrides the rule (never PDL when run's pdl is False)."""
    if "down" in p.pdl_edges:
        return pdl and p.pdl_edges["down"]
    return pdl and not (p.gemm in WGMMA_GEMMS and p.block_m == 64)


def reduce_pdl(p: "MoEPlan", pdl: bool) -> bool:
    """Whether the reduce launches dependent on the down GEMM (PDL): on every plan today. On an H100 the reduce
    without PDL was faster only after a cp.async (wgmma) down GEMM at 128-row tiles (Hy3 per-tensor 16384 2070.7 ->
    2060.5 us, block-wise 2048 413.7 -> 404.6, 16384 2312.2 -> 2299.3) and level elsewhere; this is the one place
    a per-plan rule would go once the H200 the tables are measured on agrees. ``plan(pdl_edges={"reduce": ...})``
    overrides it (never PDL when run's pdl is False)."""
    return pdl and p.pdl_edges.get("reduce", True)


def reduce_variant() -> int:
    """hp_moe_reduce's variant from ``$HOTPATHS_MOE_REDUCE`` (auto: by batch; narrow; wide). Raises ValueError on
    an unknown name."""
    return REDUCES[_named_choice(None, "reduce", REDUCE_ENV, REDUCES)]


# ----------------------------------------------------------------------------------------------------------------
# plan

@dataclass
class MoEPlan(PlanSize):
    """The routing plan of one decode step: the int32 workspace (layout ``PlanLayout``) on the device, the
    ``topk_ids`` it was built from (read again by the reduce), and the intermediate buffers of ``run``."""

    workspace: torch.Tensor
    topk_ids: torch.Tensor
    num_experts: int
    expert_offset: int
    max_tokens: int
    topk: int
    block_m: int
    gemm: str = "mma"  # GEMM path (GEMMS): mma / mma_tma (expert_gemm.cu), wgmma / wgmma_ws (expert_wgmma.cu)
    route: str = "one"  # route path (ROUTES less auto): small (decode sizes), one (one CTA), multi (many CTAs)
    pdl_edges: dict = field(default_factory=dict)  # PDL_EDGES -> bool: overrides of down_pdl / reduce_pdl
    _bufs: dict = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.workspace.device

    @property
    def num_tokens(self) -> int:
        return int(self.topk_ids.shape[0])

    @property
    def layout(self) -> PlanLayout:
        return PlanLayout(self.num_experts, self.max_pairs, self.block_m)

    def fields(self) -> dict[str, torch.Tensor]:
        """Views of the workspace by field name (header, expert_counts, ...)."""
        return self.layout.split(self.workspace)

    def update(self, topk_ids: torch.Tensor, *, pdl: bool = True) -> "MoEPlan":
        """Re-route into the same workspace (no allocation, no host sync: CUDA-graph capturable).

        Shape/Dtype: topk_ids int32 [T, K] on the plan's device, T <= max_tokens, K the plan's top-k.
        Raises TypeError / ValueError on a bad tensor or a token count above max_tokens.
        """
        _validate_ids(topk_ids, self.num_experts, device=self.device)
        t, k = (int(s) for s in topk_ids.shape)
        if k != self.topk:
            raise ValueError(f"topk_ids: expected top-k {self.topk} like the plan, got shape {tuple(topk_ids.shape)}")
        if t > self.max_tokens:
            raise ValueError(f"topk_ids: {t} tokens exceed the plan's max_tokens={self.max_tokens}")
        self.topk_ids = topk_ids
        self._route(pdl)
        return self

    def route_scratch(self) -> torch.Tensor | None:
        """int32 [ctas x E] per-chunk expert histograms of the multi-CTA route (every entry rewritten per launch),
        allocated once; None on the one-CTA route."""
        if self.route != "multi":
            return None
        if "route" not in self._bufs:
            n = int(_lib().hp_moe_route_ctas(self.max_pairs)) * self.num_experts
            self._bufs["route"] = torch.empty(n, dtype=torch.int32, device=self.device)
        return self._bufs["route"]

    def _route(self, pdl: bool) -> None:
        if self.route == "small":
            code = _lib().hp_moe_route_small(_ptr(self.topk_ids), _ptr(self.workspace), self.num_tokens * self.topk,
                                             self.num_experts, self.expert_offset, self.max_pairs, self.block_m,
                                             int(pdl), _stream(self.device))
        else:
            code = _lib().hp_moe_route(_ptr(self.topk_ids), _ptr(self.workspace), _ptr(self.route_scratch()),
                                       self.num_tokens * self.topk,
                                       self.num_experts, self.expert_offset, self.max_pairs, self.block_m, int(pdl),
                                       _stream(self.device))
        _check(code, f"fused_moe route (tokens={self.num_tokens}, topk={self.topk}, experts={self.num_experts}, "
                     f"expert_offset={self.expert_offset}, block_m={self.block_m}, route={self.route})")

    def buffers(self, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(act bf16 [max_pairs, I], ybuf bf16 [max_pairs, H]), allocated once per (H, I)."""
        key = (hidden, inter)
        if key not in self._bufs:
            mp = max(self.max_pairs, 1)
            self._bufs[key] = (torch.empty(mp, inter, dtype=torch.bfloat16, device=self.device),
                               torch.empty(mp, hidden, dtype=torch.bfloat16, device=self.device))
        return self._bufs[key]

    def quant_buffers(self, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                torch.Tensor]:
        """(xq uint8 [max_tokens, H], x_scale fp32 [max_tokens, ceil(H/128)], aq uint8 [max_pairs, I],
        act_scale fp32 [max_pairs, ceil(I/128)]): the activation pre-pass outputs (e4m3 bytes; group scales used in
        block mode only), allocated once per (H, I)."""
        key = ("quant", hidden, inter)
        if key not in self._bufs:
            mt, mp, dev = max(self.max_tokens, 1), max(self.max_pairs, 1), self.device
            self._bufs[key] = (torch.empty(mt, hidden, dtype=torch.uint8, device=dev),
                               torch.empty(mt, -(-hidden // 128), dtype=torch.float32, device=dev),
                               torch.empty(mp, inter, dtype=torch.uint8, device=dev),
                               torch.empty(mp, -(-inter // 128), dtype=torch.float32, device=dev))
        return self._bufs[key]

    def split_factors(self, hidden: int, inter: int, scales: str = "pertensor") -> tuple[int, int]:
        """(gate-up, down) split-K factors the GEMM launches take for the tile count now in the plan (1: no split).
        Reads the plan's header on the host (a sync): for tests and diagnostics, not hot paths."""
        _check_scales(scales)
        if self.gemm not in MMA_GEMMS:
            return 1, 1  # only the mma.sync GEMMs split K (the wgmma tiles are many and long)
        tiles = int(self.fields()["header"][1])
        out = tuple(int(_lib().hp_moe_split_factor(g, self.block_m, int(scales == "block"), tiles, self.num_experts,
                                                   self.max_pairs, hidden, inter, int(self.gemm == "mma_tma")))
                    for g in (1, 0))
        return out[0], out[1]

    def splitk_workspace(self, gate_up: bool) -> torch.Tensor:
        """int32 split-K workspace of the gate-up (or down) GEMM at this plan's block_m: per-item arrival counters
        (zero between launches: the kernel's last unit of an item puts its counter back) then fp32 partials.
        Allocated zeroed once, sized for the launch's CTA slots (either scale mode)."""
        key = ("splitk", bool(gate_up))
        if key not in self._bufs:
            n = max(int(_lib().hp_moe_splitk_ints(int(gate_up), self.block_m, b)) for b in (0, 1))
            if n < 0:
                raise ValueError(f"block_m: expected one of {BLOCK_MS}, got {self.block_m!r}")
            self._bufs[key] = torch.zeros(n, dtype=torch.int32, device=self.device)
        return self._bufs[key]

    def ws_split_workspace(self) -> torch.Tensor | None:
        """int32 split workspace of the warp-specialized gate-up GEMM (wgmma_ws) at this plan's block_m: per-CTA flags
        (zero between launches: the CTA that finishes a unit cut across CTAs puts them back) then fp32 partials of the
        cut units' pieces (WS_SPLIT_FLAGS slots). Allocated zeroed once; None at a tile size whose units are never
        cut (128 rows)."""
        if "ws_split" not in self._bufs:
            n = int(_lib().hp_moe_ws_split_ints(self.block_m))
            if n < 0:
                raise ValueError(f"block_m: expected one of {WGMMA_BLOCK_MS}, got {self.block_m!r}")
            self._bufs["ws_split"] = torch.zeros(n, dtype=torch.int32, device=self.device) if n else None
        return self._bufs["ws_split"]

    def describe(self) -> str:
        """A short pretty-print of the plan (copies the workspace to the host: not for hot paths)."""
        f = {k: v.cpu().tolist() for k, v in self.fields().items()}
        valid, tiles, hit, bm = f["header"][:4]
        lines = [f"MoEPlan: {valid} valid pairs, {tiles} tiles of block_m={bm} ({self.gemm}), {hit} experts hit "
                 f"(E={self.num_experts}, offset={self.expert_offset}, max_tokens={self.max_tokens}, K={self.topk})"]
        for i in range(tiles):
            e, s = f["tile_expert"][i], f["tile_start"][i]
            rows = min(bm, f["expert_offsets"][e + 1] - s)
            lines.append(f"  tile {i}: expert {e} rows {rows} pairs {f['sorted_pairs'][s:s + rows]}")
        return "\n".join(lines)


def _validate_ids(topk_ids, num_experts, *, device=None, check_device=True) -> None:
    expect_tensor(topk_ids, "topk_ids", dtype=torch.int32, ndim=2, layout="[T, K]")
    k = int(topk_ids.shape[1])
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk_ids: expected top-k in 1..{MAX_TOPK}, got shape {tuple(topk_ids.shape)}")
    if not isinstance(num_experts, int) or not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected an int in 1..{MAX_EXPERTS}, got {num_experts!r}")
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids: expected a contiguous [T, K] tensor; call .contiguous() first")
    if check_device:
        _cuda(topk_ids, "topk_ids", device)


def plan(topk_ids: torch.Tensor, *, num_experts: int, expert_offset: int = 0, max_tokens: int | None = None,
         block_m: int | None = None, pdl: bool = True, gemm: str | None = None, route: str | None = None,
         experts_total: int | None = None, scales: str | None = None,
         pdl_edges: dict[str, bool] | None = None) -> MoEPlan:
    """Allocate the routing workspace once and launch the route kernel (no host sync).

    Shape/Dtype: topk_ids int32 [T, K], contiguous, CUDA; global expert ids, -1 or any id outside
    [expert_offset, expert_offset + num_experts) is skipped here. num_experts: local experts E (1..512).
    max_tokens: the largest T ``update`` will see (default T). block_m: pairs per tile (mma, mma_tma: 8, 16, 32, 64;
    wgmma, wgmma_ws: 16, 32, 64, 128; default from the average rows per expert). gemm: a name of ``GEMMS`` (None:
    ``$HOTPATHS_MOE_GEMM``, else "auto"; ``resolve_gemm``), kept in the plan and used by every ``run`` on it.
    route: a name of ``ROUTES`` (None: ``$HOTPATHS_MOE_ROUTE``, else "auto"; ``resolve_route``), fixed per plan.
    experts_total: under expert parallelism, the experts the router picks from on all ranks (None: num_experts).
    It sizes the tiles and picks the auto GEMM path for the pairs the rank expects (max_tokens x K x E /
    experts_total, ``plan_shape``); the workspace still holds every pair, so a rank that gets more than its share
    runs more tiles, never a wrong result. scales: the FP8 format the runs on this plan will use ("pertensor" /
    "block"; None: not known), a hint for the auto GEMM path's threshold (``resolve_gemm``); a plan runs either
    format whatever it was told. pdl_edges: {edge: bool} for edges of ``PDL_EDGES``, overriding the rule that
    decides that launch's PDL edge (``down_pdl``, ``reduce_pdl``) in every run on the plan: the knob of A/B
    measurements (``hotpaths moe --ab down_pdl=on,off``); the results are the same bits either way.
    Raises TypeError / ValueError on bad input, ResourceError if the workspace does not fit, RuntimeError
    without an SM90 GPU.
    """
    _validate_ids(topk_ids, num_experts, check_device=False)
    edges = dict(pdl_edges or {})
    bad = [e for e in edges if e not in PDL_EDGES]
    if bad or not all(isinstance(v, bool) for v in edges.values()):
        raise ValueError(f"pdl_edges: expected {{edge: bool}} with edges from {PDL_EDGES}, got {pdl_edges!r}")
    t, k = (int(s) for s in topk_ids.shape)
    if not isinstance(expert_offset, int) or expert_offset < 0:
        raise ValueError(f"expert_offset: expected an int >= 0, got {expert_offset!r}")
    max_tokens = t if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or max_tokens < t:
        raise ValueError(f"max_tokens: expected an int >= T = {t}, got {max_tokens!r}")
    if block_m is not None and not isinstance(block_m, int):
        raise ValueError(f"block_m: expected an int, got {block_m!r}")
    gemm, block_m = plan_shape(max_tokens * k, num_experts, gemm=gemm, block_m=block_m, experts_total=experts_total,
                               scales=scales)
    if max_tokens * k >= 2**31 - 2**20:
        raise ValueError(f"max_tokens: {max_tokens} x top-k {k} pairs overflow the int32 plan")
    route = resolve_route(route, max_tokens * k)
    _cuda(topk_ids, "topk_ids", None)
    n = workspace_len(num_experts, max_tokens * k, block_m)
    _fits(f"fused_moe plan (E={num_experts}, max_tokens={max_tokens}, K={k})", 4 * n, topk_ids.device)
    _require_sm90(topk_ids.device)
    ws = torch.empty(n, dtype=torch.int32, device=topk_ids.device)
    p = MoEPlan(ws, topk_ids, num_experts, expert_offset, max_tokens, k, block_m, gemm, route, edges)
    p._route(pdl)
    return p


# ----------------------------------------------------------------------------------------------------------------
# run

def _validate_run(p: MoEPlan, x, w13, w2, topk_weights, scales, w13_scale, w2_scale, a1_scale, a2_scale,
                  shared_out, out) -> tuple[int, int, int]:
    expect_tensor(x, "x", dtype=torch.bfloat16, ndim=2, layout="[T, H]", contiguous=True)
    expect_tensor(w13, "w13", dtype=_FP8, ndim=3, layout="[E, 2I, H]", contiguous=True, why=" (float8_e4m3fn)")
    expect_tensor(w2, "w2", dtype=_FP8, ndim=3, layout="[E, H, I]", contiguous=True, why=" (float8_e4m3fn)")
    expect_tensor(topk_weights, "topk_weights", dtype=torch.float32, ndim=2, layout="[T, K]", contiguous=True)
    t, h = (int(s) for s in x.shape)
    e, two_i, h13 = (int(s) for s in w13.shape)
    i = two_i // 2
    if e != p.num_experts:
        raise ValueError(f"w13: expected {p.num_experts} experts like the plan, got shape {tuple(w13.shape)}")
    if h13 != h or two_i % 2:
        raise ValueError(f"w13: expected [E, 2I, H={h}], got shape {tuple(w13.shape)}")
    if h % 64 or i % 64 or h == 0 or i == 0:
        raise ValueError(f"x / w13: hidden H={h} and intermediate I={i} must be positive multiples of 64")
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(f"w2: expected shape {(e, h, i)} = [E, H, I], got {tuple(w2.shape)}")
    if max(p.max_pairs, t) * max(h, i) >= 2**31:
        raise ValueError(f"x: {max(p.max_pairs, t)} rows x {max(h, i)} columns exceed the kernels' int32 row offsets")
    if t != p.num_tokens:
        raise ValueError(f"x: expected T = {p.num_tokens} tokens like the plan's topk_ids, got shape {tuple(x.shape)}")
    if tuple(topk_weights.shape) != (t, p.topk):
        raise ValueError(f"topk_weights: expected shape {(t, p.topk)}, got {tuple(topk_weights.shape)}")
    _check_scales(scales)
    if scales == "pertensor":
        shapes = {"w13_scale": (e,), "w2_scale": (e,), "a1_scale": (1,), "a2_scale": (1,)}
    else:
        shapes = {"w13_scale": (e, math.ceil(2 * i / 128), math.ceil(h / 128)),
                  "w2_scale": (e, math.ceil(h / 128), math.ceil(i / 128))}
        for name, v in (("a1_scale", a1_scale), ("a2_scale", a2_scale)):
            if v is not None:
                raise ValueError(f"{name}: block scales compute activation scales in the kernel; pass None")
    given = {"w13_scale": w13_scale, "w2_scale": w2_scale, "a1_scale": a1_scale, "a2_scale": a2_scale}
    for name, shape in shapes.items():
        v = given[name]
        if v is None:
            raise ValueError(f"{name}: required with scales={scales!r} (fp32 {list(shape)})")
        expect_tensor(v, name, dtype=torch.float32, contiguous=True)
        if tuple(v.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} for scales={scales!r}, got {tuple(v.shape)}")
    for name, v in (("shared_out", shared_out), ("out", out)):
        if v is not None:
            expect_tensor(v, name, dtype=torch.bfloat16, ndim=2, layout="[T, H]", contiguous=True)
            if tuple(v.shape) != (t, h):
                raise ValueError(f"{name}: expected shape {(t, h)}, got {tuple(v.shape)}")
    dev = p.device
    for name, v in (("x", x), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights), ("shared_out", shared_out),
                    ("out", out), *((k, given[k]) for k in shapes)):
        if v is not None:
            _cuda(v, name, dev)
    for name, v in (("x", x), ("w13", w13), ("w2", w2), ("shared_out", shared_out), ("out", out)):
        if v is not None:
            _aligned(v, name)
    return t, h, i


def run(p: MoEPlan, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, *,
        scales: str = "pertensor", w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
        a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
        shared_out: torch.Tensor | None = None, out: torch.Tensor | None = None, stages="all",
        pdl: bool = True, split_k: bool = True) -> torch.Tensor:
    """Run the expert layer on a plan: gate-up (+SiLU-and-mul), down, top-k reduce (+ shared_out).

    Shape/Dtype: x bf16 [T, H]; w13 float8_e4m3fn [E, 2I, H] (rows < I gate, >= I up); w2 float8_e4m3fn [E, H, I];
    topk_weights fp32 [T, K]; scales="pertensor": w13_scale, w2_scale fp32 [E], a1_scale, a2_scale fp32 [1];
    scales="block": w13_scale fp32 [E, ceil(2I/128), ceil(H/128)], w2_scale fp32 [E, ceil(H/128), ceil(I/128)]
    (activation groups of 1x128 computed in the kernel; a1/a2 None); shared_out, out bf16 [T, H] or None.
    H and I positive multiples of 64; every tensor contiguous, on the plan's device, 16-byte aligned.
    stages: "all" or a subset of ("route", "gate_up", "down", "reduce") (stage timing; buffers persist in the
    plan). pdl: programmatic dependent launch between the stages (the down GEMM's launch as `down_pdl` says).
    split_k: let a GEMM split its K stages across CTAs
    when the routed items leave CTA slots idle (decided on the device per launch; deterministic; False never splits).
    Returns out bf16 [T, H].
    Raises TypeError / ValueError on bad input (before anything is allocated or launched), ResourceError when
    the buffers do not fit, RuntimeError on a launch error.
    """
    if not isinstance(p, MoEPlan):
        raise TypeError(f"plan: expected a MoEPlan from fused_moe.plan(), got {type(p).__name__}")
    todo = STAGES if stages == "all" else ((stages,) if isinstance(stages, str) else tuple(stages))
    bad = [s for s in todo if s not in STAGES]
    if bad or not todo:
        raise ValueError(f"stages: expected 'all' or names from {STAGES}, got {stages!r}")
    t, h, i = _validate_run(p, x, w13, w2, topk_weights, scales, w13_scale, w2_scale, a1_scale, a2_scale,
                            shared_out, out)
    variant = reduce_variant() if "reduce" in todo else 0
    fuse_q = "gate_up" in todo and act_quant_fused(p, scales)
    if out is None:
        _fits("fused_moe out", 2 * t * h, p.device)
        out = torch.empty(t, h, dtype=torch.bfloat16, device=p.device)
    if t == 0:
        return out
    if (h, i) not in p._bufs:
        nbytes = 2 * p.max_pairs * (h + i) + p.max_tokens * h * 1.04 + p.max_pairs * i * 1.04
        _fits(f"fused_moe buffers (max_pairs={p.max_pairs}, H={h}, I={i})", int(nbytes), p.device)
    act, ybuf = p.buffers(h, i)
    xq, xsc, aq, asc = p.quant_buffers(h, i)
    lib, stream, block = _lib(), _stream(p.device), int(scales == "block")
    mma = p.gemm in MMA_GEMMS
    sk_gu = p.splitk_workspace(True) if mma and split_k and "gate_up" in todo else None
    sk_dn = p.splitk_workspace(False) if mma and split_k and "down" in todo else None
    if p.gemm == "wgmma_ws" and split_k and "gate_up" in todo:  # gate-up units cut across CTAs (stream-K)
        sk_gu = p.ws_split_workspace()
    if "route" in todo:
        p._route(pdl)
    # The gate_up and down stages each include their activation pre-pass (x -> xq; act -> aq over the plan's
    # valid pairs, header[0]). The x pass needs no routing: after the route kernel (which lets it launch only once
    # everything before has completed) it waits at its end instead, so it overlaps routing; after anything else
    # (a stage run alone) it waits first, since a predecessor that launched early may still read xq.
    nvalid = p.workspace[:1]
    # Each GEMM stage: its activation pre-pass (rows of x or act -> fp8 + group scales), then the grouped GEMM.
    suffix = _GEMM_SUFFIX[p.gemm]
    gu_fn, dn_fn = getattr(lib, f"hp_moe_gate_up{suffix}"), getattr(lib, f"hp_moe_down{suffix}")
    # fuse_q: the gate-up epilogue writes aq as well (per-tensor, wgmma paths), so the down stage's pre-pass is not
    # launched in the same run (a down stage run alone keeps it: it may follow a change of act).
    gemms = {"gate_up": (gu_fn, x, xq, xsc, a1_scale, None, t, h, int("route" not in todo),
                         w13, w13_scale, act, sk_gu, True, aq if fuse_q else None),
             "down": (dn_fn, act, aq, asc, a2_scale, _ptr(nvalid), p.max_pairs, i, 1,
                      w2, w2_scale, ybuf, sk_dn, not fuse_q, None)}
    for stage, (gemm, src, q, sc, static, rows_ptr, rows, width, wait_first, w, w_scale, dst, sk, prepass,
                q_dst) in gemms.items():
        if stage not in todo:
            continue
        what = (f"fused_moe {stage} (tokens={t}, topk={p.topk}, experts={p.num_experts}, H={h}, I={i}, "
                f"scales={scales}, block_m={p.block_m}, gemm={p.gemm})")
        if prepass:
            _check(lib.hp_moe_quant(_ptr(src), _ptr(q), _ptr(sc), _ptr(static), rows_ptr, rows, width, block,
                                    wait_first, int(pdl), stream),
                   f"fused_moe {stage} activation pre-pass (rows<={rows}, width={width}, scales={scales})")
        edge_pdl = down_pdl(p, pdl) if stage == "down" else pdl
        _check(gemm(_ptr(p.workspace), _ptr(q), _ptr(sc), _ptr(w), _ptr(w_scale), _ptr(static), _ptr(dst), p.topk,
                    p.num_experts, h, i, p.max_pairs, p.block_m, block, int(edge_pdl), _ptr(sk), _ptr(q_dst),
                    _ptr(a2_scale if q_dst is not None else None), stream), what)
    if "reduce" in todo:
        _check(lib.hp_moe_reduce(_ptr(p.topk_ids), _ptr(topk_weights), _ptr(ybuf), _ptr(shared_out), _ptr(out), t,
                                 p.topk, p.num_experts, p.expert_offset, h, variant, int(reduce_pdl(p, pdl)), stream),
               f"fused_moe reduce (tokens={t}, topk={p.topk}, experts={p.num_experts}, H={h}, "
               f"expert_offset={p.expert_offset})")
    return out


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, *, scales: str = "pertensor", w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None, a1_scale: torch.Tensor | None = None,
              a2_scale: torch.Tensor | None = None, expert_offset: int = 0, shared_out: torch.Tensor | None = None,
              out: torch.Tensor | None = None, pdl: bool = True, gemm: str | None = None) -> torch.Tensor:
    """plan + run in one call (the plan is built for this batch and dropped). Shapes, dtypes and errors as in
    ``plan`` and ``run``; num_experts is w13.shape[0]; gemm as in ``plan``. Returns out bf16 [T, H]."""
    expect_tensor(w13, "w13", dtype=_FP8, ndim=3, layout="[E, 2I, H]", why=" (float8_e4m3fn)")
    _check_scales(scales)
    p = plan(topk_ids, num_experts=int(w13.shape[0]), expert_offset=expert_offset, pdl=pdl, gemm=gemm,
             scales=scales)
    return run(p, x, w13, w2, topk_weights, scales=scales, w13_scale=w13_scale, w2_scale=w2_scale,
               a1_scale=a1_scale, a2_scale=a2_scale, shared_out=shared_out, out=out, pdl=pdl)


# torch.ops.hotpaths.fused_moe (torch.compile / CUDA graphs): registered when this package is imported
from hotpaths.kernels.fused_moe import ops as _ops  # noqa: E402

_ops.register(fused_moe)
