"""Scheduling simulator for split-KV decode: per-CTA work and makespan of static vs dynamic task maps (CPU).

Cost model (all microseconds, fitted by `calibrate` from measured GPU times):
- a CTA costs `cta_us` (launch/prologue) + per descriptor `desc_us` (load Q, set up, write a partial) + per tile
  `tile_us` (64 tokens of K and V for one kv head, when every slot streams at once: bandwidth-bound);
- CTAs run on `sm_count * ctas_per_sm` slots, taken in CTA-index order by the first free slot (list scheduling,
  which is what the hardware block scheduler does for a non-persistent grid); a persistent grid has one CTA per slot;
- the combine costs `combine_fixed_us` (a second kernel, paid once if any pair is split) + `combine_chunk_us` per
  partial chunk read, spread over the slots;
- `launch_us` is paid once per step by every schedule (the attention kernel's own launch).
Limitations (said in notebook 01): a lone CTA does not get more bandwidth when others idle; L2 reuse and the
assign kernel (built once per step, amortized over layers) are ignored.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from hotpaths.reference.common import expand_lengths, parse_cases
from hotpaths.reference.split_kv_decode import (
    DEFAULT_MIN_TILES,
    TaskMap,
    _lens_list,
    build_task_map,
    static_chunk_task_map,
    static_count_task_map,
)

IMPLS = ("static_count", "static_chunk", "dynamic")


@dataclass(frozen=True)
class SimCosts:
    """Per-unit costs of the model, microseconds (defaults: a rough H200 FP8 guess: 64 tokens x 128 dims x K+V
    = 16 KB per tile at ~4 TB/s over 132 slots -> ~0.5 us per tile per slot)."""

    tile_us: float = 0.5
    cta_us: float = 1.0
    desc_us: float = 0.3
    combine_fixed_us: float = 2.0
    combine_chunk_us: float = 0.05
    launch_us: float = 3.0


@dataclass
class SimResult:
    """Prediction for one schedule. Arrays are per launched CTA (shape [grid])."""

    impl: str
    per_cta_tiles: np.ndarray
    per_cta_descs: np.ndarray
    per_cta_us: np.ndarray
    attention_us: float
    combine_us: float
    total_us: float
    total_tiles: int
    grid: int
    empty_ctas: int
    slots: int
    critical: np.ndarray | None = None  # CTAs on the slot that finishes last

    def row(self) -> dict:
        """Scalar summary (for a table)."""
        return dict(impl=self.impl, total_us=self.total_us, attention_us=self.attention_us,
                    combine_us=self.combine_us, total_tiles=self.total_tiles, grid=self.grid,
                    empty_ctas=self.empty_ctas, max_cta_tiles=int(self.per_cta_tiles.max(initial=0)),
                    mean_cta_tiles=float(self.per_cta_tiles.mean()) if self.grid else 0.0)


@numba.njit(cache=True)
def _list_schedule(cta_us: np.ndarray, slots: int) -> np.ndarray:
    """Slot of every CTA when CTAs are taken in index order by the earliest-free slot. Shape [n] int64."""
    free = np.zeros(slots)
    slot = np.empty(cta_us.shape[0], dtype=np.int64)
    for i in range(cta_us.shape[0]):
        j = np.argmin(free)
        slot[i] = j
        free[j] += cta_us[i]
    return slot


def _critical(per: np.ndarray, slots: int, persistent: bool) -> np.ndarray:
    """Indices of the CTAs on the slot that finishes last."""
    if len(per) == 0:
        return np.zeros(0, dtype=np.int64)
    if persistent:
        return np.array([int(np.argmax(per))])
    slot = _list_schedule(per, int(slots))
    busy = np.zeros(int(slots))
    np.add.at(busy, slot, per)
    return np.nonzero(slot == int(np.argmax(busy)))[0]


@numba.njit(cache=True)
def _cta_costs(tiles: np.ndarray, descs: np.ndarray, tile_us: float, desc_us: float, cta_us: float) -> np.ndarray:
    out = np.empty(tiles.shape[0])
    for i in range(tiles.shape[0]):
        out[i] = cta_us + desc_us * descs[i] + tile_us * tiles[i]
    return out


def default_num_splits(batch: int, num_kv_heads: int, slots: int, max_tiles: int) -> int:
    """Fixed split count a static kernel picks: enough splits to fill the slots once, at most the longest
    request's tile count, at most 64 (the FlashDecoding-style heuristic)."""
    pairs = max(batch * num_kv_heads, 1)
    return int(max(1, min(math.ceil(slots / pairs), max(max_tiles, 1), 64)))


