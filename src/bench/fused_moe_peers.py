"""Fused-MoE peers: what a serving engine would run instead of our fused FP8 MoE, made callable on the same inputs.

Every peer is ``make_<peer>(inputs) -> fn`` where ``inputs`` is the dict of
``hotpaths.reference.fused_moe.make_moe_inputs`` and ``fn()`` (no arguments, CUDA-graph capturable) returns the bf16
output [T, H]. Layout conversions a serving system does once at load time (weight transposes, padded scale grids,
dequantized BF16 copies, expert maps) happen in ``make_*`` and are NOT timed; per-step work (activation
quantization, routing sort, gathers) is inside ``fn``. ``make_*`` raises ``PeerUnavailable(reason)`` (the pattern of
hotpaths.harness.peers) so a benchmark records the reason in its table instead of failing; ``try_make`` never
raises.

Gate/up order: our w13 holds gate rows first (0..I-1) then up. HPC-Ops, flag-gems (vLLM's layout) and torch paths
take the same order; FlashInfer's CUTLASS MoE (TensorRT-LLM's layout) takes up first, so its adapter swaps the
halves once in make. Expert parallelism: HPC-Ops takes rank_ep, flag-gems a global-to-local expert map, FlashInfer
ep_size/ep_rank; the torch paths sort non-local pairs into a trailing group that is computed and then masked.

Without a GPU (or when a peer cannot run), ``emulate(name, inputs)`` gives the peer's precision path on CPU: the
BF16 grouped-GEMM path has its own emulation (bf16 dequantized weights, bf16 GEMM outputs); every FP8 peer computes
the same format as ours (per-tensor or 128x128 blocks with 1x128 activation groups), so its emulation is the
staged FP8 emulation (rounding details inside a peer's kernel are not modelled).
"""

from __future__ import annotations

import os

from hotpaths.bench._peers_common import hpc_ops_dir as hpc_ops_dir  # re-exported
from hotpaths.bench._peers_common import (
    import_flashinfer_072,
    import_hpc_ops,
    import_peer_attr,
    make_or_reason,
    run_once,
)
from hotpaths.harness.peers import PeerUnavailable

PEER_NAMES = ("hpc_ops", "torch_grouped_mm_bf16", "torch_scaled_grouped_mm_fp8", "triton_fused_moe",
              "flashinfer_cutlass")

__all__ = [
    "PEER_NAMES",
    "PeerUnavailable",
    "emulate",
    "hpc_ops_dir",
    "make_flashinfer_cutlass",
    "make_hpc_ops",
    "make_torch_grouped_mm_bf16",
    "make_torch_scaled_grouped_mm_fp8",
    "make_triton_fused_moe",
    "try_make",
]


# Opt-in for peers whose first call JIT-compiles for minutes (FlashInfer's CUTLASS MoE).
PEER_JIT_ENV = "HOTPATHS_PEER_JIT"


def _need_cuda(inputs) -> None:
    import torch

    if not torch.cuda.is_available():
        raise PeerUnavailable("not available: needs a CUDA GPU (this machine is CPU-only)")
    if inputs["x"].device.type != "cuda":
        raise PeerUnavailable(f"not available: inputs are on {inputs['x'].device}, the peer times CUDA tensors")


def _no_skip_ids(inputs, name: str) -> None:
    import torch

    if bool((inputs["topk_ids"] < 0).any()):
        raise PeerUnavailable(f"not available: {name} adapter takes no ids of -1 (skip); the benchmark's routing "
                              "has none")
    del torch


# ----------------------------------------------------------------------------------------------------------------
# HPC-Ops
# ----------------------------------------------------------------------------------------------------------------

# the shared importers (hotpaths.bench._peers_common): one place reads HOTPATHS_HPC_OPS_DIR /
# HOTPATHS_FLASHINFER_072_DIR for every op's peers
_import_hpc = import_hpc_ops


