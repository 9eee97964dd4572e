"""GPU tests of the fused attention-prologue kernel (SM90 only; skipped elsewhere with the reason).

Kernel vs the same-precision emulation on poisoned outputs and caches: the whole cache compared byte for byte (slots
not written keep their poison), Q bytes within 1 e4m3 ulp (bit-exact by design; the count of differing bytes is in
the message), q_scale equal; both norm orders, both RoPE styles, partial rotary, head_dim 64/128/256, GQA 1..16,
pads, int32 positions, static Q scale, BF16 Q and cache; vs the exact reference within the tolerance rows; CUDA-graph
capture; PDL after a producer kernel; the chain into split-KV decode (output equal to the two run separately); the
torch.library op; bad input refused before launch; the benchmark rows. Every kernel variant (VARIANTS) passes the
emulation comparisons: each case's emulation is computed once and compared with every variant's output.
"""

from __future__ import annotations

import pytest
import torch

from hotpaths.harness.check import check
from hotpaths.harness.env import requires_sm90
from hotpaths.harness.shapes import load_shapes
from hotpaths.harness.tolerances import tolerance
from hotpaths.kernels.attention_prologue import VARIANTS
from hotpaths.reference import attention_prologue as ref

pytestmark = [pytest.mark.gpu, requires_sm90()]

ARGS = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache", "v_cache")
KW = ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale", "v_scale")
SHAPES = load_shapes("attention_prologue", "tests")


@pytest.fixture(scope="module")
def ap():
    from hotpaths.kernels import attention_prologue

    return attention_prologue


