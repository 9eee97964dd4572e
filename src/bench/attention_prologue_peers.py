"""Attention-prologue peers: what a reader would run instead of our fused kernel, made runnable offline.

Every peer is ``make_<peer>(inputs) -> fn`` where ``inputs`` is the dict of
``hotpaths.bench.attention_prologue.make_bench_inputs`` (the op's arguments plus ``layout``: the same tokens as
requests, for the peers that derive positions and slots from sequence lengths and a block table) and ``fn()`` (no
arguments, CUDA-graph capturable unless said otherwise) runs the whole prologue and returns
``(q, q_scale, k_cache, v_cache)`` in our layout (q [T, Hq, D] fp8, q_scale [T, Hq] fp32: a peer that writes
another layout gets a view or a copy made outside the timed fn where possible). Setup (weight casts, metadata,
JIT builds) happens in make_* and is not timed. A peer that cannot run raises ``PeerUnavailable(reason)``;
``try_make`` turns any failure into a reason string for the table.

Peers: ``hpc_ops`` (HPC-Ops ``hpc.rope_norm_store_kv_fp8`` / ``hpc.rope_norm_store_kv``, from $HOTPATHS_HPC_OPS_DIR
or .peers/hpc_ops; hotpaths.bench._peers_common imports it), ``flashinfer_fused`` (FlashInfer 0.7.2
``cake_fused_qk_rmsnorm_rope_quantize_fp8_append_paged_kv_cache``, from $HOTPATHS_FLASHINFER_072_DIR: eps fixed at
1e-6, NeoX only), ``torch_unfused`` (norm, RoPE, quantization and cache writes as separate PyTorch ops; timed eager
as ``torch_unfused`` and under a CUDA graph as ``torch_unfused_graph``).
"""

from __future__ import annotations

import inspect

from hotpaths.bench._peers_common import PeerUnavailable, hpc_ops_dir, make_or_reason, need_cuda
from hotpaths.bench._peers_common import flashinfer_072_dir as flashinfer_dir
from hotpaths.bench._peers_common import import_flashinfer_072 as _import_flashinfer
from hotpaths.bench._peers_common import import_hpc_ops as _import_hpc
from hotpaths.bench._peers_common import short_error as _short

PEER_NAMES = ("hpc_ops", "flashinfer_fused", "torch_unfused")
FP8_MAX = 448.0

__all__ = ["PEER_NAMES", "PeerUnavailable", "make_hpc_ops", "make_flashinfer_fused", "make_torch_unfused",
           "try_make", "hpc_ops_dir", "flashinfer_dir"]


def _need_cuda(inputs) -> None:
    need_cuda(inputs["qkv"])


def _dims(inputs):
    kc = inputs["k_cache"]
    D, Hk = int(kc.shape[3]), int(kc.shape[2])
    T = int(inputs["qkv"].shape[0])
    Hq = int(inputs["qkv"].shape[1]) // D - 2 * Hk
    return T, Hq, Hk, D


# ------------------------------------------------------------------------------------------------------------
# torch unfused
# ------------------------------------------------------------------------------------------------------------


