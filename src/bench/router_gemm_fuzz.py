"""Fuzzing the router GEMM: random M/N/K (non-multiples of 64 where the reference takes them), weight scales
over several decades, checked against the exact FP64 reference.

``check_cpu``: the BF16x2 split reconstructs every weight within its derived bound (split_error_bound), and the
BF16x2 / BF16x3 emulations are within the elementwise bound of ``bound_failure`` of the exact product.
``fuzz_run`` on an SM90 GPU: the kernel (a drawn variant and K split from kernel_candidates, or the tuned default)
on a guarded output poisoned with NaN, vs the emulation within the FP32 summation-order bound.
"""

from __future__ import annotations

import torch

from hotpaths.harness import fuzzing
from hotpaths.harness.fuzzing import Draw, GuardedBuffers, unchanged
from hotpaths.reference import router_gemm as ref

OP = "router_gemm"
SCALES = ("init", 1e-3, 1.0, 30.0)


def fuzz_case(draw: Draw, *, kernel: bool = False) -> dict:
    """kernel=True: N and K multiples of 64 (what the kernel takes), M up to 4096, a kernel configuration;
    kernel=False: any N, K >= 1, M up to 300 (CPU cost)."""
    if kernel:
        m = draw.choice((1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 127, 128, 129)) if draw.boolean() \
            else draw.integer(1, 4096)
        n = 64 * draw.integer(1, 6)
        k = 64 * draw.integer(1, 96)
    else:
        m, n, k = draw.integer(1, 300), draw.integer(1, 320), draw.integer(1, 700)
    cfg = dict(m=m, n=n, k=k, scale=draw.choice(SCALES), seed=draw.integer(0, 2**16),
               parts=draw.choice((2, 3)))
    if kernel:
        from hotpaths.kernels import router_gemm as K

        cands = [c for c in K.kernel_candidates(m, n, k) if cfg["parts"] == 2 or
                 K.variant_table()[c[0]].parts >= 3]
        cfg["variant"], cfg["splits"] = draw.choice(cands + [("auto", 0)])
    return cfg


def _inputs(cfg):
    return ref.make_router_inputs(cfg["m"], cfg["n"], cfg["k"], seed=cfg["seed"], scale=cfg["scale"])


def check_cpu(cfg: dict) -> dict:
    """The BF16x2 weight split within its derived bound, and the BF16x2 / BF16x3 emulations vs exact within the
    elementwise bound of ``bound_failure``. Returns {failures: [str], path}."""
    x, w = _inputs(cfg)
    fails = []
    hi, lo = ref.split_fp32_weight(w)
    err = (ref.reconstruct(hi, lo) - w.double()).abs()
    over = err > ref.split_error_bound(w)
    if bool(over.any()):
        fails.append(f"BF16x2 split: {int(over.sum())} weights reconstruct outside the derived bound")
    exact = ref.router_gemm_ref(x, w)
    for name, emu, rel in (("bf16x2", ref.bf16x2_emulation, 2.0 ** -16), ("bf16x3", ref.bf16x3_emulation, 2.0 ** -22)):
        bad = bound_failure(emu(x, w), exact, x, w, rel)
        if bad:
            fails.append(f"{name} emulation vs exact: {bad}")
    return {"failures": fails, "path": "cpu emulation bf16x2/bf16x3 vs exact"}


def bound_failure(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rel: float) -> str | None:
    """Elementwise error bound of a split-weight product, valid at every shape (the tolerance rows are aggregates
    measured at the model's shapes and do not hold for a single score that cancels): |got - want| <= (rel +
    (2K + 4) u) sum_k |x_k||w_k| + 2^-126, u = 2^-24 (rel: the weight split's relative error; (K + 1) u for each
    side's FP32 accumulation in any order and its epilogue add). Returns the violation or None."""
    k = x.shape[1]
    absprod = x.double().abs() @ w.double().abs().T
    bound = (rel + (2 * k + 4) * 2.0 ** -24) * absprod + 2.0 ** -126
    err = (got.double() - want.double()).abs()
    over = ~(err <= bound)  # NaN counts as over
    if bool(over.any()):
        i = int(over.flatten().nonzero()[0, 0])
        return (f"{int(over.sum())} scores outside the bound (first flat index {i}: error "
                f"{float(err.flatten()[i]):.3g} > {float(bound.flatten()[i]):.3g})")
    return None


def fuzz_run(cfg: dict) -> dict:
    """On an SM90 GPU (cfg with a ``variant``): the kernel on guarded buffers (out NaN-poisoned), then no guard or
    input changed and out vs the same-split emulation within ``bound_failure``'s bound. Elsewhere: ``check_cpu``.
    Returns {failures: [str], path}."""
    from hotpaths.reference.common import sm90_skip_reason

    if "variant" not in cfg or sm90_skip_reason() is not None:
        return check_cpu(cfg)
    from hotpaths.kernels import router_gemm as K

    dev = torch.device("cuda")
    x_host, w_host = _inputs(cfg)
    g = GuardedBuffers()
    x = g.adopt("x", x_host.to(dev))
    weights = K.plan(w_host.to(dev), three_part=cfg["parts"] == 3)
    x_before = x.clone()
    out = g.alloc("out", (cfg["m"], cfg["n"]), torch.float32, dev, fill=float("nan"))
    impl = "bf16x3_kernel" if cfg["parts"] == 3 else "bf16x2_kernel"
    K.router_gemm(x, weights, impl=impl, out=out, variant=cfg["variant"], splits=cfg["splits"])
    torch.cuda.synchronize()
    fails = g.violations() + unchanged(x_before, x, name="x")
    rdev = fuzzing.REF_DEVICE  # the GPU (fast), or the CPU under compute-sanitizer
    emu = (ref.bf16x3_emulation if cfg["parts"] == 3 else ref.bf16x2_emulation)(x_host.to(rdev), w_host.to(rdev))
    bad = bound_failure(out.to(rdev), emu, x_host.to(rdev), w_host.to(rdev), 0.0)
    if bad:
        fails.append(f"kernel vs emulation (same split, any FP32 summation order): {bad}")
    return {"failures": fails, "path": f"kernel {impl} {cfg['variant']}/{cfg['splits']} vs emulation"}


SANITIZE_CASES = [
    dict(m=1, n=192, k=4096, scale="init", seed=0, parts=2, variant="auto", splits=0),
    dict(m=65, n=64, k=64, scale="init", seed=1, parts=2, variant="auto", splits=0),
    dict(m=129, n=256, k=1024, scale=1.0, seed=2, parts=3, variant="auto", splits=0),
    dict(m=4096, n=192, k=512, scale="init", seed=3, parts=2, variant="auto", splits=0),
    # the decode kernel over two row blocks (grid z), and K split over a 16-CTA (non-portable) cluster
    dict(m=100, n=128, k=1024, scale="init", seed=4, parts=2, variant="decode_w8", splits=0),
    dict(m=100, n=128, k=4096, scale="init", seed=5, parts=2, variant="tiled64d", splits=16),
]
