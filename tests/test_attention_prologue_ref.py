"""CPU tests of the attention-prologue reference and emulation: the exact reference against a direct per-token
formula, both norm orders, both RoPE styles, partial rotary, eps, pads and untouched cache slots, FP8 scales, the
emulation against the exact reference, byte/flop counts, bad input, and the op's fake implementation."""

from __future__ import annotations

import math

import pytest
import torch

from hotpaths.harness.check import check
from hotpaths.harness.tolerances import tolerance
from hotpaths.reference import attention_prologue as ref

ARGS = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache", "v_cache")
KW = ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale", "v_scale")


def emulate(inp, **over):
    d = dict(inp, **over)
    return ref.attention_prologue_emulation(*(d[k] for k in ARGS), **{k: d[k] for k in KW if k in d})


def exact(inp, **over):
    d = dict(inp, **over)
    return ref.attention_prologue_ref(d["qkv"], d["q_norm_weight"], d["k_norm_weight"], d["cos_sin"], d["positions"],
                                      kv_heads=d["k_cache"].shape[2], eps=d["eps"], norm_order=d["norm_order"],
                                      rope=d["rope"], rotary_dim=d["rotary_dim"])


def direct(x, w, cs_row, eps, order, style, rot):
    """One head of one token, written element by element in Python floats."""
    D = len(x)
    h = rot // 2

    def norm(v):
        r = math.sqrt(sum(e * e for e in v) / D + eps)
        return [v[i] / r * w[i] for i in range(D)]

    def rope(v):
        out = list(v)
        for j in range(h):
            c, s = cs_row[j], cs_row[h + j]
            a, b = (j, j + h) if style == "neox" else (2 * j, 2 * j + 1)
            out[a] = v[a] * c - v[b] * s
            out[b] = v[b] * c + v[a] * s
        return out
    return rope(norm(x)) if order == "norm_rope" else norm(rope(x))


@pytest.mark.parametrize("order", ref.NORM_ORDERS)
@pytest.mark.parametrize("style", ref.ROPE_STYLES)
@pytest.mark.parametrize("D,rot", [(64, 64), (128, 32), (256, 96)])
def test_reference_matches_direct_formula(order, style, D, rot):
    inp = ref.make_prologue_inputs(3, q_heads=2, kv_heads=1, head_dim=D, rotary_dim=rot, norm_order=order,
                                   rope=style, eps=1e-5, seed=D + rot)
    q, k, v = exact(inp)
    x = inp["qkv"].double().view(3, 4, D)
    for t in range(3):
        row = inp["cos_sin"][int(inp["positions"][t])].double().tolist()
        for hh, (out, w) in enumerate(((q[t, 0], inp["q_norm_weight"]), (q[t, 1], inp["q_norm_weight"]),
                                       (k[t, 0], inp["k_norm_weight"]))):
            want = direct(x[t, hh].tolist(), w.double().tolist(), row, 1e-5, order, style, rot)
            assert torch.allclose(out, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        assert torch.equal(v[t, 0], x[t, 3])


def test_orders_and_styles_differ_and_partial_rotary_passes_through():
    inp = ref.make_prologue_inputs(5, q_heads=4, kv_heads=2, head_dim=128, rotary_dim=64, seed=3)
    a = exact(inp, norm_order="norm_rope")[0]
    b = exact(inp, norm_order="rope_norm")[0]
    c = exact(inp, rope="interleaved")[0]
    assert (a - b).abs().max() > 1e-3  # the weight does not commute with the rotation
    assert (a - c).abs().max() > 1e-3
    # elements past rotary_dim are the normed input (norm then RoPE) untouched by the rotation
    x = inp["qkv"].double().view(5, 8, 128)[:, :4]
    normed = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + inp["eps"]) * inp["q_norm_weight"].double()
    assert torch.allclose(a[..., 64:], normed[..., 64:], rtol=0, atol=1e-12)
    assert not torch.allclose(a[..., :64], normed[..., :64], atol=1e-3)
    # RoPE is a rotation: it keeps each head's norm, so RoPE-then-norm equals norm-then-RoPE without weights
    ones = torch.ones(128, dtype=torch.bfloat16)
    assert torch.allclose(exact(inp, q_norm_weight=ones, norm_order="norm_rope")[0],
                          exact(inp, q_norm_weight=ones, norm_order="rope_norm")[0], atol=1e-12)


