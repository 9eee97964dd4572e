"""Router-GEMM peers: what a reader would run instead of our BF16x2 kernel, measured in the same run.

``hpc_ops``: HPC-Ops' ``hpc.gemm_bf16xfp32(x, w_high, w_low, 1/256, True, True, workspace)`` (FP32 output,
split-K), the production kernel of this design. It gets its own weight split, as its docstring defines it: w_high =
``w.to(bfloat16)`` (round to nearest; ours truncates) and w_low = ``((w - w_high) / (1/256)).to(bfloat16)``, made once
here (not timed, like our plan). Its workspace comes from ``hpc.get_gemm_bf16xfp32_workspace(N)``.

``make_<peer>(x, w) -> fn`` with x bf16 [M, K] and w fp32 [N, K] on the GPU; ``fn()`` (no arguments, CUDA-graph
capturable) returns the fp32 scores [M, N]. ``try_make`` turns any failure into a reason for the table.
"""

from __future__ import annotations

from hotpaths.bench._peers_common import PeerUnavailable, import_hpc_ops, make_or_reason, need_cuda, short_error

PEER_NAMES = ("hpc_ops",)
HPC_SCALE = 1.0 / 256.0


def hpc_ops_split(w):
    """HPC-Ops' two-part split of an FP32 weight (its docstring's definition): (w_high, w_low) bf16 [N, K] with
    w_high = RNE(w), w_low = RNE((w - w_high) * 256). Shape/Dtype: w fp32 [N, K]. Raises nothing."""
    import torch

    hi = w.to(torch.bfloat16)
    lo = ((w - hi.float()) / HPC_SCALE).to(torch.bfloat16)
    return hi.contiguous(), lo.contiguous()


def make_hpc_ops(x, w):
    """HPC-Ops ``gemm_bf16xfp32`` on x bf16 [M, K] and w fp32 [N, K] (split here by hpc_ops_split, not timed).
    Returns fn() -> fp32 [M, N]. Raises PeerUnavailable without CUDA or the HPC-Ops bundle, or when its first call
    fails (its error is the reason)."""
    import torch

    need_cuda(x)
    hpc = import_hpc_ops()
    hi, lo = hpc_ops_split(w)
    try:
        ws = hpc.get_gemm_bf16xfp32_workspace(int(w.shape[0]))
        res = hpc.gemm_bf16xfp32(x, hi, lo, HPC_SCALE, True, True, ws)
        torch.cuda.synchronize()
    except Exception as e:
        raise PeerUnavailable(f"not available: hpc.gemm_bf16xfp32 failed: {short_error(e)}") from None
    if tuple(res.shape) != (x.shape[0], w.shape[0]) or res.dtype != torch.float32:
        raise PeerUnavailable(f"not available: hpc.gemm_bf16xfp32 returned {res.dtype} {tuple(res.shape)}, expected "
                              f"fp32 {(x.shape[0], w.shape[0])}")

    def fn():
        return hpc.gemm_bf16xfp32(x, hi, lo, HPC_SCALE, True, True, ws)
    fn.keep = (hi, lo, ws)
    fn.note = "HPC-Ops gemm_bf16xfp32 (split-K, fp32 out), same run; its own RNE split, not timed"
    return fn


MAKERS = {"hpc_ops": make_hpc_ops}


def try_make(name: str, x, w):
    """(fn, None) or (None, reason) for peer ``name`` on x bf16 [M, K] and w fp32 [N, K] (as make_hpc_ops); never
    raises."""
    return make_or_reason(MAKERS, name, x, w)