# Block-wise HPC-Ops at an intermediate that is not a multiple of 128 is not safe at any token count on the H200:
# an illegal memory access from 32 tokens up (issue 13), and a Hy3 TP8 (I = 192) block run at batch 4, where it was
# still attempted, died with "misaligned address" (scale rows of ceil(I/128) = 2 floats are 8 bytes; our kernels'
# accesses to them are 4-byte). Either fault kills the process's CUDA context (every later row, ours included),
# so it is attempted only when asked.
HPC_BLOCK_UNSAFE_TOKENS = 1


def _ceil4(n: int) -> int:
    return -(-n // 4) * 4


def make_hpc_ops(inputs):
    """HPC-Ops ``hpc.fuse_moe`` (per-tensor) or ``hpc.fuse_moe_blockwise_fp8`` (block).

    Per-tensor: it takes x already in FP8 and folded scales: gate_up_scale = a1_scale * w13_scale [E], down_scale =
    a2_scale * w2_scale [E], act_and_mul_scale = 1 / a2_scale [1] (the quant multiplier of the activation); x is
    quantized inside fn (per-step work). num_expert_total: the local count, as its own per-tensor test passes it.
    Block: x quantized to 1x128 groups inside fn; its weight-scale grids are padded along the last dim to a
    multiple of 4 ("ceil4", [E, 2I/128, ceil4(ceil(H/128))] and [E, H/128, ceil4(ceil(I/128))]), copied once here;
    num_expert_total: the global count (its block test passes the global count with rank_ep).
    """
    import torch

    from hotpaths.reference import fused_moe as fm

    _need_cuda(inputs)
    _no_skip_ids(inputs, "hpc_ops")
    hpc = _import_hpc()
    x, ids, tw, w13, w2 = (inputs[k] for k in ("x", "topk_ids", "topk_weights", "w13", "w2"))
    e = inputs["num_experts"]
    rank = inputs["expert_offset"] // e
    if inputs["scales"] == "pertensor":
        a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
        gu_scale = (a1 * inputs["w13_scale"]).float().contiguous()
        dn_scale = (a2 * inputs["w2_scale"]).float().contiguous()
        am_scale = (1.0 / a2).float().contiguous()
        out = torch.empty_like(x)

        def fn():
            xq = (x.float() / a1).clamp(-fm.FP8_MAX, fm.FP8_MAX).to(fm.FP8_DTYPE)
            return hpc.fuse_moe(xq, w13, w2, gu_scale, dn_scale, am_scale, ids, tw, rank, e, output=out)
        return run_once(fn, "hpc.fuse_moe")
    if not hasattr(hpc, "fuse_moe_blockwise_fp8"):
        raise PeerUnavailable("not available: this HPC-Ops build has no fuse_moe_blockwise_fp8")
    t = x.shape[0]
    if inputs["inter"] % 128 and t >= HPC_BLOCK_UNSAFE_TOKENS and os.environ.get("HOTPATHS_HPC_BLOCK_UNSAFE") != "1":
        # an illegal memory access poisons the CUDA context for every later row of the process
        raise PeerUnavailable(f"skipped: hpc.fuse_moe_blockwise_fp8 at I={inputs['inter']} (not a multiple of 128) "
                              "is reported to fault on this H200 model (illegal memory access from 32 tokens, issue "
                              "13); a block run here that included it died with a misaligned address at 4 tokens, "
                              "not isolated to it; set HOTPATHS_HPC_BLOCK_UNSAFE=1 to try it, alone in its process")

    def pad4(s):
        p = torch.zeros(*s.shape[:-1], _ceil4(s.shape[-1]), dtype=torch.float32, device=s.device)
        p[..., :s.shape[-1]] = s
        return p.contiguous()
    s13, s2 = pad4(inputs["w13_scale"]), pad4(inputs["w2_scale"])

    def fn():
        xq, xs = _group_quant_gpu(x)
        return hpc.fuse_moe_blockwise_fp8(xq, xs, w13, s13, w2, s2, ids, tw, rank, inputs["experts_total"])
    return run_once(fn, "hpc.fuse_moe_blockwise_fp8")


def _group_quant_gpu(x):
    """Dynamic 1x128 FP8 groups of x [T, H] (H a multiple of 128 here): (fp8 [T, H], FP32 [T, H/128])."""
    import torch

    from hotpaths.reference import fused_moe as fm

    t, h = x.shape
    g = x.float().reshape(t, -1, fm.BLOCK)
    s = torch.clamp(g.abs().amax(dim=2) / fm.FP8_MAX, min=fm.GROUP_EPS)
    q = (g / s[..., None]).clamp(-fm.FP8_MAX, fm.FP8_MAX).to(fm.FP8_DTYPE).reshape(t, h)
    return q, s.contiguous()


# ----------------------------------------------------------------------------------------------------------------
# torch grouped GEMMs (the unfused baseline under CUDA graphs)
# ----------------------------------------------------------------------------------------------------------------

def _route_torch(ids, e: int, offset: int):
    """Capturable routing for the torch paths: pairs sorted by local expert (non-local pairs last), group ends for
    ``offs``, and the validity mask. No host sync (counts via index_add, not bincount)."""
    import torch

    loc = ids.reshape(-1).long() - offset
    valid = (loc >= 0) & (loc < e)
    key = torch.where(valid, loc, torch.full_like(loc, e))
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(e + 1, dtype=torch.int32, device=ids.device).index_add_(
        0, key, torch.ones_like(key, dtype=torch.int32))
    offs = torch.cumsum(counts[:e], 0).to(torch.int32)
    return order, offs, valid


def _combine(y_sorted, order, valid, tw, t: int, k: int, shared):
    import torch

    y = torch.empty_like(y_sorted)
    y[order] = y_sorted
    y = y.float().reshape(t, k, -1)
    w = torch.where(valid.reshape(t, k), tw, torch.zeros_like(tw))
    y = torch.where(valid.reshape(t, k, 1), y, torch.zeros_like(y))  # masked rows may hold garbage
    acc = (y * w[..., None]).sum(1)
    if shared is not None:
        acc = acc + shared.float()
    return acc.to(torch.bfloat16)


def make_torch_grouped_mm_bf16(inputs):
    """``torch._grouped_mm`` in BF16 on dequantized weights (w * scale rounded to BF16 once, here): route, gather,
    gate-up, SiLU-and-mul, down, weighted sum, each a separate PyTorch op under one CUDA graph."""
    import torch

    _need_cuda(inputs)
    if not hasattr(torch, "_grouped_mm"):
        raise PeerUnavailable(f"not available: torch {torch.__version__} has no torch._grouped_mm")
    w13b, w2b = _dequant_bf16(inputs)
    w13t, w2t = w13b.transpose(1, 2), w2b.transpose(1, 2)
    x, ids, tw, sh = inputs["x"], inputs["topk_ids"], inputs["topk_weights"], inputs.get("shared_out")
    t, k = ids.shape
    e, i, off = inputs["num_experts"], inputs["inter"], inputs["expert_offset"]

    def fn():
        order, offs, valid = _route_torch(ids, e, off)
        xs = x[torch.div(order, k, rounding_mode="floor")]
        h = torch._grouped_mm(xs, w13t, offs=offs)
        a = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
        y = torch._grouped_mm(a, w2t, offs=offs)
        return _combine(y, order, valid, tw, t, k, sh)
    return run_once(fn, "torch._grouped_mm")


def _dequant_bf16(inputs):
    import torch

    from hotpaths.reference import fused_moe as fm

    w13, w2, s13, s2 = inputs["w13"], inputs["w2"], inputs["w13_scale"], inputs["w2_scale"]
    a = torch.stack([fm.dequant_weight(w13[j], s13[j], dtype=torch.float32) for j in range(w13.shape[0])])
    b = torch.stack([fm.dequant_weight(w2[j], s2[j], dtype=torch.float32) for j in range(w2.shape[0])])
    return a.to(torch.bfloat16).contiguous(), b.to(torch.bfloat16).contiguous()


def make_torch_scaled_grouped_mm_fp8(inputs):
    """``torch._scaled_grouped_mm`` FP8 (per-tensor only: row-wise scales a1 per row and w13_scale[e] per column);
    x and the activation quantized with the static scales inside fn. Block scales have no such entry point."""
    import torch

    from hotpaths.reference import fused_moe as fm

    _need_cuda(inputs)
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise PeerUnavailable(f"not available: torch {torch.__version__} has no torch._scaled_grouped_mm")
    if inputs["scales"] != "pertensor":
        raise PeerUnavailable("not available: torch._scaled_grouped_mm takes row-wise scales, not 128x128 blocks")
    x, ids, tw, sh = inputs["x"], inputs["topk_ids"], inputs["topk_weights"], inputs.get("shared_out")
    t, k = ids.shape
    e, i, h, off = inputs["num_experts"], inputs["inter"], inputs["hidden"], inputs["expert_offset"]
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    w13t, w2t = inputs["w13"].transpose(1, 2), inputs["w2"].transpose(1, 2)
    sb13 = inputs["w13_scale"][:, None].expand(e, 2 * i).contiguous()
    sb2 = inputs["w2_scale"][:, None].expand(e, h).contiguous()
    m = t * k
    sa1 = a1.expand(m).contiguous()
    sa2 = a2.expand(m).contiguous()

    def fn():
        order, offs, valid = _route_torch(ids, e, off)
        xq = (x.float() / a1).clamp(-fm.FP8_MAX, fm.FP8_MAX).to(fm.FP8_DTYPE)
        xs = xq[torch.div(order, k, rounding_mode="floor")]
        hh = torch._scaled_grouped_mm(xs, w13t, sa1, sb13, offs=offs, out_dtype=torch.bfloat16)
        a = torch.nn.functional.silu(hh[:, :i].float()) * hh[:, i:].float()
        aq = (a / a2).clamp(-fm.FP8_MAX, fm.FP8_MAX).to(fm.FP8_DTYPE)
        y = torch._scaled_grouped_mm(aq, w2t, sa2, sb2, offs=offs, out_dtype=torch.bfloat16)
        return _combine(y, order, valid, tw, t, k, sh)
    return run_once(fn, "torch._scaled_grouped_mm")


# ----------------------------------------------------------------------------------------------------------------
# flag-gems (vLLM's Triton fused MoE) and FlashInfer CUTLASS
# ----------------------------------------------------------------------------------------------------------------

def make_triton_fused_moe(inputs):
    """flag-gems 5.0.2 ``fused_experts_impl`` (vLLM's Triton fused MoE: sorted token ids, one kernel per GEMM), run
    UNTUNED (it ships no H200 configurations and falls back to its defaults). Per-tensor: w1/w2 scales [E] and
    static a1/a2 [1]; block: block_shape [128, 128] (it needs widths that are multiples of 128, so Hy3 TP8's
    I = 192 is refused before launching, with the reason). EP: global_num_experts and an expert map (global ->
    local, -1 for other ranks' experts)."""
    import torch

    _need_cuda(inputs)
    _no_skip_ids(inputs, "triton_fused_moe")
    fused_experts_impl = import_peer_attr("flag_gems.fused.fused_moe", "fused_experts_impl",
                                          hint="put flag-gems 5.0.2 (+ sqlalchemy, greenlet) on PYTHONPATH")
    x, ids, tw, sh = inputs["x"], inputs["topk_ids"], inputs["topk_weights"], inputs.get("shared_out")
    e, off, et = inputs["num_experts"], inputs["expert_offset"], inputs["experts_total"]
    kw = dict(use_fp8_w8a8=True, w1_scale=inputs["w13_scale"], w2_scale=inputs["w2_scale"])
    if inputs["scales"] == "pertensor":
        kw.update(a1_scale=inputs["a1_scale"], a2_scale=inputs["a2_scale"])
    else:
        if inputs["inter"] % 128 or inputs["hidden"] % 128:
            # refused before any launch: a fault in its kernels would poison the context for every later row
            raise PeerUnavailable(f"skipped: flag_gems block_shape [128, 128] needs H and I multiples of 128 "
                                  f"(H={inputs['hidden']}, I={inputs['inter']})")
        kw.update(block_shape=[128, 128])
    if et != e:
        emap = torch.full((et,), -1, dtype=torch.int32, device=x.device)
        emap[off:off + e] = torch.arange(e, dtype=torch.int32, device=x.device)
        kw.update(global_num_experts=et, expert_map=emap)

    def fn():
        y = fused_experts_impl(x, inputs["w13"], inputs["w2"], tw, ids, **kw)
        return y if sh is None else (y.float() + sh.float()).to(torch.bfloat16)
    return run_once(fn, "flag_gems fused_experts_impl")


def make_flashinfer_cutlass(inputs):
    """FlashInfer 0.7.2 ``cutlass_fused_moe`` (TensorRT-LLM's CUTLASS MoE). Per-tensor FP8: x quantized with a1 in
    fn; quant_scales = [a1*w13_scale (gemm1 dequant, [E]), 1/a2 (gemm2 input quant), a2*w2_scale (gemm2 dequant),
    a1 (gemm1 input dequant)]. Block: use_deepseek_fp8_block_scale with the 128x128 weight-scale grids. Its fc1
    takes up rows first: the halves of w13 (and of the block-scale grid) are swapped here, once. EP through
    ep_size=8 / ep_rank. Its first call JIT-compiles the module fused_moe_90 (248 objects, every dtype pair
    TensorRT-LLM's MoE GEMMs ship: about an hour with 16 jobs on the H200 machine), so it runs only with
    $HOTPATHS_PEER_JIT=1 (otherwise PeerUnavailable says so)."""
    import torch

    from hotpaths.reference import fused_moe as fm

    _need_cuda(inputs)
    _no_skip_ids(inputs, "flashinfer_cutlass")
    if os.environ.get(PEER_JIT_ENV) != "1":  # checked first: it is the reason a row is missing, bundle or not
        # a benchmark row (or a test) must not stall for minutes on a peer's compiler: building it is a choice
        raise PeerUnavailable(f"skipped: cutlass_fused_moe JIT-compiles TensorRT-LLM's CUTLASS MoE on first use "
                              f"(module fused_moe_90, 248 objects: 34 built in 531 s with 16 jobs on the H200 "
                              f"machine, about an hour in all, past its device budget); set {PEER_JIT_ENV}=1 to "
                              f"build and time it")
    import_flashinfer_072()  # the 0.7.2 bundle (PeerUnavailable with the reason when absent)
    cutlass_fused_moe = import_peer_attr("flashinfer.fused_moe", "cutlass_fused_moe",
                                         hint="put FlashInfer 0.7.2 (+ apache-tvm-ffi) on PYTHONPATH")
    x, ids, tw, sh = inputs["x"], inputs["topk_ids"], inputs["topk_weights"], inputs.get("shared_out")
    e, i, off = inputs["num_experts"], inputs["inter"], inputs["expert_offset"]
    w13 = inputs["w13"]
    w31 = torch.cat([w13[:, i:], w13[:, :i]], dim=1).contiguous()
    ep = dict(ep_size=inputs["experts_total"] // e, ep_rank=off // e) if inputs["experts_total"] != e else {}
    out = torch.empty_like(x)
    if inputs["scales"] == "pertensor":
        a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
        qs = [(a1 * inputs["w13_scale"]).float(), (1.0 / a2).float(), (a2 * inputs["w2_scale"]).float(), a1.float()]

        def fn():
            xq = (x.float() / a1).clamp(-fm.FP8_MAX, fm.FP8_MAX).to(fm.FP8_DTYPE)
            cutlass_fused_moe(xq, ids, tw, w31, inputs["w2"], torch.bfloat16, qs, output=out, **ep)
            return out if sh is None else (out.float() + sh.float()).to(torch.bfloat16)
    else:
        if i % fm.BLOCK:
            raise PeerUnavailable(f"not available: I = {i} is not a multiple of 128, so the 128x128 scale blocks "
                                  "of gate and up are shared and cannot be reordered up-first")
        s13 = inputs["w13_scale"]
        nb = i // fm.BLOCK
        s31 = torch.cat([s13[:, nb:], s13[:, :nb]], dim=1).contiguous()
        qs = [s31, inputs["w2_scale"]]

        def fn():
            cutlass_fused_moe(x, ids, tw, w31, inputs["w2"], torch.bfloat16, qs, output=out,
                              use_deepseek_fp8_block_scale=True, **ep)
            return out if sh is None else (out.float() + sh.float()).to(torch.bfloat16)
    return run_once(fn, "flashinfer cutlass_fused_moe")


MAKERS = {"hpc_ops": make_hpc_ops, "torch_grouped_mm_bf16": make_torch_grouped_mm_bf16,
          "torch_scaled_grouped_mm_fp8": make_torch_scaled_grouped_mm_fp8, "triton_fused_moe": make_triton_fused_moe,
          "flashinfer_cutlass": make_flashinfer_cutlass}


def try_make(name: str, inputs):
    """(fn, None) or (None, reason): never raises, so one failing peer becomes a table row, not a crash."""
    return make_or_reason(MAKERS, name, inputs)


def grouped_mm_bf16_emulation(inputs):
    """The BF16 grouped-GEMM path on CPU: x bf16, weights dequantized and rounded to bf16 once, each GEMM's output
    rounded to bf16 (what torch._grouped_mm returns), SiLU-and-mul in FP32 rounded to bf16, FP32 weighted sum.
    Returns bf16 [T, H]."""
    import torch

    from hotpaths.reference import fused_moe as fm

    x, ids, tw, sh = inputs["x"], inputs["topk_ids"], inputs["topk_weights"], inputs.get("shared_out")
    e, i, off = inputs["num_experts"], inputs["inter"], inputs["expert_offset"]
    t = ids.shape[0]
    acc = torch.zeros(t, inputs["hidden"], dtype=torch.float32, device=x.device)
    loc = ids.long() - off
    valid = (loc >= 0) & (loc < e)
    for ex in torch.unique(loc[valid]).tolist():
        ti, ki = torch.nonzero(valid & (loc == ex), as_tuple=True)
        w13 = fm.dequant_weight(inputs["w13"][ex], inputs["w13_scale"][ex], dtype=torch.float32).to(torch.bfloat16)
        w2 = fm.dequant_weight(inputs["w2"][ex], inputs["w2_scale"][ex], dtype=torch.float32).to(torch.bfloat16)
        hh = (x[ti].float() @ w13.float().T).to(torch.bfloat16).float()
        a = (torch.nn.functional.silu(hh[:, :i]) * hh[:, i:]).to(torch.bfloat16)
        y = (a.float() @ w2.float().T).to(torch.bfloat16)
        acc.index_put_((ti,), tw[ti, ki][:, None] * y.float(), accumulate=True)
    if sh is not None:
        acc = acc + sh.float()
    return acc.to(torch.bfloat16)


def emulate(name: str, inputs):
    """The CPU stand-in of peer ``name`` (see the module docstring); bf16 [T, H]. Raises KeyError for an unknown
    name."""
    from hotpaths.reference import fused_moe as fm

    if name not in MAKERS and name != "fused":
        raise KeyError(f"unknown impl {name!r}; known: fused, {', '.join(PEER_NAMES)}")
    if name == "torch_grouped_mm_bf16":
        return grouped_mm_bf16_emulation(inputs)
    a, kw = fm.call_args(inputs)
    return fm.fused_moe_emulation(*a, **kw)
