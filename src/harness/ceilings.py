"""Measured ceilings of the device: copy bandwidth (bytes read + written) and BF16/FP8 matmul rate.

Every results table divides by these, measured in the same run, rather than by datasheet numbers.
"""

from __future__ import annotations

from hotpaths.harness.bench import bench
from hotpaths.kernels.probe import probe_copy

_cache: dict | None = None


def measure(*, copy_bytes: int = 1 << 30, mm: int = 8192, iters: int = 20, force: bool = False) -> dict:
    """Returns dict(copy_gbps, torch_copy_gbps, torch_copy_graph_gbps, probe_gbps, bf16_tflops, fp8_tflops,
    copy_bytes, mm_size); values None on CPU. GB/s count bytes read + written.

    copy_gbps, the ceiling every table divides by, is the best SM-driven device-to-device copy of ``copy_bytes``:
    the larger of torch's eager copy and the repo's streaming probe kernel (hotpaths.kernels.probe). Torch's copy
    captured in a CUDA graph becomes a memcpy node that the copy engines run (2.76 TB/s measured on the H200,
    against 3.96 TB/s for the probe): it is reported as torch_copy_graph_gbps but is not the ceiling of a kernel
    that streams through the SMs. bf16/fp8: an ``mm``-cubed product on random data (zeros run faster and would
    flatter the ceiling).
    """
    global _cache
    if _cache is not None and not force:
        return _cache
    import torch

    out = {"copy_gbps": None, "torch_copy_gbps": None, "torch_copy_graph_gbps": None, "probe_gbps": None,
           "bf16_tflops": None, "fp8_tflops": None, "copy_bytes": copy_bytes, "mm_size": mm}
    if not torch.cuda.is_available():
        _cache = out
        return out
    src = torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # copy_bytes >> L2: cold by construction. Eager: each copy takes hundreds of us, so the CPU launch is hidden.
    t = bench(lambda: dst.copy_(src), cold_l2=False, graph=False, iters=iters)  # noqa: F821 (del below)
    out["torch_copy_gbps"] = 2 * copy_bytes / t.median_us / 1e3
    t = bench(lambda: dst.copy_(src), cold_l2=False, iters=iters)  # noqa: F821 (called before the del)
    out["torch_copy_graph_gbps"] = 2 * copy_bytes / t.median_us / 1e3
    try:
        probe_copy(dst, src)
        torch.cuda.synchronize()
        if not torch.equal(dst, src):
            raise RuntimeError("probe copy produced a wrong result")
        t = bench(lambda: probe_copy(dst, src), cold_l2=False, iters=iters)  # noqa: F821
        out["probe_gbps"] = 2 * copy_bytes / t.median_us / 1e3
    except Exception as e:  # the ceiling stands without the probe; say why it is missing
        out["probe_error"] = f"{type(e).__name__}: {e}"
    out["copy_gbps"] = max(v for v in (out["torch_copy_gbps"], out["probe_gbps"]) if v is not None)
    del src, dst
    a = torch.randn(mm, mm, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(mm, mm, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(mm, mm, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: torch.matmul(a, b, out=c), cold_l2=False, iters=iters)
    out["bf16_tflops"] = 2 * mm**3 / t.median_us / 1e6
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major B, as _scaled_mm wants
        one = torch.ones((), device="cuda")
        t = bench(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                  cold_l2=False, iters=iters)
        out["fp8_tflops"] = 2 * mm**3 / t.median_us / 1e6
    except Exception as e:
        out["fp8_error"] = f"{type(e).__name__}: {e}"
    _cache = out
    return out


def pct_of_ceiling(gbps: float | None, ceilings: dict | None, key: str = "copy_gbps") -> float | None:
    """Achieved rate as a percentage of the measured ceiling (None when either is missing)."""
    if gbps is None or not ceilings or not ceilings.get(key):
        return None
    return 100.0 * gbps / ceilings[key]
