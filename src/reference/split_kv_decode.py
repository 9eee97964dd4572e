"""Decode attention over a paged KV cache: exact reference, task maps and the same-precision emulation.

Everything here runs on CPU and GPU and is written for clarity, not speed.

- ``split_kv_decode_ref``: exact attention (fp64) on the quantized inputs; the ground truth.
- ``build_task_map``: the host builder of the dynamic split-KV task map, in exactly the workspace format the
  device *assign* kernel writes (see ``docs`` / the task-map spec: header, bin_start, descriptors, chunk_start,
  num_chunks, all int32, padding -1). The device output is compared against ``TaskMap.workspace`` byte for byte.
- ``static_count_task_map``, ``static_chunk_task_map``, ``batch_invariant_task_map``: the other schedules in the
  same descriptor format, so one attention loop (and one emulation) serves all of them.
- ``split_kv_decode_emulation``: what the kernels compute, in the same precision (fp32 scores from the exactly
  representable fp8/bf16 values, fp32 online softmax over 64-token tiles, fp32 partial output + natural-log LSE,
  fp32 combine, bf16 output). ``partial_attention`` and ``combine`` are its two halves.
- ``make_decode_inputs``: the random-input generator every test, CLI and notebook uses.
- ``flops`` / ``bytes_moved``: the two numbers behind the floor time.

Conventions (shared with the kernels): q [batch*q_len, q_heads, head_dim]; k_cache / v_cache
[num_pages, page_size, kv_heads, head_dim]; block_table [batch, max_pages] int32; kv_lens [batch] int32 (they
include the q_len new tokens); query head j uses kv head j // (q_heads // kv_heads); query token i of a request
(0-based among its q_len) sees KV positions j < kv_len - (q_len - 1 - i); a row that sees no key outputs zeros.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from hotpaths.reference.common import check_fits

TILE = 64
FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
SUPPORTED_GQA = (1, 2, 4, 8, 12, 16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)
SUPPORTED_Q_LEN = (1, 2, 3, 4)
HEADER_FIELDS = ("total_tiles", "budget", "nbins", "ndesc", "batch", "num_kv_heads", "num_ctas", "min_tiles")
# The task-map workspace layout: the host side of src/kernels/split_kv_decode/task_map.cuh (kHeaderInts, kDescInts),
# which the device kernels and the loader (hotpaths.kernels.split_kv_decode, checked against the library's
# hp_decode_workspace_len when it loads) share; tests/test_split_kv_decode_ref.py parses the header to check these.
TASK_MAP_HEADER_INTS = len(HEADER_FIELDS)
TASK_MAP_DESC_INTS = 4  # (request, kv head, first tile, end tile)

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _lens_list(kv_lens, name: str = "kv_lens") -> list[int]:
    """kv_lens as a list of Python ints (accepts a list, numpy array or tensor); rejects negatives."""
    if isinstance(kv_lens, torch.Tensor):
        if kv_lens.dim() != 1:
            raise ValueError(f"{name} must be 1-D [batch], got shape {tuple(kv_lens.shape)}")
        lens = [int(x) for x in kv_lens.tolist()]
    else:
        arr = np.asarray(kv_lens)
        if arr.ndim != 1 and arr.size != 0:
            raise ValueError(f"{name} must be 1-D [batch], got shape {arr.shape}")
        lens = [int(x) for x in arr.reshape(-1).tolist()]
    for i, x in enumerate(lens):
        if x < 0:
            raise ValueError(f"{name}[{i}] = {x}: KV lengths must be >= 0")
    return lens


# ----------------------------------------------------------------------------------------------------------------
# Quantization and inputs
# ----------------------------------------------------------------------------------------------------------------

def quantize_q_fp8(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-head FP8 e4m3 quantization of the query (scale = amax / 448).

    Shape/Dtype: q [tokens, heads, head_dim] bf16 (or fp32/fp16) -> (q_fp8 [tokens, heads, head_dim] float8_e4m3fn,
    q_scale [tokens, heads] fp32). An all-zero row gets scale 1 (so it dequantizes to zeros, never NaN).
    Raises ValueError if q is not 3-D or contains NaN/Inf.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, heads, head_dim], got shape {tuple(q.shape)}")
    qf = q.float()
    if not torch.isfinite(qf).all():
        raise ValueError("q contains NaN/Inf: cannot quantize")
    amax = qf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q_fp8 = (qf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q_fp8.contiguous(), scale.contiguous()


def quantize_kv_fp8(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 e4m3 quantization of a K or V cache (scale = amax / 448).

    Shape/Dtype: cache [num_pages, page_size, kv_heads, head_dim] bf16/fp32 -> (cache_fp8 same shape
    float8_e4m3fn, scale [1] fp32; a tensor, not a float, so a CUDA graph can read it).
    Raises ValueError if the cache contains NaN/Inf (quantize before poisoning unused slots).
    """
    cf = cache.float()
    if not torch.isfinite(cf).all():
        raise ValueError("cache contains NaN/Inf: quantize before poisoning unused slots")
    amax = cf.abs().amax() if cf.numel() else torch.zeros((), device=cf.device)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).reshape(1).float()
    return (cf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).contiguous(), scale.contiguous()


