"""GPU tests of the fused FP8 MoE kernels (SM90 only; skipped elsewhere with the reason).

Route kernel vs the host plan byte for byte (hotpaths.reference.fused_moe.build_routing_plan, and a small host
builder here that states the layout independently); each stage (gate-up act, down ybuf) and the fused pipeline vs
the staged emulation of the contract on NaN-poisoned outputs, both scale modes, Hy3 TP8 and TP1/EP8 shapes, small
shapes, routing edges, zero tokens, CUDA-graph replay with plan.update inside the graph, shared_out, PDL on/off,
the torch.library op.

Every comparison uses the contract's staged emulation, hotpaths.reference.fused_moe.fused_moe_emulation (stages by
pair), when that module is importable; otherwise the same five steps written out below (quantize, gate-up +
SiLU-and-mul, quantize, down, weighted reduce), which follow it operation for operation. One detail both pin down
for every device: a block-mode group scale is amax times fp32(1/448) (what torch computes for `cuda_tensor / 448.0`),
not the correctly rounded quotient; test_block_scale_rounding_on_tie_heavy_inputs fails if the kernel rounds it the
other way.
"""

from __future__ import annotations

import math

import pytest
import torch

from hotpaths.harness.env import requires_sm90

pytestmark = [pytest.mark.gpu, requires_sm90()]

FP8 = torch.float8_e4m3fn
GEMMS = ["mma", "wgmma", "wgmma_ws", "mma_tma"]  # every GEMM path (MoEPlan.gemm) meets the same contract
TILES = {"mma": [8, 16, 32, 64], "wgmma": [16, 32, 64, 128], "wgmma_ws": [16, 32, 64, 128],
         "mma_tma": [8, 16, 32, 64]}  # block_m per path


@pytest.fixture(scope="module")
def moe():
    from hotpaths.kernels import fused_moe

    return fused_moe


# ----------------------------------------------------------------------------------------------------------------
# the contract's staged emulation (fp32 math on the fp8 values; torch's fp8 cast is round-to-nearest-even)

