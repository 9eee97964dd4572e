"""Fuzzing the attention prologue: heads, head_dim 64/128/256, rotary dims, both orders and RoPE styles, FP8/BF16
Q and cache, slot maps with pads (optionally pad rows full of NaN: they must not leak into other rows or the cache).

``check_cpu``: the emulation's Q (dequantized) and cache rows vs the exact reference within the tolerance rows,
on the non-pad rows; slots not in the mapping keep their poison. ``fuzz_run`` on an SM90 GPU: the kernel on
guarded buffers vs the emulation bit for bit (the ``*_vs_emulation`` rows are 0), unwritten cache slots untouched.
"""

from __future__ import annotations

import torch

from hotpaths.harness.check import check
from hotpaths.harness.fuzzing import Draw, GuardedBuffers, unchanged
from hotpaths.reference import attention_prologue as ref

OP = "attention_prologue"


def fuzz_case(draw: Draw, *, kernel: bool = False) -> dict:
    """One configuration: head_dim 64/128/256, 1-4 KV heads at GQA 1-8, partial rotary, both orders and RoPE
    styles, FP8/BF16 Q and cache, pads (optionally NaN rows); tokens up to 300 with kernel=True (marked ``kernel``),
    40 without (CPU emulation cost)."""
    head_dim = draw.choice(ref.HEAD_DIMS)
    kv_heads = draw.integer(1, 4)
    tokens = draw.choice((0, 1, 2, 7, 8, 9)) if draw.boolean() else draw.integer(0, 300 if kernel else 40)
    cfg = dict(tokens=tokens, q_heads=kv_heads * draw.choice((1, 2, 4, 8)), kv_heads=kv_heads, head_dim=head_dim,
                rotary_dim=16 * draw.integer(1, head_dim // 16), page_size=draw.choice((16, 32, 64, 128)),
                norm_order=draw.choice(ref.NORM_ORDERS), rope=draw.choice(ref.ROPE_STYLES),
                kv_dtype=draw.choice(("fp8", "bf16")), q_dtype=draw.choice(("fp8", "bf16")),
                pad_every=draw.choice((0, 0, 1, 2, 3, 5)), nan_pads=draw.boolean(), seed=draw.integer(0, 2**16))
    if kernel:
        cfg["kernel"] = True
    return cfg


def make_inputs(cfg: dict) -> dict:
    """The op's arguments on the CPU; with nan_pads, every pad token's qkv row is NaN."""
    inp = ref.make_prologue_inputs(cfg["tokens"], q_heads=cfg["q_heads"], kv_heads=cfg["kv_heads"],
                                   head_dim=cfg["head_dim"], page_size=cfg["page_size"],
                                   rotary_dim=cfg["rotary_dim"], kv_dtype=cfg["kv_dtype"], q_dtype=cfg["q_dtype"],
                                   norm_order=cfg["norm_order"], rope=cfg["rope"], pad_every=cfg["pad_every"],
                                   seed=cfg["seed"])
    if cfg["nan_pads"] and cfg["tokens"]:
        pads = inp["slot_mapping"] < 0
        inp["qkv"][pads] = float("nan")
    return inp


def _call(fn, inp, **extra):
    names = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache", "v_cache")
    kw = {k: inp[k] for k in ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale", "v_scale")}
    return fn(*(inp[n] for n in names), **kw, **extra)


def check_cpu(cfg: dict) -> dict:
    """Emulation vs exact on the non-pad rows (Q dequantized, K and V from the cache) within the tolerance rows, Q
    scales finite, unwritten cache slots unchanged. Returns {failures: [str], path}."""
    inp = make_inputs(cfg)
    fails = []
    q, qs, kc, vc = _call(ref.attention_prologue_emulation, inp)
    T, Hk, D = cfg["tokens"], cfg["kv_heads"], cfg["head_dim"]
    sm = inp["slot_mapping"]
    keep = sm >= 0
    if T and bool(keep.any()):
        qr, kr, vr = ref.attention_prologue_ref(inp["qkv"][keep], inp["q_norm_weight"], inp["k_norm_weight"],
                                                inp["cos_sin"], inp["positions"][keep], kv_heads=Hk,
                                                eps=inp["eps"], norm_order=inp["norm_order"], rope=inp["rope"],
                                                rotary_dim=inp["rotary_dim"])
        qd = q[keep].double() * (qs[keep].double()[..., None] if qs is not None else 1.0)
        kd, vd = kc.view(-1, Hk, D)[sm[keep]].double(), vc.view(-1, Hk, D)[sm[keep]].double()
        if inp["k_scale"] is not None:
            kd, vd = kd * float(inp["k_scale"]), vd * float(inp["v_scale"])
        for name, got, want, path in (("Q", qd, qr, f"{cfg['q_dtype']}_q_vs_exact"),
                                      ("K", kd, kr, f"{cfg['kv_dtype']}_kv_vs_exact"),
                                      ("V", vd, vr, f"{cfg['kv_dtype']}_kv_vs_exact")):
            res = check(got, want, op=OP, path=path)
            if not res.passed:
                fails.append(f"{name} of the non-pad rows, emulation vs exact ({path}): {res}")
    if qs is not None and T and bool(keep.any()) and not torch.isfinite(qs[keep]).all():
        fails.append("a non-pad row's Q scale is not finite")
    written = ref.written_mask(sm, kc.shape[0], kc.shape[1]).view(-1)
    fails += unchanged(inp["k_cache"].view(-1, Hk, D), kc.view(-1, Hk, D), ~written, name="k_cache")
    fails += unchanged(inp["v_cache"].view(-1, Hk, D), vc.view(-1, Hk, D), ~written, name="v_cache")
    return {"failures": fails, "path": "cpu emulation vs exact"}


def fuzz_run(cfg: dict) -> dict:
    """On an SM90 GPU (cfg drawn with kernel=True): the kernel on guarded buffers (outputs NaN-poisoned), then no
    guard or input changed and the output vs the emulation (see the module docstring). Elsewhere: ``check_cpu``.
    Returns {failures: [str], path}."""
    from hotpaths.reference.common import sm90_skip_reason

    if not cfg.get("kernel") or sm90_skip_reason() is not None:
        return check_cpu(cfg)
    from hotpaths.kernels import attention_prologue as K

    dev = torch.device("cuda")
    inp = make_inputs(cfg)
    g = GuardedBuffers()
    d = {k: (g.adopt(k, v.to(dev)) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    T, Hq, Hk, D = cfg["tokens"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"]
    q_dtype = torch.bfloat16 if cfg["q_dtype"] == "bf16" else ref.FP8_DTYPE
    q_out = g.alloc("q_out", (T, Hq, D), q_dtype, dev, fill=float("nan"))
    q_scale_out = None if cfg["q_dtype"] == "bf16" else g.alloc("q_scale_out", (T, Hq), torch.float32, dev,
                                                                 fill=float("nan"))
    before = {n: d[n].clone() for n in ("qkv", "positions", "slot_mapping", "cos_sin")}
    _call(K.attention_prologue, d, q_out=q_out, q_scale_out=q_scale_out)
    torch.cuda.synchronize()
    fails = g.violations()
    for n, t in before.items():
        fails += unchanged(t, d[n], name=n)
    eq, eqs, ekc, evc = _call(ref.attention_prologue_emulation, inp)
    sm = inp["slot_mapping"]
    keep = sm >= 0
    if T and bool(keep.any()):
        if not torch.equal(q_out.cpu()[keep].view(torch.uint8), eq[keep].view(torch.uint8)):
            fails.append("Q of the non-pad rows differs from the emulation")
        if eqs is not None and not torch.equal(q_scale_out.cpu()[keep], eqs[keep]):
            fails.append("Q scales of the non-pad rows differ from the emulation")
    # the whole cache, written slots and untouched ones, must equal the emulation's copy byte for byte
    for name, got, want in (("k_cache", d["k_cache"], ekc), ("v_cache", d["v_cache"], evc)):
        fails += unchanged(want.view(-1, Hk, D), got.cpu().view(-1, Hk, D), name=name)
    return {"failures": fails, "path": "kernel vs emulation (bit-exact)"}


SANITIZE_CASES = [
    dict(tokens=1, q_heads=8, kv_heads=1, head_dim=128, rotary_dim=128, page_size=64, norm_order="norm_rope",
         rope="neox", kv_dtype="fp8", q_dtype="fp8", pad_every=0, nan_pads=False, seed=0, kernel=True),
    dict(tokens=9, q_heads=16, kv_heads=4, head_dim=256, rotary_dim=64, page_size=16, norm_order="rope_norm",
         rope="interleaved", kv_dtype="bf16", q_dtype="bf16", pad_every=3, nan_pads=True, seed=1, kernel=True),
    dict(tokens=257, q_heads=8, kv_heads=2, head_dim=64, rotary_dim=32, page_size=128, norm_order="norm_rope",
         rope="neox", kv_dtype="fp8", q_dtype="fp8", pad_every=2, nan_pads=True, seed=2, kernel=True),
]