def test_eps_is_honoured():
    inp = ref.make_prologue_inputs(4, q_heads=2, kv_heads=1, head_dim=64, seed=1)
    small = dict(inp, qkv=(inp["qkv"].float() * 1e-3).to(torch.bfloat16))  # mean square ~1e-6: eps matters
    q5, q6 = exact(small, eps=1e-5)[0], exact(small, eps=1e-6)[0]
    x = small["qkv"].double().view(4, 4, 64)[:, :2]
    ms = x.pow(2).mean(-1)
    ratio = q6.norm(dim=-1) / q5.norm(dim=-1)
    assert torch.allclose(ratio, torch.sqrt((ms + 1e-5) / (ms + 1e-6)), rtol=1e-9)
    e5 = emulate(small, eps=1e-5)
    e6 = emulate(small, eps=1e-6)
    assert not torch.equal(e5[1], e6[1])  # the emulation's scales follow eps too


@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("q_dtype", ["fp8", "bf16"])
def test_emulation_writes_exactly_the_slots_and_q_rows(kv_dtype, q_dtype):
    inp = ref.make_prologue_inputs(40, q_heads=8, kv_heads=2, head_dim=128, page_size=16, kv_dtype=kv_dtype,
                                   q_dtype=q_dtype, pad_every=7, seed=5)
    q, qs, kc, vc = emulate(inp)
    assert q.shape == (40, 8, 128) and q.dtype == (ref.FP8_DTYPE if q_dtype == "fp8" else torch.bfloat16)
    assert (qs is None) == (q_dtype == "bf16")
    written = ref.written_mask(inp["slot_mapping"], kc.shape[0], kc.shape[1])
    assert int(written.sum()) == 40 - len(range(0, 40, 7))
    raw = torch.uint8 if kv_dtype == "fp8" else torch.int16
    for got, poisoned in ((kc, inp["k_cache"]), (vc, inp["v_cache"])):
        g, p = got.view(raw), poisoned.view(raw)
        assert torch.equal(g[~written], p[~written])  # untouched slots keep their poison
        assert torch.isfinite(got[written].float()).all()
    # pad rows still get their Q (finite, same formula as any other row)
    assert torch.isfinite(q[::7].float()).all()
    # the cache rows are the quantized exact K / V
    qr, kr, vr = exact(inp)
    sm = inp["slot_mapping"]
    keep = sm >= 0
    kd = kc.view(-1, 2, 128)[sm[keep]].double() * (float(inp["k_scale"]) if kv_dtype == "fp8" else 1)
    path = "fp8_kv_vs_exact" if kv_dtype == "fp8" else "bf16_kv_vs_exact"
    assert check(kd, kr[keep], tol=tolerance("attention_prologue", path)).passed
    if q_dtype == "fp8":
        qd = q.double() * qs.double()[..., None]
        assert check(qd, qr, tol=tolerance("attention_prologue", "fp8_q_vs_exact")).passed
    else:
        assert check(q.double(), qr, tol=tolerance("attention_prologue", "bf16_q_vs_exact")).passed


def test_fp8_q_scale_is_amax_over_448_and_saturates():
    inp = ref.make_prologue_inputs(16, q_heads=4, kv_heads=1, head_dim=64, seed=2)
    q, qs, _, _ = emulate(inp)
    qr = exact(inp)[0]
    assert torch.allclose(qs.double(), qr.abs().amax(-1) / 448.0, rtol=1e-5)
    assert q.float().abs().amax() == 448.0  # every head's largest element maps to the top of e4m3
    # a zero head gets scale 1 (dequantizes to zeros, never NaN)
    z = dict(inp, qkv=inp["qkv"].clone())
    z["qkv"][3, :64] = 0
    q0, qs0, _, _ = emulate(z)
    assert float(qs0[3, 0]) == 1.0 and not q0[3, 0].float().any()
    # static scale: every row quantized with it and q_scale filled with it
    s = torch.tensor([0.01])
    qst, qss, _, _ = ref.attention_prologue_emulation(*(inp[k] for k in ARGS), **{k: inp[k] for k in KW},
                                                      q_scale_static=s)
    assert torch.all(qss == 0.01)
    assert torch.equal(qst.view(torch.uint8), ref.quantize_fp8(qr.float(), s).view(torch.uint8))


def test_quantize_fp8_is_rne_and_saturating():
    x = torch.tensor([448.0, 460.0, 1e6, -1e6, 0.0, 1.0625, 1.1875, 2 ** -9 * 1.5])
    q = ref.quantize_fp8(x, torch.tensor(1.0)).float()
    # 1.0625 sits halfway between 1.0 and 1.125 (ties to even: 1.0); 1.1875 halfway 1.125/1.25 -> 1.25
    assert q.tolist() == [448.0, 448.0, 448.0, -448.0, 0.0, 1.0, 1.25, 2 ** -9 * 2]