def _cuda(inp):
    return {k: (v.cuda().contiguous() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}


def run_kernel(ap, inp, **extra):
    """Kernel on CUDA copies of the inputs with Q / q_scale outputs poisoned; returns CPU tensors."""
    g = _cuda(inp)
    T, D = g["qkv"].shape[0], g["k_cache"].shape[3]
    Hq = g["qkv"].shape[1] // D - 2 * g["k_cache"].shape[2]
    fp8q = g["q_dtype"] == "fp8"
    q_out = torch.full((T, Hq, D), 0x7F, dtype=torch.uint8, device="cuda").view(ref.FP8_DTYPE) if fp8q else \
        torch.full((T, Hq, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    qs_out = torch.full((T, Hq), float("nan"), device="cuda") if fp8q else None
    q, qs = ap.attention_prologue(*(g[k] for k in ARGS), **{k: g[k] for k in KW}, q_out=q_out, q_scale_out=qs_out,
                                  **extra)
    torch.cuda.synchronize()
    assert q.data_ptr() == q_out.data_ptr()
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    return cpu(q), cpu(qs), g["k_cache"].cpu(), g["v_cache"].cpu()


def emulate(inp, **extra):
    return ref.attention_prologue_emulation(*(inp[k] for k in ARGS), **{k: inp[k] for k in KW}, **extra)


def _bytes(t):
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int16)


def assert_matches_emulation(got, want, what=""):
    q, qs, kc, vc = got
    eq, eqs, ekc, evc = want
    for name, a, b in (("k_cache", kc, ekc), ("v_cache", vc, evc)):
        diff = int((_bytes(a) != _bytes(b)).sum())
        assert diff == 0, f"{what}: {name} differs from the emulation in {diff} elements (whole cache compared)"
    if eqs is None:
        assert qs is None
        d = int((_bytes(q) != _bytes(eq)).sum())
        assert d == 0, f"{what}: bf16 Q differs in {d} elements"
        return
    assert torch.equal(qs, eqs), f"{what}: q_scale differs (max rel {float(((qs - eqs) / eqs).abs().max()):.3e})"
    a, b = _bytes(q).to(torch.int16), _bytes(eq).to(torch.int16)
    same_sign = (a & 0x80) == (b & 0x80)
    ulps = torch.where(same_sign, (a & 0x7F) - (b & 0x7F), torch.full_like(a, 99)).abs()
    n = int((ulps > 0).sum())
    assert int(ulps.max()) <= 1, f"{what}: Q differs by more than 1 e4m3 ulp ({n} bytes differ)"
    assert n <= max(1, q.numel() // 10000), f"{what}: Q differs by 1 ulp in {n} of {q.numel()} bytes"


def assert_variants_match(ap, inp, want, what, **extra):
    """Every kernel variant (ap.VARIANTS) on fresh copies of the inputs matches the emulation `want` (computed once:
    the CPU emulation is the slow part)."""
    for v in ap.VARIANTS:
        assert_matches_emulation(run_kernel(ap, inp, variant=v, **extra), want, f"{what} [variant {v}]")


@pytest.mark.parametrize("order", ref.NORM_ORDERS)
@pytest.mark.parametrize("style", ref.ROPE_STYLES)
@pytest.mark.parametrize("D,rot", [(64, 64), (64, 32), (128, 128), (128, 64), (256, 256), (256, 96)])
def test_kernel_matches_emulation(ap, order, style, D, rot):
    inp = ref.make_prologue_inputs(77, q_heads=8, kv_heads=2, head_dim=D, rotary_dim=rot, page_size=16,
                                   norm_order=order, rope=style, pad_every=9, seed=D + rot)
    assert_variants_match(ap, inp, emulate(inp), f"{order}/{style}/D{D}/rot{rot}")


@pytest.mark.parametrize("hq,hk", [tuple(x) for x in SHAPES["gqa"]])
@pytest.mark.parametrize("kv_dtype,q_dtype", [("fp8", "fp8"), ("bf16", "bf16"), ("bf16", "fp8"), ("fp8", "bf16")])
def test_gqa_and_dtypes(ap, hq, hk, kv_dtype, q_dtype):
    inp = ref.make_prologue_inputs(33, q_heads=hq, kv_heads=hk, head_dim=128, page_size=64, kv_dtype=kv_dtype,
                                   q_dtype=q_dtype, pad_every=5, seed=hq * 10 + hk)
    assert_variants_match(ap, inp, emulate(inp), f"{hq}q{hk}kv {kv_dtype}/{q_dtype}")


@pytest.mark.parametrize("T", SHAPES["tokens"] + [5000])
def test_token_counts_and_exact_tolerance(ap, T):
    inp = ref.make_prologue_inputs(T, q_heads=8, kv_heads=1, head_dim=128, page_size=64, seed=T)
    assert_variants_match(ap, inp, emulate(inp), f"T={T}")
    q, qs, kc, _ = run_kernel(ap, inp)
    qr, kr, _ = ref.attention_prologue_ref(*(inp[k] for k in ARGS[:5]), kv_heads=1, eps=inp["eps"])
    assert check(q.double() * qs.double()[..., None], qr, tol=tolerance("attention_prologue", "fp8_q_vs_exact")).passed
    kd = kc.view(-1, 1, 128)[inp["slot_mapping"]].double() * float(inp["k_scale"])
    assert check(kd, kr, tol=tolerance("attention_prologue", "fp8_kv_vs_exact")).passed


@pytest.mark.parametrize("T,hq,hk,D,style", [(6000, 8, 2, 64, "interleaved"), (2000, 8, 2, 256, "neox"),
                                             (3000, 64, 8, 128, "neox")])
def test_grids_of_several_waves_match_emulation(ap, T, hq, hk, D, style):
    """Grids of more than one wave of resident CTAs at every head_dim: every variant's last CTAs (a partial wave)
    write what the emulation writes."""
    inp = ref.make_prologue_inputs(T, q_heads=hq, kv_heads=hk, head_dim=D, page_size=64, rope=style, pad_every=7,
                                   seed=T + D)
    assert_variants_match(ap, inp, emulate(inp), f"T={T} {hq}q{hk}kv D={D}")


@pytest.mark.parametrize("pdl,trigger", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("T,D,style", [(1, 128, "neox"), (13, 64, "interleaved"), (301, 256, "neox")])
def test_launch_options_match_emulation(ap, pdl, trigger, T, D, style):
    """With or without PDL and the trigger the kernel computes the same bytes; T not a multiple of a CTA's units so
    the tail lane groups of the last CTA are inactive."""
    inp = ref.make_prologue_inputs(T, q_heads=8, kv_heads=1, head_dim=D, page_size=16, rope=style, pad_every=4,
                                   seed=T + D)
    assert_variants_match(ap, inp, emulate(inp), f"pdl={pdl} trigger={trigger} T={T} D={D}", pdl=pdl,
                          trigger=trigger)


@pytest.mark.parametrize("variant", VARIANTS)
def test_pads_write_q_but_not_the_cache(ap, variant):
    inp = ref.make_prologue_inputs(24, q_heads=4, kv_heads=1, head_dim=64, page_size=16, pad_every=2, seed=4)
    q, qs, kc, vc = run_kernel(ap, inp, variant=variant)
    pads = inp["slot_mapping"] < 0
    assert int(pads.sum()) == 12
    assert torch.isfinite(q[pads].float()).all() and torch.isfinite(qs[pads]).all()  # Q rows of pads are written
    written = ref.written_mask(inp["slot_mapping"], kc.shape[0], kc.shape[1])
    assert int(written.sum()) == 12
    assert (kc.view(torch.uint8)[~written] == 0x7F).all() and (vc.view(torch.uint8)[~written] == 0x7F).all()
    assert not (kc.view(torch.uint8)[written] == 0x7F).any()


def test_int32_positions_static_scale_and_eps(ap):
    inp = ref.make_prologue_inputs(40, q_heads=8, kv_heads=1, head_dim=128, pos_dtype=torch.int32, seed=8)
    assert_variants_match(ap, inp, emulate(inp), "int32 positions")
    s = torch.tensor([0.02])
    assert_variants_match(ap, inp, emulate(inp, q_scale_static=s), "static q scale", q_scale_static=s.cuda())
    assert torch.all(run_kernel(ap, inp, q_scale_static=s.cuda())[1] == 0.02)
    small = dict(inp, qkv=(inp["qkv"].float() * 1e-3).to(torch.bfloat16))
    for eps in (1e-5, 1e-6):
        assert_variants_match(ap, dict(small, eps=eps), emulate(dict(small, eps=eps)), f"eps {eps}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_graph_capture_and_pdl_after_a_producer(ap, variant):
    inp = _cuda(ref.make_prologue_inputs(64, q_heads=8, kv_heads=1, head_dim=128, seed=11))
    src = inp["qkv"].clone()
    qkv = torch.zeros_like(src)
    g_inp = dict(inp, qkv=qkv)
    q_out = torch.empty((64, 8, 128), dtype=ref.FP8_DTYPE, device="cuda")
    qs_out = torch.empty((64, 8), device="cuda")

    def step():
        qkv.copy_(src)  # the producer the prologue waits for (griddepcontrol.wait)
        ap.attention_prologue(*(g_inp[k] for k in ARGS), **{k: g_inp[k] for k in KW}, q_out=q_out,
                              q_scale_out=qs_out, check_inputs=False, variant=variant)
    step()
    torch.cuda.synchronize()
    want = emulate({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()})
    assert_matches_emulation((q_out.cpu(), qs_out.cpu(), inp["k_cache"].cpu(), inp["v_cache"].cpu()), want, "eager")
    q_out.view(torch.uint8).fill_(0x7F)
    qs_out.fill_(float("nan"))
    qkv.zero_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_emulation((q_out.cpu(), qs_out.cpu(), inp["k_cache"].cpu(), inp["v_cache"].cpu()), want, "graph")


def test_torch_library_op(ap):
    inp = _cuda(ref.make_prologue_inputs(16, q_heads=8, kv_heads=1, head_dim=128, seed=12))
    q, qs = torch.ops.hotpaths.attention_prologue(*(inp[k] for k in ARGS), inp["eps"], inp["norm_order"],
                                                  inp["rope"], inp["rotary_dim"], "fp8", None, inp["k_scale"],
                                                  inp["v_scale"])
    want = emulate({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()})
    assert_matches_emulation((q.cpu(), qs.cpu(), inp["k_cache"].cpu(), inp["v_cache"].cpu()), want, "op")


def test_bad_input_refused_before_launch(ap):
    inp = _cuda(ref.make_prologue_inputs(8, q_heads=4, kv_heads=1, head_dim=64, page_size=16, seed=0))
    before = inp["k_cache"].clone()
    a = [inp[k] for k in ARGS]
    kw = {k: inp[k] for k in KW}
    with pytest.raises(ValueError, match="slot_mapping"):
        ap.attention_prologue(*a[:5], torch.full((8,), 10 ** 6, device="cuda"), *a[6:], **kw)
    with pytest.raises(ValueError, match="positions"):
        ap.attention_prologue(*a[:4], torch.full((8,), -1, device="cuda"), *a[5:], **kw)
    buf = torch.empty(inp["qkv"].numel() + 8, dtype=torch.bfloat16, device="cuda")
    mis = buf[1:1 + inp["qkv"].numel()].view_as(inp["qkv"])
    with pytest.raises(ValueError, match="aligned"):
        ap.attention_prologue(mis, *a[1:], **kw)
    with pytest.raises(ValueError, match="expected a tensor on"):
        ap.attention_prologue(*a[:3], inp["cos_sin"].cpu(), *a[4:], **kw)
    with pytest.raises(TypeError, match="qkv"):
        ap.attention_prologue(inp["qkv"].half(), *a[1:], **kw)
    torch.cuda.synchronize()
    assert torch.equal(inp["k_cache"].view(torch.uint8), before.view(torch.uint8))


@pytest.mark.parametrize("case,q_len,kv_dtype", [("8x0.5K", 1, "fp8"), ("4x1K+3x100", 2, "fp8"),
                                                 ("6x300", 4, "bf16"), ("5x700+2x64", 4, "fp8"),
                                                 ("3x200+1x1K", 1, "bf16")])
def test_chain_into_decode_equals_separate_runs(case, q_len, kv_dtype):
    """Eager and graph-replayed chains, with the prologue's trigger on and off, the decode plan's early work
    (assign before its PDL wait, L2 prefetch before the attention's wait) off and on, and with the step's assign
    kernel inside the chain: every output bit-equal to the prologue, a full sync, then decode."""
    from hotpaths.bench import attention_prologue as bap

    results = []
    for trigger, graph, early, assign in ((True, False, False, False), (False, False, False, False),
                                          (True, True, False, False), (False, True, False, False),
                                          (True, False, True, False), (True, True, True, False),
                                          (True, True, False, True), (True, True, True, True),
                                          (False, True, True, True), (True, False, True, True)):
        ci = bap.make_chain_inputs(case, q_len=q_len, kv_dtype=kv_dtype, seed=3)
        chain, pf, dec = bap.make_chain(ci, trigger=trigger, early=early, assign=assign)
        assert chain.plan.early is early
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                out = chain()
            torch.cuda.current_stream().wait_stream(s)
            out.fill_(float("nan"))
            if assign:  # the graph's assign must rebuild the map: poison it too
                chain.plan.workspace.fill_(-7)
            g.replay()
        else:
            out = chain()
        torch.cuda.synchronize()
        chained = out.clone()  # dec() below writes the same buffer
        results.append(chained)
        # separately: the prologue, a full sync, then decode
        out.fill_(float("nan"))
        pf()
        torch.cuda.synchronize()
        sep = dec().clone()
        torch.cuda.synchronize()
        assert torch.isfinite(sep.float()).all() and torch.isfinite(chained.float()).all()
        assert torch.equal(chained, sep), f"chain (trigger={trigger}, graph={graph}, early={early}, " \
                                          f"assign={assign}) differs"
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_chain_decode_reads_the_prologue_outputs():
    """The decode output of the chain equals decode attention run on the emulation's Q and cache (the reference
    decode in fp64 would add its own error; the decode kernel on identical bytes must give identical output)."""
    from hotpaths.bench import attention_prologue as bap
    from hotpaths.kernels import split_kv_decode as sk

    ci = bap.make_chain_inputs("4x200", q_len=1, kv_dtype="fp8", seed=5)
    pro = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in ci["prologue"].items()}
    eq, eqs, ekc, evc = emulate(pro)
    chain, _, _ = bap.make_chain(ci)
    out = chain().clone()
    dec = ci["decode"]
    want = sk.split_kv_decode(eq.cuda(), ekc.cuda(), evc.cuda(), dec["block_table"], dec["kv_lens"], q_scale=eqs.cuda(),
                              k_scale=dec["k_scale"], v_scale=dec["v_scale"])
    torch.cuda.synchronize()
    assert check(out, want).rel_l2_err < 1e-2  # plans may differ in split order only


def test_bench_rows_on_gpu():
    from hotpaths.bench import attention_prologue as bap

    ours = ("fused",) + tuple(bap.VARIANT_PREFIX + v for v in bap.fused_variants())
    rows = bap.prologue_rows([1, 64], impls=ours + ("torch_unfused_graph", "hpc_ops", "flashinfer_fused"),
                             check=True, iters=20)
    by = {(r["tokens"], r["impl"]): r for r in rows}
    for t in (1, 64):
        for impl in ours:
            f = by[(t, impl)]
            assert f["median_us"] > 0 and f["q_mismatch"] == 0 and f["cache_mismatch"] == 0, impl
        f = by[(t, "fused")]
        assert f["pct_of_read_probe"] is not None and f["floor_us"] > 0
        assert f["rel_l2_err"] < tolerance("attention_prologue", "fp8_q_vs_exact").rel_l2
        assert by[(t, "torch_unfused_graph")]["median_us"] > 0
        for peer in ("hpc_ops", "flashinfer_fused"):
            r = by[(t, peer)]
            assert r.get("median_us") or r.get("note"), f"{peer}: neither a time nor a reason"
    crow = bap.chain_rows(["8x0.5K"], iters=20)
    names = {r["impl"] for r in crow}
    assert names == {"prologue", "decode", "chain_pdl", "chain_no_trigger", "sum_alone", "chain_pdl_early",
                     "decode_assign", "chain_assign_pdl", "chain_assign_pdl_early", "sum_alone_assign"}
    for r in crow:
        if r["impl"].startswith("chain"):
            assert r["median_us"] > 0 and r["saved_us"] is not None, r["impl"]
