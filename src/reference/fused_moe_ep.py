"""Expert-parallel MoE (the TP1/EPn shape) over torch.distributed: dispatch, per-rank expert compute, combine.

Each of the W ranks holds E = experts_total / W experts, ids [rank*E, (rank+1)*E), and its own tokens.
1. dispatch: every valid (token, slot) pair whose expert lives on rank j sends the token's row (bf16) and the
   slot's expert id to j, with one ``all_to_all_single`` per tensor (ragged splits, exchanged first).
2. expert compute: the receiving rank runs the per-rank MoE on the rows it received, one pair per row (top-1, the
   row's expert id, weight 1.0): the fused kernel on a GPU, ``fused_moe_emulation`` on the CPU. With weight 1.0
   the per-rank reduce returns ``bf16(1.0 * float(y)) == y``: the un-weighted expert output.
3. combine: the outputs travel back to the token's home rank (the reverse ``all_to_all_single``); the home rank
   sums ``w[t, k] * y`` over the slots in order k = 0..K-1 in FP32, adds the shared expert, rounds once to bf16.

Why the routing weight stays home rather than travelling with the row: the home rank already holds it, the
combine then carries bf16 (a weighted FP32 product would double the bytes, a weighted bf16 one would round twice),
and the home-side sum is the same arithmetic as the single-process emulation's reduce, so the layer equals
``fused_moe_emulation`` over all experts BIT FOR BIT (the emulation computes every pair's row independently of
which other rows share its tile, and FP8 activation scales are per token or static). Rows travel in bf16, not FP8:
the kernels quantize x themselves (the first stage), so FP8 rows would need a kernel entry that takes quantized
rows and their scales; that halves the dispatch bytes and is the first follow-up (docs/ops/fused_moe_ep.md).

Transport: ``all_to_all_single`` on NCCL (GPU) and on gloo (CPU; gloo implements ragged all-to-all in torch 2.x,
bf16 included; tested in tests/test_fused_moe_ep.py). Split sizes must be known on the host, so the counts exchange
is one small collective and a host sync per layer (a CUDA-graph version would use fixed worst-case buffers).

Overlap (``micro_batches=2``): the tokens are cut into chunks; the dispatch of chunk c+1 and the combine of chunk c
are issued asynchronously while chunk c (c+1) computes, so with two chunks about min(comm, compute) of the
per-layer time can hide. The result does not depend on the chunking (per-row arithmetic).

Imports torch and hotpaths.reference only (the GPU composition lives in hotpaths.bench.fused_moe_ep).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hotpaths.reference.common import expect_tensor
from hotpaths.reference.fused_moe import fused_moe_emulation, weighted_slot_sum

# NVLink multicast (NVLS) stays off in every process of this layer: the lent machines do not support it reliably.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_off(env=None) -> dict:
    """Set the three multicast-off variables in ``env`` (default os.environ; child processes inherit it) and return
    it. Call in the launcher before starting workers and again in each worker (torchrun starts them itself)."""
    env = os.environ if env is None else env
    env.update(MULTICAST_OFF)
    return env


@dataclass(frozen=True)
class EPRouting:
    """Where this rank's valid pairs go. pair_index: int64 [P] flat pair ids t*K+k, grouped by destination rank
    (rank-major, ascending pair id inside a rank); send_counts: pairs per destination, length W."""
    num_tokens: int
    topk: int
    pair_index: torch.Tensor
    send_counts: list


def route_pairs(topk_ids: torch.Tensor, *, experts_per_rank: int, world_size: int) -> EPRouting:
    """Group this rank's valid (token, slot) pairs by the rank owning their expert (local work, no communication).

    Shape/Dtype: topk_ids int32 [T, K], global expert ids in [-1, world_size * experts_per_rank) (-1 = skip).
    Returns EPRouting. Raises TypeError/ValueError on a bad tensor, sizes, or ids out of range.
    """
    expect_tensor(topk_ids, "topk_ids", dtype=torch.int32, ndim=2, layout="[T, K]", why=" (global expert ids)")
    for name, v in (("experts_per_rank", experts_per_rank), ("world_size", world_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    if flat.numel():
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -1 or hi >= world_size * experts_per_rank:
            raise ValueError(f"topk_ids: expected ids in [-1, {world_size * experts_per_rank}) ({world_size} ranks x "
                             f"{experts_per_rank} experts), got min {lo}, max {hi}")
    valid = torch.nonzero(flat >= 0).flatten()
    dest = torch.div(flat[valid], experts_per_rank, rounding_mode="floor")
    dest, order = torch.sort(dest, stable=True)  # stable: ascending pair id within each destination
    counts = torch.bincount(dest, minlength=world_size)
    return EPRouting(t, k, valid[order], [int(c) for c in counts.tolist()])


def exchange_counts(send: list[list[int]], *, group=None, device="cpu") -> list[list[int]]:
    """send[c][j]: pairs of chunk c this rank sends to rank j. Returns recv[c][j]: pairs of chunk c it receives
    from rank j. One all_to_all_single of W * chunks int64 (a host sync: the splits of the data collectives)."""
    w = dist.get_world_size(group)
    m = len(send)
    inp = torch.tensor([send[c][j] for j in range(w) for c in range(m)], dtype=torch.int64, device=device)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp, group=group)
    got = out.cpu().tolist()
    return [[got[j * m + c] for j in range(w)] for c in range(m)]


class _Chunk:
    """One micro-batch in flight: its routing, received counts and buffers, and pending collectives."""

    def __init__(self, t0: int, t1: int, routing: EPRouting, recv_counts: list):
        self.t0, self.t1, self.routing, self.recv_counts = t0, t1, routing, recv_counts
        self.handles: list = []

    def wait(self) -> None:
        for h in self.handles:
            h.wait()
        self.handles = []


def _dispatch(ch: _Chunk, x, topk_ids, group, async_op: bool) -> None:
    r = ch.routing
    tok = torch.div(r.pair_index, r.topk, rounding_mode="floor") + ch.t0
    rows = x[tok].contiguous()
    ids = topk_ids.reshape(-1)[r.pair_index + ch.t0 * r.topk].contiguous()
    n = sum(ch.recv_counts)
    ch.recv_x = torch.empty(n, x.shape[1], dtype=x.dtype, device=x.device)
    ch.recv_ids = torch.empty(n, dtype=torch.int32, device=x.device)
    for out, inp in ((ch.recv_x, rows), (ch.recv_ids, ids)):
        h = dist.all_to_all_single(out, inp, ch.recv_counts, r.send_counts, group=group, async_op=async_op)
        if async_op:
            ch.handles.append(h)


def _combine(ch: _Chunk, y, group, async_op: bool) -> None:
    r = ch.routing
    ch.back = torch.empty(len(r.pair_index), y.shape[1], dtype=y.dtype, device=y.device)
    h = dist.all_to_all_single(ch.back, y, r.send_counts, ch.recv_counts, group=group, async_op=async_op)
    if async_op:
        ch.handles.append(h)


def slot_reduce(back, routing: EPRouting, topk_ids, topk_weights, shared_out=None) -> torch.Tensor:
    """The home rank's combine: bf16(sum over slots k = 0..K-1 of w[t, k] * float(y[t, k]) in FP32, + shared_out),
    y of skipped slots 0; the same arithmetic as the single-process emulation's reduce (so the results match to the
    bit). Shape/Dtype: back bf16 [P, H] in routing.pair_index order; topk_ids int32 [T, K]; topk_weights fp32 [T, K];
    shared_out bf16 [T, H] or None. Returns bf16 [T, H]."""
    t, k = topk_ids.shape
    h = back.shape[1]
    ybuf = torch.zeros(t * k, h, dtype=back.dtype, device=back.device)
    ybuf[routing.pair_index] = back
    return weighted_slot_sum(ybuf.reshape(t, k, h), topk_ids >= 0, topk_weights, shared_out)


def emulation_expert_fn(local: dict, expert_offset: int):
    """The CPU expert compute: ``fn(recv_x bf16 [R, H], recv_ids int32 [R]) -> y bf16 [R, H]``, each row one pair
    through fused_moe_emulation with weight 1.0. local: w13, w2, w13_scale, w2_scale, a1_scale, a2_scale, scales
    (this rank's experts; a1/a2 the layer's static scales, the same on every rank)."""
    def fn(recv_x, recv_ids):
        if recv_x.shape[0] == 0:
            return recv_x.clone()
        ones = torch.ones(recv_x.shape[0], 1, dtype=torch.float32, device=recv_x.device)
        return fused_moe_emulation(recv_x, recv_ids[:, None], ones, local["w13"], local["w2"], scales=local["scales"],
                                   w13_scale=local["w13_scale"], w2_scale=local["w2_scale"],
                                   a1_scale=local.get("a1_scale"), a2_scale=local.get("a2_scale"),
                                   expert_offset=expert_offset)
    return fn


def ep_moe(x, topk_ids, topk_weights, *, experts_per_rank: int, expert_fn, shared_out=None, group=None,
           micro_batches: int = 1, mark=None) -> torch.Tensor:
    """One expert-parallel MoE layer on this rank (a collective: every rank of ``group`` calls it).

    Shape/Dtype: x bf16 [T, H] (this rank's tokens; T may differ between ranks, 0 included); topk_ids int32 [T, K]
    global ids in [-1, W * experts_per_rank); topk_weights fp32 [T, K]; shared_out bf16 [T, H] or None (the shared
    expert's output, added at home). expert_fn(recv_x bf16 [R, H], recv_ids int32 [R]) -> bf16 [R, H]: this rank's
    experts on received pairs (emulation_expert_fn, or the fused kernel in hotpaths.bench.fused_moe_ep).
    micro_batches: token chunks pipelined so that communication of one overlaps compute of another (1 = none).
    mark(name): called after each phase ("dispatch", "compute", "combine"; with micro_batches > 1 only "combine" at
    the end) for timing. Returns bf16 [T, H].
    Raises TypeError/ValueError on bad input (before any communication).
    """
    expect_tensor(x, "x", dtype=torch.bfloat16, ndim=2, layout="[T, H]")
    expect_tensor(topk_weights, "topk_weights", dtype=torch.float32, ndim=2, layout="[T, K]")
    w = dist.get_world_size(group)
    routing = route_pairs(topk_ids, experts_per_rank=experts_per_rank, world_size=w)  # validates topk_ids
    t, k = topk_ids.shape
    if x.shape[0] != t or tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"x, topk_weights: expected {t} rows (and [T, K] = {(t, k)} weights) like topk_ids, got "
                         f"{tuple(x.shape)} and {tuple(topk_weights.shape)}")
    if shared_out is not None:
        expect_tensor(shared_out, "shared_out", dtype=torch.bfloat16, ndim=2, layout="[T, H]")
        if tuple(shared_out.shape) != tuple(x.shape):
            raise ValueError(f"shared_out: expected shape {tuple(x.shape)} like x, got {tuple(shared_out.shape)}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches: expected an int >= 1, got {micro_batches!r}")
    mark = mark or (lambda name: None)
    # chunk boundaries by token; every rank uses the same number of chunks (the collectives must pair up)
    bounds = [(t * c // micro_batches, t * (c + 1) // micro_batches) for c in range(micro_batches)]
    routings = [routing] if micro_batches == 1 else [
        route_pairs(topk_ids[a:b], experts_per_rank=experts_per_rank, world_size=w) for a, b in bounds]
    recv = exchange_counts([r.send_counts for r in routings], group=group, device=x.device)
    chunks = [_Chunk(a, b, r, rc) for (a, b), r, rc in zip(bounds, routings, recv)]
    if micro_batches == 1:
        ch = chunks[0]
        _dispatch(ch, x, topk_ids, group, async_op=False)
        mark("dispatch")
        y = expert_fn(ch.recv_x, ch.recv_ids)
        mark("compute")
        _combine(ch, y, group, async_op=False)
        out = slot_reduce(ch.back, ch.routing, topk_ids, topk_weights, shared_out)
        mark("combine")
        return out
    _dispatch(chunks[0], x, topk_ids, group, async_op=True)
    for c, ch in enumerate(chunks):
        ch.wait()
        if c + 1 < len(chunks):  # in flight while this chunk computes
            _dispatch(chunks[c + 1], x, topk_ids, group, async_op=True)
        y = expert_fn(ch.recv_x, ch.recv_ids)
        _combine(ch, y, group, async_op=True)  # in flight while the next chunk computes
    parts = []
    for ch in chunks:
        ch.wait()
        a, b = ch.t0, ch.t1
        parts.append(slot_reduce(ch.back, ch.routing, topk_ids[a:b], topk_weights[a:b],
                                 None if shared_out is None else shared_out[a:b]))
    out = torch.cat(parts) if parts else x.new_empty(0, x.shape[1])
    mark("combine")
    return out


def a2a_bytes_per_token(*, topk: int, hidden: int, world_size: int, row_bytes: int = 2, both_ways: bool = True) -> dict:
    """All-to-all bytes per token under uniform routing: K slots x H x row_bytes each way; the fraction 1/W of the
    slots lands on the home rank and crosses no link. Returns {total, remote, local_fraction}."""
    one_way = topk * hidden * row_bytes
    total = one_way * (2 if both_ways else 1)
    return {"total": total, "remote": total * (world_size - 1) / world_size, "local_fraction": 1.0 / world_size}
