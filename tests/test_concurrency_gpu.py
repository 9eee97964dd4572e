"""Concurrency (SM90): the same op launched on two streams at once, and two captured CUDA graphs with different
plans replayed at once, give bit for bit the results of running them one after the other. A workspace, counter or
scratch buffer shared by mistake between plans (a global, a static, a cached allocation keyed too coarsely) makes
the two overlapping runs corrupt each other."""

import pytest
import torch

pytestmark = pytest.mark.gpu

REPEATS = 4  # interleaved launches per stream: more overlap between the two


def _on_streams(fa, fb):
    """Run fa on one side stream and fb on another, REPEATS times each, interleaved; return their last results."""
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ra = rb = None
    for _ in range(REPEATS):
        with torch.cuda.stream(s1):
            ra = fa()
        with torch.cuda.stream(s2):
            rb = fb()
    torch.cuda.synchronize()
    return ra, rb


def _graphs(fa, fb):
    """Capture fa and fb in two graphs (after a warm-up), replay both at once on two streams; return the outputs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (library load, first-use allocations) outside capture
        fa(), fb()
    torch.cuda.synchronize()
    ga, gb = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(ga):
        oa = fa()
    with torch.cuda.graph(gb):
        ob = fb()
    torch.cuda.synchronize()
    for t in (oa, ob):  # poison: the replays must rewrite them
        for x in (t if isinstance(t, tuple) else (t,)):
            if x is not None and x.is_floating_point():
                x.fill_(float("nan"))
    # The replay streams wait for the poison fills (queued on the current stream) BEFORE any replay: no stream
    # ever waits on work recorded later, and the fills cannot land after a replay's writes.
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    for _ in range(REPEATS):
        with torch.cuda.stream(s1):
            ga.replay()
        with torch.cuda.stream(s2):
            gb.replay()
    torch.cuda.synchronize()
    return oa, ob


def _same(a, b, what):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        if x is None:
            continue
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), what


# ----------------------------------------------------------------------------------------------------------------
# split-KV decode: two plans with different lengths (different task maps, partial buffers, grids)

def _decode_pair():
    from hotpaths.kernels import split_kv_decode as K
    from hotpaths.reference import split_kv_decode as ref

    def make(lens, seed):
        d = ref.make_decode_inputs(lens, q_heads=8, kv_heads=1, page_size=64, kv_dtype="fp8", device="cuda",
                                   seed=seed)
        p = K.plan(d["kv_lens"], num_kv_heads=1, q_heads=8, variant="v3", fuse_max=0, kv_dtype=d["k_cache"].dtype)
        out = torch.empty(d["q"].shape, dtype=torch.bfloat16, device="cuda")

        def f():
            p.update(d["kv_lens"])
            return K.run(p, d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["kv_lens"], q_scale=d["q_scale"],
                         k_scale=d["k_scale"], v_scale=d["v_scale"], out=out).clone()
        return f

    return make([5000, 300, 17, 4096], 0), make([64] * 24 + [9000], 1)


# ----------------------------------------------------------------------------------------------------------------
# router GEMM: two token counts (different grids; split-K workspaces per call)

def _router_pair():
    from hotpaths.kernels import router_gemm as K
    from hotpaths.reference import router_gemm as ref

    def make(m, n, k, seed):
        x, w = ref.make_router_inputs(m, n, k, seed=seed, device="cuda")
        wt = K.plan(w)
        out = torch.empty(m, n, dtype=torch.float32, device="cuda")
        return lambda: K.router_gemm(x, wt, impl="bf16x2_kernel", out=out).clone()

    return make(7, 192, 4096, 0), make(1024, 256, 2048, 1)


# ----------------------------------------------------------------------------------------------------------------
# attention prologue: two batches writing two caches

def _prologue_pair():
    from hotpaths.kernels import attention_prologue as K
    from hotpaths.reference import attention_prologue as ref

    def make(tokens, q_heads, kv_heads, seed):
        d = ref.make_prologue_inputs(tokens, q_heads=q_heads, kv_heads=kv_heads, pad_every=5, device="cuda",
                                     seed=seed)
        names = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache",
                 "v_cache")
        kw = {k: d[k] for k in ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale", "v_scale")}
        q_out = torch.empty(tokens, q_heads, 128, dtype=ref.FP8_DTYPE, device="cuda")
        qs_out = torch.empty(tokens, q_heads, dtype=torch.float32, device="cuda")

        def f():
            K.attention_prologue(*(d[n] for n in names), **kw, q_out=q_out, q_scale_out=qs_out)
            return q_out.clone(), qs_out.clone(), d["k_cache"].clone(), d["v_cache"].clone()
        return f

    return make(7, 8, 1, 0), make(2048, 64, 8, 1)


# ----------------------------------------------------------------------------------------------------------------
# fused MoE: two plans (different routings and token counts, same weights: the buffers live in each plan)

def _moe_pair():
    from hotpaths.kernels import fused_moe as K
    from hotpaths.reference import fused_moe as fm

    def make(tokens, routing, seed):
        d = fm.make_moe_inputs(tokens, experts=16, topk=4, hidden=512, inter=8 * 192, scales="block", seed=seed,
                               routing=routing, device="cuda")
        p = K.plan(d["topk_ids"], num_experts=d["num_experts"], expert_offset=d["expert_offset"])
        out = torch.empty(tokens, d["hidden"], dtype=torch.bfloat16, device="cuda")

        def f():
            p.update(d["topk_ids"])
            return K.run(p, d["x"], d["w13"], d["w2"], d["topk_weights"], scales="block", w13_scale=d["w13_scale"],
                         w2_scale=d["w2_scale"], out=out).clone()
        return f

    return make(3, "random", 0), make(512, "duplicates", 1)


# ----------------------------------------------------------------------------------------------------------------
# each pair run alone first (the expected bits), then both at once: on two streams, or as two graphs replayed

PAIRS = {"decode": _decode_pair, "router": _router_pair, "prologue": _prologue_pair, "moe": _moe_pair}
AT_ONCE = {"streams": _on_streams, "graphs": _graphs}


@pytest.mark.parametrize("how", list(AT_ONCE))
@pytest.mark.parametrize("op", list(PAIRS))
def test_two_at_once_match_sequential(op, how):
    fa, fb = PAIRS[op]()
    ea, eb = fa(), fb()
    torch.cuda.synchronize()
    ca, cb = AT_ONCE[how](fa, fb)
    _same(ea, ca, f"{op}: A run beside B ({how}) differs from A run alone")
    _same(eb, cb, f"{op}: B run beside A ({how}) differs from B run alone")