def _quant(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (v / s).clamp(-448.0, 448.0).to(FP8).float()


_INV448 = 1.0 / 448.0  # rounded to fp32 where it multiplies an fp32 tensor


def _group_quant(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1x128 groups along the last dim (last group partial): (quantized values as fp32, scales [n, G]).
    The scale is amax * fp32(1/448) on every device (a tensor operand, so CPU and CUDA round alike)."""
    n, k = v.shape
    g = math.ceil(k / 128)
    pad = torch.zeros(n, g * 128, dtype=torch.float32, device=v.device)
    pad[:, :k] = v
    amax = pad.view(n, g, 128).abs().amax(-1)
    s = torch.clamp(amax * torch.tensor(_INV448, dtype=torch.float32, device=v.device), min=1e-12)
    q = _quant(pad.view(n, g, 128), s[:, :, None]).view(n, g * 128)[:, :k]
    return q, s


def _gemm(aq, a_s, w, w_s, mode):
    """(aq . w^T) * scales: aq fp32 [n, K] (fp8 values), w fp8 [R, K]; per-tensor: a_s [1] x w_s scalar; block:
    a_s [n, G] x w_s [ceil(R/128), G], per 128-wide K group."""
    wf = w.float()
    if mode == "pertensor":
        return (aq @ wf.t()) * (a_s * w_s)
    n, k = aq.shape
    r = wf.shape[0]
    g = math.ceil(k / 128)
    pa = torch.zeros(n, g * 128, device=aq.device)
    pa[:, :k] = aq
    pw = torch.zeros(r, g * 128, device=aq.device)
    pw[:, :k] = wf
    part = torch.bmm(pa.view(n, g, 128).transpose(0, 1), pw.view(r, g, 128).permute(1, 2, 0))  # [G, n, R]
    wsr = w_s.repeat_interleave(128, dim=0)[:r]  # [R, G]
    return (part * (a_s.t()[:, :, None] * wsr.t()[:, None, :])).sum(0)


def _reference_emulation():
    try:
        from hotpaths.reference.fused_moe import fused_moe_emulation
    except ImportError:
        return None
    return fused_moe_emulation


def emulate(x, ids, tw, w13, w2, mode, w13_scale, w2_scale, a1_scale=None, a2_scale=None, expert_offset=0,
            shared_out=None):
    """Returns (act [P, I] bf16 by pair, y [P, H] bf16 by pair, out [T, H] bf16, valid [P] bool): the reference
    module's emulation when importable, else the local one."""
    ref = _reference_emulation()
    if ref is None:
        return emulate_local(x, ids, tw, w13, w2, mode, w13_scale, w2_scale, a1_scale, a2_scale, expert_offset,
                             shared_out)
    e_count = w13.shape[0]
    loc = ids.long() - expert_offset
    valid = ((loc >= 0) & (loc < e_count)).reshape(-1)
    # the reference rejects ids below -1 as malformed; every id outside the local range is skipped alike
    ids_ref = torch.where(valid.view(ids.shape), ids, torch.full_like(ids, -1))
    st = ref(x, ids_ref, tw, w13, w2, scales=mode, w13_scale=w13_scale, w2_scale=w2_scale, a1_scale=a1_scale,
             a2_scale=a2_scale, expert_offset=expert_offset, shared_out=shared_out, return_stages=True)
    return st["act"], st["ybuf"], st["out"], valid


def emulate_local(x, ids, tw, w13, w2, mode, w13_scale, w2_scale, a1_scale=None, a2_scale=None, expert_offset=0,
                  shared_out=None):
    """The contract's stages written out here; same return as ``emulate``."""
    t, k = ids.shape
    e_count, two_i, h = w13.shape
    inter = two_i // 2
    flat = ids.reshape(-1).long() - expert_offset
    valid = (flat >= 0) & (flat < e_count)
    xf = x.float()
    if mode == "pertensor":
        xq, xs = _quant(xf, a1_scale), None
    else:
        xq, xs = _group_quant(xf)
    act = torch.zeros(t * k, inter, dtype=torch.bfloat16, device=x.device)
    y = torch.zeros(t * k, h, dtype=torch.bfloat16, device=x.device)
    for e in torch.unique(flat[valid]).tolist():
        pairs = torch.nonzero(valid & (flat == e)).flatten()
        tok = pairs // k
        if mode == "pertensor":
            hh = _gemm(xq[tok], a1_scale, w13[e], w13_scale[e], mode)
        else:
            hh = _gemm(xq[tok], xs[tok], w13[e], w13_scale[e], mode)
        g, u = hh[:, :inter], hh[:, inter:]
        a = (g * torch.sigmoid(g) * u).to(torch.bfloat16)
        act[pairs] = a
        if mode == "pertensor":
            yy = _gemm(_quant(a.float(), a2_scale), a2_scale, w2[e], w2_scale[e], mode)
        else:
            aq, as_ = _group_quant(a.float())
            yy = _gemm(aq, as_, w2[e], w2_scale[e], mode)
        y[pairs] = yy.to(torch.bfloat16)
    acc = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    v2 = valid.view(t, k)
    for kk in range(k):
        acc = acc + torch.where(v2[:, kk:kk + 1], tw[:, kk:kk + 1] * y.view(t, k, h)[:, kk].float(),
                                torch.zeros((), device=x.device))
    if shared_out is not None:
        acc = acc + shared_out.float()
    return act, y, acc.to(torch.bfloat16), valid


# ----------------------------------------------------------------------------------------------------------------
# inputs and checks

def make_weights(e, h, inter, mode, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randn(e, 2 * inter, h, generator=g, device=device).to(FP8)
    w2 = torch.randn(e, h, inter, generator=g, device=device).to(FP8)
    if mode == "pertensor":
        w13s = (0.5 + torch.rand(e, generator=g, device=device)) / math.sqrt(h)
        w2s = (0.5 + torch.rand(e, generator=g, device=device)) / math.sqrt(inter)
        extra = dict(a1_scale=torch.tensor([0.01], device=device), a2_scale=torch.tensor([0.005], device=device))
    else:
        w13s = (0.5 + torch.rand(e, math.ceil(2 * inter / 128), math.ceil(h / 128), generator=g, device=device)) \
            / math.sqrt(h)
        w2s = (0.5 + torch.rand(e, math.ceil(h / 128), math.ceil(inter / 128), generator=g, device=device)) \
            / math.sqrt(inter)
        extra = {}
    return w13, w2, dict(w13_scale=w13s, w2_scale=w2s, **extra)


def make_tokens(t, k, h, ids_hi, seed=0, ids_lo=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(1000 + seed)
    x = torch.randn(t, h, generator=g, device=device).to(torch.bfloat16)
    ids = torch.randint(ids_lo, ids_hi, (t, k), generator=g, device=device, dtype=torch.int32)
    tw = torch.rand(t, k, generator=g, device=device)
    return x, ids, tw / tw.sum(-1, keepdim=True).clamp(min=1e-6)


def assert_close(got, exp, what, cos_min=0.9999, rel_max=0.02):
    assert got.shape == exp.shape, what
    if exp.numel() == 0:
        return
    gf, ef = got.float().flatten(), exp.float().flatten()
    assert not torch.isnan(gf).any(), f"{what}: NaN in the kernel output"
    if ef.abs().max() == 0:
        assert gf.abs().max() == 0, f"{what}: expected all zeros"
        return
    cos = torch.nn.functional.cosine_similarity(gf.double(), ef.double(), dim=0).item()
    rel = ((gf - ef).norm() / ef.norm()).item()
    assert cos >= cos_min and rel <= rel_max, f"{what}: cosine {cos:.6f} (>= {cos_min}), rel L2 {rel:.2e}"


def host_plan(ids, num_experts, expert_offset, max_tokens, block_m):
    """The layout of plan_layout.cuh, written independently of the kernel (a pure-Python loop)."""
    t, k = ids.shape
    max_pairs = max_tokens * k
    flat = ids.reshape(-1).tolist()
    per = [[] for _ in range(num_experts)]
    for p, v in enumerate(flat):
        e = v - expert_offset
        if 0 <= e < num_experts:
            per[e].append(p)
    counts = [len(q) for q in per]
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    valid = offsets[-1]
    sorted_pairs = [p for q in per for p in q] + [-1] * (max_pairs - valid)
    max_tiles = -(-max_pairs // block_m) + num_experts
    te, ts = [], []
    for e in range(num_experts):
        for s in range(offsets[e], offsets[e + 1], block_m):
            te.append(e)
            ts.append(s)
    n_tiles = len(te)
    te += [-1] * (max_tiles - n_tiles)
    ts += [-1] * (max_tiles - n_tiles)
    header = [valid, n_tiles, sum(c > 0 for c in counts), block_m, 0, 0, 0, 0]
    return torch.tensor(header + counts + offsets + sorted_pairs + te + ts, dtype=torch.int32)


# ----------------------------------------------------------------------------------------------------------------
# plan

ROUTE_CASES = [  # (T, K, E, expert_offset, id range, max_tokens, block_m)
    (1, 8, 192, 0, (0, 192), None, 8),
    (64, 8, 192, 0, (0, 192), None, 16),
    (256, 8, 192, 0, (0, 192), 300, 16),
    (200, 8, 24, 24, (-5, 200), None, 64),   # EP8 rank 1: remote ids, negative ids
    (300, 4, 4, 0, (0, 4), None, 32),        # multiple chunks of 1024 pairs, heavy experts
    (1000, 16, 512, 0, (0, 512), None, 8),
    (100, 8, 384, 0, (0, 384), None, 16),     # 48 KB of counters + the kernel's static arrays: needs the opt-in
    (100, 8, 370, 0, (0, 370), None, 16),     # below 48 KB of dynamic memory, above it with the static arrays
    (0, 8, 192, 0, (0, 192), 16, 8),
    (5, 3, 7, 0, (0, 1), None, 8),            # all to one expert
]


@pytest.mark.parametrize("case", ROUTE_CASES)
def test_device_plan_matches_host_builder(moe, case):
    t, k, e, off, (lo, hi), mt, bm = case
    g = torch.Generator().manual_seed(t * 7 + k)
    ids = torch.randint(lo, hi, (t, k), generator=g, dtype=torch.int32)
    if t > 2:
        ids[1] = -1                                   # a token routed nowhere
        ids[2, : min(k, 3)] = ids[2, 0].item()        # duplicates within a row
        ids[0, 0] = 2**31 - 1                         # garbage id: skipped
    p = moe.plan(ids.cuda(), num_experts=e, expert_offset=off, max_tokens=mt, block_m=bm)
    exp = host_plan(ids, e, off, mt if mt is not None else t, bm)
    got = p.workspace.cpu()
    n = moe.workspace_len(e, (mt or t) * k, bm)
    assert got.numel() == exp.numel() == n == moe.c_workspace_len(e, (mt or t) * k, bm)
    bad = torch.nonzero(got != exp).flatten()[:10].tolist()
    assert not bad, f"plan differs at {bad}; layout {p.layout.offsets}\n{p.describe()}"


def test_device_plan_matches_reference_builder(moe):
    from hotpaths.reference.fused_moe import build_routing_plan, workspace_len
    for t, k, e, off, (lo, hi), mt, bm in ROUTE_CASES:
        g = torch.Generator().manual_seed(t * 7 + k)
        ids = torch.randint(lo, hi, (t, k), generator=g, dtype=torch.int32)
        p = moe.plan(ids.cuda(), num_experts=e, expert_offset=off, max_tokens=mt, block_m=bm)
        ref = build_routing_plan(ids, num_experts=e, expert_offset=off, max_tokens=mt, block_m=bm)
        ref = torch.as_tensor(getattr(ref, "workspace", ref)).to(torch.int32).cpu().flatten()
        assert workspace_len(e, (mt or t) * k, bm) == moe.c_workspace_len(e, (mt or t) * k, bm)
        assert torch.equal(p.workspace.cpu(), ref), f"case {(t, k, e, off, mt, bm)}:\n{p.describe()}"


def test_plan_update_reroutes_in_place(moe):
    ids = torch.randint(0, 16, (32, 4), dtype=torch.int32)
    p = moe.plan(ids.cuda(), num_experts=16, max_tokens=64, block_m=8)
    ptr = p.workspace.data_ptr()
    for t in (64, 1, 0, 17):
        ids2 = torch.randint(-1, 16, (t, 4), dtype=torch.int32)
        p.update(ids2.cuda())
        assert p.workspace.data_ptr() == ptr
        assert torch.equal(p.workspace.cpu(), host_plan(ids2, 16, 0, 64, 8))
    with pytest.raises(ValueError, match="max_tokens"):
        p.update(torch.zeros(65, 4, dtype=torch.int32, device="cuda"))


# The multi-CTA route (per-chunk histograms, then placement at (expert, chunk) offsets) must give the same bytes as
# the one-CTA kernel and the host builders, chunk boundaries included: large pair counts (many chunks, several warps'
# segments per chunk), EP offsets, skew, every pair on one expert, max_tokens above T (idle chunks), zero tokens.
LARGE_ROUTE_CASES = [  # (T, K, E, expert_offset, id range, max_tokens, block_m)
    (4096, 8, 192, 0, (0, 192), None, 128),     # Hy3 TP8, batch 4096
    (16384, 8, 192, 0, (0, 192), None, 128),    # 128 chunks of 1024 pairs
    (4096, 8, 24, 48, (-3, 192), None, 64),     # EP8 rank 2: most ids remote, some negative
    (3000, 8, 192, 0, (0, 192), 4096, 64),      # max_tokens above T: the last chunks are empty
    (8192, 8, 192, 0, (7, 8), None, 128),       # every pair on one expert
    (2000, 16, 512, 0, (0, 512), None, 16),     # the largest E and K
    (0, 8, 192, 0, (0, 192), 4096, 64),         # zero tokens on a multi-CTA plan
    (700, 8, 1, 0, (-1, 2), None, 128),         # one local expert, ids on both sides of it
    (1500, 8, 384, 0, (0, 384), None, 32),      # 48 KB of warp counters: shared memory past the default limit
    (600, 8, 300, 0, (0, 300), None, 16),
]


def capture(fn) -> torch.cuda.CUDAGraph:
    """fn() captured into a CUDA graph on a side stream (after a sync: warm-up work is done)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def _route_ids(t, k, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(lo, hi, (t, k), generator=g, dtype=torch.int32)
    if t > 2:
        ids[1] = -1                                   # a token routed nowhere
        ids[2, : min(k, 3)] = ids[2, 0].item()        # duplicates within a row
        ids[0, 0] = 2**31 - 1                         # garbage id: skipped
    return ids


@pytest.mark.parametrize("route", ["small", "one", "multi"])
@pytest.mark.parametrize("case", ROUTE_CASES + LARGE_ROUTE_CASES)
def test_route_paths_match_host_plans(moe, case, route):
    from hotpaths.reference.fused_moe import build_routing_plan
    t, k, e, off, (lo, hi), mt, bm = case
    if route == "small" and (mt if mt is not None else t) * k > moe.ROUTE_SMALL_MAX_PAIRS:
        pytest.skip("a plan larger than the small route takes")
    ids = _route_ids(t, k, lo, hi, seed=t * 7 + k + e)
    if hi - lo > 8 and t >= 64:  # skew: a quarter of the tokens on experts 0..3 (relative to the rank)
        ids[: t // 4] = torch.randint(off, off + 4, (t // 4, k), dtype=torch.int32)
    p = moe.plan(ids.cuda(), num_experts=e, expert_offset=off, max_tokens=mt, block_m=bm, route=route)
    assert p.route == route
    got = p.workspace.cpu()
    exp = host_plan(ids, e, off, mt if mt is not None else t, bm)
    bad = torch.nonzero(got != exp).flatten()[:10].tolist()
    assert not bad, f"{route} route differs at {bad}; layout {p.layout.offsets}"
    ref = build_routing_plan(ids, num_experts=e, expert_offset=off, max_tokens=mt, block_m=bm)
    assert torch.equal(got, torch.as_tensor(getattr(ref, "workspace", ref)).to(torch.int32).cpu().flatten())


def test_multi_route_update_and_stale_workspace(moe):
    """Re-routing fewer tokens into a multi-CTA plan rewrites every byte (padding and tiles of the larger routing
    before it included), and the scratch needs no clearing between launches."""
    e, k, mt = 192, 8, 4096
    p = moe.plan(_route_ids(mt, k, 0, e, 1).cuda(), num_experts=e, max_tokens=mt, route="multi")
    assert p.route == "multi" and p.route_scratch().numel() == moe._lib().hp_moe_route_ctas(mt * k) * e
    for t in (4096, 1, 0, 513, 4095, 2048):
        ids = _route_ids(t, k, -1, e, 100 + t)
        p.workspace.fill_(12345)
        p.update(ids.cuda())
        assert torch.equal(p.workspace.cpu(), host_plan(ids, e, 0, mt, p.block_m)), f"update to {t} tokens"


def test_multi_route_graph_replay_with_changing_counts(moe):
    """The multi-CTA route captured in a CUDA graph (PDL on) replays correctly while the live token count (the
    tokens whose ids are not -1) changes between replays."""
    e, k, mt = 192, 8, 4096
    ids_buf = _route_ids(mt, k, 0, e, 3).cuda()
    p = moe.plan(ids_buf, num_experts=e, max_tokens=mt)  # auto: 32768 pairs take the multi-CTA route
    assert p.route == "multi"
    graph = capture(lambda: p.update(ids_buf))
    for active in (4096, 1, 1500, 0, 4000, 37):
        new_ids = _route_ids(mt, k, 0, e, 200 + active)
        new_ids[active:] = -1
        ids_buf.copy_(new_ids.cuda())
        p.workspace.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(p.workspace.cpu(), host_plan(new_ids, e, 0, mt, p.block_m)), f"{active} active tokens"


@pytest.mark.parametrize("case", [(128, 8, 192, 0), (1024, 1, 512, 0), (64, 16, 24, 24), (300, 3, 7, 0)])
def test_small_route_updates_and_graph_replay(moe, case):
    """The decode-size route at its capacity (1024 pairs, E = 512 included) re-routes any live count into a stale
    workspace byte for byte, inside a CUDA graph too (PDL on)."""
    mt, k, e, off = case
    ids_buf = _route_ids(mt, k, -1, off + e, 5).cuda()
    p = moe.plan(ids_buf, num_experts=e, expert_offset=off, max_tokens=mt, route="small")
    assert p.route == "small"
    graph = capture(lambda: p.update(ids_buf))
    for active in (mt, 1, mt // 3, 0, mt - 1):
        new_ids = _route_ids(mt, k, -1, off + e, 300 + active)
        new_ids[active:] = -1
        ids_buf.copy_(new_ids.cuda())
        p.workspace.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(p.workspace.cpu(), host_plan(new_ids, e, off, mt, p.block_m)), f"{active} active tokens"
    p.workspace.fill_(12345)
    p.update(ids_buf[:1])
    assert torch.equal(p.workspace.cpu(), host_plan(ids_buf[:1].cpu(), e, off, mt, p.block_m)), "eager update"


def test_route_choice_by_plan_size(moe, monkeypatch):
    monkeypatch.delenv(moe.ROUTE_ENV, raising=False)
    small = moe.plan(torch.zeros(64, 8, dtype=torch.int32, device="cuda"), num_experts=192)
    mid = moe.plan(torch.zeros(64, 8, dtype=torch.int32, device="cuda"), num_experts=192, max_tokens=65)
    big = moe.plan(torch.zeros(64, 8, dtype=torch.int32, device="cuda"), num_experts=192, max_tokens=4096)
    assert (small.route, mid.route, big.route) == ("small", "one", "multi") and small.route_scratch() is None
    monkeypatch.setenv(moe.ROUTE_ENV, "one")
    assert moe.plan(torch.zeros(64, 8, dtype=torch.int32, device="cuda"), num_experts=192,
                    max_tokens=4096).route == "one"


# ----------------------------------------------------------------------------------------------------------------
# the top-k reduce alone: both kernels against the contract's combine, bit for bit

REDUCE_CASES = [  # (T, K, E, expert_offset, id range, H, shared)
    (1, 8, 192, 0, (0, 192), 4096, False),
    (256, 8, 192, 0, (0, 192), 4096, False),    # the first batch auto gives the wide kernel
    (600, 8, 192, 0, (-1, 192), 4096, True),
    (4096, 8, 192, 0, (0, 192), 4096, False),   # Hy3 TP8 at the measured large batch
    (513, 8, 24, 24, (0, 192), 4096, True),     # EP: most slots remote (their ybuf rows are NaN here)
    (333, 16, 64, 0, (0, 64), 192, True),       # K 16 (the 16 x 1 wide instantiation), a partial slab
    (77, 3, 8, 0, (-2, 8), 320, False),         # K 3, slabs not a multiple of 512 columns
    (2048, 1, 4, 0, (0, 4), 4096, True),
]


@pytest.mark.parametrize("variant", ["narrow", "wide", "auto"])
@pytest.mark.parametrize("case", REDUCE_CASES)
def test_reduce_kernels_bit_exact(moe, case, variant):
    from hotpaths.reference.fused_moe import weighted_slot_sum
    t, k, e, off, (lo, hi), h, shared = case
    g = torch.Generator(device="cuda").manual_seed(t + k + h)
    ids = torch.randint(lo, hi, (t, k), generator=g, device="cuda", dtype=torch.int32)
    tw = torch.rand(t, k, generator=g, device="cuda")
    y = torch.randn(t * k, h, generator=g, device="cuda").to(torch.bfloat16)
    so = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16) if shared else None
    valid = ((ids.long() - off >= 0) & (ids.long() - off < e))
    y_poison = y.clone()
    y_poison[~valid.flatten()] = float("nan")  # rows of slots not routed here are never written by the down GEMM
    exp = weighted_slot_sum(torch.where(valid.flatten()[:, None], y, 0).view(t, k, h), valid, tw, so)
    out = torch.full((t, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    code = moe._lib().hp_moe_reduce(moe._ptr(ids), moe._ptr(tw), moe._ptr(y_poison), moe._ptr(so), moe._ptr(out), t,
                                    k, e, off, h, moe.REDUCES[variant], 1, moe._stream(out.device))
    moe._check(code, "reduce")
    torch.cuda.synchronize()
    bad = torch.nonzero(out.view(torch.int16) != exp.view(torch.int16))[:5].tolist()
    assert not bad, f"{variant} reduce differs from the contract's combine at {bad}"


@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_reduce_variant_through_run(moe, monkeypatch, variant):
    """$HOTPATHS_MOE_REDUCE reaches the launch: both kernels give the pipeline's bits."""
    monkeypatch.setenv(moe.REDUCE_ENV, variant)
    _, (_, _, out), (_, _, eo, _) = _run_case(moe, "small_i192", "pertensor", 40, shared=True)
    assert_close(out, eo, f"reduce={variant}")
    monkeypatch.setenv(moe.REDUCE_ENV, "narrow" if variant == "wide" else "wide")
    _, (_, _, out2), _ = _run_case(moe, "small_i192", "pertensor", 40, shared=True)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))


@pytest.mark.parametrize("gemm", ["wgmma", "wgmma_ws"])
@pytest.mark.parametrize("name,t", [("small_i192", 37), ("hy3_tp8", 64), ("h320_i320", 29), ("hy3_tp8", 600)])
def test_gate_up_writes_aq_like_the_prepass(moe, monkeypatch, name, t, gemm):
    """Per-tensor on the wgmma paths the gate-up epilogue writes aq itself (the down GEMM's pre-pass is not
    launched): aq of the valid pairs and out equal, bit for bit, to a run with the pre-pass
    ($HOTPATHS_MOE_ACT_QUANT = prepass)."""
    e, k, h, i, off, _ = SHAPES[name]
    res = {}
    for choice in ("prepass", "auto"):
        monkeypatch.setenv(moe.ACT_QUANT_ENV, choice)
        p, (_, _, out), _ = _run_case(moe, name, "pertensor", t, seed=t, gemm=gemm)
        assert moe.act_quant_fused(p, "pertensor") == (choice == "auto")
        nvalid = int(p.fields()["header"][0])
        aq = p.quant_buffers(h, i)[2]
        res[choice] = (aq[:nvalid].clone(), out.clone())
    assert torch.equal(res["auto"][0], res["prepass"][0]), f"{name}/T={t}/{gemm}: aq differs from the pre-pass"
    assert torch.equal(res["auto"][1].view(torch.int16), res["prepass"][1].view(torch.int16)), \
        f"{name}/T={t}/{gemm}: out differs with the fused act quantization"


# ----------------------------------------------------------------------------------------------------------------
# stages and the fused pipeline

SHAPES = {  # name: (E, K, H, I, expert_offset, id range)
    "small": (8, 2, 128, 64, 0, (0, 8)),
    "small_i192": (6, 3, 256, 192, 0, (-1, 6)),
    "hy3_tp8": (192, 8, 4096, 192, 0, (0, 192)),
    "hy3_tp1_ep8": (24, 8, 4096, 1536, 24, (0, 192)),
    # partial last 1x128 groups on both sides (64 wide): scale rows of 2 floats, an odd count of k stages
    "h192_i64": (8, 2, 192, 64, 0, (0, 8)),
    "h192_i192": (8, 3, 192, 192, 0, (-1, 8)),
    # rows of 1.25 x 256 columns: the activation pre-pass's (row, 256-column chunk) units with a partial last chunk
    "h320_i320": (8, 2, 320, 320, 0, (0, 8)),
}
_W = {}


def weights(name, mode):
    if (name, mode) not in _W:
        e, k, h, i, off, _ = SHAPES[name]
        _W.clear()  # one big weight set resident at a time
        _W[(name, mode)] = make_weights(e, h, i, mode, seed=sum(map(ord, name)))
    return _W[(name, mode)]


def _run_case(moe, name, mode, t, *, seed=0, block_m=None, shared=False, pdl=True, ids=None, gemm=None):
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    w13, w2, sc = weights(name, mode)
    x, ids0, tw = make_tokens(t, k, h, hi, seed=seed, ids_lo=lo)
    ids = ids0 if ids is None else ids
    # seeded like the tokens: a test may run the same case twice and compare bits
    g = torch.Generator(device="cuda").manual_seed(2000 + seed)
    so = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16) if shared else None
    p = moe.plan(ids, num_experts=e, expert_offset=off, block_m=block_m, pdl=pdl, gemm=gemm)
    if gemm is not None:
        assert p.gemm == gemm
    out = torch.full((t, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    act, ybuf = p.buffers(h, i)
    act.fill_(float("nan"))
    ybuf.fill_(float("nan"))
    res = moe.run(p, x, w13, w2, tw, scales=mode, shared_out=so, out=out, pdl=pdl, **sc)
    assert res.data_ptr() == out.data_ptr()
    ea, ey, eo, valid = emulate(x, ids, tw, w13, w2, mode, expert_offset=off, shared_out=so, **sc)
    return p, (act, ybuf, out), (ea, ey, eo, valid)


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("t", [1, 4, 16, 64])
def test_stages_and_pipeline_match_emulation(moe, name, mode, t, gemm):
    p, (act, ybuf, out), (ea, ey, eo, valid) = _run_case(moe, name, mode, t, seed=t, gemm=gemm)
    f = p.fields()
    nvalid = int(f["header"][0])
    assert nvalid == int(valid.sum())
    sp = f["sorted_pairs"][:nvalid].long()
    assert_close(act[:nvalid], ea[sp], f"{name}/{mode}/T={t}/{gemm}: gate-up act")
    vp = torch.nonzero(valid).flatten()
    assert_close(ybuf[vp], ey[vp], f"{name}/{mode}/T={t}/{gemm}: down ybuf")
    assert_close(out, eo, f"{name}/{mode}/T={t}/{gemm}: output")


@pytest.mark.parametrize("gemm,block_m", [("mma", 8), ("mma", 16), ("mma", 64), ("wgmma", 16), ("wgmma", 64),
                                          ("wgmma", 128), ("wgmma_ws", 16), ("wgmma_ws", 64), ("wgmma_ws", 128),
                                          ("mma_tma", 8), ("mma_tma", 16), ("mma_tma", 64)])
@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name", ["h192_i64", "h192_i192"])
@pytest.mark.parametrize("t", [1, 3, 5, 70])
def test_partial_scale_groups_match_emulation(moe, name, mode, t, block_m, gemm):
    """H and I multiples of 64 but not of 128 (group-scale rows of 2 floats, 8 bytes: no 16-byte access may rely
    on them), odd token counts, every tile height: the layer equals the emulation and writes every output."""
    _, (_, _, out), (_, _, eo, _) = _run_case(moe, name, mode, t, seed=7 * t + block_m, block_m=block_m, gemm=gemm)
    torch.cuda.synchronize()  # a misaligned access surfaces here, named by the case
    assert torch.isfinite(out).all(), f"{name}/{mode}/T={t}/block_m={block_m}/{gemm}: NaN left in out"
    assert_close(out, eo, f"{name}/{mode}/T={t}/block_m={block_m}/{gemm}: output")


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name", ["small_i192", "hy3_tp8", "hy3_tp1_ep8", "h320_i320"])
def test_prepass_quantizes_like_the_contract(moe, name, mode):
    """The activation pre-pass: xq = e4m3(x / s) for the T rows and aq = e4m3(act / s) for the valid pairs (by
    sorted position), s = a1/a2 or the 1x128 group scales amax * fp32(1/448) (bit-equal to the emulation's). The
    kernel divides with a reciprocal plus one correction (correctly rounded but for rare last-ulp cases), so at most
    1e-4 of the bytes may differ, each by one e4m3 step."""
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    t = 37
    p, (act, _, _), _ = _run_case(moe, name, mode, t, seed=11)
    xq, xsc, aq, asc = p.quant_buffers(h, i)
    nvalid = int(p.fields()["header"][0])
    w13, w2, sc = weights(name, mode)
    x, _, _ = make_tokens(t, k, h, hi, seed=11, ids_lo=lo)
    for what, src, q, qs, a_s in (("x", x, xq[:t], xsc[:t], sc.get("a1_scale")),
                                  ("act", act[:nvalid], aq[:nvalid], asc[:nvalid], sc.get("a2_scale"))):
        if mode == "pertensor":
            exp = (src.float() / a_s).clamp(-448.0, 448.0).to(FP8)
        else:
            eq, es = _group_quant(src.float())
            assert torch.equal(qs, es), f"{what}: group scales differ from amax * fp32(1/448)"
            exp = eq.to(FP8)
        got8, exp8 = q.view(FP8).float(), exp.float()
        diff = got8 != exp8
        assert diff.float().mean().item() <= 1e-4, f"{what}: {int(diff.sum())} of {diff.numel()} bytes differ"
        if diff.any():  # one e4m3 step at most
            from hotpaths.reference.fused_moe import e4m3_steps

            assert (e4m3_steps(got8[diff], exp8[diff]) <= 1.0001).all(), f"{what}: off by more than one step"


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("t", [128, 256, 1024])
def test_hy3_tp8_large_batches(moe, mode, t, gemm):
    p, (act, ybuf, out), (ea, ey, eo, valid) = _run_case(moe, "hy3_tp8", mode, t, seed=t, gemm=gemm)
    nvalid = int(p.fields()["header"][0])
    sp = p.fields()["sorted_pairs"][:nvalid].long()
    assert_close(act[:nvalid], ea[sp], f"hy3_tp8/{mode}/T={t}/{gemm} (block_m {p.block_m}): gate-up act")
    vp = torch.nonzero(valid).flatten()
    assert_close(ybuf[vp], ey[vp], f"hy3_tp8/{mode}/T={t}/{gemm} (block_m {p.block_m}): down ybuf")
    assert_close(out, eo, f"hy3_tp8/{mode}/T={t}/{gemm} (block_m {p.block_m}): output")


def _small_ints(shape, seed, lo=-2, hi=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g, device="cuda").float()


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("h", [256, 192])
@pytest.mark.parametrize("block_m,t", [(16, 13), (32, 32), (64, 61), (128, 128), (128, 100), (64, 70), (128, 40),
                                       (128, 170)])
def test_gemm_tile_on_exact_integers(moe, gemm, h, block_m, t):
    """One expert (two tiles when t > block_m), top-1: every token of the tile is sorted position = token. Operands
    are small integers (exact in e4m3 with unit scales), so each GEMM's fp32 sums are exact: the down GEMM's ybuf
    must equal bf16(aq . w2^T) bit for bit, and the gate-up act equals bf16(silu(g) * u) up to the SiLU's last ulp.
    A swizzle, descriptor, fragment-layout or row-mapping bug shows here as grossly wrong values, apart from the
    pipeline and routing tests. h = 192: a K tail of half a stage (gate-up) and a last down n-tile of 64 rows."""
    if block_m not in TILES[gemm]:
        pytest.skip(f"block_m {block_m} is not a {gemm} tile")
    inter, e = 64 if h == 256 else 192, 1
    x = _small_ints((t, h), seed=block_m + t).to(torch.bfloat16)
    w13f, w2f = _small_ints((e, 2 * inter, h), seed=1), _small_ints((e, h, inter), seed=2)
    w13, w2 = w13f.to(FP8), w2f.to(FP8)
    ones = dict(w13_scale=torch.ones(e, device="cuda"), w2_scale=torch.ones(e, device="cuda"),
                a1_scale=torch.ones(1, device="cuda"), a2_scale=torch.ones(1, device="cuda"))
    ids = torch.zeros(t, 1, dtype=torch.int32, device="cuda")
    tw = torch.ones(t, 1, device="cuda")
    p = moe.plan(ids, num_experts=e, block_m=block_m, gemm=gemm)
    act, ybuf = p.buffers(h, inter)
    act.fill_(float("nan"))
    moe.run(p, x, w13, w2, tw, scales="pertensor", stages=("route", "gate_up"), **ones)
    g = x.float() @ w13f[0, :inter].t()
    u = x.float() @ w13f[0, inter:].t()
    exp_act = (g * torch.sigmoid(g) * u).to(torch.bfloat16)
    got = act[:t].float()
    assert torch.isfinite(got).all(), f"{gemm}/h={h}/block_m={block_m}: act rows not written"
    bad = (got - exp_act.float()).abs() > 1e-2 * exp_act.float().abs() + 1e-3
    assert not bad.any(), (f"{gemm}/h={h}/block_m={block_m}: {int(bad.sum())} of {bad.numel()} act values wrong, "
                           f"first at {torch.nonzero(bad)[0].tolist()}: {got[bad][0].item()} vs "
                           f"{exp_act.float()[bad][0].item()}")
    # down alone on an exact activation: small integers in act, a2 = 1, so aq = act exactly
    a_int = _small_ints((t, inter), seed=3 + t)
    act[:t] = a_int.to(torch.bfloat16)
    ybuf.fill_(float("nan"))
    moe.run(p, x, w13, w2, tw, scales="pertensor", stages="down", **ones)
    exp_y = (a_int @ w2f[0].t()).to(torch.bfloat16)
    assert torch.equal(ybuf[:t], exp_y), (f"{gemm}/h={h}/block_m={block_m}: ybuf differs at "
                                          f"{torch.nonzero(ybuf[:t] != exp_y)[:4].tolist()}")


def test_wgmma_and_mma_agree_on_hy3_tp8(moe):
    """The two GEMM paths on the same inputs (21 rows per expert: auto picks wgmma_ws): act within the fp32
    summation order (cosine 0.99999), the layer output within the emulation tolerance."""
    e, k, h, i, off, (lo, hi) = SHAPES["hy3_tp8"]
    w13, w2, sc = weights("hy3_tp8", "pertensor")
    x, ids, tw = make_tokens(512, k, h, hi, seed=77)
    res = {}
    for gemm in ("mma", "wgmma"):
        p = moe.plan(ids, num_experts=e, gemm=gemm)
        out = moe.run(p, x, w13, w2, tw, scales="pertensor", **sc)
        act, _ = p.buffers(h, i)
        nvalid = int(p.fields()["header"][0])
        res[gemm] = (act[:nvalid].clone(), out.clone())
    assert moe.plan(ids, num_experts=e, gemm="auto").gemm == "wgmma_ws"
    assert_close(res["wgmma"][0], res["mma"][0], "act wgmma vs mma", cos_min=0.99999, rel_max=5e-3)
    assert_close(res["wgmma"][1], res["mma"][1], "out wgmma vs mma")


def _layer_by_path(moe, mode, t, seed, gemms, split_k=True, block_m=None):
    """The Hy3 TP8 layer on the same inputs under each GEMM path of `gemms` (buffers NaN-poisoned first): per path
    (act by sorted position, ybuf of the valid pairs, out, the plan's split factors, its block_m)."""
    e, k, h, i, off, (lo, hi) = SHAPES["hy3_tp8"]
    w13, w2, sc = weights("hy3_tp8", mode)
    x, ids, tw = make_tokens(t, k, h, hi, seed=seed)
    res = {}
    for gemm in gemms:
        p = moe.plan(ids, num_experts=e, gemm=gemm, block_m=block_m)
        act, ybuf = p.buffers(h, i)
        act.fill_(float("nan"))
        ybuf.fill_(float("nan"))
        out = moe.run(p, x, w13, w2, tw, scales=mode, split_k=split_k, **sc)
        nvalid = int(p.fields()["header"][0])
        vp = torch.nonzero(ids.reshape(-1) >= 0).flatten()
        res[gemm] = (act[:nvalid].clone(), ybuf[vp].clone(), out.clone(), p.split_factors(h, i, mode), p.block_m)
    return res


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("t", [4, 64, 512])
def test_mma_tma_matches_mma(moe, mode, t):
    """The TMA-fed mma.sync kernel runs the same units, k32 slices, fixed-order warp sum and split-K order as
    expert_gemm_kernel whenever both take the same split factor, so act, ybuf and the output are bit-identical then;
    with different factors (their grids differ) they agree to fp32 summation order. A wrong swizzle offset, ring
    phase or stale slot shows as gross differences. t = 512 at block_m 64: many units per CTA, the ring wraps and
    crosses unit boundaries; t = 4: split-K units."""
    res = _layer_by_path(moe, mode, t, 70 + t, ("mma", "mma_tma"))
    assert res["mma"][4] == res["mma_tma"][4]
    same_split = res["mma"][3] == res["mma_tma"][3]
    for j, what in enumerate(("act", "ybuf", "out")):
        if same_split:
            assert torch.equal(res["mma_tma"][j], res["mma"][j]), f"{mode}/T={t}: {what} mma_tma vs mma not bit-equal"
        else:
            assert_close(res["mma_tma"][j], res["mma"][j], f"{mode}/T={t}: {what} mma_tma vs mma", cos_min=0.99999,
                         rel_max=5e-3)


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("t", [64, 512, 4096])
def test_wgmma_ws_matches_wgmma(moe, mode, t):
    """The warp-specialized kernel computes each output from the same operands with the same wgmma k32 steps in the
    same K order as expert_wgmma_kernel (who loads, which warpgroup holds which half and the instruction's N, narrowed
    to the tile's rows, differ), so act and ybuf agree to the last fp32 rounding: rel L2 <= 1e-3 (in practice 0 or
    a few flipped bf16 roundings). A wrong ring phase, a stale slot, a lost row or a narrowed N that drops occupied
    rows shows as gross differences. split_k=False: no unit is cut across CTAs (a cut unit's pieces start from
    zero accumulators, which moves where the tensor cores' FP8 accumulation rounds; see
    test_wgmma_ws_units_cut_across_ctas).
    t = 4096: block_m 128 for both (auto would give the cp.async kernel 64-row tiles there), many items per CTA: the
    ring wraps many times and crosses item boundaries."""
    res = _layer_by_path(moe, mode, t, 90 + t, ("wgmma", "wgmma_ws"), split_k=False,
                         block_m=128 if t >= 4096 else None)
    assert res["wgmma"][4] == res["wgmma_ws"][4]
    for j, what in enumerate(("act", "ybuf", "out")):
        assert_close(res["wgmma_ws"][j], res["wgmma"][j], f"{mode}/T={t}: {what} wgmma_ws vs wgmma", cos_min=0.999999,
                     rel_max=1e-3)


def _poisoned_split_runs(moe, p, x, w13, w2, tw, mode, sc, h, i, keep, after_split=None):
    """The layer three times on NaN-poisoned act / ybuf: split_k False, True, True. keep(act, ybuf, out) picks the
    tensors each run returns (cloned); after_split(), when given, checks the plan after each split run."""
    act, ybuf = p.buffers(h, i)
    runs = []
    for split in (False, True, True):
        act.fill_(float("nan"))
        ybuf.fill_(float("nan"))
        out = moe.run(p, x, w13, w2, tw, scales=mode, split_k=split, **sc)
        torch.cuda.synchronize()
        runs.append(tuple(v.clone() for v in keep(act, ybuf, out)))
        if split and after_split is not None:
            after_split()
    return runs


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name,t", [("hy3_tp8", 1), ("hy3_tp8", 2), ("hy3_tp1_ep8", 1)])
@pytest.mark.parametrize("gemm", ["mma", "mma_tma"])
def test_split_k_on_off(moe, name, mode, t, gemm):
    """Split-K across CTAs vs no split at sizes whose items leave CTA slots idle: the plan reports the factor the
    launches take (hp_moe_split_factor, the kernel's own formula) and the case is built so the gate-up GEMM must
    split (EP8 at batch 1: exactly one local pair, 1 tile x 2I/32 = 96 items of 32 K stages against >= 2 x 132
    slots; its down GEMM, 64 items of 12 K stages, splits too). The same act up to fp32 summation order, the same
    output within the emulation tolerance; a second split run on poisoned buffers is bit-identical (deterministic
    reduction, and the arrival counters were put back to 0: a stale counter would skip the epilogue and leave NaN)."""
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    w13, w2, sc = weights(name, mode)
    x, ids, tw = make_tokens(t, k, h, hi, seed=40 + t, ids_lo=lo)
    if off:
        ids.fill_(-1)  # exactly one local pair: a single tile whatever the seed
    ids[0, 0] = off + 3
    p = moe.plan(ids, num_experts=e, expert_offset=off, block_m=8, gemm=gemm)
    nvalid = int(p.fields()["header"][0])
    split_gu, split_dn = p.split_factors(h, i, mode)
    assert split_gu > 1, f"{name}/T={t}: the gate-up GEMM should split here, factor {split_gu}"
    if off:
        assert split_dn > 1, f"{name}/T={t}: the down GEMM should split here, factor {split_dn}"
    runs = _poisoned_split_runs(moe, p, x, w13, w2, tw, mode, sc, h, i, lambda a, y, o: (a[:nvalid], o))
    # the split launches wrote partials: the fp32 region past the counters is no longer all zero
    assert torch.count_nonzero(p.splitk_workspace(True)) > 0, "the gate-up GEMM wrote no split-K partial"
    (a0, o0), (a1, o1), (a2, o2) = runs
    assert torch.equal(a1, a2) and torch.equal(o1, o2), "split-K runs differ: counters not reset or order-dependent"
    assert_close(a1, a0, f"{name}/{mode}/T={t}: act split vs no split", cos_min=0.99999, rel_max=5e-3)
    assert_close(o1, o0, f"{name}/{mode}/T={t}: out split vs no split")
    _, _, eo, _ = emulate(x, ids, tw, w13, w2, mode, expert_offset=off, **sc)
    assert_close(o1, eo, f"{name}/{mode}/T={t}: split output vs emulation")
    assert p.split_factors(h, i, mode) == (split_gu, split_dn)


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name,t", [("hy3_tp8", 1), ("hy3_tp8", 4), ("hy3_tp8", 16), ("hy3_tp8", 64),
                                    ("hy3_tp1_ep8", 4), ("hy3_tp1_ep8", 64)])
def test_wgmma_ws_units_cut_across_ctas(moe, name, mode, t):
    """The warp-specialized gate-up GEMM gives every CTA an equal share of the launch's (unit, K stage) steps, so a
    unit is cut where a CTA's range ends: its later pieces leave fp32 partials and flags in the plan's split
    workspace and the CTA holding its first step adds them before the epilogue (t = 1: 24 gate-up units of 32
    stages over 96 CTAs of 8 steps, each unit in 4 pieces; t = 64: ~540 units, cut at most CTA boundaries; TP1/EP8:
    24 n-tiles per tile). Against split_k=False (ranges on unit boundaries, no partial): act within cosine 0.99999
    (a piece starts from a zero accumulator, which moves where the tensor cores' FP8 accumulation rounds: more than
    an fp32 reorder, less than the emulation tolerance), ybuf and the output (one requant of act further) within the
    emulation tolerance; two cut runs on NaN-poisoned buffers are bit-identical (the pieces are added in CTA
    order), every flag is back at 0 after each launch (a stale flag would hand the next launch an old partial),
    and partials were written."""
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    w13, w2, sc = weights(name, mode)
    x, ids, tw = make_tokens(t, k, h, hi, seed=120 + t, ids_lo=lo)
    p = moe.plan(ids, num_experts=e, expert_offset=off, gemm="wgmma_ws")
    nvalid = int(p.fields()["header"][0])
    vp = torch.nonzero((ids.reshape(-1) >= off) & (ids.reshape(-1) < off + e)).flatten()

    def flags_down():
        flags = p.ws_split_workspace()[:moe.WS_SPLIT_FLAGS]
        assert not torch.count_nonzero(flags), f"{name}/{mode}/T={t}: split flags left raised after a launch"
    runs = _poisoned_split_runs(moe, p, x, w13, w2, tw, mode, sc, h, i, lambda a, y, o: (a[:nvalid], y[vp], o),
                                flags_down)
    assert torch.count_nonzero(p.ws_split_workspace()[moe.WS_SPLIT_FLAGS:]) > 0, "no unit was cut: no partial written"
    (a0, y0, o0), (a1, y1, o1), (a2, y2, o2) = runs
    assert torch.equal(a1, a2) and torch.equal(y1, y2) and torch.equal(o1, o2), "cut runs differ: order-dependent"
    assert torch.isfinite(a1).all() and torch.isfinite(o1).all(), "a cut unit's rows were not written"
    assert_close(a1, a0, f"{name}/{mode}/T={t}: act cut vs uncut", cos_min=0.99999, rel_max=5e-3)
    assert_close(y1, y0, f"{name}/{mode}/T={t}: ybuf cut vs uncut")
    _, _, eo, _ = emulate(x, ids, tw, w13, w2, mode, expert_offset=off, **sc)
    assert_close(o1, eo, f"{name}/{mode}/T={t}: cut output vs emulation")


@pytest.mark.parametrize("gemm,block_m", [(g, b) for g in GEMMS for b in TILES[g]])
@pytest.mark.parametrize("mode", ["pertensor", "block"])
def test_every_block_m(moe, block_m, mode, gemm):
    _, (_, _, out), (_, _, eo, _) = _run_case(moe, "small_i192", mode, 50, seed=block_m, block_m=block_m, gemm=gemm)
    assert_close(out, eo, f"block_m={block_m}/{mode}/{gemm}")


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("mode", ["pertensor", "block"])
def test_shared_out_and_no_pdl(moe, mode, gemm):
    for pdl in (True, False):
        _, (_, _, out), (_, _, eo, _) = _run_case(moe, "small_i192", mode, 33, shared=True, pdl=pdl, gemm=gemm)
        assert_close(out, eo, f"shared_out pdl={pdl} {gemm}")


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("edge", ["one_expert", "all_skip", "duplicates", "garbage_ids"])
def test_routing_edges(moe, edge, gemm):
    e, k, h, i, off, _ = SHAPES["small"]
    t = 40
    ids = torch.randint(0, e, (t, k), dtype=torch.int32, device="cuda")
    if edge == "one_expert":
        ids.fill_(3)
    elif edge == "all_skip":
        ids.fill_(-1)
    elif edge == "duplicates":
        ids[:, 1] = ids[:, 0]
    else:
        bad = torch.tensor([-2**31, 2**31 - 1, 100, -7], dtype=torch.int32, device="cuda")
        ids[::3, 0] = bad.repeat(14)[: len(ids[::3])]
    _, (_, _, out), (_, _, eo, _) = _run_case(moe, "small", "pertensor", t, ids=ids, gemm=gemm)
    assert_close(out, eo, f"{edge}/{gemm}")
    if edge == "all_skip":
        assert torch.count_nonzero(out) == 0


def test_zero_tokens_returns_empty(moe):
    e, k, h, i, off, _ = SHAPES["small"]
    w13, w2, sc = weights("small", "pertensor")
    x = torch.empty(0, h, dtype=torch.bfloat16, device="cuda")
    ids = torch.empty(0, k, dtype=torch.int32, device="cuda")
    tw = torch.empty(0, k, device="cuda")
    out = moe.fused_moe(x, ids, tw, w13, w2, scales="pertensor", **sc)
    torch.cuda.synchronize()
    assert out.shape == (0, h) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("gemm", GEMMS)
def test_graph_replay_with_changing_tokens(moe, gemm):
    e, k, h, i, off, (lo, hi) = SHAPES["small_i192"]
    w13, w2, sc = weights("small_i192", "block")
    tmax = 48
    x, ids0, tw = make_tokens(tmax, k, h, hi, seed=5)
    ids_buf = ids0.clone()
    p = moe.plan(ids_buf, num_experts=e, max_tokens=tmax, gemm=gemm)
    out = torch.empty(tmax, h, dtype=torch.bfloat16, device="cuda")
    moe.run(p, x, w13, w2, tw, scales="block", out=out, **sc)  # warm-up allocates the plan's buffers
    graph = capture(lambda: (p.update(ids_buf), moe.run(p, x, w13, w2, tw, scales="block", out=out, **sc)))
    for active in (48, 1, 17, 0, 30):
        _, new_ids, _ = make_tokens(tmax, k, h, hi, seed=100 + active)
        new_ids[active:] = -1  # inactive tokens: the token count of this step is `active`
        ids_buf.copy_(new_ids)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _, _, eo, _ = emulate(x, ids_buf, tw, w13, w2, "block", **sc)
        assert_close(out, eo, f"graph replay ({gemm}), {active} active tokens")
        assert torch.equal(p.workspace.cpu(), host_plan(ids_buf.cpu(), e, 0, tmax, p.block_m))


def test_update_with_fewer_tokens_then_run(moe):
    e, k, h, i, off, (lo, hi) = SHAPES["small"]
    w13, w2, sc = weights("small", "pertensor")
    x, ids, tw = make_tokens(30, k, h, hi, seed=9)
    p = moe.plan(ids, num_experts=e, max_tokens=30)
    p.update(ids[:11])
    out = moe.run(p, x[:11], w13, w2, tw[:11], scales="pertensor", **sc)
    _, _, eo, _ = emulate(x[:11], ids[:11], tw[:11], w13, w2, "pertensor", **sc)
    assert_close(out, eo, "update to 11 tokens")


def test_stage_hook_runs_each_stage(moe):
    e, k, h, i, off, (lo, hi) = SHAPES["small"]
    w13, w2, sc = weights("small", "pertensor")
    x, ids, tw = make_tokens(20, k, h, hi, seed=3)
    p = moe.plan(ids, num_experts=e)
    out = torch.full((20, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    for stage in ("route", "gate_up", "down", "reduce"):
        moe.run(p, x, w13, w2, tw, scales="pertensor", out=out, stages=stage, **sc)
    _, _, eo, _ = emulate(x, ids, tw, w13, w2, "pertensor", **sc)
    assert_close(out, eo, "stage by stage")


def test_torch_library_op_and_compile(moe):
    e, k, h, i, off, (lo, hi) = SHAPES["small"]
    w13, w2, sc = weights("small", "pertensor")
    x, ids, tw = make_tokens(9, k, h, hi, seed=4)
    args = (x, ids, tw, w13, w2, sc["w13_scale"], sc["w2_scale"], sc["a1_scale"], sc["a2_scale"], None,
            "pertensor", 0)
    out = torch.ops.hotpaths.fused_moe(*args)
    _, _, eo, _ = emulate(x, ids, tw, w13, w2, "pertensor", **sc)
    assert_close(out, eo, "torch.ops.hotpaths.fused_moe")
    compiled = torch.compile(lambda *a: torch.ops.hotpaths.fused_moe(*a) * 2, fullgraph=True, backend="aot_eager")
    assert_close(compiled(*args), (eo.float() * 2).to(torch.bfloat16), "torch.compile")


@pytest.mark.parametrize("mode", ["pertensor", "block"])
@pytest.mark.parametrize("name,t", [("small_i192", 37), ("hy3_tp8", 64), ("hy3_tp1_ep8", 16)])
def test_local_emulation_matches_reference_module(mode, name, t):
    """The local fallback emulation vs hotpaths.reference.fused_moe.fused_moe_emulation, stage by stage (so the
    tests mean the same thing before and after the reference module is present). The two differ only in the fp32
    summation order of the GEMMs, which can flip a bf16 act rounding and then an act group scale: tolerances, not
    equality."""
    ref = _reference_emulation()
    assert ref is not None, "hotpaths.reference.fused_moe.fused_moe_emulation failed to import"
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    w13, w2, sc = weights(name, mode)
    x, ids, tw = make_tokens(t, k, h, hi, seed=77 + t, ids_lo=lo)
    la, ly, lo_, valid = emulate_local(x, ids, tw, w13, w2, mode, expert_offset=off, **sc)
    ra, ry, ro, _ = emulate(x, ids, tw, w13, w2, mode, expert_offset=off, **sc)
    vp = torch.nonzero(valid).flatten()
    assert_close(la[vp], ra[vp], f"{name}/{mode}: act, local vs reference emulation", cos_min=0.99999, rel_max=3e-3)
    assert_close(ly[vp], ry[vp], f"{name}/{mode}: ybuf, local vs reference emulation")
    assert_close(lo_, ro, f"{name}/{mode}: out, local vs reference emulation")


def _tie_heavy_tokens(t, h, seed, amax=2.625):
    """bf16 tokens whose every 1x128 group has amax exactly `amax` and the rest uniform in (-amax, amax). With
    amax = 2.625, amax * fp32(1/448) and the correctly rounded amax / 448 differ by an ulp, and 3.6% of the elements
    sit on an e4m3 rounding tie that the two scales resolve differently (measured on the CPU)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.rand(t, h, generator=g, device="cuda") * 2 - 1) * amax
    ng = h // 128
    col = torch.randint(0, 128, (t, ng), generator=g, device="cuda") + torch.arange(ng, device="cuda") * 128
    sign = torch.where(torch.rand(t, ng, generator=g, device="cuda") < 0.5, -1.0, 1.0)
    x.scatter_(1, col, sign * amax)
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("name", ["small_i192", "hy3_tp8"])
def test_block_scale_rounding_on_tie_heavy_inputs(moe, name):
    """Block mode's x group scale must be rounded exactly as the contract rounds it: on inputs full of e4m3 ties the
    other rounding (the correctly rounded quotient) moves the gate-up act by ~3% rel L2 (CPU measurement), while
    the same rounding leaves only the GEMM summation order (<= ~1e-3). The act is compared before any further
    quantization, so the tolerance can be tight."""
    e, k, h, i, off, (lo, hi) = SHAPES[name]
    w13, w2, sc = weights(name, "block")
    t = 8
    x = _tie_heavy_tokens(t, h, seed=21)
    assert bool((x.float().abs().view(t, -1, 128).amax(-1) == 2.625).all())
    _, ids, tw = make_tokens(t, k, h, hi, seed=21, ids_lo=max(lo, 0))
    p = moe.plan(ids, num_experts=e, expert_offset=off)
    act, _ = p.buffers(h, i)
    act.fill_(float("nan"))
    moe.run(p, x, w13, w2, tw, scales="block", **sc)
    ea, _, _, valid = emulate(x, ids, tw, w13, w2, "block", expert_offset=off, **sc)
    nvalid = int(valid.sum())
    sp = p.fields()["sorted_pairs"][:nvalid].long()
    assert_close(act[:nvalid], ea[sp], f"{name}: tie-heavy gate-up act", cos_min=0.99999, rel_max=5e-3)


def test_fused_moe_captured_with_allocations_inside_the_graph(moe):
    """plan + run allocating their workspace and buffers during capture (what torch.ops.hotpaths.fused_moe does
    under a CUDA graph): the replay reads the new routing from the captured ids buffer."""
    e, k, h, i, off, (lo, hi) = SHAPES["small"]
    w13, w2, sc = weights("small", "pertensor")
    x, ids, tw = make_tokens(24, k, h, hi, seed=11)
    moe.fused_moe(x, ids, tw, w13, w2, scales="pertensor", **sc)  # library loaded, launch attributes cached
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, ids, tw, w13, w2, scales="pertensor", **sc)
    _, ids2, _ = make_tokens(24, k, h, hi, seed=12)
    ids.copy_(ids2)
    graph.replay()
    torch.cuda.synchronize()
    _, _, eo, _ = emulate(x, ids, tw, w13, w2, "pertensor", **sc)
    assert_close(out, eo, "captured fused_moe")


# Per-tensor layers of a few rows whose output missed the emulation by more than the tolerance while the per-tensor
# GEMMs kept all of K in the tensor cores' FP8 accumulator (~14 bits of each k32 sum kept against the running total;
# the fuzzer's failure of seed 12, case 168, is the first; the others are the failing seeds of the same layer shape
# over 41 seeds, cosine 0.99955-0.99989 then). A two-row layer does not average the drift away. With every stage's
# partial promoted to fp32 all of them pass (docs/ops/fused_moe.md, "Per-tensor promotion").
PER_TENSOR_ACCUMULATION_CASE = {"block_m": 32, "experts": 5, "hidden": 1024, "inter": 128, "kernel": True,
                                "mode": "tp8ep1", "rank": 0, "routing": "one_expert", "scales": "pertensor",
                                "seed": 54183, "spare_tokens": 4, "tokens": 2, "topk": 5}
PER_TENSOR_DRIFT_CASES = [(54183, 1024, 2), (10, 1024, 2), (28, 1024, 2), (32, 1024, 2), (34, 4096, 2),
                          (18, 7168, 4), (36, 7168, 4)]


@pytest.mark.parametrize("seed,hidden,tokens", PER_TENSOR_DRIFT_CASES)
def test_per_tensor_long_k_matches_emulation(seed, hidden, tokens):
    """Guards, untouched inputs, the route workspace, the fuzzer's staged checks, and the output vs the end-to-end
    emulation (cosine 0.9999, rel L2 2e-2) although these layers hold fewer act elements than the fuzzer asserts it
    from: the drift of an FP8 accumulator showed there first."""
    from hotpaths.bench import fused_moe_fuzz
    from hotpaths.harness.tolerances import tolerance

    res = fused_moe_fuzz.fuzz_run(dict(PER_TENSOR_ACCUMULATION_CASE, seed=seed, hidden=hidden, tokens=tokens))
    assert res["failures"] == []
    m, t = res["metrics"], tolerance("fused_moe", "pertensor_vs_emulation")
    assert m["e2e_rel_l2"] <= t.rel_l2 and m["e2e_cosine"] >= t.min_cosine, m
