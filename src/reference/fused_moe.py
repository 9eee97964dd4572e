"""Fused FP8 MoE (one expert layer of a decode step): exact reference, the staged same-precision emulation the SM90
kernels must match, the host routing plan (routing index + per-tile task map) with its pretty-printer, the input
generator for the model shapes and parallel modes, and FLOP/byte counts.

The layer, per token t with top-k expert ids ``topk_ids[t]`` and weights ``topk_weights[t]``:
``out[t] = sum_k w[t,k] * W2[e] (silu(G[e] x[t]) * U[e] x[t]) (+ shared_out[t])`` with ``W13[e] = [G[e]; U[e]]``
(rows 0..I-1 gate, I..2I-1 up). Ids outside the local expert range ``[expert_offset, expert_offset + E)`` (another
rank's experts under expert parallelism) and ids of -1 contribute nothing; duplicate ids within a row count once
per slot.

FP8 formats (e4m3, quantization ``q = e4m3(clamp(v / s, -448, 448))``, round to nearest even):
- ``"pertensor"``: one scale per expert weight (``w13_scale [E]``, ``w2_scale [E]``) and static activation scales
  ``a1_scale [1]`` (x) and ``a2_scale [1]`` (the SiLU-and-mul output).
- ``"block"``: 128x128 weight blocks (``w13_scale [E, ceil(2I/128), ceil(H/128)]``, ``w2_scale [E, ceil(H/128),
  ceil(I/128)]``) and dynamic 1x128 activation groups, ``s = max(amax(group) * fp32(1/448), 1e-12)``. When I is not a
  multiple of 128 (Hy3 TP8: I = 1536 / 8 = 192) the last block along I covers the remainder: two blocks along I,
  the second 64 wide, for both the w2 weight scale and the activation groups of the down GEMM; the gate-up output
  has 2I = 384 rows = 3 full blocks, the third holding up-rows 64..191 (gate and up share no block only when I is a
  multiple of 128; the scale grid is over the stacked [2I, H] weight, whatever I is).

Accumulation model of the emulation: each product of FP8 values is exact in FP32, and a dot product over one
128-wide k-block (or the whole row, per-tensor) is summed exactly (fp64 holds a sum of 4096 such products without
rounding) and rounded once to FP32. The kernel's FP32 tensor-core accumulation differs from that by summation
order only; the emulation is independent of how rows are tiled, so the plan-driven emulation equals the per-token
loop bit for bit (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from hotpaths.reference.common import check_fits, expect_tensor

OP = "fused_moe"
FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
BLOCK = 128          # weight block edge and activation group width (block mode)
GROUP_EPS = 1e-12    # floor of a dynamic group scale (an all-zero group quantizes to zeros)
DIM_MULTIPLE = 64    # hidden and intermediate-per-rank must be multiples of this
MAX_TOPK = 16
SCALE_MODES = ("pertensor", "block")
PAR_MODES = ("tp8ep1", "tp1ep8")
EP_RANKS = 8         # the published parallel modes use 8 GPUs
HEADER_LEN = 8

# experts, topk, hidden, intermediate (whole model; TP8 splits the intermediate, EP8 the experts)
MODELS = {
    "hy3": dict(experts=192, topk=8, hidden=4096, inter=1536),
    "qwen3-235b": dict(experts=128, topk=8, hidden=4096, inter=1536),
    "dsv3": dict(experts=256, topk=8, hidden=7168, inter=2048),
}
ROUTINGS = ("random", "one_expert", "hot_expert", "duplicates", "skip", "half_experts")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (b > 0)."""
    return -(-a // b)


# ----------------------------------------------------------------------------------------------------------------
# FP8 quantization
# ----------------------------------------------------------------------------------------------------------------

def quant_fp8(v: torch.Tensor, s) -> torch.Tensor:
    """``e4m3(clamp(v / s, -448, 448))`` in FP32 arithmetic, round to nearest even.

    v: any float tensor. s: a Python float or an FP32 tensor broadcastable to v. Returns float8_e4m3fn, v's shape.
    """
    return (v.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def e4m3_steps(got: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """Elementwise distance of ``got`` from ``exp`` in e4m3 steps of exp's binade (a step is 1/8 of the binade's
    lower bound; below the smallest normal, 2**-6, the subnormal step 2**-9): 1 where two quantizations of the same
    value differ by one rounding, 0 where they agree.

    got, exp: float8_e4m3fn or float tensors of e4m3 values, one shape. Returns FP32 of that shape."""
    g, e = got.float(), exp.float()
    step = torch.exp2(torch.floor(torch.log2(e.abs().clamp(min=2.0 ** -6))) - 3)
    return (g - e).abs() / step


def group_scales(v: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    """Dynamic 1xgroup scales along the last dim: ``max(amax(group) / 448, 1e-12)``; the last group is partial when
    the width is not a multiple of ``group``.

    v: [N, D] float. Returns FP32 [N, ceil(D/group)].
    """
    n, d = v.shape
    ng = cdiv(d, group)
    pad = ng * group - d
    a = v.float().abs()
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))  # zeros never raise an amax
    amax = a.reshape(n, ng, group).amax(dim=2)
    # amax * fp32(1/448), not amax / 448: the same rounding on every device (torch turns a division by a Python
    # float into this multiply on CUDA, not on CPU) and the one the kernels compute
    return torch.clamp(amax * (1.0 / FP8_MAX), min=GROUP_EPS)


def expand_groups(s: torch.Tensor, width: int, group: int = BLOCK) -> torch.Tensor:
    """Scales [..., ceil(width/group)] -> [..., width] (each group's scale repeated over its columns)."""
    return s.repeat_interleave(group, dim=-1)[..., :width]


def quant_groups(v: torch.Tensor, group: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic 1xgroup FP8 quantization of v [N, D]: returns (q fp8 [N, D], scales FP32 [N, ceil(D/group)])."""
    s = group_scales(v, group)
    return quant_fp8(v, expand_groups(s, v.shape[1], group)), s


def block_scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """Shape of the 128x128 block-scale grid of a [rows, cols] weight (last blocks partial)."""
    return cdiv(rows, BLOCK), cdiv(cols, BLOCK)


def quantize_weight(w: torch.Tensor, scales: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize one expert's weight w [N, K] (float) from its amax: per-tensor -> (fp8 [N, K], FP32 scalar tensor);
    block -> (fp8 [N, K], FP32 [ceil(N/128), ceil(K/128)]). Raises ValueError for a ``scales`` outside SCALE_MODES."""
    if scales not in SCALE_MODES:
        raise ValueError(f"scales: expected one of {SCALE_MODES}, got {scales!r}")
    if scales == "pertensor":
        s = torch.clamp(w.float().abs().amax() / FP8_MAX, min=GROUP_EPS)
        return quant_fp8(w, s), s
    n, k = w.shape
    bn, bk = block_scale_shape(n, k)
    a = torch.nn.functional.pad(w.float().abs(), (0, bk * BLOCK - k, 0, bn * BLOCK - n))
    s = torch.clamp(a.reshape(bn, BLOCK, bk, BLOCK).amax(dim=(1, 3)) / FP8_MAX, min=GROUP_EPS)
    full = s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return quant_fp8(w, full), s


def dequant_weight(w: torch.Tensor, scale: torch.Tensor, *, dtype=torch.float64) -> torch.Tensor:
    """One expert's FP8 weight w [N, K] times its scale (a scalar tensor, or a [ceil(N/128), ceil(K/128)] grid)."""
    wf = w.to(dtype)
    if scale.dim() == 0 or scale.numel() == 1:
        return wf * scale.to(dtype).reshape(())
    n, k = w.shape
    return wf * scale.to(dtype).repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoEDims:
    tokens: int
    hidden: int
    topk: int
    experts: int
    inter: int


def validate_moe_args(x, topk_ids, topk_weights, w13, w2, *, scales, w13_scale, w2_scale, a1_scale=None,
                      a2_scale=None, expert_offset: int = 0, shared_out=None, check_ids: bool = True) -> MoEDims:
    """Check every argument of the fused MoE (reference, emulation and kernel share this) and return the sizes.

    Shape/Dtype: x [T, H] bf16; topk_ids [T, K] int32; topk_weights [T, K] fp32; w13 [E, 2I, H] fp8 e4m3;
    w2 [E, H, I] fp8 e4m3; pertensor: w13_scale [E], w2_scale [E], a1_scale [1], a2_scale [1] fp32;
    block: w13_scale [E, ceil(2I/128), ceil(H/128)], w2_scale [E, ceil(H/128), ceil(I/128)] fp32 (a1/a2 None);
    shared_out [T, H] bf16 or None. H and I multiples of 64, K in 1..16, all on one device.
    check_ids: also reject ids below -1 (reads the ids: a host sync on a GPU tensor).
    Raises TypeError (not a tensor, wrong dtype) or ValueError (shapes, sizes, scale mode, devices, ids).
    """
    if scales not in SCALE_MODES:
        raise ValueError(f"scales: expected one of {SCALE_MODES}, got {scales!r}")
    expect_tensor(x, "x", dtype=torch.bfloat16, ndim=2, layout="[T, H]")
    expect_tensor(topk_ids, "topk_ids", dtype=torch.int32, ndim=2, layout="[T, K]",
                  why=" (global expert ids, -1 = skip)")
    expect_tensor(topk_weights, "topk_weights", dtype=torch.float32, ndim=2, layout="[T, K]")
    expect_tensor(w13, "w13", dtype=FP8_DTYPE, ndim=3, layout="[E, 2I, H]")
    expect_tensor(w2, "w2", dtype=FP8_DTYPE, ndim=3, layout="[E, H, I]")
    t, h = x.shape
    k = topk_ids.shape[1]
    e, two_i, h13 = w13.shape
    i = two_i // 2
    if topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids: expected {t} rows like x, got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights: expected shape {tuple(topk_ids.shape)} like topk_ids, "
                         f"got {tuple(topk_weights.shape)}")
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk_ids: expected 1..{MAX_TOPK} slots per token, got {k}")
    if e < 1:
        raise ValueError("w13: expected at least one expert, got 0")
    if h13 != h:
        raise ValueError(f"w13: expected hidden {h} (x's last dim) as its last dim, got shape {tuple(w13.shape)}")
    if two_i % 2:
        raise ValueError(f"w13: expected an even 2I rows (gate then up), got {two_i}")
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(f"w2: expected shape {(e, h, i)} [E, H, I], got {tuple(w2.shape)}")
    if h % DIM_MULTIPLE or h == 0:
        raise ValueError(f"x: hidden {h} is not a positive multiple of {DIM_MULTIPLE}")
    if i % DIM_MULTIPLE or i == 0:
        raise ValueError(f"w13: intermediate per rank {i} is not a positive multiple of {DIM_MULTIPLE}")
    if not isinstance(expert_offset, (int, np.integer)) or isinstance(expert_offset, bool) or expert_offset < 0:
        raise ValueError(f"expert_offset: expected an integer >= 0, got {expert_offset!r}")
    if scales == "pertensor":
        for name, s, n in (("w13_scale", w13_scale, e), ("w2_scale", w2_scale, e), ("a1_scale", a1_scale, 1),
                           ("a2_scale", a2_scale, 1)):
            if s is None:
                raise ValueError(f"{name}: required for scales='pertensor'")
            expect_tensor(s, name, dtype=torch.float32)
            if s.numel() != n or s.dim() != 1:
                raise ValueError(f"{name}: expected shape ({n},) for scales='pertensor', got {tuple(s.shape)}")
    else:
        want13 = (e, *block_scale_shape(two_i, h))
        want2 = (e, *block_scale_shape(h, i))
        for name, s, want in (("w13_scale", w13_scale, want13), ("w2_scale", w2_scale, want2)):
            if s is None:
                raise ValueError(f"{name}: required for scales='block'")
            expect_tensor(s, name, dtype=torch.float32)
            if tuple(s.shape) != want:
                raise ValueError(f"{name}: expected shape {want} (128x128 blocks) for scales='block', "
                                 f"got {tuple(s.shape)}")
        for name, s in (("a1_scale", a1_scale), ("a2_scale", a2_scale)):
            if s is not None:
                raise ValueError(f"{name}: must be None for scales='block' (activation scales are dynamic 1x128 "
                                 "groups)")
    if shared_out is not None:
        expect_tensor(shared_out, "shared_out", dtype=torch.bfloat16, ndim=2, layout="[T, H]")
        if tuple(shared_out.shape) != (t, h):
            raise ValueError(f"shared_out: expected shape {(t, h)} like x, got {tuple(shared_out.shape)}")
    devs = {a.device for a in (x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, a1_scale, a2_scale,
                                shared_out) if a is not None}
    if len(devs) > 1:
        raise ValueError("x, topk_ids, topk_weights, w13, w2, scales: expected one device, "
                         f"got {sorted(map(str, devs))}")
    if check_ids and topk_ids.numel() and int(topk_ids.min()) < -1:
        raise ValueError(f"topk_ids: ids below -1 are malformed (-1 = skip), got min {int(topk_ids.min())}")
    return MoEDims(t, h, k, e, i)


# ----------------------------------------------------------------------------------------------------------------
# Routing plan: routing index + per-tile task map (host version of what the kernels build on the device)
# ----------------------------------------------------------------------------------------------------------------

def max_tiles_for(num_experts: int, max_pairs: int, block_m: int) -> int:
    """Upper bound on tiles: ceil(max_pairs / block_m) + E (each expert wastes at most one partial tile)."""
    return cdiv(max_pairs, block_m) + num_experts


def workspace_offsets(num_experts: int, max_pairs: int, block_m: int) -> dict:
    """Offsets (in int32 elements) of each field of the plan workspace, and its total length.

    Layout: header[8] | expert_counts[E] | expert_offsets[E+1] | sorted_pairs[max_pairs] | tile_expert[max_tiles]
    | tile_start[max_tiles].
    """
    e = int(num_experts)
    mt = max_tiles_for(e, max_pairs, block_m)
    o = {"header": 0, "expert_counts": HEADER_LEN, "expert_offsets": HEADER_LEN + e,
         "sorted_pairs": HEADER_LEN + 2 * e + 1}
    o["tile_expert"] = o["sorted_pairs"] + max_pairs
    o["tile_start"] = o["tile_expert"] + mt
    o["total"] = o["tile_start"] + mt
    o["max_tiles"] = mt
    return o


def workspace_len(num_experts: int, max_pairs: int, block_m: int) -> int:
    """8 + E + (E+1) + max_pairs + 2 * max_tiles int32 elements."""
    return workspace_offsets(num_experts, max_pairs, block_m)["total"]


class PlanSize:
    """What a routing plan's workspace is sized for, shared by this module's ``RoutingPlan`` and the kernels'
    ``MoEPlan``: ``max_tokens`` tokens of ``topk`` (expert, weight) pairs each (both set by the subclass)."""

    @property
    def max_pairs(self) -> int:
        return self.max_tokens * self.topk


@dataclass
class RoutingPlan(PlanSize):
    """The routing index and tile map of one routing ``topk_ids`` (numpy int32), in the device layout.

    ``workspace`` is the one int32 array the kernels read (see ``workspace_offsets``); the properties are views
    into it. Header: [0] valid pairs, [1] tiles, [2] experts hit, [3] block_m, [4..7] 0.
    """
    workspace: np.ndarray
    num_experts: int
    expert_offset: int
    num_tokens: int
    max_tokens: int
    topk: int
    block_m: int

    @property
    def offsets(self) -> dict:
        return workspace_offsets(self.num_experts, self.max_pairs, self.block_m)

    def _field(self, name: str, n: int) -> np.ndarray:
        o = self.offsets[name]
        return self.workspace[o:o + n]

    @property
    def header(self) -> np.ndarray:
        return self._field("header", HEADER_LEN)

    @property
    def num_valid(self) -> int:
        return int(self.header[0])

    @property
    def num_tiles(self) -> int:
        return int(self.header[1])

    @property
    def experts_hit(self) -> int:
        return int(self.header[2])

    @property
    def expert_counts(self) -> np.ndarray:
        return self._field("expert_counts", self.num_experts)

    @property
    def expert_offsets(self) -> np.ndarray:
        return self._field("expert_offsets", self.num_experts + 1)

    @property
    def sorted_pairs(self) -> np.ndarray:
        return self._field("sorted_pairs", self.max_pairs)

    @property
    def tile_expert(self) -> np.ndarray:
        return self._field("tile_expert", self.offsets["max_tiles"])

    @property
    def tile_start(self) -> np.ndarray:
        return self._field("tile_start", self.offsets["max_tiles"])

    def tile_rows(self) -> np.ndarray:
        """Rows of each valid tile: min(block_m, offsets[e+1] - start)."""
        n = self.num_tiles
        e, s = self.tile_expert[:n], self.tile_start[:n]
        return np.minimum(self.block_m, self.expert_offsets[e + 1] - s).astype(np.int32)

    def tiles(self):
        """[(tile, local expert, start, rows)] for the valid tiles."""
        rows = self.tile_rows()
        return [(j, int(self.tile_expert[j]), int(self.tile_start[j]), int(rows[j])) for j in range(self.num_tiles)]


def _ids_numpy(topk_ids) -> np.ndarray:
    if isinstance(topk_ids, torch.Tensor):
        if topk_ids.dtype != torch.int32:
            raise TypeError(f"topk_ids: expected dtype torch.int32, got {topk_ids.dtype}")
        if topk_ids.dim() != 2:
            raise ValueError(f"topk_ids: expected a 2-D [T, K] tensor, got shape {tuple(topk_ids.shape)}")
        return topk_ids.detach().cpu().numpy()
    if isinstance(topk_ids, np.ndarray):
        if topk_ids.dtype != np.int32:
            raise TypeError(f"topk_ids: expected dtype int32, got {topk_ids.dtype}")
        if topk_ids.ndim != 2:
            raise ValueError(f"topk_ids: expected a 2-D [T, K] array, got shape {topk_ids.shape}")
        return topk_ids
    raise TypeError(f"topk_ids: expected a torch.Tensor or numpy array, got {type(topk_ids).__name__}")


def build_routing_plan(topk_ids, *, num_experts: int, expert_offset: int = 0, max_tokens: int | None = None,
                       block_m: int = 16) -> RoutingPlan:
    """Host routing index and tile map of a routing, in the device workspace layout.

    topk_ids: [T, K] int32 (torch or numpy), global ids; -1 and ids outside [expert_offset, expert_offset + E) are
    not placed. Pairs p = t*K + k are grouped by local expert in expert order, in increasing p within an expert;
    tiles of up to block_m rows cover each expert's range, in expert order then start order. max_tokens (>= T,
    default T) sizes the workspace so one plan buffer serves every token count up to it.
    Raises TypeError/ValueError on a wrong dtype, shape, T > max_tokens, K outside 1..16, or bad sizes.
    """
    ids = _ids_numpy(topk_ids)
    t, k = ids.shape
    if not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise ValueError(f"num_experts: expected an integer >= 1, got {num_experts!r}")
    if not isinstance(block_m, (int, np.integer)) or block_m < 1:
        raise ValueError(f"block_m: expected an integer >= 1, got {block_m!r}")
    if not isinstance(expert_offset, (int, np.integer)) or expert_offset < 0:
        raise ValueError(f"expert_offset: expected an integer >= 0, got {expert_offset!r}")
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk_ids: expected 1..{MAX_TOPK} slots per token, got {k}")
    max_tokens = t if max_tokens is None else max_tokens
    if not isinstance(max_tokens, (int, np.integer)) or max_tokens < t:
        raise ValueError(f"max_tokens: expected an integer >= the {t} tokens of topk_ids, got {max_tokens!r}")
    e = int(num_experts)
    max_pairs = int(max_tokens) * k
    off = workspace_offsets(e, max_pairs, block_m)
    ws = np.zeros(off["total"], dtype=np.int32)
    local = ids.reshape(-1).astype(np.int64) - expert_offset
    valid = (local >= 0) & (local < e)
    pairs = np.nonzero(valid)[0]
    experts = local[pairs]
    order = np.argsort(experts, kind="stable")  # stable: increasing p within an expert
    sorted_pairs = pairs[order]
    counts = np.bincount(experts, minlength=e)[:e]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    tile_e, tile_s = [], []
    for ex in np.nonzero(counts)[0]:
        for s in range(int(offsets[ex]), int(offsets[ex + 1]), block_m):
            tile_e.append(ex)
            tile_s.append(s)
    nv, nt = len(pairs), len(tile_e)
    ws[0:4] = (nv, nt, int((counts > 0).sum()), block_m)
    ws[off["expert_counts"]:off["expert_counts"] + e] = counts
    ws[off["expert_offsets"]:off["expert_offsets"] + e + 1] = offsets
    sp = ws[off["sorted_pairs"]:off["sorted_pairs"] + max_pairs]
    sp[:] = -1
    sp[:nv] = sorted_pairs
    te = ws[off["tile_expert"]:off["tile_expert"] + off["max_tiles"]]
    ts = ws[off["tile_start"]:off["tile_start"] + off["max_tiles"]]
    te[:] = -1
    ts[:] = -1
    te[:nt] = tile_e
    ts[:nt] = tile_s
    return RoutingPlan(ws, e, int(expert_offset), t, int(max_tokens), k, int(block_m))


def check_plan(plan: RoutingPlan, topk_ids) -> list[str]:
    """The plan's invariants against its routing; returns the violations (empty = valid). Every valid (token, slot)
    placed once, ranges contiguous and in expert order, increasing p within an expert, the tile map covering each
    expert's rows exactly once, padding entries -1. topk_ids: integer [T, K] (tensor or array), the routing the plan
    was built from."""
    ids = _ids_numpy(topk_ids).reshape(-1).astype(np.int64) - plan.expert_offset
    e = plan.num_experts
    bad = []
    valid_p = np.nonzero((ids >= 0) & (ids < e))[0]
    nv = plan.num_valid
    if nv != len(valid_p):
        bad.append(f"header valid pairs {nv}, routing has {len(valid_p)}")
    sp = plan.sorted_pairs
    placed = sp[:nv]
    if sorted(placed.tolist()) != valid_p.tolist():
        bad.append("sorted_pairs is not a permutation of the valid pairs")
    if (sp[nv:] != -1).any():
        bad.append("sorted_pairs entries past the valid pairs are not -1")
    cnt, offs = plan.expert_counts, plan.expert_offsets
    if offs[0] != 0 or (np.diff(offs) != cnt).any() or offs[e] != nv:
        bad.append("expert_offsets is not the exclusive prefix sum of expert_counts ending at the valid pairs")
    for ex in range(e):
        seg = placed[offs[ex]:offs[ex + 1]] if not bad else np.array([], dtype=np.int64)
        if len(seg) and ((ids[seg] != ex).any() or (np.diff(seg) <= 0).any()):
            bad.append(f"expert {ex}: range holds other experts' pairs or is not in increasing p")
            break
    if plan.experts_hit != int((cnt > 0).sum()):
        bad.append("header experts hit differs from the counts")
    covered = np.zeros(nv, dtype=np.int64)
    nt = plan.num_tiles
    prev = (-1, -1)
    for j, ex, start, rows in plan.tiles():
        if not (0 <= ex < e) or rows < 1 or rows > plan.block_m or start < offs[ex] or start + rows > offs[ex + 1]:
            bad.append(f"tile {j}: expert {ex} start {start} rows {rows} outside the expert's range")
            break
        if (ex, start) <= prev:
            bad.append(f"tile {j}: not in expert order then start order")
        prev = (ex, start)
        covered[start:start + rows] += 1
    if (covered != 1).any():
        bad.append("the tile map does not cover every placed row exactly once")
    if (plan.tile_expert[nt:] != -1).any() or (plan.tile_start[nt:] != -1).any():
        bad.append("tile entries past num_tiles are not -1")
    return bad


def format_plan(plan: RoutingPlan, *, max_experts: int = 16, max_tiles: int = 24) -> str:
    """A readable summary: header, experts hit with their rows and ranges, and the tile map."""
    cnt, offs = plan.expert_counts, plan.expert_offsets
    hit = np.nonzero(cnt)[0]
    lines = [f"RoutingPlan: {plan.num_tokens} tokens (max {plan.max_tokens}) x top-{plan.topk}, local experts "
             f"{plan.expert_offset}..{plan.expert_offset + plan.num_experts - 1}, block_m {plan.block_m}",
             f"  valid pairs {plan.num_valid} of {plan.num_tokens * plan.topk}, experts hit {plan.experts_hit}/"
             f"{plan.num_experts}, tiles {plan.num_tiles} (max {plan.offsets['max_tiles']}), "
             f"workspace {plan.workspace.size} int32"]
    if len(hit):
        lines.append(f"  rows per expert: min {cnt[hit].min()}, max {cnt[hit].max()}, mean {cnt[hit].mean():.2f}")
    sp = plan.sorted_pairs
    for ex in hit[:max_experts]:
        seg = sp[offs[ex]:offs[ex + 1]]
        shown = ", ".join(f"t{p // plan.topk}.{p % plan.topk}" for p in seg[:6]) + (" ..." if len(seg) > 6 else "")
        lines.append(f"  expert {plan.expert_offset + ex:>4} (local {ex:>3}): rows [{offs[ex]}, {offs[ex + 1]}) "
                     f"= {cnt[ex]:>3} pairs: {shown}")
    if len(hit) > max_experts:
        lines.append(f"  ... {len(hit) - max_experts} more experts")
    tl = plan.tiles()
    lines.append("  tiles (expert:start+rows): " + " ".join(f"{ex}:{s}+{r}" for _, ex, s, r in tl[:max_tiles])
                 + (f" ... ({len(tl) - max_tiles} more)" if len(tl) > max_tiles else ""))
    return "\n".join(lines)


def persistent_schedule(plan: RoutingPlan, num_ctas: int) -> np.ndarray:
    """Rows each CTA of a persistent grid of ``num_ctas`` computes when it takes tiles j, j+num_ctas, ... (the
    static strided order a persistent kernel walks). Returns int64 [num_ctas] (padded rows of a partial tile not
    counted)."""
    if num_ctas < 1:
        raise ValueError(f"num_ctas: expected >= 1, got {num_ctas}")
    rows = plan.tile_rows().astype(np.int64)
    load = np.zeros(num_ctas, dtype=np.int64)
    np.add.at(load, np.arange(len(rows)) % num_ctas, rows)
    return load


def step_ranges(units: int, kt_count: int, ctas: int, *, split: bool, min_steps: int = 8) -> np.ndarray:
    """Host mirror of the warp-specialized GEMM's work split (expert_wgmma.cu, WsWork): the launch's units (tile,
    n-tile), each of ``kt_count`` K stages, make S = units x kt_count steps in tile-major order; CTA c takes
    [c S / G, (c + 1) S / G) when units may be cut (``split``; G = min(ctas, S // min_steps), at least 1), else
    the unit boundaries [floor(c U / G) kt, floor((c + 1) U / G) kt) with G = ctas. Returns int64 [ctas, 2] of
    (first, end) steps; CTAs past G get empty ranges. Raises ValueError on negative sizes or ctas < 1."""
    if units < 0 or kt_count < 1 or ctas < 1 or min_steps < 1:
        raise ValueError(f"units >= 0, kt_count >= 1, ctas >= 1, min_steps >= 1 expected, got {units}, {kt_count}, "
                         f"{ctas}, {min_steps}")
    s = units * kt_count
    g = max(1, min(ctas, s // min_steps)) if split else ctas
    c = np.arange(g + 1, dtype=np.int64)
    starts = c * s // g if split else (c * units // g) * kt_count
    out = np.zeros((ctas, 2), dtype=np.int64)
    out[:g, 0], out[:g, 1] = starts[:-1], starts[1:]
    return out


def cut_units(ranges: np.ndarray, kt_count: int) -> dict[int, list[int]]:
    """The units a ``step_ranges`` split cuts: {unit: [finisher CTA (holds the unit's first step), then the CTAs
    whose ranges start inside it, in order: each leaves one partial the finisher adds]}."""
    out: dict[int, list[int]] = {}
    for cta, (a, b) in enumerate(ranges):
        if b > a and a % kt_count:  # a range that starts inside a unit holds a later piece of it
            out.setdefault(int(a // kt_count), []).append(cta)
    for unit, writers in out.items():
        first = unit * kt_count
        finisher = int(np.nonzero((ranges[:, 0] <= first) & (ranges[:, 1] > first))[0][0])
        writers.insert(0, finisher)
    return out


# ----------------------------------------------------------------------------------------------------------------
# The staged emulation (what the kernels must match) and the exact reference
# ----------------------------------------------------------------------------------------------------------------

def _exact_dot(a8: torch.Tensor, w8: torch.Tensor) -> torch.Tensor:
    """a8 [R, K] x w8 [N, K]^T of FP8 values, summed exactly (fp64) and rounded once to FP32."""
    w = w8 if w8.dtype == torch.float64 else w8.double()
    return (a8.double() @ w.T).float()


def scaled_gemm(a8: torch.Tensor, a_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                scales: str) -> torch.Tensor:
    """The contract's scaled GEMM, one stage of the emulation (gate-up or down of one expert): FP32
    ``(a8 . w8^T) * scales``. pertensor: a_scale, w_scale FP32 scalars, one scale after the whole sum. block: a_scale
    [R, ceil(K/128)] groups, w_scale [ceil(N/128), ceil(K/128)]; per 128-wide k-block the exact partial times (a
    group scale * w block scale), accumulated in FP32 in k-block order.
    Shapes: a8 [R, K], w8 [N, K] (FP8 e4m3 or their float values). Returns FP32 [R, N]."""
    if scales == "pertensor":
        return _exact_dot(a8, w8) * (a_scale.reshape(()) * w_scale.reshape(()))
    r, k = a8.shape
    n = w8.shape[0]
    acc = torch.zeros(r, n, dtype=torch.float32, device=a8.device)
    for kb in range(cdiv(k, BLOCK)):
        sl = slice(kb * BLOCK, min(k, (kb + 1) * BLOCK))
        part = _exact_dot(a8[:, sl], w8[:, sl])
        s = a_scale[:, kb:kb + 1] * expand_groups(w_scale[:, kb], n)[None, :]
        acc = acc + part * s
    return acc


def grouped_scaled_gemm(a8: torch.Tensor, a_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                        scales: str, counts) -> torch.Tensor:
    """``scaled_gemm`` per expert over an expert-contiguous activation buffer (the grouped GEMM of the unfused
    pipeline, and the down GEMM the fuzzer runs on the kernel's aq): rows ``[start, start + counts[e])`` of a8 use
    expert e's weights, in expert order.
    Shapes: a8 [P, K] (FP8 values, sorted by expert); a_scale an FP32 scalar (pertensor) or [P, ceil(K/128)]
    (block); w8 [E, N, K]; w_scale [E] or [E, ceil(N/128), ceil(K/128)]; counts E ints summing to P. Returns FP32
    [P, N]."""
    out = torch.zeros(a8.shape[0], w8.shape[1], dtype=torch.float32, device=a8.device)
    start = 0
    for ex, n in enumerate(int(c) for c in counts):
        if n:
            sl = slice(start, start + n)
            out[sl] = scaled_gemm(a8[sl], a_scale if scales == "pertensor" else a_scale[sl], w8[ex], w_scale[ex],
                                  scales)
            start += n
    return out


def silu_mul(h: torch.Tensor, inter: int) -> torch.Tensor:
    """bf16(silu(g) * u) from h = [g | u] FP32 [R, 2I] (SiLU in FP32)."""
    g, u = h[:, :inter], h[:, inter:]
    return (g * torch.sigmoid(g) * u).to(torch.bfloat16)


def fused_moe_emulation(x, topk_ids, topk_weights, w13, w2, *, scales: str, w13_scale, w2_scale, a1_scale=None,
                        a2_scale=None, expert_offset: int = 0, shared_out=None, plan: RoutingPlan | None = None,
                        return_stages: bool = False):
    """The staged FP8 MoE exactly as the kernels compute it (up to FP32 summation order), driven by the routing plan:
    1. xq = quant(x) (pertensor: a1_scale; block: dynamic 1x128 groups per token);
    2. per tile of the plan, gate-up reads its tokens through sorted_pairs (no gathered copy of x), h in FP32,
       act = bf16(silu(g) * u); 3. aq = quant(act) (a2_scale, or 1x128 groups along I, the last partial);
    4. y = down GEMM in FP32, ybuf[p] = bf16(y); 5. out[t] = bf16(sum_k w[t,k] * ybuf[t*K+k] in slot order, FP32,
       + shared_out[t]).

    Shape/Dtype: as validate_moe_args; returns bf16 [T, H] (on x's device), or with return_stages a dict with
    ``out``, ``xq`` fp8 [T, H], ``x_scale`` (FP32 [T, ceil(H/128)] or [1]), ``act`` bf16 [T*K, I], ``aq`` fp8
    [T*K, I], ``a_scale``, ``ybuf`` bf16 [T*K, H] (rows of skipped pairs are 0) and ``plan``.
    plan: a RoutingPlan of topk_ids (built here when None; block_m does not change the result).
    Raises TypeError/ValueError on bad input (validate_moe_args), or if plan does not match topk_ids' sizes.
    """
    d = validate_moe_args(x, topk_ids, topk_weights, w13, w2, scales=scales, w13_scale=w13_scale,
                          w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, expert_offset=expert_offset,
                          shared_out=shared_out)
    if plan is None:
        plan = build_routing_plan(topk_ids, num_experts=d.experts, expert_offset=expert_offset)
    elif (plan.num_tokens, plan.topk, plan.num_experts, plan.expert_offset) != (d.tokens, d.topk, d.experts,
                                                                                 expert_offset):
        raise ValueError(f"plan: built for {plan.num_tokens} tokens x top-{plan.topk}, {plan.num_experts} experts "
                         f"at offset {plan.expert_offset}; the call has {d.tokens} x {d.topk}, {d.experts} at "
                         f"{expert_offset}")
    dev = x.device
    t, h, k, i = d.tokens, d.hidden, d.topk, d.inter
    if scales == "pertensor":
        xs = a1_scale.float()
        xq = quant_fp8(x, xs.reshape(()))
    else:
        xq, xs = quant_groups(x)
    npairs = t * k
    act = torch.zeros(npairs, i, dtype=torch.bfloat16, device=dev)
    aq = torch.zeros(npairs, i, dtype=FP8_DTYPE, device=dev)
    a_sc = a2_scale.float() if scales == "pertensor" else torch.zeros(npairs, cdiv(i, BLOCK), device=dev)
    ybuf = torch.zeros(npairs, h, dtype=torch.bfloat16, device=dev)
    sp = torch.from_numpy(plan.sorted_pairs.astype(np.int64)).to(dev)
    cur_e, w13e, w2e = -1, None, None
    for _, ex, start, rows in plan.tiles():
        if ex != cur_e:  # tiles come in expert order: one expert's weights stay resident across its tiles
            cur_e, w13e, w2e = ex, w13[ex].double(), w2[ex].double()  # FP8 values are exact in fp64
        p = sp[start:start + rows]
        tok = torch.div(p, k, rounding_mode="floor")
        if scales == "pertensor":
            hh = scaled_gemm(xq[tok], xs, w13e, w13_scale[ex], scales)
        else:
            hh = scaled_gemm(xq[tok], xs[tok], w13e, w13_scale[ex], scales)
        a = silu_mul(hh, i)
        if scales == "pertensor":
            q = quant_fp8(a, a_sc.reshape(()))
            y = scaled_gemm(q, a_sc, w2e, w2_scale[ex], scales)
        else:
            q, s = quant_groups(a)
            a_sc[p] = s
            y = scaled_gemm(q, s, w2e, w2_scale[ex], scales)
        act[p], aq[p], ybuf[p] = a, q, y.to(torch.bfloat16)
    out = weighted_reduce(ybuf, topk_ids, topk_weights, expert_offset, d.experts, shared_out)
    if return_stages:
        return {"out": out, "xq": xq, "x_scale": xs, "act": act, "aq": aq, "a_scale": a_sc, "ybuf": ybuf,
                "plan": plan}
    return out


def _local_valid(topk_ids, expert_offset: int, num_experts: int) -> torch.Tensor:
    loc = topk_ids.long() - expert_offset
    return (loc >= 0) & (loc < num_experts)


def weighted_reduce(ybuf, topk_ids, topk_weights, expert_offset, num_experts, shared_out):
    """The contract's combine stage: bf16(sum over valid slots in order k = 0..K-1 of w * float(ybuf) in FP32,
    + float(shared_out)). ybuf bf16 [T * K, H] in (token, slot) order; topk_ids int [T, K]; topk_weights fp32
    [T, K]; slots whose id is not one of this rank's experts (expert_offset .. + num_experts) add nothing; shared_out
    bf16 [T, H] or None. Returns bf16 [T, H]."""
    t, k = topk_ids.shape
    valid = _local_valid(topk_ids, expert_offset, num_experts)
    return weighted_slot_sum(ybuf.reshape(t, k, ybuf.shape[1]), valid, topk_weights, shared_out)


def weighted_slot_sum(y, valid, topk_weights, shared_out=None) -> torch.Tensor:
    """The combine the emulation and the EP reference share (one order, so their results match to the bit):
    bf16(sum over slots k = 0..K-1 in that order of w[t, k] * float(y[t, k]) in FP32 where valid[t, k],
    + float(shared_out)).
    Shape/Dtype: y bf16 [T, K, H]; valid bool [T, K]; topk_weights fp32 [T, K]; shared_out bf16 [T, H] or None.
    Returns bf16 [T, H]."""
    t, k, h = y.shape
    acc = torch.zeros(t, h, dtype=torch.float32, device=y.device)
    for kk in range(k):
        wk = torch.where(valid[:, kk], topk_weights[:, kk], torch.zeros_like(topk_weights[:, kk]))
        acc = acc + wk[:, None] * y[:, kk].float()
    if shared_out is not None:
        acc = acc + shared_out.float()
    return acc.to(torch.bfloat16)


def fused_moe_loop(x, topk_ids, topk_weights, w13, w2, *, scales: str, w13_scale, w2_scale, a1_scale=None,
                   a2_scale=None, expert_offset: int = 0, shared_out=None) -> torch.Tensor:
    """The same arithmetic as fused_moe_emulation as a plain loop over tokens and slots (no plan, no grouping): the
    independent check of the plan-driven emulation. Shapes/dtypes and errors as fused_moe_emulation; bf16 [T, H]."""
    d = validate_moe_args(x, topk_ids, topk_weights, w13, w2, scales=scales, w13_scale=w13_scale,
                          w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, expert_offset=expert_offset,
                          shared_out=shared_out)
    out = torch.zeros(d.tokens, d.hidden, dtype=torch.bfloat16, device=x.device)
    for t in range(d.tokens):
        xt = x[t:t + 1]
        if scales == "pertensor":
            xq, xs = quant_fp8(xt, a1_scale.float().reshape(())), a1_scale.float()
        else:
            xq, xs = quant_groups(xt)
        acc = torch.zeros(1, d.hidden, dtype=torch.float32, device=x.device)
        for k in range(d.topk):
            ex = int(topk_ids[t, k]) - expert_offset
            if not 0 <= ex < d.experts:
                continue
            hh = scaled_gemm(xq, xs, w13[ex], w13_scale[ex], scales)
            a = silu_mul(hh, d.inter)
            if scales == "pertensor":
                q, s = quant_fp8(a, a2_scale.float().reshape(())), a2_scale.float()
            else:
                q, s = quant_groups(a)
            y = scaled_gemm(q, s, w2[ex], w2_scale[ex], scales).to(torch.bfloat16)
            acc = acc + topk_weights[t, k] * y.float()
        if shared_out is not None:
            acc = acc + shared_out[t:t + 1].float()
        out[t] = acc.to(torch.bfloat16)[0]
    return out


def fused_moe_unfused(x, topk_ids, topk_weights, w13, w2, *, scales: str, w13_scale, w2_scale, a1_scale=None,
                      a2_scale=None, expert_offset: int = 0, shared_out=None) -> dict:
    """The classic unfused pipeline, stage by stage with every intermediate materialized (what fusion removes):
    route (count + sort), gather x into a per-expert-contiguous buffer, grouped gate-up GEMM, SiLU-and-mul + quant,
    grouped down GEMM, scatter back to pair order, top-k weighted reduce. Same arithmetic as the emulation, so its
    ``out`` equals it bit for bit. Returns a dict: ``out`` bf16 [T, H] and ``buffers`` {name: bytes written} of the
    intermediates that cross HBM between stages. Errors as fused_moe_emulation."""
    d = validate_moe_args(x, topk_ids, topk_weights, w13, w2, scales=scales, w13_scale=w13_scale,
                          w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, expert_offset=expert_offset,
                          shared_out=shared_out)
    k, i, h = d.topk, d.inter, d.hidden
    local = topk_ids.reshape(-1).long() - expert_offset
    valid = torch.nonzero((local >= 0) & (local < d.experts)).flatten()
    order = torch.sort(local[valid], stable=True).indices
    pairs = valid[order]
    counts = torch.bincount(local[pairs], minlength=d.experts) if len(pairs) else torch.zeros(d.experts,
                                                                                            dtype=torch.long)
    if scales == "pertensor":
        xq_all, xs_all = quant_fp8(x, a1_scale.float().reshape(())), a1_scale.float()
    else:
        xq_all, xs_all = quant_groups(x)
    gathered = xq_all[pairs // k]                                  # materialized gather [P, H]
    gs = xs_all if scales == "pertensor" else xs_all[pairs // k]
    hbuf = grouped_scaled_gemm(gathered, gs, w13, w13_scale, scales, counts)
    act = silu_mul(hbuf, i)
    if scales == "pertensor":
        aq, asc = quant_fp8(act, a2_scale.float().reshape(())), a2_scale.float()
    else:
        aq, asc = (quant_groups(act) if len(pairs)
                   else (act.to(FP8_DTYPE), torch.zeros(0, cdiv(i, BLOCK), device=x.device)))
    ysorted = grouped_scaled_gemm(aq, asc, w2, w2_scale, scales, counts).to(torch.bfloat16)
    ybuf = torch.zeros(d.tokens * k, h, dtype=torch.bfloat16, device=x.device)
    ybuf[pairs] = ysorted                                          # scatter back to pair order
    out = weighted_reduce(ybuf, topk_ids, topk_weights, expert_offset, d.experts, shared_out)
    p = len(pairs)
    buffers = {"routing index (int32)": 4 * (p + d.experts + 1), "gathered x (fp8)": p * h,
               "gate-up output (bf16)": 2 * p * 2 * i, "activation (fp8)": p * i,
               "down output (bf16)": 2 * p * h}
    return {"out": out, "buffers": buffers}


def fused_moe_ref(x, topk_ids, topk_weights, w13, w2, *, scales: str, w13_scale, w2_scale, a1_scale=None,
                  a2_scale=None, expert_offset: int = 0, shared_out=None, fp8_input: bool = False) -> torch.Tensor:
    """Exact MoE in fp64: the UNquantized x through the dequantized FP8 weights (w * scale), silu(g) * u, down,
    top-k weighted sum (+ shared_out). What "error vs exact" measures: activation quantization, the bf16 roundings
    and accumulation all count as error. fp8_input=True starts from x already through stage 1's FP8 quantization
    (a1_scale, or 1x128 groups), as a caller that hands the layer FP8 activations sees it: the form of the
    published error figures (measured: cosine 0.99965 / max rel 0.026 at Hy3 TP8, against 0.9990 / 0.043 from the
    bf16 x). Shapes/dtypes and errors as fused_moe_emulation (a2_scale is checked but unused); returns float64
    [T, H] on x's device."""
    d = validate_moe_args(x, topk_ids, topk_weights, w13, w2, scales=scales, w13_scale=w13_scale,
                          w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, expert_offset=expert_offset,
                          shared_out=shared_out)
    if fp8_input:
        if scales == "pertensor":
            x = quant_fp8(x, a1_scale.float().reshape(())).double() * a1_scale.double()
        else:
            q, s = quant_groups(x)
            x = q.double() * expand_groups(s.double(), d.hidden)
    out = torch.zeros(d.tokens, d.hidden, dtype=torch.float64, device=x.device)
    if shared_out is not None:
        out += shared_out.double()
    loc = topk_ids.long() - expert_offset
    valid = _local_valid(topk_ids, expert_offset, d.experts)
    xd = x.double()
    for ex in torch.unique(loc[valid]).tolist():
        t_idx, k_idx = torch.nonzero(valid & (loc == ex), as_tuple=True)
        sc13 = w13_scale[ex] if scales == "block" else w13_scale[ex].reshape(())
        sc2 = w2_scale[ex] if scales == "block" else w2_scale[ex].reshape(())
        hh = xd[t_idx] @ dequant_weight(w13[ex], sc13).T
        g, u = hh[:, :d.inter], hh[:, d.inter:]
        y = (g * torch.sigmoid(g) * u) @ dequant_weight(w2[ex], sc2).T
        out.index_add_(0, t_idx, topk_weights[t_idx, k_idx].double()[:, None] * y)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Inputs, counts
# ----------------------------------------------------------------------------------------------------------------

def model_dims(model: str = "hy3", mode: str = "tp8ep1", *, experts=None, topk=None, hidden=None, inter=None) -> dict:
    """Per-rank sizes of a model in a parallel mode: tp8ep1 keeps every expert with inter/8 per rank; tp1ep8 keeps
    experts/8 with the full inter. Flags override the model's whole-model sizes. Returns experts_total, experts
    (local), topk, hidden, inter (per rank). Raises ValueError on an unknown model/mode or unsupported sizes."""
    if model not in MODELS:
        raise ValueError(f"model: expected one of {sorted(MODELS)}, got {model!r}")
    if mode not in PAR_MODES:
        raise ValueError(f"mode: expected one of {PAR_MODES}, got {mode!r}")
    m = dict(MODELS[model])
    for key, v in (("experts", experts), ("topk", topk), ("hidden", hidden), ("inter", inter)):
        if v is not None:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{key}: expected a positive integer, got {v!r}")
            m[key] = int(v)
    if not 1 <= m["topk"] <= MAX_TOPK:
        raise ValueError(f"topk: expected 1..{MAX_TOPK}, got {m['topk']}")
    if m["hidden"] % DIM_MULTIPLE:
        raise ValueError(f"hidden: {m['hidden']} is not a multiple of {DIM_MULTIPLE}")
    if mode == "tp8ep1":
        if m["inter"] % (EP_RANKS * DIM_MULTIPLE):
            raise ValueError(f"inter: {m['inter']} / {EP_RANKS} (TP8) is not a multiple of {DIM_MULTIPLE}")
        local_e, i = m["experts"], m["inter"] // EP_RANKS
    else:
        if m["experts"] % EP_RANKS:
            raise ValueError(f"experts: {m['experts']} is not divisible by {EP_RANKS} (EP8)")
        if m["inter"] % DIM_MULTIPLE:
            raise ValueError(f"inter: {m['inter']} is not a multiple of {DIM_MULTIPLE}")
        local_e, i = m["experts"] // EP_RANKS, m["inter"]
    if m["topk"] > m["experts"]:
        raise ValueError(f"topk: {m['topk']} exceeds the {m['experts']} experts")
    return {"experts_total": m["experts"], "experts": local_e, "topk": m["topk"], "hidden": m["hidden"],
            "inter": i}


def _routing(t: int, k: int, e_total: int, offset: int, e_local: int, routing: str, gen, device) -> torch.Tensor:
    if routing not in ROUTINGS:
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    if t == 0:
        return torch.zeros(0, k, dtype=torch.int32, device=device)

    def distinct(n_e, base):  # uniform top-k without replacement over n_e experts starting at base
        return (torch.rand(t, n_e, generator=gen, device=device).argsort(dim=1)[:, :k] + base)

    if routing == "random":
        ids = distinct(e_total, 0)
    elif routing == "one_expert":  # slot 0 of every token on the first local expert, the other slots skipped
        ids = torch.full((t, k), -1, dtype=torch.long, device=device)
        ids[:, 0] = offset
    elif routing == "hot_expert":  # slot 0 on the first local expert, the others distinct and random
        rest = torch.rand(t, e_total, generator=gen, device=device)
        rest[:, offset] = 2.0  # sorts last: never drawn again
        ids = torch.cat([torch.full((t, 1), offset, device=device, dtype=torch.long),
                         rest.argsort(dim=1)[:, :k - 1]], dim=1)
    elif routing == "duplicates":  # drawn with replacement over the local experts; slot 1 repeats slot 0
        ids = torch.randint(0, e_local, (t, k), generator=gen, device=device) + offset
        if k > 1:
            ids[:, 1] = ids[:, 0]
    elif routing == "skip":  # random, then about a quarter of the slots set to -1
        ids = distinct(e_total, 0)
        ids[torch.rand(t, k, generator=gen, device=device) < 0.25] = -1
    else:  # half_experts: only the first half of the local experts receive tokens (the rest stay empty)
        half = max(1, e_local // 2)
        if half >= k:
            ids = distinct(half, offset)
        else:
            ids = torch.randint(0, half, (t, k), generator=gen, device=device) + offset
    return ids.to(torch.int32)


def make_moe_inputs(num_tokens: int, *, model: str = "hy3", mode: str = "tp8ep1", scales: str = "pertensor",
                    experts=None, topk=None, hidden=None, inter=None, seed: int = 0, device="cpu",
                    routing: str = "random", rank: int = 0, shared: bool = False) -> dict:
    """Seeded inputs of one MoE layer on one rank.

    Weights: W ~ N(0, 1/fan_in) per expert (gate-up fan-in H, down fan-in I), so with x ~ N(0, 1) the gate-up
    outputs are ~N(0, 1) and the layer output O(0.1-1): the range of a trained model's activations. Quantized per
    expert from its amax (per-tensor: one scale; block: one per 128x128 block). a1_scale = amax(x) / 448 and
    a2_scale = amax of the exact SiLU-and-mul over this batch's local pairs / 448 (static scales calibrated on the
    batch itself, so nothing clamps). topk_weights: a softmax over the K slots (sums to 1 per token).
    Routing (``routing``): "random" = uniform top-k without replacement over ALL experts_total experts; in tp1ep8
    the rank owns experts [rank*E, (rank+1)*E), E = experts_total/8, so about 1/8 of the slots land locally and the
    rest contribute nothing here (a real EP rank sees exactly that); other routings: see ROUTINGS.
    Returns a dict: x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, a1_scale, a2_scale, shared_out (bf16
    [T, H] when shared else None), scales, expert_offset, num_experts (local), plus the sizes and labels.
    Raises ValueError on bad sizes (model_dims), a bad rank/routing/scales, or inputs that would not fit in memory.
    """
    if not isinstance(num_tokens, (int, np.integer)) or isinstance(num_tokens, bool) or num_tokens < 0:
        raise ValueError(f"num_tokens: expected an integer >= 0, got {num_tokens!r}")
    if scales not in SCALE_MODES:
        raise ValueError(f"scales: expected one of {SCALE_MODES}, got {scales!r}")
    dims = model_dims(model, mode, experts=experts, topk=topk, hidden=hidden, inter=inter)
    e, k, h, i, e_total = dims["experts"], dims["topk"], dims["hidden"], dims["inter"], dims["experts_total"]
    ranks = EP_RANKS if mode == "tp1ep8" else 1
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < ranks:
        raise ValueError(f"rank: expected 0..{ranks - 1} in mode {mode}, got {rank!r}")
    offset = rank * e
    t = int(num_tokens)
    weight_b = e * 3 * i * h + 4 * e * (2 * i + h) * h // BLOCK ** 2 + 8 * e
    temp_b = 4 * 2 * i * h * 3                  # one expert's fp32 draw, its |w| and scaled copy
    act_b = t * h * (2 + 2 + 8) + t * k * 8 + t * k * i * 4
    check_fits(f"fused_moe inputs ({model} {mode}, {t} tokens, E={e} H={h} I={i})",
               device_bytes=weight_b + temp_b + act_b, device=device)
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    x = torch.randn(t, h, generator=gen, device=dev).to(torch.bfloat16)
    ids = _routing(t, k, e_total, offset, e, routing, gen, dev)
    tw = torch.softmax(torch.randn(t, k, generator=gen, device=dev), dim=1).float()
    w13 = torch.empty(e, 2 * i, h, dtype=FP8_DTYPE, device=dev)
    w2 = torch.empty(e, h, i, dtype=FP8_DTYPE, device=dev)
    if scales == "pertensor":
        s13, s2 = torch.empty(e, device=dev), torch.empty(e, device=dev)
    else:
        s13 = torch.empty(e, *block_scale_shape(2 * i, h), device=dev)
        s2 = torch.empty(e, *block_scale_shape(h, i), device=dev)
    for ex in range(e):  # one expert at a time keeps the fp32 draw small
        q, s = quantize_weight(torch.randn(2 * i, h, generator=gen, device=dev) / math.sqrt(h), scales)
        w13[ex], s13[ex] = q, s
        q, s = quantize_weight(torch.randn(h, i, generator=gen, device=dev) / math.sqrt(i), scales)
        w2[ex], s2[ex] = q, s
    shared_out = (0.5 * torch.randn(t, h, generator=gen, device=dev)).to(torch.bfloat16) if shared else None
    a1 = a2 = None
    if scales == "pertensor":
        a1 = torch.clamp(x.float().abs().amax() if t else torch.zeros((), device=dev), min=GROUP_EPS)
        a1 = (a1 / FP8_MAX).reshape(1).float()
        a2 = (torch.clamp(_act_amax(x, ids, w13, s13, offset, e, i), min=GROUP_EPS) / FP8_MAX).reshape(1).float()
    return {"x": x, "topk_ids": ids, "topk_weights": tw, "w13": w13, "w2": w2, "w13_scale": s13, "w2_scale": s2,
            "a1_scale": a1, "a2_scale": a2, "shared_out": shared_out, "scales": scales, "expert_offset": offset,
            "num_experts": e, "experts_total": e_total, "topk": k, "hidden": h, "inter": i, "num_tokens": t,
            "model": model, "mode": mode, "routing": routing, "seed": int(seed), "rank": rank}


def _act_amax(x, ids, w13, s13, offset, e, i) -> torch.Tensor:
    """amax of the exact (fp32) silu(g) * u over the local pairs: the calibration of the static a2_scale."""
    amax = torch.zeros((), device=x.device)
    loc = ids.long() - offset
    valid = (loc >= 0) & (loc < e)
    for ex in torch.unique(loc[valid]).tolist():
        tok = torch.nonzero((loc == ex).any(dim=1)).flatten()
        hh = x[tok].float() @ dequant_weight(w13[ex], s13[ex].reshape(()), dtype=torch.float32).T
        a = silu_mul(hh, i).float()
        amax = torch.maximum(amax, a.abs().amax())
    return amax


def call_args(inputs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of fused_moe_ref / fused_moe_emulation / the kernel's fused_moe for an inputs dict."""
    args = tuple(inputs[n] for n in ("x", "topk_ids", "topk_weights", "w13", "w2"))
    kw = {n: inputs[n] for n in ("scales", "w13_scale", "w2_scale", "a1_scale", "a2_scale", "expert_offset",
                                 "shared_out")}
    return args, kw


def experts_hit(topk_ids, *, num_experts: int, expert_offset: int = 0) -> int:
    """Distinct local experts with at least one valid pair. topk_ids: integer [T, K] (global expert ids; ids outside
    [expert_offset, expert_offset + num_experts) belong to other ranks or are padding)."""
    loc = topk_ids.long() - expert_offset
    v = loc[(loc >= 0) & (loc < num_experts)]
    return int(torch.unique(v).numel())


def valid_pairs(topk_ids, *, num_experts: int, expert_offset: int = 0) -> int:
    """(token, slot) pairs routed to a local expert. topk_ids: integer [T, K], as experts_hit."""
    return int(_local_valid(topk_ids, expert_offset, num_experts).sum())


def flops(topk_ids, *, num_experts: int, hidden: int, inter: int, expert_offset: int = 0) -> int:
    """Matmul FLOPs of the layer on this rank: 2 * valid pairs * (2I*H + H*I) (activation and reduce excluded).
    topk_ids: integer [T, K], as experts_hit."""
    return 2 * valid_pairs(topk_ids, num_experts=num_experts, expert_offset=expert_offset) * 3 * inter * hidden


def weight_bytes(topk_ids, *, num_experts: int, hidden: int, inter: int, expert_offset: int = 0,
                 scales: str = "pertensor") -> int:
    """FP8 weight bytes (and their scales) of the experts actually hit: what a memory-bound kernel must read.
    topk_ids: integer [T, K], as experts_hit."""
    n = experts_hit(topk_ids, num_experts=num_experts, expert_offset=expert_offset)
    if scales == "pertensor":
        sc = 8
    else:
        sc = 4 * (math.prod(block_scale_shape(2 * inter, hidden)) + math.prod(block_scale_shape(hidden, inter)))
    return n * (3 * inter * hidden + sc)


def bytes(topk_ids, *, num_experts: int, hidden: int, inter: int, expert_offset: int = 0, scales: str = "pertensor",
          shared: bool = False) -> int:
    """HBM bytes the fused layer must move at least: weights of the experts hit (+ scales), x in (bf16), ids and
    weights (8 bytes a slot), out (bf16), shared_out in (bf16) when given. Intermediates stay on chip.
    topk_ids: integer [T, K], as experts_hit."""
    t, k = topk_ids.shape
    act = t * hidden * 2 * (2 + (1 if shared else 0)) + t * k * 8
    return weight_bytes(topk_ids, num_experts=num_experts, hidden=hidden, inter=inter, expert_offset=expert_offset,
                        scales=scales) + act


bytes_moved = bytes  # an alias that does not shadow the builtin where imported by name


def cost(inputs: dict) -> dict:
    """flops, bytes, weight_bytes, experts_hit and valid_pairs of an inputs dict (make_moe_inputs)."""
    kw = dict(num_experts=inputs["num_experts"], expert_offset=inputs["expert_offset"])
    sz = dict(hidden=inputs["hidden"], inter=inputs["inter"])
    ids = inputs["topk_ids"]
    return {"flops": flops(ids, **kw, **sz),
            "bytes": bytes(ids, **kw, **sz, scales=inputs["scales"], shared=inputs.get("shared_out") is not None),
            "weight_bytes": weight_bytes(ids, **kw, **sz, scales=inputs["scales"]),
            "experts_hit": experts_hit(ids, **kw), "valid_pairs": valid_pairs(ids, **kw)}


def expert_histogram(topk_ids, *, num_experts: int, expert_offset: int = 0) -> np.ndarray:
    """Pairs per local expert, int64 [E] (the rows each expert's GEMM sees)."""
    loc = topk_ids.long().flatten() - expert_offset
    v = loc[(loc >= 0) & (loc < num_experts)]
    return torch.bincount(v, minlength=num_experts).cpu().numpy()


def error_vs(out, ref) -> dict:
    """cosine and max relative error (max |out - ref| / max |ref|, the published metric's form) plus rel L2.
    out, ref: float tensors of the same number of elements (any device; compared in fp64 on out's)."""
    o = out.double().flatten()
    r = ref.double().to(o.device).flatten()
    if o.numel() == 0:
        return {"cosine": 1.0, "max_rel_err": 0.0, "rel_l2_err": 0.0}
    rn, on = float(r.norm()), float(o.norm())
    cos = float(o @ r) / (on * rn) if on * rn > 0 else (1.0 if on == rn else 0.0)
    rmax = float(r.abs().max())
    d = (o - r).abs()
    return {"cosine": cos, "max_rel_err": float(d.max()) / rmax if rmax > 0 else float(d.max()),
            "rel_l2_err": float((o - r).norm()) / rn if rn > 0 else float((o - r).norm())}


def measure_emulation_error(*, seeds=(0, 1), tokens=(1, 16, 64)) -> dict:
    """Worst emulation-vs-exact error per scale mode over small shapes of both parallel modes (the measurement the
    tolerance rows ("fused_moe", "<scales>_vs_exact") are derived from). Returns {scales: {rel_l2_err, cosine,
    max_rel_err}}."""
    shapes = (("tp8ep1", dict(experts=32, hidden=512)), ("tp1ep8", dict(experts=32, hidden=512, inter=512)),
              ("tp8ep1", dict(experts=16, hidden=1024, inter=1024)))
    out = {}
    for scales in SCALE_MODES:
        w = {"rel_l2_err": 0.0, "cosine": 1.0, "max_rel_err": 0.0}
        for mode, kw in shapes:
            for t in tokens:
                for seed in seeds:
                    inp = make_moe_inputs(t, mode=mode, scales=scales, seed=seed, **kw)
                    if not valid_pairs(inp["topk_ids"], num_experts=inp["num_experts"],
                                       expert_offset=inp["expert_offset"]):
                        continue
                    a, k = call_args(inp)
                    e = error_vs(fused_moe_emulation(*a, **k), fused_moe_ref(*a, **k))
                    w = {"rel_l2_err": max(w["rel_l2_err"], e["rel_l2_err"]), "cosine": min(w["cosine"], e["cosine"]),
                         "max_rel_err": max(w["max_rel_err"], e["max_rel_err"])}
        out[scales] = w
    return out


def make_topk_ids(num_tokens: int, *, model: str = "hy3", mode: str = "tp8ep1", experts=None, topk=None,
                  seed: int = 0, routing: str = "random", rank: int = 0, device="cpu") -> tuple[torch.Tensor, dict]:
    """The routing alone (no weights): topk_ids int32 [T, K] as make_moe_inputs draws it for the same model, mode,
    routing and rank (not the same random stream), and the per-rank sizes (model_dims plus expert_offset). Cheap at
    full model size: for histograms, plans and byte counts. Raises ValueError as make_moe_inputs."""
    if not isinstance(num_tokens, (int, np.integer)) or isinstance(num_tokens, bool) or num_tokens < 0:
        raise ValueError(f"num_tokens: expected an integer >= 0, got {num_tokens!r}")
    dims = model_dims(model, mode, experts=experts, topk=topk)
    ranks = EP_RANKS if mode == "tp1ep8" else 1
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < ranks:
        raise ValueError(f"rank: expected 0..{ranks - 1} in mode {mode}, got {rank!r}")
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    offset = rank * dims["experts"]
    ids = _routing(int(num_tokens), dims["topk"], dims["experts_total"], offset, dims["experts"], routing, gen, dev)
    return ids, dict(dims, expert_offset=offset)


def expected_experts_hit(num_tokens: int, *, experts_total: int, experts_local: int, topk: int) -> float:
    """Expected distinct local experts hit by uniform top-k routing without replacement over experts_total:
    E_local * (1 - (1 - k/E_total)^T)."""
    return experts_local * (1.0 - (1.0 - topk / experts_total) ** num_tokens)
