"""Dynamic split-KV decode attention on SM90: loader and Python API (plan once per decode step, run per layer).

    plan = plan(kv_lens, num_kv_heads=1, q_heads=8)       # device assign kernel builds the task map (no sync)
    out = run(plan, q, k_cache, v_cache, block_table, kv_lens, q_scale=qs, k_scale=ks, v_scale=vs)
    plan.update(kv_lens)                                   # next step: same buffers, CUDA-graph capturable

Modes: "dynamic" (persistent grid of num_ctas CTAs draining the assign kernel's bins), "static_count" (grid
(H, batch, num_splits), each pair cut into num_splits equal chunks), "static_chunk" (grid sized for the longest
request, chunks of chunk_tiles tiles), "batch_invariant" (chunks of chunk_tiles tiles from each request's own
tile 0: a request's output is bit-identical whatever it is batched with; grid as static_chunk). All modes run the
same device tile function (attention.cu), so dynamic / static is a fair ratio.

Variants (configurations of the one attention kernel template, attention.cu; task map, partial layout and API are
shared): "v2" (row layout: bank-conflict-free shared-memory patterns, FP8 V fragments built in registers, 4 FP8
stages, coalesced output / partial stores: docs/ops/split_kv_decode.md) and "v3" (FP8 KV: products transposed so
the 64-token tile fills the MMA's 16-row side, QK on the FP8 tensor-core instruction, P transposed in registers with
movmatrix; BF16 KV runs v2). "v3s3c3", "v3s5", "v3s2c4" are v3 with other (stages, CTAs per SM) choices, kept for
the measurement that picked v3's (the first kernel, "v1", was removed; its lesson is in the notes). "v3m" (MTP): v3
with one row group of up to 32 query rows (8:1 GQA at q_len 3-4 reads each K/V tile once) on a grid of 2 CTAs per
SM. "v3b", "v3bs3", "v3bc3" (BF16 KV): the transposed layout on bf16 MMAs (S^T = K Q^T, O^T += V^T P^T: half the
row layout's MMAs and accumulators at 8 query rows per KV head) with {stages, CTAs per SM} 2/2, 3/2, 2/3; FP8 KV runs
v3 (v3b, v3bs3) or v3s3c3 (v3bc3) under those names, and BF16 with more than 8 rows per group the row layout. (A
4-stage / 1-per-SM MTP configuration and BF16 row-layout configurations with v3's start-up were measured and
removed: docs/ops/split_kv_decode.md.) "auto" (the default) picks per plan: v3s2c4 (a finer grid:
4 CTAs per SM of 2 stages) for FP8 KV in dynamic mode when its longest (head, request) stays within AUTO_MAX_CHUNKS
chunks, else v2 (choose_variant); with 9-16 query rows per pair (q_len x GQA ratio) v3m takes v3s2c4's place, and
above AUTO_MTP_ALWAYS_ROWS rows the warpgroup-MMA kernel runs whatever the chunk estimate: "v3w" (3 stages, 2 CTAs
per SM), or "v3wc3" (2 stages, 3 per SM) where its finer grid gives every CTA one chunk and v3w's does not; BF16 KV
runs v3b up to 8 rows and v3w (its BF16 form: bf16 wgmma, V read in place) above. plan(variant=None) reads the
environment variable HOTPATHS_DECODE_VARIANT (default DEFAULT_VARIANT).

Early work before the PDL wait (plan(early=...), default on; $HOTPATHS_DECODE_EARLY=0 turns it off): update()
launches the assign kernel with PDL so that it reads kv_lens and builds the map in registers and shared memory while
the previous kernel (in a decode step, the attention prologue) still runs, waiting only before its first workspace
write; run()'s attention kernel prefetches the task map, kv_lens and the block table into L2 before its wait (a hint:
no value read changes). Contract of early: kv_lens must be final when the kernel launched just before update()
signals its dependents (PDL trigger, or its exit): not written by that kernel, nor by an earlier one that it lets run
on past its trigger. The prologue, attention and combine kernels trigger at or after their own PDL wait (only assign
itself and fused_moe's quant_rows kernel with wait_first off trigger first), and a launch without PDL (torch, cuBLAS,
a memcpy) orders everything before it, so a producer of kv_lens two launches back (decode_step: meta, then the
prologue, then update()) is fine; plan() itself launches the workspace fill right before its first assign.
early=False is the old behaviour (assign a plain stream-ordered launch, no prefetch), kept for A/B runs and for
callers that compute kv_lens on the device right before update().

The static modes size their grid from the lengths on the host (plan() reads kv_lens, or takes max_kv_len): later
updates must not exceed that maximum. The dynamic mode never reads lengths on the host.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import numpy as np

from hotpaths.kernels import _build
from hotpaths.kernels._build import check_status, stream_ptr
from hotpaths.reference import split_kv_decode as ref
from hotpaths.reference.common import expect_tensor
from hotpaths.reference.split_kv_decode import DEFAULT_MIN_TILES, workspace_len

TILE = 64
HEAD_DIMS = (128,)
PAGE_SIZES = (16, 32, 64, 128)
GQA_RATIOS = (1, 2, 4, 8, 12, 16)
MAX_Q_LEN = 4
MODES = ("dynamic", "static_count", "static_chunk", "batch_invariant")
_MODE_CODE = {"dynamic": 0, "static_count": 1, "static_chunk": 2, "batch_invariant": 2}
DEFAULT_CHUNK_TILES = 16  # static_chunk / batch_invariant chunk: 1024 tokens
VARIANTS = ("v2", "v3", "v3s3c3", "v3s5", "v3s2c4", "v3m", "v3b", "v3bs3", "v3bc3", "v3w", "v3wc3")
# variant -> config id of hp_decode_attention (attention.cu kNumConfigs): 0 the row layout, 1..4 the transposed
# layout with {stages, CTAs per SM} 4/2, 3/3, 5/2, 2/4; 5 the MTP configuration (transposed, one row group of up to
# 32 rows per pass over the KV: 8:1 GQA at q_len 2-4 reads each K/V tile once; the 32-row kernel at 2 stages, 2 CTAs
# per SM); 6..8 the transposed layout for BF16 KV with {stages, CTAs per SM} 2/2, 3/2, 2/3 (the last two keep their merge
# buffer in the stage just computed, which is what makes them fit: attention.cu Traits::MERGE_IN_STAGE); 9, 10
# "v3w", "v3wc3": the warpgroup-MMA kernel (any row count, groups of 64 rows as wgmma's M side; FP8 KV 3 stages at 2
# CTAs per SM, 2 at 3; BF16 KV runs it under v3w at 2 stages, 2 per SM, and the row layout under v3wc3).
CONFIGS = {"v2": 0, "v3": 1, "v3s3c3": 2, "v3s5": 3, "v3s2c4": 4, "v3m": 5, "v3b": 6, "v3bs3": 7, "v3bc3": 8,
           "v3w": 9, "v3wc3": 10}
ROW_CONFIGS = {k: v for k, v in CONFIGS.items() if v == 0}  # the row layout (v2)
V3_CONFIGS = {k: v for k, v in CONFIGS.items() if k not in ROW_CONFIGS}  # the transposed (v3) configurations
MTP_CONFIGS = ("v3m", "v3w", "v3wc3")
WG_CONFIGS = ("v3w", "v3wc3")  # the warpgroup-MMA kernel (attention.cu attention_wg; BF16 KV: v3w only)
# The configurations whose BF16 kernel is the transposed layout (at most 8 query rows per group; more run the row
# layout): the fused merge and fuse-all then work for BF16 KV too.
BF16_TRANSPOSED_CONFIGS = ("v3b", "v3bs3", "v3bc3")
# Warps per (row, pair) CTA of the combine kernel: 8 (default), or 32 (the online form, whatever the variant) for
# plans whose longest pair has hundreds of chunks, where the 8-warp form needs one dependent L2 round trip per 32
# chunks behind the whole attention kernel (docs/ops/split_kv_decode.md, "Fixed-cost cases").
COMBINE_WARPS = (8, 32)
DEFAULT_COMBINE_WARPS = 8
# plan(combine_warps="auto"): 32 when the longest pair has more chunks than AUTO_COMBINE_WIDE_CHUNKS (the 8-warp form
# then needs more than one L2 round trip for it), else 8 (many short pairs: the wide CTAs would only be idle warps).
# plan(fuse_max="auto"): FUSE_ALL when the longest pair has at most AUTO_FUSE_ALL_MAX_CHUNKS chunks (auto's FP8 rule,
# for any variant that runs the transposed layout), else 0. Both read kv_lens on the host once, as "auto" does.
AUTO_COMBINE_WIDE_CHUNKS = 32
# Variants whose combine is the online form (one L2 round trip per 32 chunks): every transposed configuration (the
# two-pass form stays v2's so v2 is unchanged).
ONLINE_COMBINE = tuple(V3_CONFIGS)
# v3 fused merge (off by default): with plan(fuse_max=F), a pair cut into 2..F chunks is merged by the attention CTA
# that finishes its last chunk (per-pair arrival counters), so the combine kernel has nothing to do for it; longer
# pairs go to the combine. Off because it loses more than it wins: slightly faster on uniform batches, slower on
# skewed ones (every CTA stalls on a fence + atomic at each fused descriptor end, and the combine still runs for the
# long pair); the H200 numbers are in docs/ops/split_kv_decode.md.
DEFAULT_FUSE_MAX = 0
# fuse_max >= FUSE_ALL (dynamic mode; mirrors attention.cu kFuseAll): every split pair is merged by the attention
# kernel (and the zero rows of kv_len-0 requests written there too), so run() launches no combine kernel at all.
# That takes the combine's kernel boundary off a step, but the last CTA of a pair merges its chunks 4 per L2 round
# trip, so it only pays on batches whose pairs have few chunks (the notes have the measurements). plan(variant="auto")
# picks it (with v3s2c4) when the longest pair has at most AUTO_FUSE_ALL_MAX_CHUNKS = 9 chunks at plan time (64x4K:
# 8 + 1; 64x0.5K: 4 + 1); 32x0.125K+32x4K (17) and longer keep the combine kernel. Later updates stay correct
# whatever their lengths (a long pair is still merged, just slowly).
FUSE_ALL = 1 << 20
AUTO_FUSE_ALL_MAX_CHUNKS = 9
MAX_ROW_GROUPS = 8  # counters per pair (attention.cu kMaxRowGroups): rows = q_heads / H * q_len <= 64
# "auto" is the default: v3s2c4's finer grid balances better on batches without a dominant request (64x4K,
# 32x0.125K+32x4K, 2x32K+30x4K), but it cuts a long request into twice the chunks and the combine pays one more L2
# round trip per 32 of them, so on batches dominated by one long request (1x64K+15x4K, 1x128K+31x4K: 171-342
# chunks) v2 is faster (numbers: docs/ops/split_kv_decode.md).
# AUTO_FALLBACK (v2) is also what the static modes, an explicit num_ctas and an unknown KV dtype get.
# BF16 KV in dynamic mode with at most 8 query rows per pair picks AUTO_BF16 (v3b: the transposed BF16 layout, 2
# stages, 2 CTAs per SM), with fuse-all by the same chunk rule: on the H200, one run, the nine cases took 14.7 / 48.0
# / 31.7 / 41.1 / 33.0 / 50.7 / 15.8 / 28.8 / 41.8 us against v2's 17.0 / 51.8 / 35.9 / 43.7 / 35.4 / 53.0 / 16.0 /
# 31.0 / 44.5 (v3bs3 and v3bc3 were within 1-5% of v3b, never ahead by more than 0.6%; docs/ops/split_kv_decode.md).
# With 9-16 query rows per (request, KV head) (q_len x GQA ratio: 8:1 at q_len 2, 12:1 / 16:1 at q_len 1), "auto" on
# FP8 KV in dynamic mode picks AUTO_MTP (v3m): one row group of up to 16 rows reads each K/V tile once, on a grid
# sized for the kernel that runs (v3s2c4's 4-per-SM grid ran the 2-per-SM 16-row kernel in two waves), while the
# longest pair stays within AUTO_MTP_MAX_CHUNKS chunks at its grid (v2 above, as for 8 rows at AUTO_MAX_CHUNKS).
# Above AUTO_MTP_ALWAYS_ROWS rows (8:1 at q_len 3-4, 16:1 at q_len 2-4, 64:8 at q_len 3-4) it picks the warpgroup-MMA
# kernel whatever the chunk estimate (it reads the KV once for up to 64 rows): AUTO_MTP_WG (v3w, 3 stages, 2 CTAs per
# SM), or AUTO_MTP_WG_FINE (v3wc3, 2 stages, 3 per SM) when every CTA of v3wc3's grid gets a single descriptor and
# some CTA of v3w's gets two or more (_max_descs_per_cta): a second descriptor is a second epilogue and merge in the
# middle of that CTA's stream. On the H200, one run, FP8 8:1 q_len 4, v3w / v3wc3 / HPC-Ops us: 2x32K+30x4K 36.7 /
# 32.8 / 35.7, 1x64K+31x4K 36.7 / 33.3 / 36.1, 1x64K+7x4K 26.5 / 25.3 / 25.3 (the three batches where the rule
# picks v3wc3), 64x4K 39.0 / 41.2 / 34.1, 32x0.125K+32x4K 29.3 / 32.6 / 30.9, 1x64K+15x4K 27.2 / 29.3 / 28.1 (v3w's
# grid divides them evenly and v3wc3's does not); v3m took 33.1-52.5 us on the same batches.
AUTO = "auto"
AUTO_FINE = "v3s2c4"
AUTO_MTP = "v3m"
AUTO_FALLBACK = "v2"
AUTO_BF16 = "v3b"
AUTO_BF16_CTAS_PER_SM = 2  # v3b's and v3w's grid (CONFIGS note above): the chunk estimate of the fuse-all rule
# BF16 KV with more than 8 query rows per pair (8:1 at q_len 2-4): the warpgroup-MMA kernel (v3w; bf16 wgmma, V read
# in place as an MN-major operand), with fuse-all by the same chunk rule. On the H200, one run, nine cases, HPC-Ops
# time / ours (the faster of its two paths), geomean at q_len 2 / 3 / 4: v3w 1.034 / 1.089 / 1.063 against the row
# layout v2 (auto before) 0.949 / 0.669 / 0.655 (64x4K q_len 4: 49.8 vs 91.7 us, HPC-Ops 49.7); at 8 rows v3w and
# v3b are level (1.040 / 1.041), so v3b stays there (docs/ops/split_kv_decode.md, "v3w for BF16 KV").
AUTO_BF16_MTP = "v3w"
AUTO_MAX_CHUNKS = 128
AUTO_MTP_ALWAYS_ROWS = 16
# At 9-16 rows (8:1 at q_len 2) v3m only while its longest pair stays within AUTO_MTP_MAX_CHUNKS chunks: on the H200,
# one run, q_len 2, v2 took 29.7 / 30.8 us on 2x32K+30x4K / 1x64K+31x4K (longest 44 / 87 chunks at v3m's grid)
# against v3m's 32.4 / 33.1, while v3m kept 64x0.5K (14.0 vs 15.6), 64x4K (34.6 vs 35.4) and 32x0.125K+32x4K (level)
# at 5-9 chunks.
AUTO_MTP_MAX_CHUNKS = 16
# At 9-16 rows, where v3m would run, the warpgroup-MMA kernel instead when some CTA of the 2-per-SM grid gets at least
# AUTO_MTP_WG_MIN_DESCS descriptors (many short pairs beside long ones). On the H200, one run, FP8 8:1 q_len 2, each
# with fuse-all: 32x0.125K+32x4K (4 descriptors on the busiest CTA) v3w 25.3 / v3m 27.0 us (HPC-Ops 25.3), against
# 64x4K (1) 36.4 / 34.5 and 64x0.5K (1) 14.0 / 14.1, where v3m stays.
AUTO_MTP_WG_MIN_DESCS = 3
AUTO_MTP_WG = "v3w"
AUTO_MTP_WG_FINE = "v3wc3"
# Wide plans: above 8 rows, when the per-CTA budget of the 2-per-SM grid is at least AUTO_WIDE_BUDGET tiles (many
# KV heads: 64:8 puts 8 pairs per request into the map, a budget of 45-124 tiles on the 64:8 cases against <= 16 for
# every 8:1 case), the descriptor rules above no longer say what is fast: each CTA streams long enough that the
# kernels' streaming rates decide. Above AUTO_MTP_ALWAYS_ROWS rows: v3wc3 (its 3-per-SM grid keeps more loads in
# flight than v3w's). At 9-16 rows: v2 (the row layout, 16 rows per pass), or v3wc3 where a CTA of the 2-per-SM grid
# holds AUTO_WIDE_FINE_DESCS or more descriptors (short pairs among long ones). On the H200, one run, FP8 64:8, v3w
# (auto before) / the new pick, us: q_len 2 64x4K 198.0 / 167.6 (v2), 32x0.125K+32x4K 166.5 / 126.3 (v3wc3),
# 2x32K+30x4K 147.6 / 125.1, 1x64K+31x4K 158.3 / 127.0; q_len 4 64x4K 205.6 / 183.9, 32x0.125K+32x4K 190.8 / 145.7,
# 1x128K+31x4K 217.5 / 199.1, 1x64K+15x4K 118.4 / 108.4 (2x32K+30x4K 153.9 / 159.4 is the one loss; 64x0.5K, budget
# 15.5, keeps v3w: 37.7 vs v3wc3's 42.1). No 8:1 plan of the nine reaches the budget (docs/ops/split_kv_decode.md).
AUTO_WIDE_BUDGET = 32
AUTO_WIDE_FINE_DESCS = 8
DEFAULT_VARIANT = AUTO
VARIANT_ENV = "HOTPATHS_DECODE_VARIANT"
EARLY_ENV = "HOTPATHS_DECODE_EARLY"  # "0": plan(early=None) gives the old launches (resolve_early)

_lib = None


def _load():
    global _lib
    if _lib is None:
        lib = _build.load("split_kv_decode")
        vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        lib.hp_decode_assign.argtypes = [vp, vp, i, i, i, i, i, i, vp]
        lib.hp_decode_assign.restype = i
        lib.hp_decode_attention.argtypes = [vp] * 12 + [f] + [i] * 14 + [vp, i, vp, i, i]
        lib.hp_decode_attention.restype = i
        lib.hp_decode_combine.argtypes = [vp] * 5 + [i] * 10 + [vp, i, i, i]
        lib.hp_decode_combine.restype = i
        lib.hp_decode_smem_bytes.argtypes = [i, i]
        lib.hp_decode_smem_bytes.restype = i
        lib.hp_decode_ctas_per_sm.argtypes = [i]
        lib.hp_decode_ctas_per_sm.restype = i
        lib.hp_decode_transposed.argtypes = [i, i, i]
        lib.hp_decode_transposed.restype = i
        lib.hp_decode_workspace_len.argtypes = [i, i]
        lib.hp_decode_workspace_len.restype = ctypes.c_longlong
        for c, m in ((1, 1), (264, 256), (528, 8192)):  # the host layout (reference) must match task_map.cuh
            if lib.hp_decode_workspace_len(c, m) != workspace_len(c, m):
                raise RuntimeError(f"task-map layout mismatch: library {lib.hp_decode_workspace_len(c, m)} vs "
                                   f"hotpaths.reference {workspace_len(c, m)} entries for C={c}, max_pairs={m}")
        _lib = lib
    return _lib


def _torch():
    import torch

    return torch


def _fp8():
    return _torch().float8_e4m3fn


def resolve_early(early: bool | None = None) -> bool:
    """Whether the decode kernels do their early work before the PDL wait (module docstring): `early` if given, else
    $HOTPATHS_DECODE_EARLY ("1" / "0"; unset: True).

    Raises ValueError for an environment value other than "0" or "1".
    """
    import os

    if early is not None:
        return bool(early)
    v = os.environ.get(EARLY_ENV, "").strip()
    if v not in ("", "0", "1"):
        raise ValueError(f"{EARLY_ENV} must be '0' or '1', got {v!r}")
    return v != "0"


def resolve_variant(variant: str | None = None) -> str:
    """The attention kernel variant to use: `variant` if given, else $HOTPATHS_DECODE_VARIANT, else DEFAULT_VARIANT.

    Raises ValueError naming the source (argument or environment variable) for a value not in VARIANTS.
    """
    import os

    src = "variant"
    if variant is None:
        variant, src = os.environ.get(VARIANT_ENV, "").strip() or DEFAULT_VARIANT, VARIANT_ENV
    if variant not in VARIANTS and variant != AUTO:
        raise ValueError(f"{src} must be one of {VARIANTS + (AUTO,)}, got {variant!r}")
    return variant


def _kv_is_fp8(kv_dtype) -> bool | None:
    if kv_dtype is None:
        return None
    if isinstance(kv_dtype, str):
        if kv_dtype not in ("fp8", "bf16"):
            raise ValueError(f"kv_dtype must be 'fp8', 'bf16', a torch dtype or None, got {kv_dtype!r}")
        return kv_dtype == "fp8"
    torch = _torch()
    if kv_dtype not in (torch.bfloat16, _fp8()):
        raise ValueError(f"kv_dtype must be torch.bfloat16 or torch.float8_e4m3fn, got {kv_dtype}")
    return kv_dtype == _fp8()


def choose_variant(kv_lens, *, num_kv_heads: int, kv_dtype=None, mode: str = "dynamic", num_ctas: int | None = None,
                   min_tiles: int = DEFAULT_MIN_TILES, num_sms: int | None = None, rows: int = 8) -> str:
    """The variant plan(variant="auto") runs (see _auto_choice)."""
    return _auto_choice(kv_lens, num_kv_heads=num_kv_heads, kv_dtype=kv_dtype, mode=mode, num_ctas=num_ctas,
                        min_tiles=min_tiles, num_sms=num_sms, rows=rows)[0]


def _auto_choice(kv_lens, *, num_kv_heads: int, kv_dtype=None, mode: str = "dynamic", num_ctas: int | None = None,
                 min_tiles: int = DEFAULT_MIN_TILES, num_sms: int | None = None,
                 rows: int = 8) -> tuple[str, int | None]:
    """The variant plan(variant="auto") runs: AUTO_FINE (v3s2c4) for FP8 KV in dynamic mode with the default grid
    when the longest (head, request) is cut into at most AUTO_MAX_CHUNKS chunks at that grid's per-CTA budget
    (max(ceil(tiles / CTAs), min_tiles), plus one for a bin boundary), else AUTO_FALLBACK (v2). rows = GQA ratio x
    q_len (query rows per pair): above 8, AUTO_MTP (v3m, 2 CTAs per SM) takes AUTO_FINE's place, with the chunk
    estimate at its own grid and AUTO_MTP_MAX_CHUNKS as the bound (AUTO_MTP_WG in its place when some CTA of that
    grid gets AUTO_MTP_WG_MIN_DESCS descriptors or more); above AUTO_MTP_ALWAYS_ROWS, AUTO_MTP_WG (v3w, 2
    CTAs per SM) whatever the estimate, or AUTO_MTP_WG_FINE (v3wc3, 3 per SM) when its grid gives every CTA at most
    one descriptor and v3w's does not (_max_descs_per_cta); above 8 rows on wide plans (a per-CTA budget of at
    least AUTO_WIDE_BUDGET tiles at the 2-per-SM grid) v3wc3 above AUTO_MTP_ALWAYS_ROWS rows, else v2 or (with
    AUTO_WIDE_FINE_DESCS descriptors on a CTA) v3wc3. BF16 KV in dynamic mode
    with the default grid: AUTO_BF16 (v3b) at rows <= 8, AUTO_BF16_MTP (v3w) above (the estimate at their grid).

    Shape/Dtype: kv_lens [batch] int32 (any device: read on the host, one sync, only when dynamic / default grid /
    a known dtype; kv_dtype None = unknown, which also gives the fallback without reading anything). num_sms
    defaults to the device's SM count (132 without a GPU). Returns (variant, the estimated chunk count of the
    longest pair at the chosen variant's budget, or None when nothing was read)."""
    fp8 = _kv_is_fp8(kv_dtype)
    if fp8 is None or mode != "dynamic" or num_ctas is not None:
        return AUTO_FALLBACK, None
    tiles = [_cdiv(max(int(x), 0), TILE) for x in kv_lens.tolist()]
    total = sum(tiles) * int(num_kv_heads)
    if total == 0:
        return AUTO_FALLBACK, None
    if num_sms is None:
        torch = _torch()
        num_sms = (torch.cuda.get_device_properties(kv_lens.device).multi_processor_count
                   if kv_lens.device.type == "cuda" else 132)
    if not fp8:  # BF16: v3b up to 8 rows, the warpgroup body above, whatever the estimate (it only sets fuse-all)
        longest = _longest_chunks(tiles, int(num_kv_heads), AUTO_BF16_CTAS_PER_SM * int(num_sms), min_tiles)
        return (AUTO_BF16 if rows <= 8 else AUTO_BF16_MTP), longest
    # the variant and the CTAs per SM of its grid (the chunk estimate's budget)
    H, sms = int(num_kv_heads), int(num_sms)
    fine, cps = (AUTO_MTP, 2) if rows > 8 else (AUTO_FINE, 4)
    longest = _longest_chunks(tiles, H, cps * sms, min_tiles)
    if rows > 8 and _budget(total, 2 * sms, min_tiles) >= AUTO_WIDE_BUDGET:  # wide plans (see the constant)
        if rows > AUTO_MTP_ALWAYS_ROWS or _max_descs_per_cta(tiles, H, 2 * sms, min_tiles) >= AUTO_WIDE_FINE_DESCS:
            return AUTO_MTP_WG_FINE, _longest_chunks(tiles, H, 3 * sms, min_tiles)
        return AUTO_FALLBACK, _longest_chunks(tiles, H, 2 * sms, min_tiles)
    if rows > AUTO_MTP_ALWAYS_ROWS:
        if (_max_descs_per_cta(tiles, H, 3 * sms, min_tiles) <= 1
                and _max_descs_per_cta(tiles, H, 2 * sms, min_tiles) > 1):
            return AUTO_MTP_WG_FINE, _longest_chunks(tiles, H, 3 * sms, min_tiles)
        return AUTO_MTP_WG, longest
    limit = AUTO_MTP_MAX_CHUNKS if rows > 8 else AUTO_MAX_CHUNKS
    if longest > limit:
        return AUTO_FALLBACK, longest
    if rows > 8 and _max_descs_per_cta(tiles, H, 2 * sms, min_tiles) >= AUTO_MTP_WG_MIN_DESCS:
        return AUTO_MTP_WG, longest  # same 2-per-SM grid as v3m: the chunk estimate holds
    return fine, longest