@pytest.mark.parametrize("order", ref.NORM_ORDERS)
@pytest.mark.parametrize("style", ref.ROPE_STYLES)
def test_emulation_close_to_exact_before_rounding(order, style):
    inp = ref.make_prologue_inputs(20, q_heads=4, kv_heads=1, head_dim=128, rotary_dim=64, q_dtype="bf16",
                                   kv_dtype="bf16", norm_order=order, rope=style, seed=9)
    q, _, _, _ = emulate(inp)
    qr = exact(inp)[0]
    res = check(q.double(), qr)
    assert res.rel_l2_err < 4e-3  # one bf16 rounding (2^-9 relative at most, ~1.6e-3 rms)
    assert res.rel_l2_err > 0  # and not vacuous: bf16 output does round


def test_sum_of_squares_order_is_the_kernels():
    x = torch.randn(3, 128)
    got = ref._sum_squares_kernel_order(x)
    assert torch.allclose(got.double(), x.double().pow(2).sum(-1), rtol=1e-6)
    # the order is fixed: lanes of 8 sequential squares, then a butterfly over 16 lanes
    lanes = torch.zeros(3, 16)
    for e in range(8):
        lanes = lanes + x.view(3, 16, 8)[..., e] ** 2
    for o in (8, 4, 2, 1):
        lanes = lanes + lanes[:, torch.arange(16) ^ o]
    assert torch.equal(got, lanes[:, 0])


def _pair_chunk(sub: int, m: int) -> int:
    """prologue.cu pair_chunk: the first chunk of lane `sub` in the pair layout (bit m squeezed out)."""
    return (sub & (m - 1)) | ((sub & ~(m - 1)) << 1)