def make_torch_unfused(inputs, *, allow_cpu: bool = False):
    """The unfused PyTorch sequence a serving engine runs without a fused prologue: per-head RMSNorm (fp32), RoPE
    (gathered cos/sin), Q amax / scale / FP8 cast, K and V FP8 casts, two index_copy_ cache writes: about 40
    kernels. Pads are dropped from the slot list here (host work, not timed). Follows inputs' norm_order, rope,
    rotary_dim, eps and dtypes.
    Returns fn() -> (q, q_scale, k_cache, v_cache). Raises PeerUnavailable without CUDA (unless allow_cpu).
    """
    import torch

    if not allow_cpu:
        _need_cuda(inputs)
    T, Hq, Hk, D = _dims(inputs)
    rot = int(inputs["rotary_dim"])
    eps = float(inputs["eps"])
    qkv, cs, pos = inputs["qkv"], inputs["cos_sin"], inputs["positions"].long()
    kc, vc = inputs["k_cache"], inputs["v_cache"]
    fp8 = kc.dtype == torch.float8_e4m3fn
    q_fp8 = inputs.get("q_dtype", "fp8") == "fp8"
    keep = (inputs["slot_mapping"] >= 0).nonzero().flatten()
    slots = inputs["slot_mapping"][keep].contiguous()
    qw, kw = inputs["q_norm_weight"].float(), inputs["k_norm_weight"].float()
    ks, vs = inputs.get("k_scale"), inputs.get("v_scale")
    h = rot // 2
    raw = torch.uint8 if fp8 else torch.int16

    def rope(x, cos, sin):
        out = x.clone()
        if inputs["rope"] == "neox":
            a, b = x[..., :h], x[..., h:rot]
            out[..., :h] = a * cos - b * sin
            out[..., h:rot] = b * cos + a * sin
        else:
            a, b = x[..., 0:rot:2], x[..., 1:rot:2]
            out[..., 0:rot:2] = a * cos - b * sin
            out[..., 1:rot:2] = b * cos + a * sin
        return out

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def fn():
        x = qkv.view(T, Hq + 2 * Hk, D)
        c = cs.index_select(0, pos)
        cos, sin = c[:, None, :h], c[:, None, h:]
        q, k = x[:, :Hq].float(), x[:, Hq:Hq + Hk].float()
        if inputs["norm_order"] == "norm_rope":
            q, k = rope(norm(q, qw), cos, sin), rope(norm(k, kw), cos, sin)
        else:
            q, k = norm(rope(q, cos, sin), qw), norm(rope(k, cos, sin), kw)
        v = x[:, Hq + Hk:]
        if q_fp8:
            amax = q.abs().amax(-1)
            q_scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
            q_out = (q / q_scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        else:
            q_scale, q_out = None, q.to(torch.bfloat16)
        if fp8:
            k8 = (k / ks).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            v8 = (v.float() / vs).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        else:
            k8, v8 = k.to(torch.bfloat16), v
        # through an integer view: index_copy_ has no fp8 kernel on the CPU (a bit copy either way)
        kc.view(raw).view(-1, Hk, D).index_copy_(0, slots, k8.index_select(0, keep).view(raw))
        vc.view(raw).view(-1, Hk, D).index_copy_(0, slots, v8.index_select(0, keep).contiguous().view(raw))
        return q_out, q_scale, kc, vc
    return fn


# ------------------------------------------------------------------------------------------------------------
# HPC-Ops
# ------------------------------------------------------------------------------------------------------------


def _layout(inputs):
    lay = inputs.get("layout")
    if lay is None:
        raise PeerUnavailable("not available: the inputs carry no request layout (use make_bench_inputs)")
    return lay


def _as_our_scale(qs, T: int, Hq: int, lay):
    """A peer's q_scale -> [T, Hq]: decode layout [T, Hq] as is; prefill layout [num_req, Hq, >= max_len] (HPC-Ops,
    FlashInfer's dynamic prefill: entry [r, h, i] is token i of request r) gathered per request."""
    import torch

    if qs is None:
        return None
    if qs.dim() == 2 and tuple(qs.shape) == (T, Hq):
        return qs
    if qs.dim() == 3 and qs.shape[1] == Hq:
        ind = lay["q_indptr"].tolist()
        parts = [qs[r, :, : ind[r + 1] - ind[r]].transpose(0, 1) for r in range(len(ind) - 1)]
        return torch.cat(parts, 0)
    if qs.numel() == T * Hq:
        return qs.reshape(T, Hq)
    raise ValueError(f"unrecognised q_scale layout {tuple(qs.shape)}")


def make_hpc_ops(inputs):
    """HPC-Ops ``hpc.rope_norm_store_kv_fp8`` (FP8 cache; quant_policy 1: Q FP8 with per-token-per-head scales) or
    ``hpc.rope_norm_store_kv`` (BF16 cache, BF16 Q). Positions and slots come from its own arguments: sequence
    lengths, a Q prefix sum and the block table of inputs['layout'] (the same tokens as our positions/slots).
    qk_norm_policy 2 = norm then RoPE, 1 = RoPE then norm; NeoX only; norm weights fp32; no eps argument in the
    BF16 entry (the FP8 entry's rms_eps is passed when its signature has it).
    Returns fn() -> (q, q_scale [T, Hq] or None, k_cache, v_cache). Raises PeerUnavailable without CUDA or the
    package, for interleaved RoPE, partial rotary, static Q scale, pads, or when the first call fails (the error
    text is the reason).
    """
    import torch

    _need_cuda(inputs)
    T, Hq, Hk, D = _dims(inputs)
    if inputs["rope"] != "neox":
        raise PeerUnavailable("not available: HPC-Ops' prologue is NeoX RoPE only")
    if int(inputs["rotary_dim"]) != D:
        raise PeerUnavailable("not available: HPC-Ops' prologue rotates the whole head (no partial rotary)")
    if bool((inputs["slot_mapping"] < 0).any()):
        raise PeerUnavailable("not available: HPC-Ops derives slots from sequence lengths (no pad rows)")
    hpc = _import_hpc()
    lay = _layout(inputs)
    kc, vc = inputs["k_cache"], inputs["v_cache"]
    fp8 = kc.dtype == torch.float8_e4m3fn
    if fp8 != (inputs.get("q_dtype", "fp8") == "fp8"):
        raise PeerUnavailable("not available: HPC-Ops pairs FP8 Q with an FP8 cache and BF16 Q with a BF16 cache")
    policy = 2 if inputs["norm_order"] == "norm_rope" else 1
    qw, kw = inputs["q_norm_weight"].float().contiguous(), inputs["k_norm_weight"].float().contiguous()
    cs = inputs["cos_sin"]
    seq = lay["seq_lens"].to(torch.int32).contiguous()
    qi = lay["q_indptr"].to(torch.int32).contiguous()
    bt = lay["block_table"].to(torch.int32).contiguous()
    prefill = bool(lay["is_prefill"])
    max_len = int(lay["max_seqlen"])
    out_q = torch.empty((T, Hq, D), dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device=kc.device)
    if fp8:
        f = hpc.rope_norm_store_kv_fp8
        params = inspect.signature(f).parameters
        kw_extra = {}
        if "rms_eps" in params:
            kw_extra["rms_eps"] = float(inputs["eps"])
        if "upper_max" in params:
            kw_extra["upper_max"] = FP8_MAX

        def call():
            return f(kc, vc, inputs["qkv"], cs, seq, qi, bt, prefill, inputs["k_scale"], inputs["v_scale"], 1,
                     max_seqlens=max_len, q_norm_weight=qw, k_norm_weight=kw, out_q=out_q, qk_norm_policy=policy,
                     **kw_extra)
    else:
        f = hpc.rope_norm_store_kv

        def call():
            return f(kc, vc, inputs["qkv"], cs, seq, qi, bt, prefill, q_norm_weight=qw, k_norm_weight=kw,
                     out_q=out_q, qk_norm_policy=policy)
    try:
        res = call()
        torch.cuda.synchronize()
    except Exception as e:
        raise PeerUnavailable(f"not available: hpc.{f.__name__} failed: {_short(e)}") from None
    res = res if isinstance(res, (tuple, list)) else (res,)
    q_res = res[0]
    qs_raw = res[1] if fp8 and len(res) > 1 else None

    def fn():
        r = call()
        r = r if isinstance(r, (tuple, list)) else (r,)
        return r[0], (r[1] if fp8 and len(r) > 1 else None), kc, vc

    def convert(out):
        q, qs, k, v = out
        return q, _as_our_scale(qs, T, Hq, lay), k, v
    fn.convert = convert  # outside the timed fn: the prefill q_scale layout is gathered here
    fn.q_shape = tuple(q_res.shape)
    fn.q_scale_shape = None if qs_raw is None else tuple(qs_raw.shape)
    return fn


# ------------------------------------------------------------------------------------------------------------
# FlashInfer 0.7.2 fused prologue
# ------------------------------------------------------------------------------------------------------------


def _find_flashinfer_fused(fi):
    name = "cake_fused_qk_rmsnorm_rope_quantize_fp8_append_paged_kv_cache"
    for modname in ("rope", "cake_fused_qk_rope_fp8_append"):
        try:
            mod = getattr(fi, modname, None) or __import__(f"flashinfer.{modname}", fromlist=[name])
        except Exception:
            continue
        if hasattr(mod, name):
            return getattr(mod, name)
    if hasattr(fi, name):
        return getattr(fi, name)
    raise PeerUnavailable(f"not available: flashinfer {fi.__version__} has no {name}")


def make_flashinfer_fused(inputs):
    """FlashInfer 0.7.2's fused prologue (a port of HPC-Ops' design): RMSNorm (eps fixed 1e-6) + NeoX RoPE + FP8 Q
    (quant_policy 1: per-token-per-head scale) + FP8 paged K/V append, one launch. Arguments are passed by the
    names of its runtime signature (inspect.signature); metadata (sequence lengths, Q prefix sum, page table) come
    from inputs['layout']. Returns fn() -> (q, q_scale, k_cache, v_cache). Raises PeerUnavailable without CUDA or
    the package, for BF16, interleaved RoPE, partial rotary, pads, head_dim != 128, or when the first call fails
    (the error text, with the signature, is the reason).
    """
    import torch

    _need_cuda(inputs)
    T, Hq, Hk, D = _dims(inputs)
    kc, vc = inputs["k_cache"], inputs["v_cache"]
    if kc.dtype != torch.float8_e4m3fn or inputs.get("q_dtype", "fp8") != "fp8":
        raise PeerUnavailable("not available: this FlashInfer entry is the FP8 one (FP8 Q and cache)")
    if inputs["rope"] != "neox" or int(inputs["rotary_dim"]) != D or D != 128:
        raise PeerUnavailable("not available: FlashInfer's fused prologue is NeoX over a whole 128-wide head")
    if bool((inputs["slot_mapping"] < 0).any()):
        raise PeerUnavailable("not available: FlashInfer derives slots from sequence lengths (no pad rows)")
    fi = _import_flashinfer()
    f = _find_flashinfer_fused(fi)
    lay = _layout(inputs)
    sig = inspect.signature(f)
    out_q = torch.empty((T, Hq, D), dtype=torch.float8_e4m3fn, device=kc.device)
    max_len = int(lay["max_seqlen"])
    if lay["is_prefill"]:  # dynamic prefill: [B, Hq, round_up(max_seqlen, 128)] by token index inside its request
        nreq = int(lay["q_indptr"].numel()) - 1
        q_scale = torch.empty((nreq, Hq, -(-max_len // 128) * 128), dtype=torch.float32, device=kc.device)
    else:
        q_scale = torch.empty((T, Hq), dtype=torch.float32, device=kc.device)
    cand = dict(qkv=inputs["qkv"], cos_sin_cache=inputs["cos_sin"], cos_sin=inputs["cos_sin"],
                seq_lens=lay["seq_lens"].to(torch.int32).contiguous(),
                q_indptr=lay["q_indptr"].to(torch.int32).contiguous(),
                page_indices=lay["block_table"].to(torch.int32).contiguous(),
                kv_indices=lay["block_table"].to(torch.int32).contiguous(),
                paged_kv_cache=(kc, vc), key_cache=kc, value_cache=vc, is_prefill=bool(lay["is_prefill"]),
                k_scale=inputs["k_scale"], v_scale=inputs["v_scale"], quant_policy=1,
                max_seqlen=max_len, upper_max=FP8_MAX, q_norm_weight=inputs["q_norm_weight"].float().contiguous(),
                k_norm_weight=inputs["k_norm_weight"].float().contiguous(),
                qk_norm_policy=2 if inputs["norm_order"] == "norm_rope" else 1, out_q=out_q, q_scale=q_scale)
    kwargs = {k: cand[k] for k in sig.parameters if k in cand}
    missing = [k for k, p in sig.parameters.items() if k not in cand and p.default is inspect.Parameter.empty]
    if missing:
        raise PeerUnavailable(f"not available: FlashInfer signature {sig} needs {missing}, which this adapter does "
                              "not map")
    try:
        res = f(**kwargs)
        torch.cuda.synchronize()
    except Exception as e:
        raise PeerUnavailable(f"not available: flashinfer {f.__name__} failed: {_short(e)} (signature {sig})"
                              ) from None

    def pick(r):
        r = r if isinstance(r, (tuple, list)) else (r,)
        q = next((t for t in r if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn), out_q)
        qs = next((t for t in r if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel()), q_scale)
        return q, qs
    pick(res)

    def fn():
        q, qs = pick(f(**kwargs))
        return q, qs, kc, vc

    def convert(out):
        q, qs, k, v = out
        return q, _as_our_scale(qs, T, Hq, lay), k, v
    fn.convert = convert
    return fn


# ------------------------------------------------------------------------------------------------------------

MAKERS = {"hpc_ops": make_hpc_ops, "flashinfer_fused": make_flashinfer_fused, "torch_unfused": make_torch_unfused}


def try_make(name: str, inputs, **kw):
    """(fn, None) or (None, reason): never raises, so one failing peer becomes a table row, not a crash."""
    return make_or_reason(MAKERS, name, inputs, **kw)