def ctas_per_sm(variant: str) -> int:
    """Resident CTAs per SM the variant's attention kernel is sized for (the default persistent grid is this x SMs).
    v3 configurations size for FP8 KV (BF16 KV runs the row layout there, two per SM); the BF16 transposed ones
    (BF16_TRANSPOSED_CONFIGS) for both dtypes. Raises ValueError for a name not in VARIANTS (resolve "auto" with
    choose_variant first)."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return int(_load().hp_decode_ctas_per_sm(CONFIGS[variant]))


def _budget(total: int, num_ctas: int, min_tiles: int) -> int:
    """Tiles per CTA of a dynamic map of num_ctas bins over `total` tiles: max(ceil(total / C), min_tiles), the
    per-CTA budget of hotpaths.reference.split_kv_decode.build_task_map."""
    return max(_cdiv(int(total), int(num_ctas)), int(min_tiles))


def _longest_chunks(tiles: list[int], num_kv_heads: int, num_ctas: int, min_tiles: int) -> int:
    """Chunks of the longest (head, request) in a dynamic map of C = num_ctas bins: its tiles over the per-CTA budget
    max(ceil(total / C), min_tiles), plus one for a bin boundary (an upper bound, exact for the plan's rules)."""
    total = sum(tiles) * num_kv_heads
    if total == 0:
        return 0
    return _cdiv(max(tiles), _budget(total, num_ctas, min_tiles)) + 1


def _max_descs_per_cta(tiles: list[int], num_kv_heads: int, num_ctas: int, min_tiles: int) -> int:
    """Most descriptors (pieces of distinct pairs) any CTA of a dynamic map of C = num_ctas bins gets: the map's pairs
    (head-major, each request's `tiles`) poured into bins of max(ceil(total / C), min_tiles) tiles, as
    hotpaths.reference.split_kv_decode.build_task_map does (tests pin the two together). 0 for an empty batch."""
    t = np.tile(np.asarray(tiles, dtype=np.int64), int(num_kv_heads))
    total = int(t.sum())
    if total == 0:
        return 0
    budget = _budget(total, num_ctas, min_tiles)
    start = (np.cumsum(t) - t)[t > 0]
    t = t[t > 0]
    per_bin = np.zeros(_cdiv(total, budget) + 1, dtype=np.int64)
    np.add.at(per_bin, start // budget, 1)  # each pair covers bins [first, last]: +1 at first, -1 after last
    np.add.at(per_bin, (start + t - 1) // budget + 1, -1)
    return int(np.cumsum(per_bin)[:-1].max())


def runs_transposed(variant: str, *, fp8: bool, rows: int = 8) -> bool:
    """Whether `variant` runs the transposed layout (which alone has the fused merge / fuse-all) for this KV dtype and
    `rows` query rows per (request, KV head). Asks the library (attention.cu runs_transposed). Raises ValueError for
    a name not in VARIANTS."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return _load().hp_decode_transposed(CONFIGS[variant], int(bool(fp8)), int(rows)) == 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _is_capturing() -> bool:
    torch = _torch()
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


@dataclass
class DecodePlan:
    """A decode step's schedule and its fixed-size device buffers (allocated once, reused by update()).

    Fields: mode; num_kv_heads (H); q_heads; head_dim; q_len (max query tokens per request the partial buffers
    fit); max_batch; num_ctas (C, dynamic grid); min_tiles (F); splits (static grid: splits per pair);
    chunk_tiles (static_chunk / batch_invariant); workspace [workspace_len(C, max_batch*H)] int32 (dynamic task
    map); partial_o [slots, rows, head_dim] fp32; partial_lse [slots, rows] fp32; batch and kv_lens of the last
    update; variant (one of VARIANTS: which attention kernel run() launches); fuse_max and counters
    [max_pairs * MAX_ROW_GROUPS] int32 (transposed layout's fused merge; zero between launches); combine_warps
    (COMBINE_WARPS: the combine kernel's warps per (row, pair); 32 runs its online form); early (update()'s
    assign and run()'s attention kernel do their early work before the PDL wait: module docstring; may be set
    between calls to A/B the two).
    """

    mode: str
    num_kv_heads: int
    q_heads: int
    head_dim: int
    q_len: int
    max_batch: int
    num_ctas: int
    min_tiles: int
    splits: int
    chunk_tiles: int
    workspace: object
    partial_o: object
    partial_lse: object
    batch: int = 0
    kv_lens: object = None
    device: object = None
    variant: str = AUTO_FALLBACK
    fuse_max: int = 0
    counters: object = None
    combine_warps: int = DEFAULT_COMBINE_WARPS
    early: bool = True
    _extra: dict = field(default_factory=dict)

    @property
    def max_pairs(self) -> int:
        return self.max_batch * self.num_kv_heads

    def update(self, kv_lens) -> "DecodePlan":
        """Re-plan for new lengths into the same buffers (dynamic: launches assign; no host sync; capturable).

        Shape/Dtype: kv_lens [batch] int32 on the plan's device, batch <= max_batch. With self.early (the default)
        assign is a PDL launch that reads kv_lens BEFORE its wait for the previous kernel: kv_lens must not be
        written by the kernel launched just before update() (nor by an earlier one that kernel lets run past its PDL
        trigger; module docstring). Writing it two launches back (decode_step: meta -> prologue -> update), on the
        host, or by a plain copy is fine; if it comes from the immediately preceding kernel, set self.early = False.
        Raises TypeError/ValueError for a wrong dtype, device, shape or batch > max_batch.
        """
        torch = _torch()
        _check_lens(kv_lens, self.device)
        batch = kv_lens.shape[0]
        if batch > self.max_batch:
            raise ValueError(f"kv_lens has batch {batch} > the plan's max_batch {self.max_batch}")
        if batch == 0:
            raise ValueError("kv_lens is empty (batch 0): nothing to plan")
        self.batch, self.kv_lens = batch, kv_lens
        if self.mode == "dynamic":
            with torch.cuda.device(kv_lens.device):
                code = _load().hp_decode_assign(kv_lens.data_ptr(), self.workspace.data_ptr(), batch,
                                                self.num_kv_heads, self.num_ctas, self.min_tiles, self.max_pairs,
                                                int(bool(self.early)), stream_ptr(kv_lens.device))
            check_status(code, f"split_kv_decode assign (batch={batch}, kv_heads={self.num_kv_heads}, "
                              f"num_ctas={self.num_ctas}, max_pairs={self.max_pairs})")
        return self


def _check_lens(kv_lens, device=None) -> None:
    expect_tensor(kv_lens, "kv_lens", dtype=_torch().int32, ndim=1, layout="[batch]", device_type="cuda",
                  contiguous=True)
    if device is not None and kv_lens.device != device:
        raise ValueError(f"kv_lens is on {kv_lens.device} but the plan is on {device}")


def plan(kv_lens, *, num_kv_heads: int, q_heads: int, head_dim: int = 128, max_batch: int | None = None,
         num_ctas: int | None = None, min_tiles: int = DEFAULT_MIN_TILES, mode: str = "dynamic", num_splits: int | None = None,
         chunk_tiles: int | None = None, q_len: int = 1, max_kv_len: int | None = None,
         variant: str | None = None, fuse_max: int | str | None = None, kv_dtype=None,
         combine_warps: int | str = DEFAULT_COMBINE_WARPS, early: bool | None = None) -> DecodePlan:
    """Allocate the step's buffers and build its schedule (dynamic: device assign kernel, no host sync).

    Shape/Dtype: kv_lens [batch] int32 on the GPU. num_ctas: see variant below; max_batch defaults to batch (sizes
    the workspace and the partial buffers); q_len is the largest query length run() will be called with.
    Static modes: num_splits (static_count; default ceil(num_ctas / (batch * H))), chunk_tiles (static_chunk /
    batch_invariant; default 16), max_kv_len (default: max(kv_lens), read on the host).
    variant: attention kernel, one of VARIANTS or "auto" (None: $HOTPATHS_DECODE_VARIANT, else DEFAULT_VARIANT =
    "auto": choose_variant(), which needs kv_dtype "fp8" / torch.float8_e4m3fn to pick anything but v2 and then
    reads kv_lens on the host once); every mode runs on every variant. num_ctas defaults to ctas_per_sm(variant)
    x the SM count.
    fuse_max (whenever the variant runs the transposed layout: v3 variants with FP8 KV, BF16_TRANSPOSED_CONFIGS with
    BF16 KV at <= 8 rows per group): pairs cut into 2..fuse_max chunks are merged inside the attention kernel by the
    CTA that finishes last (default DEFAULT_FUSE_MAX = 0: every merge in the combine kernel, except that "auto"
    may pick FUSE_ALL); FUSE_ALL (dynamic mode only) merges every pair there and launches no combine (a map whose
    pairs are all single chunks then needs no merge at all: each CTA writes its pairs' bf16 rows directly); ignored
    by v2 and by a run whose kernel is the row layout.
    fuse_max="auto": FUSE_ALL when the longest pair has at most AUTO_FUSE_ALL_MAX_CHUNKS chunks at the plan's grid,
    else 0 (reads kv_lens on the host).
    combine_warps: one of COMBINE_WARPS (default 8); 32 runs the online combine with 32 warps per (row, pair);
    "auto": 32 when the longest pair has more than AUTO_COMBINE_WIDE_CHUNKS chunks (reads kv_lens on the host).
    early: the kernels' work before the PDL wait (module docstring; None: resolve_early(), default True). With it,
    kv_lens must not be written by the kernel launched just before a later update() (DecodePlan.update); plan()'s
    own assign follows the workspace fill plan() launches, so any kv_lens is safe here. False gives the old launches.
    Raises ValueError/TypeError for an unknown mode or variant, a bad $HOTPATHS_DECODE_EARLY, unsupported head_dim /
    GQA ratio / q_len, batch > max_batch, combine_warps not in COMBINE_WARPS, or non-positive sizes.
    """
    torch = _torch()
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    variant = resolve_variant(variant)
    early = resolve_early(early)
    _check_lens(kv_lens)
    fuse_auto = isinstance(fuse_max, str)
    if fuse_auto and fuse_max != "auto":
        raise ValueError(f"fuse_max must be an int >= 0, None or 'auto', got {fuse_max!r}")
    if combine_warps not in COMBINE_WARPS and combine_warps != "auto":
        raise ValueError(f"combine_warps must be one of {COMBINE_WARPS} or 'auto', got {combine_warps!r}")
    if fuse_auto:
        fuse_max = None
    if variant == AUTO:
        rows_auto = (q_heads // num_kv_heads) * q_len if num_kv_heads >= 1 and q_heads >= 1 else 8
        variant, longest = _auto_choice(kv_lens, num_kv_heads=num_kv_heads, kv_dtype=kv_dtype, mode=mode,
                                        num_ctas=num_ctas, min_tiles=min_tiles, rows=rows_auto)
        if (fuse_max is None and variant in (AUTO_FINE, AUTO_MTP, AUTO_MTP_WG, AUTO_MTP_WG_FINE, AUTO_BF16,
                                             AUTO_BF16_MTP)
                and longest <= AUTO_FUSE_ALL_MAX_CHUNKS):
            fuse_max = FUSE_ALL
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} unsupported by the SM90 kernel (supported: {HEAD_DIMS}; 64/256 are "
                         "reference-only)")
    if num_kv_heads < 1 or q_heads < 1 or q_heads % num_kv_heads != 0:
        raise ValueError(f"q_heads ({q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    if q_heads // num_kv_heads not in GQA_RATIOS:
        raise ValueError(f"GQA ratio {q_heads // num_kv_heads} unsupported (supported: {GQA_RATIOS})")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in 1..{MAX_Q_LEN}, got {q_len}")
    if min_tiles < 1:
        raise ValueError(f"min_tiles must be >= 1, got {min_tiles}")
    batch = kv_lens.shape[0]
    if batch == 0:
        raise ValueError("kv_lens is empty (batch 0): nothing to plan")
    max_batch = batch if max_batch is None else int(max_batch)
    if batch > max_batch:
        raise ValueError(f"kv_lens has batch {batch} > max_batch {max_batch}")
    dev = kv_lens.device
    if num_ctas is None:
        num_ctas = torch.cuda.get_device_properties(dev).multi_processor_count * ctas_per_sm(variant)
    if num_ctas < 1:
        raise ValueError(f"num_ctas must be >= 1, got {num_ctas}")
    H = int(num_kv_heads)
    rows = (q_heads // H) * q_len
    splits, ct = 1, 0
    if mode == "static_count":
        splits = int(num_splits) if num_splits is not None else max(1, _cdiv(num_ctas, batch * H))
        if splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {splits}")
    elif mode in ("static_chunk", "batch_invariant"):
        ct = int(chunk_tiles) if chunk_tiles is not None else DEFAULT_CHUNK_TILES
        if ct < 1:
            raise ValueError(f"chunk_tiles must be >= 1, got {ct}")
        mx = int(kv_lens.max().item()) if max_kv_len is None else int(max_kv_len)  # static grids: host sizing
        splits = max(1, _cdiv(_cdiv(mx, TILE), ct))
    max_pairs = max_batch * H
    if (fuse_auto and fuse_max is None) or combine_warps == "auto":
        if mode == "dynamic":
            tiles = [_cdiv(max(int(x), 0), TILE) for x in kv_lens.tolist()]
            longest = _longest_chunks(tiles, H, int(num_ctas), min_tiles)
        else:
            longest = splits  # the static grids' chunks per pair
        if fuse_auto and fuse_max is None:
            fuse_max = FUSE_ALL if (mode == "dynamic" and longest <= AUTO_FUSE_ALL_MAX_CHUNKS) else 0
        if combine_warps == "auto":
            combine_warps = 32 if longest > AUTO_COMBINE_WIDE_CHUNKS else DEFAULT_COMBINE_WARPS
    if fuse_max is None:
        fuse_max = DEFAULT_FUSE_MAX
    if fuse_max < 0:
        raise ValueError(f"fuse_max must be >= 0, got {fuse_max}")
    fuse_max = min(int(fuse_max), FUSE_ALL)
    if fuse_max >= FUSE_ALL and mode != "dynamic":
        raise ValueError(f"fuse_max=FUSE_ALL (no combine kernel) needs mode 'dynamic', got {mode!r}")
    if variant not in V3_CONFIGS:
        fuse_max = 0
    slots = (max_pairs + num_ctas) if mode == "dynamic" else max_pairs * splits
    ws_len = workspace_len(num_ctas, max_pairs) if mode == "dynamic" else 8
    p = DecodePlan(mode=mode, num_kv_heads=H, q_heads=int(q_heads), head_dim=head_dim, q_len=q_len,
                   max_batch=max_batch, num_ctas=int(num_ctas), min_tiles=int(min_tiles), splits=splits,
                   chunk_tiles=ct,
                   workspace=torch.full((ws_len,), -1, dtype=torch.int32, device=dev),
                   partial_o=torch.empty((slots, rows, head_dim), dtype=torch.float32, device=dev),
                   partial_lse=torch.empty((slots, rows), dtype=torch.float32, device=dev), device=dev,
                   variant=variant, fuse_max=int(fuse_max),
                   counters=torch.zeros((max_pairs * MAX_ROW_GROUPS,), dtype=torch.int32, device=dev)
                   if fuse_max else None, combine_warps=int(combine_warps), early=early)
    return p.update(kv_lens)


def assign_only(p: DecodePlan) -> None:
    """Re-run the assign kernel on the plan's current lengths (for timing assign alone; dynamic mode only)."""
    if p.mode != "dynamic":
        raise ValueError(f"assign_only needs a dynamic plan, got mode {p.mode!r}")
    p.update(p.kv_lens)


def workspace_numpy(p: DecodePlan) -> np.ndarray:
    """The plan's device task map as a numpy int32 array (synchronizes), to compare with build_task_map()."""
    if p.mode != "dynamic":
        raise ValueError(f"workspace_numpy needs a dynamic plan, got mode {p.mode!r}")
    return p.workspace.cpu().numpy()


# Every tensor the kernels read or write: contiguous, on the plan's device, 16-byte aligned (cp.async / vector I/O).
_KERNEL_OPERAND = dict(contiguous=True, align=16)


def run(p: DecodePlan, q, k_cache, v_cache, block_table, kv_lens, *, q_scale=None, k_scale=None, v_scale=None,
        sm_scale: float | None = None, q_len: int = 1, out=None, check_inputs: bool | None = None,
        stages: str = "all"):
    """One layer of decode attention with the plan's schedule: attention then combine (PDL-chained; p.early: the
    attention kernel prefetches its start-up arrays into L2 before its PDL wait).

    Shape/Dtype: q [batch*q_len, q_heads, 128] bf16, or float8_e4m3fn with q_scale [batch*q_len, q_heads] fp32;
    k_cache, v_cache [num_pages, page_size, H, 128] bf16 (with bf16 q) or float8_e4m3fn with k_scale, v_scale
    fp32 [1]; block_table [batch, max_pages] int32; kv_lens [batch] int32 (the tensor the plan was built /
    updated with); out [batch*q_len, q_heads, 128] bf16 (allocated if None). Returns out.
    check_inputs (default: True unless a CUDA graph is being captured) also reads kv_lens and the block table on
    the host to reject a too-short block table or out-of-range pages; without it the kernel clamps (zero-fills)
    instead of faulting.
    stages (for profiling the parts of a step): "all" (default), "attention" (the attention kernel only: rows of
    pairs split into several chunks are left unwritten in out) or "combine" (the combine kernel only: merges the
    partials the previous "all"/"attention" launch on this plan left into out; rows of single-chunk pairs are not
    written, so pass that launch's out to get its full result).
    Raises TypeError/ValueError naming the argument for wrong dtype/device/shape/contiguity, unsupported
    head_dim/page size/q_len/GQA ratio, q_heads not a multiple of H, batch != the plan's batch.
    """
    torch = _torch()
    if not isinstance(p, DecodePlan):
        raise TypeError(f"p must be a DecodePlan from plan(), got {type(p).__name__}")
    if stages not in ("all", "attention", "combine"):
        raise ValueError(f"stages must be 'all', 'attention' or 'combine', got {stages!r}")
    dev = p.device
    fp8 = isinstance(k_cache, torch.Tensor) and k_cache.dtype == _fp8()
    kv_types = (torch.bfloat16, _fp8())
    expect_tensor(k_cache, "k_cache", dtype=kv_types, ndim=4, device=dev, **_KERNEL_OPERAND)
    expect_tensor(v_cache, "v_cache", dtype=k_cache.dtype, ndim=4, device=dev, why=" (k_cache's)", **_KERNEL_OPERAND)
    expect_tensor(q, "q", dtype=_fp8() if fp8 else torch.bfloat16, ndim=3, device=dev, why=" (as the KV cache)",
                  **_KERNEL_OPERAND)
    expect_tensor(block_table, "block_table", dtype=torch.int32, ndim=2, device=dev, **_KERNEL_OPERAND)
    _check_lens(kv_lens, dev)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    num_pages, page_size, H, D = k_cache.shape
    if H != p.num_kv_heads:
        raise ValueError(f"k_cache has {H} kv heads but the plan has num_kv_heads={p.num_kv_heads}")
    if D not in HEAD_DIMS or D != p.head_dim:
        raise ValueError(f"head_dim {D} unsupported (kernel supports {HEAD_DIMS}; plan has {p.head_dim})")
    if page_size not in PAGE_SIZES:
        raise ValueError(f"page_size {page_size} unsupported (supported: {PAGE_SIZES})")
    if not 1 <= q_len <= p.q_len:
        raise ValueError(f"q_len must be in 1..{p.q_len} (the plan's q_len), got {q_len}")
    batch = kv_lens.shape[0]
    if batch != p.batch or (p.kv_lens is not None and kv_lens.data_ptr() != p.kv_lens.data_ptr()):
        raise ValueError("kv_lens must be the tensor the plan was built/updated with (batch "
                         f"{batch} vs plan batch {p.batch}); call plan.update(kv_lens) first")
    tokens, q_heads, qd = q.shape
    if q_heads != p.q_heads or q_heads % H:
        raise ValueError(f"q has {q_heads} heads; the plan has q_heads={p.q_heads} (a multiple of H={H})")
    if qd != D:
        raise ValueError(f"q head_dim {qd} must equal the cache head_dim {D}")
    if tokens != batch * q_len:
        raise ValueError(f"q has {tokens} tokens; expected batch*q_len = {batch}*{q_len}")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [batch={batch}, max_pages], got {tuple(block_table.shape)}")
    if fp8:
        if q_scale is None or k_scale is None or v_scale is None:
            raise ValueError("the FP8 path needs q_scale [batch*q_len, q_heads], k_scale [1], v_scale [1] (fp32)")
        expect_tensor(q_scale, "q_scale", dtype=torch.float32, ndim=2, device=dev, **_KERNEL_OPERAND)
        if tuple(q_scale.shape) != (tokens, q_heads):
            raise ValueError(f"q_scale must be [{tokens}, {q_heads}], got {tuple(q_scale.shape)}")
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            expect_tensor(s, name, dtype=torch.float32, ndim=1, device=dev, **_KERNEL_OPERAND)
            if s.numel() != 1:
                raise ValueError(f"{name} must have shape [1], got {tuple(s.shape)}")
    elif q_scale is not None or k_scale is not None or v_scale is not None:
        raise ValueError("q_scale/k_scale/v_scale are only for the FP8 path (the cache is bf16)")
    if out is None:
        out = torch.empty((tokens, q_heads, D), dtype=torch.bfloat16, device=dev)
    else:
        expect_tensor(out, "out", dtype=torch.bfloat16, ndim=3, device=dev, **_KERNEL_OPERAND)
        if tuple(out.shape) != (tokens, q_heads, D):
            raise ValueError(f"out must be [{tokens}, {q_heads}, {D}], got {tuple(out.shape)}")
    if check_inputs is None:
        check_inputs = not _is_capturing()
    if check_inputs:
        lens = kv_lens.tolist()
        if min(lens) < 0:
            raise ValueError(f"kv_lens must be >= 0, got {min(lens)}")
        need = max(_cdiv(L, page_size) for L in lens)
        if need > block_table.shape[1]:
            r = int(np.argmax(lens))
            raise ValueError(f"block_table too short: kv_lens[{r}] = {lens[r]} needs {need} pages of {page_size} "
                             f"but block_table has {block_table.shape[1]} columns")
        bt = block_table.cpu()
        for r, L in enumerate(lens):
            n = _cdiv(L, page_size)
            if n and (int(bt[r, :n].min()) < 0 or int(bt[r, :n].max()) >= num_pages):
                raise ValueError(f"block_table[{r}, :{n}] holds a page index outside [0, {num_pages})")
        if p.mode != "dynamic":
            mx = max(_cdiv(L, TILE) for L in lens)
            if p.mode == "static_chunk" or p.mode == "batch_invariant":
                if _cdiv(mx, p.chunk_tiles) > p.splits:
                    raise ValueError(f"kv_lens max {max(lens)} exceeds the static plan's max_kv_len "
                                     f"({p.splits * p.chunk_tiles * TILE}); re-plan")
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    lib = _load()
    mode = _MODE_CODE[p.mode]
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    with torch.cuda.device(dev):
        s = stream_ptr(dev)
        args = (q.data_ptr(), ptr(q_scale), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
                kv_lens.data_ptr(), ptr(k_scale), ptr(v_scale), out.data_ptr(), p.partial_o.data_ptr(),
                p.partial_lse.data_ptr(), p.workspace.data_ptr(), scale, batch, H, q_heads, q_len, page_size,
                block_table.shape[1], num_pages, p.num_ctas, p.max_pairs, mode, p.splits, p.chunk_tiles, int(fp8), 1, s)
        # the fused merge is the transposed layout's: off where this dtype / row count runs the row layout
        fuse = p.fuse_max if (p.fuse_max and runs_transposed(p.variant, fp8=fp8, rows=(q_heads // H) * q_len)) else 0
        if stages != "combine":
            code = lib.hp_decode_attention(*args, CONFIGS[p.variant], ptr(p.counters), fuse, int(bool(p.early)))
            check_status(code, f"split_kv_decode attention (variant={p.variant}, mode={p.mode}, batch={batch}, "
                               f"q_heads={q_heads}, kv_heads={H}, q_len={q_len}, page_size={page_size})")
        if stages == "attention" or fuse >= FUSE_ALL:  # fuse-all: the attention kernel wrote every row
            return out
        # the v3 variants run the online combine (which also skips v3's fused pairs), v2 the two-pass one; 32 warps
        # exist only in the online form
        online = int(p.variant in ONLINE_COMBINE or p.combine_warps != DEFAULT_COMBINE_WARPS)
        code = lib.hp_decode_combine(kv_lens.data_ptr(), out.data_ptr(), p.partial_o.data_ptr(),
                                     p.partial_lse.data_ptr(), p.workspace.data_ptr(), batch, H, q_heads, q_len,
                                     p.num_ctas, p.max_pairs, mode, p.splits, p.chunk_tiles, 1, s, online, fuse,
                                     p.combine_warps)
        check_status(code, f"split_kv_decode combine (variant={p.variant}, mode={p.mode}, batch={batch}, "
                           f"q_heads={q_heads}, kv_heads={H}, q_len={q_len})")
    return out


def split_kv_decode(q, k_cache, v_cache, block_table, kv_lens, *, q_len: int = 1, q_scale=None, k_scale=None,
                    v_scale=None, sm_scale: float | None = None, out=None, mode: str = "dynamic",
                    num_ctas: int | None = None, min_tiles: int = DEFAULT_MIN_TILES, num_splits: int | None = None,
                    chunk_tiles: int | None = None, variant: str | None = None):
    """plan() + run() in one call (argument names and order as hotpaths.reference.split_kv_decode.split_kv_decode_ref).

    Shape/Dtype: as run(). Returns out [batch*q_len, q_heads, head_dim] bf16.
    Raises TypeError/ValueError as plan() and run().
    """
    torch = _torch()
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        raise ValueError("k_cache must be a 4-D tensor [num_pages, page_size, kv_heads, head_dim]")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q must be a 3-D tensor [batch*q_len, q_heads, head_dim]")
    H, D = k_cache.shape[2], k_cache.shape[3]
    if q.shape[1] % H:
        raise ValueError(f"q_heads ({q.shape[1]}) must be a multiple of kv_heads ({H})")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in 1..{MAX_Q_LEN}, got {q_len}")
    pl = plan(kv_lens, num_kv_heads=H, q_heads=q.shape[1], head_dim=D, num_ctas=num_ctas, min_tiles=min_tiles,
              mode=mode, num_splits=num_splits, chunk_tiles=chunk_tiles, q_len=q_len, variant=variant,
              kv_dtype=k_cache.dtype)
    return run(pl, q, k_cache, v_cache, block_table, kv_lens, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
               sm_scale=sm_scale, q_len=q_len, out=out)


def host_task_map(p: DecodePlan, lens):
    """The host TaskMap (hotpaths.reference.split_kv_decode) describing what plan p computes for lengths `lens`
    (for the emulation): dynamic -> build_task_map, static_count -> static_count_task_map, static_chunk ->
    static_chunk_task_map, batch_invariant -> static_chunk_task_map (same chunks; the grid differs only in order).
    """
    if p.mode == "dynamic":
        return ref.build_task_map(lens, p.num_kv_heads, p.num_ctas, min_tiles=p.min_tiles, max_pairs=p.max_pairs)
    if p.mode == "static_count":
        return ref.static_count_task_map(lens, p.num_kv_heads, p.splits)
    return ref.static_chunk_task_map(lens, p.num_kv_heads, p.chunk_tiles)


def p_dtype_for(kv_fp8: bool):
    """The dtype the kernel rounds P to before the PV product (for split_kv_decode_emulation(p_dtype=...))."""
    torch = _torch()
    return torch.float16 if kv_fp8 else torch.bfloat16

# torch.ops.hotpaths.split_kv_decode (torch.compile / CUDA graphs): registered when this package is imported
from hotpaths.kernels.split_kv_decode import ops as _ops  # noqa: E402

_ops.register(split_kv_decode)