def _pair_sum_model(x: torch.Tensor, m: int) -> torch.Tensor:
    """prologue.cu pair_sum in torch: lanes of the pair layout each hold chunks ca and ca | m; chunk offsets above m
    shuffle both partial sums (lane offset o/2), offset m adds the lane's two, offsets below m shuffle the merged one.
    Returns every lane's result [..., P]."""
    NC = x.shape[-1] // 8
    P = NC // 2
    chunks = torch.zeros(*x.shape[:-1], NC)
    for e in range(8):
        chunks = chunks + x.view(*x.shape[:-1], NC, 8)[..., e] ** 2
    ca = torch.tensor([_pair_chunk(s, m) for s in range(P)])
    a, b = chunks[..., ca], chunks[..., ca | m]
    lanes = torch.arange(P)
    o = NC // 2
    while o >= 1:
        if o > m:
            a, b = a + a[..., lanes ^ (o // 2)], b + b[..., lanes ^ (o // 2)]
        elif o == m:
            a = a + b
        else:
            a = a + a[..., lanes ^ o]
        o //= 2
    return a


@pytest.mark.parametrize("D,m", [(64, 1), (64, 2), (64, 4), (128, 1), (128, 4), (128, 8), (256, 1), (256, 16),
                                 (256, 2)])
def test_pair_layout_reduces_in_the_emulations_order(D, m):
    """The pair variants' lane mapping covers every chunk once, pairs each neox chunk with its rotate-half partner
    (rotary_dim = 16 m) and sums squares in exactly the emulation's tree (bit-equal on every lane), so they can
    write the baseline's bytes."""
    P = D // 16
    ca = [_pair_chunk(s, m) for s in range(P)]
    held = sorted(ca + [c | m for c in ca])
    assert held == list(range(D // 8))  # every chunk once
    assert all(c & m == 0 for c in ca)
    rot = 16 * m
    for c in ca:  # rotated chunks pair with the chunk rot/2 elements on; the others pass through in pairs
        assert (c < m) == ((c | m) * 8 < rot) and ((c | m) * 8 - c * 8 == rot // 2 or c * 8 >= rot)
    x = torch.randn(200, D, generator=torch.Generator().manual_seed(D + m))
    want = ref._sum_squares_kernel_order(x)
    got = _pair_sum_model(x, m)
    assert torch.equal(got, want[..., None].expand_as(got))
    seq = torch.zeros(200)
    for e in range(D):  # not vacuous: another order (sequential) changes bits on some rows
        seq = seq + x[:, e] ** 2
    assert not torch.equal(seq, want)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("style", ref.ROPE_STYLES)
def test_pair_layout_rope_is_the_emulations(D, style):
    """RoPE as the pair kernels index it (lane chunks ca / ca | m, the lane's 8 angles at ca*8 (neox) or ca*4
    (interleaved), rotated iff ca < m (neox) or ca*8 < rot) gives the emulation's bits at every rotary_dim the pair
    layout takes (neox: rot/16 a power of two)."""
    g = torch.Generator().manual_seed(D)
    for rot in range(16, D + 1, 16):
        m = 1 if style == "interleaved" else rot // 16
        if m & (m - 1):
            continue  # the host runs the baseline kernel there
        x, cs = torch.randn(4, 3, D, generator=g), torch.randn(4, rot, generator=g)
        want = ref._rope(x, cs[:, None, :rot // 2], cs[:, None, rot // 2:], rot, style, torch.mul, torch.add,
                         torch.sub)
        got = x.clone()
        ia, ib = (list(range(0, 16, 2)), list(range(1, 16, 2))) if style == "interleaved" else \
            (list(range(8)), list(range(8, 16)))
        for sub in range(D // 16):
            ca = _pair_chunk(sub, m)
            cb = ca | m
            if not (ca * 8 < rot if style == "interleaved" else ca < m):
                continue
            off = ca * 4 if style == "interleaved" else ca * 8
            c, s = cs[:, None, off:off + 8], cs[:, None, rot // 2 + off:rot // 2 + off + 8]
            xs = torch.cat([x[..., ca * 8:ca * 8 + 8], x[..., cb * 8:cb * 8 + 8]], -1)
            a, b = xs[..., ia], xs[..., ib]
            xs[..., ia] = torch.sub(torch.mul(a, c), torch.mul(b, s))
            xs[..., ib] = torch.add(torch.mul(b, c), torch.mul(a, s))
            got[..., ca * 8:ca * 8 + 8], got[..., cb * 8:cb * 8 + 8] = xs[..., :8], xs[..., 8:]
        assert torch.equal(got, want), f"rot {rot}"
        assert not torch.equal(got, x)  # not vacuous: something rotated


def test_bytes_and_flops():
    b = ref.bytes(64, 8, 1, 128, q_dtype="fp8", kv_dtype="fp8")
    assert b == 64 * (10 * 128 * 2 + 16 + 4 * 128) + 4 * 128 + 64 * (8 * 128 + 32) + 64 * 2 * 128
    assert ref.bytes(64, 8, 1, 128, kv_dtype="bf16") - b == 64 * 2 * 128
    assert ref.bytes(64, 8, 1, 128, pads=4) == b - 4 * 2 * 128
    assert ref.flops(2, 8, 1, 128) == 2 * ref.flops(1, 8, 1, 128) > 0


def _bad(inp, **over):
    d = dict(inp, **over)
    return lambda: ref.validate_inputs(*(d[k] for k in ARGS), **{k: d[k] for k in KW})


def test_bad_input_raises_naming_the_argument():
    inp = ref.make_prologue_inputs(8, q_heads=4, kv_heads=1, head_dim=64, page_size=16, seed=0)
    cases = [
        (dict(qkv=inp["qkv"].float()), TypeError, "qkv"),
        (dict(qkv=inp["qkv"][:, :-32]), ValueError, "qkv"),  # width does not split into heads
        (dict(qkv=inp["qkv"][:, :128]), ValueError, "qkv"),  # no room for a Q head
        (dict(k_cache=torch.zeros(2, 16, 1, 96, dtype=ref.FP8_DTYPE),
              v_cache=torch.zeros(2, 16, 1, 96, dtype=ref.FP8_DTYPE)), ValueError, "head_dim 96"),
        (dict(v_cache=inp["v_cache"][:1]), ValueError, "v_cache"),
        (dict(q_norm_weight=inp["q_norm_weight"][:32]), ValueError, "q_norm_weight"),
        (dict(k_norm_weight=inp["k_norm_weight"].float()), TypeError, "k_norm_weight"),
        (dict(cos_sin=inp["cos_sin"].double()), TypeError, "cos_sin"),
        (dict(rotary_dim=40), ValueError, "rotary_dim"),
        (dict(rotary_dim=128), ValueError, "rotary_dim"),
        (dict(positions=inp["positions"].float()), TypeError, "positions"),
        (dict(positions=inp["positions"][:3]), ValueError, "positions"),
        (dict(positions=torch.full((8,), 10 ** 6)), ValueError, "positions[0]"),
        (dict(slot_mapping=inp["slot_mapping"].int()), TypeError, "slot_mapping"),
        (dict(slot_mapping=torch.full((8,), 10 ** 6)), ValueError, "slot_mapping[0]"),
        (dict(slot_mapping=torch.full((8,), -2)), ValueError, "slot_mapping[0]"),
        (dict(norm_order="pre"), ValueError, "norm_order"),
        (dict(rope="gptj"), ValueError, "rope"),
        (dict(k_scale=None), ValueError, "k_scale"),
        (dict(v_scale=torch.tensor([1.0, 2.0])), ValueError, "v_scale"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(q_dtype="fp16"), ValueError, "q_dtype"),
    ]
    for over, exc, word in cases:
        with pytest.raises(exc, match=word.replace("[", r"\[")):  # noqa: PT012
            _bad(inp, **over)()


def test_public_function_rejects_before_launch_on_cpu():
    from hotpaths.kernels.attention_prologue import attention_prologue

    inp = ref.make_prologue_inputs(8, q_heads=4, kv_heads=1, head_dim=64, page_size=16, seed=0)
    a = [inp[k] for k in ARGS]
    kw = {k: inp[k] for k in KW}
    with pytest.raises(ValueError, match="slot_mapping"):  # validation first, even without a GPU
        attention_prologue(*a[:5], torch.full((8,), 10 ** 6), *a[6:], **kw)
    with pytest.raises(RuntimeError, match="CUDA|SM90"):  # valid input on the CPU: a clear refusal, no launch
        attention_prologue(*a, **kw)


def test_fake_impl_gives_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import hotpaths.kernels.attention_prologue  # noqa: F401  (registers the op)

    inp = ref.make_prologue_inputs(6, q_heads=8, kv_heads=2, head_dim=128, page_size=16, seed=0)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        q, qs = torch.ops.hotpaths.attention_prologue(*(fake[k] for k in ARGS), fake["eps"], fake["norm_order"],
                                                      fake["rope"], fake["rotary_dim"], "fp8", None, fake["k_scale"],
                                                      fake["v_scale"])
        assert q.shape == (6, 8, 128) and q.dtype == ref.FP8_DTYPE
        assert qs.shape == (6, 8) and qs.dtype == torch.float32
        qb, qsb = torch.ops.hotpaths.attention_prologue(*(fake[k] for k in ARGS), 1e-5, "norm_rope", "neox", 128,
                                                        "bf16", None, fake["k_scale"], fake["v_scale"])
        assert qb.dtype == torch.bfloat16 and qsb.numel() == 0


def test_quantize_is_multiply_by_the_rounded_reciprocal():
    """The documented definition: x * fp32(1/scale), one rounding, then e4m3; it agrees with x / scale except within
    an fp32 ulp of an e4m3 rounding boundary (rare, and then by one e4m3 code)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1 << 18, generator=g) * 3
    s = torch.tensor(0.0137)  # 1/s is not exact in fp32
    inv = ref.inverse_scale(s)
    assert inv.dtype == torch.float32 and float(inv) == float(torch.tensor(1.0 / 0.0137, dtype=torch.float64).float())
    mul = ref.quantize_fp8(x, s)
    assert torch.equal(mul.view(torch.uint8), (x * inv).clamp(-448, 448).to(ref.FP8_DTYPE).view(torch.uint8))
    div = (x.double() / s.double()).float().clamp(-448, 448).to(ref.FP8_DTYPE)
    diff = (mul.view(torch.uint8).int() - div.view(torch.uint8).int()).abs()
    assert int(diff.max()) <= 1 and int((diff > 0).sum()) < x.numel() // 1000
    # the fp32 values the two definitions round to e4m3 really differ (by one ulp) on a fraction of the elements
    assert int(((x * inv) != (x.double() / s.double()).float()).sum()) > 0


def test_tiny_q_head_gets_a_finite_reciprocal():
    """A Q head whose amax / 448 underflows below the normal range keeps a scale whose reciprocal is finite, so its
    zeros stay zeros (0 * inf would be NaN) and its bytes dequantize close to the values."""
    inp = ref.make_prologue_inputs(2, q_heads=2, kv_heads=1, head_dim=64, page_size=16, seed=1)
    inp["q_norm_weight"] = torch.full_like(inp["q_norm_weight"], 1e-38)  # Q after the norm ~1e-38
    q, qs, _, _ = ref.attention_prologue_emulation(*(inp[k] for k in ARGS), **{k: inp[k] for k in KW})
    assert torch.all(qs >= torch.finfo(torch.float32).tiny) and torch.isfinite(ref.inverse_scale(qs)).all()
    assert not torch.isnan(q.float()).any()