def simulate_map(tm: TaskMap, *, slots: int, costs: SimCosts = SimCosts(), persistent: bool | None = None
                 ) -> SimResult:
    """Predict one task map. persistent (default: dynamic/batch-invariant maps) means one CTA per bin already
    resident: makespan = slowest bin; otherwise the grid is list-scheduled on `slots`."""
    tiles = tm.per_cta_tiles()
    descs = tm.per_cta_descs()
    if persistent is None:
        persistent = tm.kind in ("dynamic", "batch_invariant")
    c = costs
    per = _cta_costs(tiles.astype(np.int64), descs.astype(np.int64), c.tile_us, c.desc_us, c.cta_us)
    crit = _critical(per, slots, persistent)
    att = float(per[crit].sum())
    split_chunks = int(tm.num_chunks[tm.num_chunks > 1].sum())
    comb = (c.combine_fixed_us + c.combine_chunk_us * split_chunks / slots) if split_chunks else 0.0
    res = SimResult(impl=tm.kind, per_cta_tiles=tiles, per_cta_descs=descs, per_cta_us=per, attention_us=att,
                    combine_us=comb, total_us=c.launch_us + att + comb, total_tiles=tm.total_tiles,
                    grid=tm.num_ctas, empty_ctas=tm.empty_ctas, slots=int(slots), critical=crit)
    return res