def make_decode_inputs(
    lengths: Sequence[int],
    *,
    q_heads: int = 8,
    kv_heads: int = 1,
    head_dim: int = 128,
    page_size: int = 64,
    q_len: int = 1,
    kv_dtype: str = "fp8",
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict:
    """Random decode inputs over a shuffled paged cache, with every unused slot poisoned.

    kv_dtype "fp8": Q fp8 e4m3 with per-token-per-head q_scale, K/V fp8 with per-tensor scales [1];
    "bf16": everything bf16, scales None. Pages are shuffled in the block table; unused slots of a request's last
    page, spare pages and block-table entries past a request's pages (they point at a spare poisoned page) hold
    NaN (bf16) or 0x7F (the e4m3 NaN), so an implementation that reads past kv_len produces NaN.
    Returns a dict whose keys are split_kv_decode_ref's arguments: q, k_cache, v_cache, block_table, kv_lens,
    q_len, q_scale, k_scale, v_scale (so `split_kv_decode_ref(**inputs)` works).
    Shape/Dtype: q [batch*q_len, q_heads, head_dim]; k_cache/v_cache [num_pages, page_size, kv_heads, head_dim];
    block_table [batch, max_pages] int32; kv_lens [batch] int32.
    Raises ValueError for a negative length, an unknown kv_dtype or an unsupported configuration, and
    ResourceError (a ValueError, with the estimate) before allocating when the inputs would not fit in host or
    device memory.
    """
    lens = _lens_list(lengths, "lengths")
    if kv_dtype not in ("fp8", "bf16"):
        raise ValueError(f"kv_dtype must be 'fp8' or 'bf16', got {kv_dtype!r}")
    _check_config(q_heads, kv_heads, head_dim, page_size, q_len)
    batch = len(lens)
    pages_per_req = [_cdiv(L, page_size) for L in lens]
    n_spare = 2  # poisoned pages that unused block-table entries point at
    num_pages = sum(pages_per_req) + n_spare
    max_pages = max(pages_per_req, default=0) + 1  # at least one unused entry per row
    # Refuse what cannot fit before the first allocation. Host peak: K and V drawn in fp32, their fp32 scaling
    # temporaries and the quantized copies, the slot mask, the block table and Q; on a CUDA device the final K/V.
    elems = num_pages * page_size * kv_heads * head_dim
    item = 1 if kv_dtype == "fp8" else 2
    q_bytes = batch * q_len * q_heads * head_dim * 4
    check_fits(f"decode inputs for {batch} request(s), {sum(lens)} KV tokens ({kv_dtype})",
               host_bytes=elems * (4 + 4 + 4 + 2 * item) + num_pages * page_size + batch * max_pages * 4 + 2 * q_bytes,
               device_bytes=2 * elems * item + batch * max_pages * 4 + q_bytes, device=device)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)
    spare = perm[-n_spare:]
    block_table = torch.empty(batch, max_pages, dtype=torch.int32)
    pos = 0
    for r, n in enumerate(pages_per_req):
        block_table[r, :n] = perm[pos:pos + n].to(torch.int32)
        block_table[r, n:] = int(spare[r % n_spare])
        pos += n
    # valid[page, slot] marks cache slots that hold a token of some request
    valid = torch.zeros(num_pages, page_size, dtype=torch.bool)
    for r, L in enumerate(lens):
        for t0 in range(0, L, page_size):
            valid[int(block_table[r, t0 // page_size]), : min(page_size, L - t0)] = True

    shape = (num_pages, page_size, kv_heads, head_dim)
    k = torch.randn(shape, generator=g)
    v = torch.randn(shape, generator=g)
    q = torch.randn(batch * q_len, q_heads, head_dim, generator=g).to(torch.bfloat16)
    inv = ~valid[:, :, None, None].expand(shape)
    if kv_dtype == "bf16":
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
        k[inv] = float("nan")
        v[inv] = float("nan")
        q_scale = k_scale = v_scale = None
    else:
        q, q_scale = quantize_q_fp8(q)
        k, k_scale = quantize_kv_fp8(k)
        v, v_scale = quantize_kv_fp8(v)
        k.view(torch.uint8)[inv] = 0x7F  # e4m3fn NaN
        v.view(torch.uint8)[inv] = 0x7F
    dev = torch.device(device)
    mv = lambda t: None if t is None else t.to(dev).contiguous()  # noqa: E731
    return dict(
        q=mv(q), k_cache=mv(k), v_cache=mv(v), block_table=mv(block_table),
        kv_lens=torch.tensor(lens, dtype=torch.int32, device=dev), q_len=q_len,
        q_scale=mv(q_scale), k_scale=mv(k_scale), v_scale=mv(v_scale),
    )


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------

def _check_config(q_heads: int, kv_heads: int, head_dim: int, page_size: int, q_len: int) -> None:
    if kv_heads < 1:
        raise ValueError(f"kv_heads must be >= 1, got {kv_heads}")
    if q_heads < 1 or q_heads % kv_heads != 0:
        raise ValueError(f"q_heads ({q_heads}) must be a positive multiple of kv_heads ({kv_heads})")
    if q_heads // kv_heads not in SUPPORTED_GQA:
        raise ValueError(f"GQA ratio q_heads/kv_heads = {q_heads // kv_heads} unsupported; "
                         f"supported: {SUPPORTED_GQA}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} unsupported; supported: {SUPPORTED_HEAD_DIMS}")
    if page_size not in SUPPORTED_PAGE_SIZES:
        raise ValueError(f"page_size {page_size} unsupported; supported: {SUPPORTED_PAGE_SIZES}")
    if q_len not in SUPPORTED_Q_LEN:
        raise ValueError(f"q_len must be in 1..4, got {q_len}")


def validate_decode_inputs(q, k_cache, v_cache, block_table, kv_lens, *, q_len=1, q_scale=None,
                           k_scale=None, v_scale=None) -> dict:
    """Check the decode inputs; return the derived sizes (batch, q_heads, kv_heads, head_dim, page_size, lens).

    Raises TypeError (wrong dtype / not a tensor) or ValueError (shape, contiguity, device, unsupported config,
    block table too short or pointing outside the cache), each naming the argument and the expectation.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("kv_lens", kv_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in (torch.bfloat16, FP8_DTYPE):
        raise TypeError(f"q must be bfloat16 or float8_e4m3fn, got {q.dtype}")
    if k_cache.dtype not in (torch.bfloat16, FP8_DTYPE):
        raise TypeError(f"k_cache must be bfloat16 or float8_e4m3fn, got {k_cache.dtype}")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"v_cache dtype {v_cache.dtype} must equal k_cache dtype {k_cache.dtype}")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {block_table.dtype}")
    if kv_lens.dtype != torch.int32:
        raise TypeError(f"kv_lens must be int32, got {kv_lens.dtype}")
    dev = q.device
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("kv_lens", kv_lens)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but q is on {dev}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [num_pages, page_size, kv_heads, head_dim], got {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("q", q), ("block_table", block_table)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    num_pages, page_size, kv_heads, head_dim = k_cache.shape
    if q.dim() != 3:
        raise ValueError(f"q must be [batch*q_len, q_heads, head_dim], got {tuple(q.shape)}")
    tokens, q_heads, qd = q.shape
    if qd != head_dim:
        raise ValueError(f"q head_dim {qd} must equal the cache head_dim {head_dim}")
    _check_config(q_heads, kv_heads, head_dim, page_size, q_len)
    if kv_lens.dim() != 1:
        raise ValueError(f"kv_lens must be 1-D [batch], got {tuple(kv_lens.shape)}")
    batch = kv_lens.shape[0]
    if tokens != batch * q_len:
        raise ValueError(f"q has {tokens} tokens; expected batch*q_len = {batch}*{q_len} = {batch * q_len}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [batch={batch}, max_pages], got {tuple(block_table.shape)}")
    lens = _lens_list(kv_lens)
    max_pages = block_table.shape[1]
    need = max((_cdiv(L, page_size) for L in lens), default=0)
    if need > max_pages:
        r = max(range(batch), key=lambda i: lens[i])
        raise ValueError(f"block_table too short: kv_lens[{r}] = {lens[r]} needs {need} pages of {page_size} "
                         f"but block_table has {max_pages} columns")
    bt = block_table.cpu()
    for r, L in enumerate(lens):
        n = _cdiv(L, page_size)
        if n and (bt[r, :n].min() < 0 or bt[r, :n].max() >= num_pages):
            raise ValueError(f"block_table[{r}, :{n}] holds a page index outside [0, {num_pages})")
    if q.dtype == FP8_DTYPE:
        if q_scale is None:
            raise ValueError("q is float8_e4m3fn: q_scale [batch*q_len, q_heads] fp32 is required")
        if q_scale.dtype != torch.float32 or tuple(q_scale.shape) != (tokens, q_heads):
            raise ValueError(f"q_scale must be fp32 [{tokens}, {q_heads}], got {q_scale.dtype} "
                             f"{tuple(q_scale.shape)}")
        if q_scale.device != dev:
            raise ValueError(f"q_scale is on {q_scale.device} but q is on {dev}")
    elif q_scale is not None:
        raise ValueError(f"q_scale given but q is {q.dtype} (scales only apply to float8_e4m3fn)")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if k_cache.dtype == FP8_DTYPE:
            if s is None:
                raise ValueError(f"k_cache/v_cache are float8_e4m3fn: {name} (fp32 tensor of shape [1]) is required")
            if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) != (1,):
                raise ValueError(f"{name} must be an fp32 tensor of shape [1]")
            if s.device != dev:
                raise ValueError(f"{name} is on {s.device} but q is on {dev}")
        elif s is not None:
            raise ValueError(f"{name} given but the cache is {k_cache.dtype} (scales only apply to fp8)")
    return dict(batch=batch, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
                num_pages=num_pages, lens=lens)


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, r: int, begin: int, end: int) -> torch.Tensor:
    """Tokens [begin, end) of request r from the paged cache, reading only the pages that hold them.

    Shape: -> [end - begin, kv_heads, head_dim], cache dtype.
    """
    ps = cache.shape[1]
    if end <= begin:
        return cache.new_empty((0,) + tuple(cache.shape[2:]))
    p0, p1 = begin // ps, _cdiv(end, ps)
    pages = block_table[r, p0:p1].long()
    toks = cache[pages].reshape(-1, *cache.shape[2:])
    return toks[begin - p0 * ps: end - p0 * ps]


def _as_float(t: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    # fp8 e4m3 and bf16 values are exactly representable in fp32 (and fp64)
    return t.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Exact reference
# ----------------------------------------------------------------------------------------------------------------

def split_kv_decode_ref(q, k_cache, v_cache, block_table, kv_lens, *, q_len=1, q_scale=None, k_scale=None,
                        v_scale=None, sm_scale=None) -> torch.Tensor:
    """Exact decode attention (fp64) over a paged KV cache, GQA and MTP-causal, on the (quantized) inputs.

    Shape/Dtype: q [batch*q_len, q_heads, head_dim] bf16 or float8_e4m3fn (+ q_scale [batch*q_len, q_heads] fp32);
    k_cache, v_cache [num_pages, page_size, kv_heads, head_dim] bf16 or float8_e4m3fn (+ k_scale, v_scale [1] fp32);
    block_table [batch, max_pages] int32; kv_lens [batch] int32 (including the q_len new tokens).
    Returns out [batch*q_len, q_heads, head_dim] fp32 (computed in fp64). kv_len 0 (or a query row that sees no
    key) gives zeros. Only the first ceil(kv_len/page_size) block-table entries and the first kv_len tokens are read.
    sm_scale defaults to 1/sqrt(head_dim); on the FP8 path s = sm_scale * q_scale * k_scale * (q_fp8 . k_fp8).
    Raises TypeError/ValueError on malformed input (see validate_decode_inputs).
    """
    info = validate_decode_inputs(q, k_cache, v_cache, block_table, kv_lens, q_len=q_len, q_scale=q_scale,
                                  k_scale=k_scale, v_scale=v_scale)
    B, Hq, H, D = info["batch"], info["q_heads"], info["kv_heads"], info["head_dim"]
    G = Hq // H
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    f64 = torch.float64
    qd = _as_float(q, f64)
    if q_scale is not None:
        qd = qd * q_scale.to(f64)[..., None]
    ks = float(k_scale.item()) if k_scale is not None else 1.0
    vs = float(v_scale.item()) if v_scale is not None else 1.0
    out = torch.zeros(B * q_len, Hq, D, dtype=f64, device=q.device)
    for r, L in enumerate(info["lens"]):
        if L == 0:
            continue
        k = _as_float(_gather_kv(k_cache, block_table, r, 0, L), f64) * ks  # [L, H, D]
        v = _as_float(_gather_kv(v_cache, block_table, r, 0, L), f64) * vs
        for i in range(q_len):
            limit = L - (q_len - 1 - i)  # causal among the draft tokens
            if limit <= 0:
                continue
            row = r * q_len + i
            qr = qd[row].reshape(H, G, D)
            s = torch.einsum("hgd,lhd->hgl", qr, k[:limit]) * scale
            p = torch.softmax(s, dim=-1)
            out[row] = torch.einsum("hgl,lhd->hgd", p, v[:limit]).reshape(Hq, D)
    return out.float()


# ----------------------------------------------------------------------------------------------------------------
# Task maps
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class TaskMap:
    """A schedule of (request, kv_head, tile range) descriptors into CTA bins, plus its int32 workspace.

    workspace is the exact device format: header[8] = (T, B, nbins, ndesc, batch, H, C, F), bin_start[C+1],
    desc[(max_pairs + C) * 4], chunk_start[max_pairs], num_chunks[max_pairs], padding -1.
    The other fields are decoded views (numpy int32/int64). Pairs are p = h * batch + r.
    kind: "dynamic", "static_count", "static_chunk" or "batch_invariant" (for static maps C is the grid size and
    each bin holds at most one descriptor; for "batch_invariant" the header's F slot holds chunk_tiles; for these
    three kinds the descriptor section holds max(max_pairs + C, ndesc) entries: extra["desc_capacity"]).
    """

    kind: str
    workspace: np.ndarray
    kv_lens: np.ndarray
    num_kv_heads: int
    num_ctas: int
    min_tiles: int
    max_pairs: int
    tile: int
    total_tiles: int
    budget: int
    nbins: int
    bin_start: np.ndarray
    descriptors: np.ndarray      # [ndesc, 4] (r, h, tile_begin, tile_end)
    chunk_start: np.ndarray      # [batch * H]
    num_chunks: np.ndarray       # [batch * H]
    tiles: np.ndarray            # [batch * H] tiles per pair
    extra: dict = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return int(len(self.kv_lens))

    @property
    def ndesc(self) -> int:
        return int(len(self.descriptors))

    @property
    def desc_bin(self) -> np.ndarray:
        """Bin (CTA) of every descriptor. Shape [ndesc]."""
        counts = np.diff(self.bin_start)
        return np.repeat(np.arange(self.num_ctas), counts)

    def bins(self) -> list[np.ndarray]:
        """Descriptors of each bin, as a list of [n, 4] arrays (one per CTA)."""
        return [self.descriptors[self.bin_start[b]:self.bin_start[b + 1]] for b in range(self.num_ctas)]

    def per_cta_tiles(self) -> np.ndarray:
        """Tiles each CTA processes. Shape [num_ctas] int64."""
        w = (self.descriptors[:, 3] - self.descriptors[:, 2]).astype(np.int64)
        out = np.zeros(self.num_ctas, dtype=np.int64)
        np.add.at(out, self.desc_bin, w)
        return out

    def per_cta_descs(self) -> np.ndarray:
        """Descriptors each CTA processes. Shape [num_ctas] int64."""
        return np.diff(self.bin_start).astype(np.int64)

    @property
    def grid(self) -> int:
        """CTAs launched (num_ctas: persistent grid for dynamic maps, the full grid for static ones)."""
        return self.num_ctas

    @property
    def empty_ctas(self) -> int:
        """Launched CTAs that own no descriptor."""
        return int((self.per_cta_descs() == 0).sum())

    @property
    def split_pairs(self) -> int:
        """Pairs with more than one chunk (they need the combine)."""
        return int((self.num_chunks > 1).sum())


def workspace_len(num_ctas: int, max_pairs: int, desc_capacity: int | None = None) -> int:
    """int32 entries of the task-map workspace: 8 + (C + 1) + 4 * (max_pairs + C) + 2 * max_pairs.

    The one Python definition of the layout (the kernels' loader imports it). desc_capacity replaces max_pairs + C
    for the static / batch-invariant maps, whose descriptor count is not bounded by max_pairs + C (the dynamic
    format, the only one the device uses, always has max_pairs + C)."""
    cap = max_pairs + num_ctas if desc_capacity is None else desc_capacity
    return TASK_MAP_HEADER_INTS + (num_ctas + 1) + TASK_MAP_DESC_INTS * cap + 2 * max_pairs


def _assemble(kind, lens, H, C, F, B, max_pairs, tile, tiles, descs, dbins, num_chunks, total_tiles, nbins,
              extra=None) -> TaskMap:
    """Lay out a workspace from descriptors (ordered by bin) and their bins."""
    batch = len(lens)
    P = batch * H
    if max_pairs is None:
        max_pairs = P
    if max_pairs < P:
        raise ValueError(f"max_pairs ({max_pairs}) must be >= batch * num_kv_heads = {P}")
    descs = np.asarray(descs, dtype=np.int32).reshape(-1, TASK_MAP_DESC_INTS)
    nd = len(descs)
    cap = max_pairs + C
    if nd > cap:
        if kind == "dynamic":  # cannot happen: each of the C - 1 bin boundaries splits at most one pair
            raise AssertionError(f"{nd} descriptors exceed max_pairs + num_ctas = {cap}")
        cap = nd
    extra = dict(extra or {}, desc_capacity=cap)
    num_chunks = np.asarray(num_chunks, dtype=np.int32)
    chunk_start = np.zeros(P, dtype=np.int32)
    if P:
        chunk_start[1:] = np.cumsum(num_chunks)[:-1]
    bin_start = np.searchsorted(np.asarray(dbins, dtype=np.int64), np.arange(C + 1), side="left").astype(np.int32)
    ws = np.full(workspace_len(C, max_pairs, cap), -1, dtype=np.int32)
    ws[:TASK_MAP_HEADER_INTS] = (total_tiles, B, nbins, nd, batch, H, C, F)
    o = TASK_MAP_HEADER_INTS
    ws[o:o + C + 1] = bin_start
    o += C + 1
    ws[o:o + TASK_MAP_DESC_INTS * nd] = descs.reshape(-1)
    o += TASK_MAP_DESC_INTS * cap
    ws[o:o + P] = chunk_start
    o += max_pairs
    ws[o:o + P] = num_chunks
    return TaskMap(kind=kind, workspace=ws, kv_lens=np.asarray(lens, dtype=np.int64), num_kv_heads=H, num_ctas=C,
                   min_tiles=F, max_pairs=max_pairs, tile=tile, total_tiles=int(total_tiles), budget=int(B),
                   nbins=int(nbins), bin_start=bin_start, descriptors=descs, chunk_start=chunk_start,
                   num_chunks=num_chunks, tiles=np.asarray(tiles, dtype=np.int64), extra=extra)


def _check_map_args(H: int, C: int, tile: int) -> None:
    if H < 1:
        raise ValueError(f"num_kv_heads must be >= 1, got {H}")
    if C < 1:
        raise ValueError(f"num_ctas must be >= 1, got {C}")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    if C > 2**31 - 1:  # the workspace header holds it as int32
        raise ValueError(f"num_ctas must be < 2**31, got {C}")
    # per-CTA arrays of the map (bin starts, per-CTA counts, the device workspace's per-CTA entries): int64 each
    check_fits(f"task map for num_ctas={C}", host_bytes=C * 8 * 6)


def _pair_tiles(lens: list[int], H: int, tile: int) -> np.ndarray:
    per_req = np.array([_cdiv(L, tile) for L in lens], dtype=np.int64)
    return np.tile(per_req, H)  # p = h * batch + r: head-major, request-minor


# The minimum-work floor (tiles per CTA bin) of the dynamic map: small enough that a batch of short requests still
# spreads over every CTA (a large floor serializes them onto few CTAs), large enough that no CTA pays a descriptor
# and a combine entry for a single tile. A floor of 2 keeps both: on short or one-long-many-short batches it is
# what lets every SM work, and on large batches the budget is far above it so it changes nothing.
DEFAULT_MIN_TILES = 2


def build_task_map(kv_lens, num_kv_heads: int, num_ctas: int, *, min_tiles: int = DEFAULT_MIN_TILES,
                   max_pairs: int | None = None,
                   tile: int = TILE) -> TaskMap:
    """Host builder of the dynamic split-KV task map (ground truth for the device assign kernel).

    Shape/Dtype: kv_lens [batch] ints (list, numpy or tensor), each >= 0. Returns a TaskMap whose `workspace`
    (numpy int32) equals the device workspace byte for byte: budget B = max(ceil(T / C), min_tiles) tiles,
    pairs walked head-major request-minor, poured into bins of B tiles, consecutive tiles of one pair in one bin
    forming one descriptor.
    Raises ValueError for negative lengths, num_kv_heads/num_ctas/min_tiles < 1, or max_pairs < batch*H.
    """
    lens = _lens_list(kv_lens)
    H, C, F = int(num_kv_heads), int(num_ctas), int(min_tiles)
    _check_map_args(H, C, tile)
    if not 1 <= F <= 2**31 - 1:  # the workspace header holds it as int32
        raise ValueError(f"min_tiles must be in [1, 2**31), got {F}")
    tiles = _pair_tiles(lens, H, tile)
    tstart = np.concatenate([[0], np.cumsum(tiles)[:-1]]).astype(np.int64) if len(tiles) else tiles
    T = int(tiles.sum())
    B = max(_cdiv(T, C), F) if T > 0 else F
    nbins = _cdiv(T, B)
    has = tiles > 0
    b0 = np.where(has, tstart // B, 0)
    b1 = np.where(has, (tstart + tiles - 1) // B, -1)
    num_chunks = np.where(has, b1 - b0 + 1, 0)
    pair = np.repeat(np.arange(len(tiles)), num_chunks)
    first = np.concatenate([[0], np.cumsum(num_chunks)[:-1]]) if len(tiles) else num_chunks
    c = np.arange(len(pair)) - np.repeat(first, num_chunks)
    b = b0[pair] + c
    ts, nt = tstart[pair], tiles[pair]
    batch = len(lens)
    descs = np.stack([pair % max(batch, 1), pair // max(batch, 1),
                      np.maximum(ts, b * B) - ts, np.minimum(ts + nt, (b + 1) * B) - ts], axis=1)
    return _assemble("dynamic", lens, H, C, F, B, max_pairs, tile, tiles, descs, b, num_chunks, T, nbins)


def _static_map(kind, lens, H, splits_per_pair, chunk_of_pair, tile, max_pairs, header_b, header_f, extra):
    """Static grid (H, batch, splits): CTA (p * splits + s) covers tiles [s*ct, min((s+1)*ct, tiles[p]))."""
    tiles = _pair_tiles(lens, H, tile)
    batch = len(lens)
    S = int(splits_per_pair)
    C = len(tiles) * S
    descs, dbins, num_chunks = [], [], np.zeros(len(tiles), dtype=np.int64)
    for p, nt in enumerate(tiles.tolist()):
        ct = chunk_of_pair(nt)
        for s in range(S):
            tb, te = s * ct, min((s + 1) * ct, nt)
            if tb < te:
                descs.append((p % batch, p // batch, tb, te))
                dbins.append(p * S + s)
                num_chunks[p] += 1
    T = int(tiles.sum())
    return _assemble(kind, lens, H, C, header_f, header_b, max_pairs, tile, tiles, descs, dbins, num_chunks, T, C,
                     extra)


def _static_args(kv_lens, num_kv_heads: int, tile: int, name: str, value: int) -> tuple[list[int], int, int]:
    """Checked arguments of a static map: (lengths, kv heads, the longest request in tiles); ValueError names
    ``name`` when ``value`` < 1."""
    lens = _lens_list(kv_lens)
    H = int(num_kv_heads)
    _check_map_args(H, 1, tile)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return lens, H, max((_cdiv(L, tile) for L in lens), default=0)


def static_count_task_map(kv_lens, num_kv_heads: int, num_splits: int, *, max_pairs: int | None = None,
                          tile: int = TILE) -> TaskMap:
    """Static split-KV with a fixed split COUNT: every pair cut into num_splits chunks of ceil(tiles/num_splits).

    Grid = num_kv_heads * batch * num_splits CTAs, one (possibly empty) chunk each, so the longest request's
    chunks decide the tail. Shape/Dtype: kv_lens [batch] ints. Returns a TaskMap (kind "static_count"; header B =
    the largest chunk in tiles, F = num_splits). Raises ValueError for num_splits < 1 or bad lengths.
    """
    lens, H, mx = _static_args(kv_lens, num_kv_heads, tile, "num_splits", num_splits)
    tm = _static_map("static_count", lens, H, num_splits, lambda nt: _cdiv(nt, num_splits), tile, max_pairs,
                     _cdiv(mx, num_splits), num_splits, {"num_splits": num_splits})
    return tm


def static_chunk_task_map(kv_lens, num_kv_heads: int, chunk_tiles: int, *, max_pairs: int | None = None,
                          tile: int = TILE) -> TaskMap:
    """Static split-KV with a fixed chunk SIZE (chunk_tiles tiles); the grid is sized for the longest request.

    Grid = num_kv_heads * batch * ceil(max_tiles / chunk_tiles) CTAs; short requests own empty CTAs that still
    take scheduling slots (TaskMap.empty_ctas). Shape/Dtype: kv_lens [batch] ints. Returns a TaskMap (kind
    "static_chunk"; header B = F = chunk_tiles). Raises ValueError for chunk_tiles < 1 or bad lengths.
    """
    lens, H, mx = _static_args(kv_lens, num_kv_heads, tile, "chunk_tiles", chunk_tiles)
    S = max(_cdiv(mx, chunk_tiles), 1)
    return _static_map("static_chunk", lens, H, S, lambda nt: chunk_tiles, tile, max_pairs, chunk_tiles,
                       chunk_tiles, {"num_splits": S, "chunk_tiles": chunk_tiles})


def batch_invariant_task_map(kv_lens, num_kv_heads: int, num_ctas: int, chunk_tiles: int = 16, *,
                             max_pairs: int | None = None, tile: int = TILE) -> TaskMap:
    """Batch-invariant dynamic map: each pair cut into chunks of chunk_tiles tiles from its own tile 0.

    A request's descriptors and its combine order then depend only on its own length, so its output is
    bit-identical whatever it is batched with. Chunks are poured into num_ctas bins in order with budget
    B = max(ceil(T / C), chunk_tiles) tiles (descriptor d goes to bin (tiles before d) // B, so a bin holds at most
    B + chunk_tiles - 1 tiles). Header F slot = chunk_tiles. Shape/Dtype: kv_lens [batch] ints.
    Raises ValueError for chunk_tiles / num_ctas < 1 or bad lengths.
    """
    lens = _lens_list(kv_lens)
    H, C = int(num_kv_heads), int(num_ctas)
    _check_map_args(H, C, tile)
    if chunk_tiles < 1:
        raise ValueError(f"chunk_tiles must be >= 1, got {chunk_tiles}")
    tiles = _pair_tiles(lens, H, tile)
    batch = len(lens)
    T = int(tiles.sum())
    B = max(_cdiv(T, C), chunk_tiles)
    descs, dbins = [], []
    num_chunks = np.zeros(len(tiles), dtype=np.int64)
    done = 0
    for p, nt in enumerate(tiles.tolist()):
        for tb in range(0, nt, chunk_tiles):
            te = min(tb + chunk_tiles, nt)
            descs.append((p % batch, p // batch, tb, te))
            dbins.append(done // B)
            done += te - tb
            num_chunks[p] += 1
    nbins = (max(dbins) + 1) if dbins else 0
    return _assemble("batch_invariant", lens, H, C, chunk_tiles, B, max_pairs, tile, tiles, descs, dbins,
                     num_chunks, T, nbins, {"chunk_tiles": chunk_tiles})


def decode_workspace(workspace, *, num_ctas: int, max_pairs: int, desc_capacity: int | None = None) -> dict:
    """Split a task-map workspace (e.g. copied back from the device) into its named parts (numpy int32 views).

    Shape/Dtype: workspace [workspace_len(num_ctas, max_pairs)] int32. Returns dict(header, bin_start, desc
    [max_pairs + num_ctas, 4], chunk_start, num_chunks) plus the header fields by name.
    Raises ValueError if the length does not match.
    """
    ws = np.asarray(workspace, dtype=np.int32).reshape(-1)
    C, M = int(num_ctas), int(max_pairs)
    cap = M + C if desc_capacity is None else int(desc_capacity)
    if len(ws) != workspace_len(C, M, cap):
        raise ValueError(f"workspace has {len(ws)} entries; expected {workspace_len(C, M, cap)} for "
                         f"num_ctas={C}, max_pairs={M}, desc_capacity={cap}")
    o = TASK_MAP_HEADER_INTS
    out = dict(header=ws[:o], bin_start=ws[o:o + C + 1])
    o += C + 1
    out["desc"] = ws[o:o + TASK_MAP_DESC_INTS * cap].reshape(cap, TASK_MAP_DESC_INTS)
    o += TASK_MAP_DESC_INTS * cap
    out["chunk_start"] = ws[o:o + M]
    out["num_chunks"] = ws[o + M:o + 2 * M]
    out.update({k: int(v) for k, v in zip(HEADER_FIELDS, ws[:TASK_MAP_HEADER_INTS])})
    return out


def compare_workspaces(got, expected: TaskMap) -> str | None:
    """None if `got` (int32 workspace) equals expected.workspace, else a message locating the first difference."""
    got = np.asarray(got, dtype=np.int32).reshape(-1)
    exp = expected.workspace
    if got.shape != exp.shape:
        return f"workspace length {got.shape[0]} != expected {exp.shape[0]}"
    diff = np.nonzero(got != exp)[0]
    if len(diff) == 0:
        return None
    i = int(diff[0])
    C, M = expected.num_ctas, expected.max_pairs
    bounds = [("header", 8), ("bin_start", C + 1), ("desc", 4 * expected.extra["desc_capacity"]), ("chunk_start", M),
              ("num_chunks", M)]
    o = 0
    for name, n in bounds:
        if i < o + n:
            where = f"{name}[{i - o}]" if name != "desc" else f"desc[{(i - o) // 4}][{(i - o) % 4}]"
            break
        o += n
    return (f"{len(diff)} entries differ; first at {where} (flat {i}): got {got[i]}, expected {exp[i]}\n"
            f"expected map:\n{format_task_map(expected, max_bins=16)}")


def format_task_map(tm: TaskMap, *, max_bins: int = 40, max_desc_per_bin: int = 8) -> str:
    """Human-readable task map: a header line, then one row per bin: `bin b [n tiles]: (r,h,[b,e)) ...`."""
    lines = [f"{tm.kind} task map: batch={tm.batch} H={tm.num_kv_heads} C={tm.num_ctas} tile={tm.tile} "
             f"T={tm.total_tiles} tiles, budget B={tm.budget}, nbins={tm.nbins}, ndesc={tm.ndesc}, "
             f"split pairs={tm.split_pairs}, empty CTAs={tm.empty_ctas}"]
    load = tm.per_cta_tiles()
    shown = 0
    for b, ds in enumerate(tm.bins()):
        if len(ds) == 0 and b >= tm.nbins:
            continue
        if shown >= max_bins:
            lines.append(f"... ({tm.num_ctas - b} more CTAs)")
            break
        items = " ".join(f"({r},{h},[{x},{y}))" for r, h, x, y in ds[:max_desc_per_bin].tolist())
        if len(ds) > max_desc_per_bin:
            items += f" ... +{len(ds) - max_desc_per_bin}"
        lines.append(f"bin {b:4d} [{int(load[b]):4d} tiles]: {items if len(ds) else '(empty)'}")
        shown += 1
    idle = tm.num_ctas - tm.nbins if tm.kind in ("dynamic", "batch_invariant") else 0
    if idle > 0:
        lines.append(f"({idle} CTAs with no bin: idle)")
    return "\n".join(lines)


def check_task_map(tm: TaskMap) -> None:
    """Assert the map's invariants: every tile of every pair covered exactly once, descriptors ordered by pair
    chunk, chunk_start/num_chunks consistent, bin_start monotone. Raises AssertionError with the map printed."""
    def fail(msg):
        raise AssertionError(f"{msg}\n{format_task_map(tm, max_bins=16)}")
    batch, H = tm.batch, tm.num_kv_heads
    if not np.all(np.diff(tm.bin_start) >= 0) or tm.bin_start[0] != 0 or tm.bin_start[-1] != tm.ndesc:
        fail("bin_start not monotone from 0 to ndesc")
    covered = np.zeros(batch * H, dtype=np.int64)
    for p in range(batch * H):
        r, h = p % batch, p // batch
        s, n = int(tm.chunk_start[p]), int(tm.num_chunks[p])
        if n == 0 and tm.tiles[p] != 0:
            fail(f"pair {p} has {tm.tiles[p]} tiles but 0 chunks")
        expect = 0
        for d in range(s, s + n):
            dr, dh, tb, te = tm.descriptors[d].tolist()
            if (dr, dh) != (r, h) or tb != expect or te <= tb:
                fail(f"descriptor {d} = {tm.descriptors[d].tolist()} breaks pair {p}'s chunk chain at tile {expect}")
            expect = te
        if expect != tm.tiles[p]:
            fail(f"pair {p}: chunks cover {expect} of {tm.tiles[p]} tiles")
        covered[p] = expect
    if int(tm.num_chunks.sum()) != tm.ndesc:
        fail(f"sum(num_chunks) = {tm.num_chunks.sum()} != ndesc = {tm.ndesc}")


# ----------------------------------------------------------------------------------------------------------------
# Same-precision emulation
# ----------------------------------------------------------------------------------------------------------------

def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, score_scale: torch.Tensor,
                      v_scale: float = 1.0, kv_offset: int = 0, row_limit: torch.Tensor | None = None,
                      tile: int = TILE, p_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 online-softmax attention of some query rows over one chunk of keys, tile by tile.

    Shape/Dtype: q [R, D] fp32 (exact fp8/bf16 values, undequantized); k, v [N, D] fp32 (exact cache values);
    score_scale [R] fp32 (sm_scale * q_scale * k_scale per row); v_scale a float; row_limit [R] int64 (row i sees
    absolute key positions < row_limit[i]; keys are at kv_offset .. kv_offset+N-1) or None (all keys).
    p_dtype: round P to this dtype before the PV product (to mirror a kernel that does), None = keep fp32.
    Returns (o [R, D] fp32 normalized by its own sum, lse [R] fp32 natural log of the sum of exp of the scaled
    scores; a row that sees no key gets o = 0, lse = -inf).
    """
    R, D = q.shape
    m = torch.full((R,), float("-inf"), dtype=torch.float32, device=q.device)
    l = torch.zeros(R, dtype=torch.float32, device=q.device)
    acc = torch.zeros(R, D, dtype=torch.float32, device=q.device)
    for t0 in range(0, k.shape[0], tile):
        kt, vt = k[t0:t0 + tile], v[t0:t0 + tile]
        s = (q @ kt.T) * score_scale[:, None]
        if row_limit is not None:
            pos = kv_offset + t0 + torch.arange(kt.shape[0], device=q.device)
            s = s.masked_fill(pos[None, :] >= row_limit[:, None], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=1))
        m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # all-masked rows: avoid inf-inf
        alpha = torch.exp(m - m_use)
        p = torch.exp(s - m_use[:, None])
        l = l * alpha + p.sum(dim=1)
        if p_dtype is not None:
            p = p.to(p_dtype).float()
        acc = acc * alpha[:, None] + p @ vt
        m = m_new
    seen = l > 0
    o = torch.where(seen[:, None], acc / torch.where(seen, l, torch.ones_like(l))[:, None] * v_scale,
                    torch.zeros_like(acc))
    lse = torch.where(seen, m + torch.log(torch.where(seen, l, torch.ones_like(l))),
                      torch.full_like(l, float("-inf")))
    return o, lse


def combine(partial_o: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
    """Merge n partial results with the global softmax renormalization (fp32).

    Shape/Dtype: partial_o [n, R, D] fp32; partial_lse [n, R] fp32 (-inf for a chunk the row saw no key in).
    Returns [R, D] fp32 = sum_i exp(lse_i - max) o_i / sum_i exp(lse_i - max); rows with all lse -inf give zeros.
    Raises ValueError if the shapes disagree or n == 0.
    """
    if partial_o.dim() != 3 or partial_lse.shape != partial_o.shape[:2] or partial_o.shape[0] == 0:
        raise ValueError(f"partial_o [n, R, D] and partial_lse [n, R] with n >= 1 expected, got "
                         f"{tuple(partial_o.shape)} and {tuple(partial_lse.shape)}")
    mx = partial_lse.amax(dim=0)
    seen = torch.isfinite(mx)
    w = torch.exp(partial_lse - torch.where(seen, mx, torch.zeros_like(mx))[None])  # exp(-inf) = 0
    den = w.sum(dim=0)
    out = (w[..., None] * partial_o).sum(dim=0) / torch.where(seen, den, torch.ones_like(den))[:, None]
    return torch.where(seen[:, None], out, torch.zeros_like(out))


def split_kv_decode_emulation(q, k_cache, v_cache, block_table, kv_lens, *, task_map: TaskMap | None = None,
                              q_len=1, q_scale=None, k_scale=None, v_scale=None, sm_scale=None,
                              p_dtype: torch.dtype | None = None, return_partials: bool = False):
    """What the split-KV kernels compute, in their precision: descriptor by descriptor, then the combine.

    Shape/Dtype: as split_kv_decode_ref; task_map from build_task_map / static_*_task_map /
    batch_invariant_task_map for the same kv_lens and kv_heads (None: build_task_map(kv_lens, H, 132)).
    Returns out [batch*q_len, q_heads, head_dim] bf16 (and, with return_partials, also partial_o
    [ndesc, G*q_len, D] fp32 and partial_lse [ndesc, G*q_len] fp32 in descriptor slots, rows ordered
    (q_len token, group head)). Single-chunk pairs are written directly; kv_len 0 -> zeros.
    Raises TypeError/ValueError on malformed inputs or a task map built for other lengths/heads.
    """
    info = validate_decode_inputs(q, k_cache, v_cache, block_table, kv_lens, q_len=q_len, q_scale=q_scale,
                                  k_scale=k_scale, v_scale=v_scale)
    B, Hq, H, D = info["batch"], info["q_heads"], info["kv_heads"], info["head_dim"]
    lens = info["lens"]
    if task_map is None:
        task_map = build_task_map(lens, H, 132)
    if task_map.num_kv_heads != H or task_map.kv_lens.tolist() != lens:
        raise ValueError("task_map was built for other kv_lens or num_kv_heads than these inputs")
    G = Hq // H
    tile = task_map.tile
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    ks = float(k_scale.item()) if k_scale is not None else 1.0
    vs = float(v_scale.item()) if v_scale is not None else 1.0
    qf = _as_float(q)  # exact values
    qs = q_scale.float() if q_scale is not None else torch.ones(B * q_len, Hq, device=q.device)
    dev = q.device
    out = torch.zeros(B * q_len, Hq, D, dtype=torch.bfloat16, device=dev)
    nd = task_map.ndesc
    po = torch.full((nd, q_len * G, D), float("nan"), dtype=torch.float32, device=dev)
    pl = torch.full((nd, q_len * G), float("nan"), dtype=torch.float32, device=dev)

    def rows_of(r, h):  # (token i, head g) rows of request r, kv head h: q [q_len*G, D], scales, limits
        qr = qf[r * q_len:(r + 1) * q_len, h * G:(h + 1) * G].reshape(q_len * G, D)
        sc = (qs[r * q_len:(r + 1) * q_len, h * G:(h + 1) * G].reshape(q_len * G) * scale) * ks
        lim = torch.tensor([lens[r] - (q_len - 1 - i) for i in range(q_len) for _ in range(G)], device=dev)
        return qr, sc.float(), lim

    for d, (r, h, tb, te) in enumerate(task_map.descriptors.tolist()):
        L = lens[r]
        begin, end = tb * tile, min(te * tile, L)
        k = _as_float(_gather_kv(k_cache, block_table, r, begin, end)[:, h])
        v = _as_float(_gather_kv(v_cache, block_table, r, begin, end)[:, h])
        qr, sc, lim = rows_of(r, h)
        o, lse = partial_attention(qr, k, v, score_scale=sc, v_scale=vs, kv_offset=begin,
                                   row_limit=lim if q_len > 1 else None, tile=tile, p_dtype=p_dtype)
        po[d], pl[d] = o, lse
        p = h * B + r
        if task_map.num_chunks[p] == 1:  # single chunk: final output written directly
            out[r * q_len:(r + 1) * q_len, h * G:(h + 1) * G] = o.reshape(q_len, G, D).to(torch.bfloat16)
    for p in np.nonzero(task_map.num_chunks > 1)[0].tolist():
        r, h = p % B, p // B
        s, n = int(task_map.chunk_start[p]), int(task_map.num_chunks[p])
        o = combine(po[s:s + n], pl[s:s + n])
        out[r * q_len:(r + 1) * q_len, h * G:(h + 1) * G] = o.reshape(q_len, G, D).to(torch.bfloat16)
    if return_partials:
        return out, po, pl
    return out


# ----------------------------------------------------------------------------------------------------------------
# The two numbers
# ----------------------------------------------------------------------------------------------------------------

def flops(kv_lens, q_heads: int, head_dim: int, q_len: int = 1) -> int:
    """FLOPs of decode attention: 4 * head_dim per (query row, visible key) (QK^T and PV, 2 each), MTP-causal."""
    lens = _lens_list(kv_lens)
    vis = sum(max(0, L - (q_len - 1 - i)) for L in lens for i in range(q_len))
    return 4 * q_heads * head_dim * vis


def bytes_moved(kv_lens, kv_heads: int, head_dim: int, kv_dtype: str = "fp8", q_heads: int = 8,
                q_len: int = 1) -> int:
    """Minimum HBM bytes: K and V read once + Q (fp8 + fp32 per-token-head scale on the fp8 path, else bf16)
    + the bf16 output. Raises ValueError for an unknown kv_dtype."""
    if kv_dtype not in ("fp8", "bf16"):
        raise ValueError(f"kv_dtype must be 'fp8' or 'bf16', got {kv_dtype!r}")
    lens = _lens_list(kv_lens)
    e = 1 if kv_dtype == "fp8" else 2
    rows = len(lens) * q_len * q_heads
    kv = 2 * sum(lens) * kv_heads * head_dim * e
    qb = rows * head_dim * e + (rows * 4 if kv_dtype == "fp8" else 0)
    return kv + qb + rows * head_dim * 2


def measure_emulation_error(configs=None, seed: int = 0) -> list[dict]:
    """Emulation vs exact over a grid of small configs (how the split_kv_decode rows of hotpaths.harness.tolerances
    were derived). Returns one dict per run
    with kv_dtype, config, schedule, rel_l2, max_abs, cosine."""
    if configs is None:
        configs = [dict(q_heads=g, kv_heads=1, head_dim=d, page_size=ps, q_len=ql)
                   for g in SUPPORTED_GQA for d in (64, 128) for ps, ql in ((16, 1), (64, 2), (128, 4), (32, 3))]
    lens = [1, 63, 64, 65, 300, 0, 700]
    rows = []
    for i, cfg in enumerate(configs):
        for kv_dtype in ("fp8", "bf16"):
            inp = make_decode_inputs(lens, kv_dtype=kv_dtype, seed=seed + i, **cfg)
            ref = split_kv_decode_ref(**inp)
            for name, tm in (("dynamic", build_task_map(lens, cfg["kv_heads"], 8)),
                             ("static_count", static_count_task_map(lens, cfg["kv_heads"], 3))):
                out = split_kv_decode_emulation(**inp, task_map=tm).float()
                err = (out - ref)
                rel = float(err.norm() / ref.norm())
                cos = float(torch.nn.functional.cosine_similarity(out.reshape(1, -1), ref.reshape(1, -1)))
                rows.append(dict(kv_dtype=kv_dtype, schedule=name, rel_l2=rel, max_abs=float(err.abs().max()),
                                 cosine=cos, **cfg))
    return rows