def make_maps(kv_lens, *, num_kv_heads: int = 1, sm_count: int = 132, ctas_per_sm: int = 1,
              min_tiles: int = DEFAULT_MIN_TILES,
              num_splits: int | None = None, chunk_tiles: int = 16) -> dict[str, TaskMap]:
    """The three schedules of one batch: static fixed-count (num_splits, default `default_num_splits`), static
    fixed-chunk (chunk_tiles tiles, grid sized for the longest request) and dynamic (one bin per slot)."""
    lens = _lens_list(kv_lens)
    slots = sm_count * ctas_per_sm
    mx = max((-(-L // 64) for L in lens), default=0)
    ns = num_splits or default_num_splits(len(lens), num_kv_heads, slots, mx)
    return {
        "static_count": static_count_task_map(lens, num_kv_heads, ns),
        "static_chunk": static_chunk_task_map(lens, num_kv_heads, chunk_tiles),
        "dynamic": build_task_map(lens, num_kv_heads, slots, min_tiles=min_tiles),
    }


def simulate(kv_lens, *, num_kv_heads: int = 1, sm_count: int = 132, ctas_per_sm: int = 1,
             costs: SimCosts = SimCosts(), min_tiles: int = DEFAULT_MIN_TILES, num_splits: int | None = None,
             chunk_tiles: int = 16) -> dict[str, SimResult]:
    """Predict static fixed-count, static fixed-chunk and dynamic for one length distribution.

    Shape/Dtype: kv_lens [batch] ints >= 0. Returns {impl: SimResult}. Raises ValueError on bad lengths or
    sm_count/ctas_per_sm < 1.
    """
    if sm_count < 1 or ctas_per_sm < 1:
        raise ValueError(f"sm_count and ctas_per_sm must be >= 1, got {sm_count}, {ctas_per_sm}")
    slots = sm_count * ctas_per_sm
    maps = make_maps(kv_lens, num_kv_heads=num_kv_heads, sm_count=sm_count, ctas_per_sm=ctas_per_sm,
                     min_tiles=min_tiles, num_splits=num_splits, chunk_tiles=chunk_tiles)
    return {k: simulate_map(tm, slots=slots, costs=costs) for k, tm in maps.items()}


def skew_sweep(total_tokens: int, *, batch: int = 32, fractions: Sequence[float] | None = None,
               multiple: int = 64) -> list[dict]:
    """Distributions of constant total tokens (so constant KV bytes) with growing skew: 1 x L + (batch-1) x S.

    fractions: the long request's share of the tokens (default from uniform 1/batch up to 0.9). S is rounded down
    to `multiple`, L takes the rest, so sum(lengths) == total_tokens exactly. Returns one dict per point:
    fraction, long_len, short_len, skew (= L / S), case ("1xL+{n}xS" in tokens), lengths (np.int64 [batch]).
    Raises ValueError if total_tokens < batch * multiple or batch < 2.
    """
    if batch < 2:
        raise ValueError(f"batch must be >= 2, got {batch}")
    if total_tokens < batch * multiple:
        raise ValueError(f"total_tokens ({total_tokens}) must be >= batch * multiple ({batch * multiple})")
    if fractions is None:
        fractions = [1.0 / batch, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9]
    out = []
    for f in fractions:
        S = int((total_tokens * (1.0 - f)) / (batch - 1)) // multiple * multiple
        S = max(S, multiple)
        L = total_tokens - (batch - 1) * S
        if L < S:  # uniform is the floor of the sweep
            S = total_tokens // batch // multiple * multiple
            L = total_tokens - (batch - 1) * S
        lens = np.array([L] + [S] * (batch - 1), dtype=np.int64)
        out.append(dict(fraction=float(f), long_len=int(L), short_len=int(S), skew=L / S,
                        case=f"1x{L}+{batch - 1}x{S}", lengths=lens))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Calibration against measured GPU times
# ----------------------------------------------------------------------------------------------------------------

_COST_FIELDS = ("tile_us", "cta_us", "desc_us", "combine_fixed_us", "combine_chunk_us", "launch_us")


def _impl_key(impl: str) -> str | None:
    s = str(impl).lower().replace("-", "_")
    if "emul" in s or "ref" in s:
        return None
    if "dynamic" in s and "invariant" not in s:
        return "dynamic"
    if "static" in s:
        return "static_chunk" if "chunk" in s else "static_count"
    return None


def _lengths_of(case) -> list[int]:
    if isinstance(case, str):
        return list(expand_lengths(parse_cases(case)))
    return _lens_list(case)


def _features(tm: TaskMap, slots: int, costs: SimCosts) -> np.ndarray:
    """Coefficients of the six cost fields in the predicted time, for the critical slot chosen under `costs`
    (so total_us == features @ cost_vector exactly while the critical slot does not change)."""
    r = simulate_map(tm, slots=slots, costs=costs)
    crit = r.critical
    split_chunks = float(tm.num_chunks[tm.num_chunks > 1].sum())
    return np.array([float(r.per_cta_tiles[crit].sum()), float(len(crit)), float(r.per_cta_descs[crit].sum()),
                     1.0 if split_chunks else 0.0, split_chunks / slots, 1.0])


def _nnls(A: np.ndarray, b: np.ndarray, iters: int = 50) -> np.ndarray:
    """Non-negative least squares by repeated clipping of an active set (small problems only)."""
    active = np.ones(A.shape[1], dtype=bool)
    x = np.zeros(A.shape[1])
    for _ in range(iters):
        x = np.zeros(A.shape[1])
        if active.any():
            x[active] = np.linalg.lstsq(A[:, active], b, rcond=None)[0]
        neg = active & (x < 0)
        if not neg.any():
            break
        active &= ~neg
    return np.clip(x, 0, None)


def _usable_rows(measured_rows: Iterable[dict]):
    """(row, sim impl key, median_us as float) for each measured row of a simulated impl with a finite time."""
    for row in measured_rows:
        key = _impl_key(row.get("impl", ""))
        us = row.get("median_us")
        if key is not None and us is not None and np.isfinite(float(us)):
            yield row, key, float(us)


def calibrate(measured_rows: Iterable[dict], *, num_kv_heads: int = 1, sm_count: int = 132, ctas_per_sm: int = 1,
              min_tiles: int = DEFAULT_MIN_TILES, num_splits: int | None = None, chunk_tiles: int = 16, iters: int = 4,
              start: SimCosts = SimCosts()) -> SimCosts:
    """Fit the cost model to measured times by non-negative least squares.

    measured_rows: dicts (or DataFrame records) with case (a case string or a list of lengths), impl (rows whose
    impl is not dynamic/static[_count|_chunk] are ignored) and median_us (NaN/None rows ignored). The critical CTA
    depends on the costs, so features are recomputed under the last fit `iters` times.
    Returns SimCosts. Raises ValueError if fewer usable rows than 3.
    """
    slots = sm_count * ctas_per_sm
    rows = []
    for row, key, us in _usable_rows(measured_rows):
        maps = make_maps(_lengths_of(row["case"]), num_kv_heads=num_kv_heads, sm_count=sm_count,
                         ctas_per_sm=ctas_per_sm, min_tiles=min_tiles, num_splits=num_splits,
                         chunk_tiles=chunk_tiles)
        rows.append((maps[key], us))
    if len(rows) < 3:
        raise ValueError(f"calibrate needs >= 3 measured dynamic/static rows, got {len(rows)}")
    costs = start
    b = np.array([us for _, us in rows])
    for _ in range(iters):
        A = np.stack([_features(tm, slots, costs) for tm, _ in rows])
        x = _nnls(A, b)
        costs = SimCosts(**dict(zip(_COST_FIELDS, (float(v) for v in x))))
    return costs


def prediction_error(measured_rows: Iterable[dict], costs: SimCosts, *, num_kv_heads: int = 1, sm_count: int = 132,
                     ctas_per_sm: int = 1, min_tiles: int = DEFAULT_MIN_TILES, num_splits: int | None = None,
                     chunk_tiles: int = 16) -> list[dict]:
    """Predicted vs measured per usable row: case, impl, measured_us, predicted_us, rel_err (pred/meas - 1)."""
    out = []
    for row, key, us in _usable_rows(measured_rows):
        res = simulate(_lengths_of(row["case"]), num_kv_heads=num_kv_heads, sm_count=sm_count,
                       ctas_per_sm=ctas_per_sm, costs=costs, min_tiles=min_tiles, num_splits=num_splits,
                       chunk_tiles=chunk_tiles)[key]
        out.append(dict(case=row["case"], impl=key, measured_us=us, predicted_us=res.total_us,
                        rel_err=res.total_us / us - 1.0))
    return out


def load_measured(path) -> list[dict] | None:
    """Rows of a measured decode table (CSV with case, impl, median_us[, dtype]); None if the file is absent."""
    import os
    if not os.path.exists(path):
        return None
    import pandas as pd
    return pd.read_csv(path).to_dict("records")


# ----------------------------------------------------------------------------------------------------------------
# Pictures (used by notebook 01)
# ----------------------------------------------------------------------------------------------------------------

def task_map_image(tm: TaskMap, width: int | None = None) -> np.ndarray:
    """[num_ctas, width] float image: cell (b, j) = request index owning the j-th tile of bin b, NaN if empty."""
    load = tm.per_cta_tiles()
    W = int(width or max(int(load.max(initial=0)), 1))
    img = np.full((tm.num_ctas, W), np.nan)
    for b, ds in enumerate(tm.bins()):
        j = 0
        for r, _h, tb, te in ds.tolist():
            n = min(te - tb, W - j)
            img[b, j:j + n] = r
            j += n
            if j >= W:
                break
    return img


def plot_task_map(tm: TaskMap, ax=None, title: str | None = None):
    """Heat map of a task map: one row per CTA, one column per tile slot, colour = request. Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    img = task_map_image(tm)
    im = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("tile slot in the CTA (64 tokens each)")
    ax.set_ylabel("CTA")
    ax.set_title(title or f"{tm.kind}: {tm.total_tiles} tiles over {tm.num_ctas} CTAs, budget {tm.budget}")
    ax.figure.colorbar(im, ax=ax, label="request")
    return ax
