"""Fuzzing split-KV decode: random configurations over the supported space, checked against the references.

``fuzz_case(draw, kernel=...)`` draws a configuration (lengths with the boundary values 0, 1, 63/64/65 ..., GQA
ratios, page sizes, q_len 1-4, head dims, grid sizes small enough to force splits); ``check_cpu(cfg)`` checks the
dynamic and static task maps' invariants (every KV tile of every (request, head) assigned exactly once, no CTA
over the budget) and the same-precision emulation vs the exact reference within the tolerance row;
``fuzz_run(cfg)`` runs the SM90 kernel on guarded, poisoned buffers when there is one (else ``check_cpu``).
"""

from __future__ import annotations

import torch

from hotpaths.harness import fuzzing
from hotpaths.harness.check import check
from hotpaths.harness.fuzzing import Draw, GuardedBuffers, unchanged
from hotpaths.reference import split_kv_decode as ref

OP = "split_kv_decode"
BOUNDARY_LENS = (0, 1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257)


def fuzz_case(draw: Draw, *, kernel: bool = False) -> dict:
    """One configuration. kernel=True restricts to what the SM90 kernel runs (head_dim 128) and draws a variant,
    mode and grid; kernel=False spans the reference's space with small lengths (CPU emulation cost)."""
    batch = draw.integer(1, 16 if kernel else 5)
    max_len = 4500 if kernel else 700
    lens = [draw.choice(BOUNDARY_LENS) if draw.boolean() else draw.integer(0, max_len) for _ in range(batch)]
    kv_heads = draw.integer(1, 2)
    cfg = dict(lens=lens, gqa=draw.choice(ref.SUPPORTED_GQA), kv_heads=kv_heads,
               head_dim=128 if kernel else draw.choice(ref.SUPPORTED_HEAD_DIMS),
               page_size=draw.choice(ref.SUPPORTED_PAGE_SIZES), q_len=draw.choice(ref.SUPPORTED_Q_LEN),
               kv_dtype=draw.choice(("fp8", "bf16")), num_ctas=draw.integer(1, 140 if kernel else 16),
               min_tiles=draw.integer(1, 4), seed=draw.integer(0, 2**16))
    if kernel:
        from hotpaths.kernels import split_kv_decode as K

        cfg["mode"] = draw.choice(K.MODES)
        cfg["variant"] = draw.choice(K.VARIANTS)
        cfg["fuse_max"] = draw.choice((0, 2, K.FUSE_ALL)) if cfg["mode"] == "dynamic" else 0
    return cfg


def _inputs(cfg: dict, device="cpu") -> dict:
    return ref.make_decode_inputs(cfg["lens"], q_heads=cfg["gqa"] * cfg["kv_heads"], kv_heads=cfg["kv_heads"],
                                  head_dim=cfg["head_dim"], page_size=cfg["page_size"], q_len=cfg["q_len"],
                                  kv_dtype=cfg["kv_dtype"], device=device, seed=cfg["seed"])


def map_failures(lens, kv_heads: int, num_ctas: int, min_tiles: int) -> list[str]:
    """Invariants of the dynamic task map (and the static count map) for these lengths, checked independently of
    the map's own checker too: the descriptors cover every tile of every pair exactly once, each CTA's tiles <=
    the budget, no more bins than CTAs."""
    out = []
    tm = ref.build_task_map(lens, kv_heads, num_ctas, min_tiles=min_tiles)
    try:
        ref.check_task_map(tm)
    except AssertionError as exc:
        out.append(f"dynamic map: {str(exc).splitlines()[0]}")
    batch = len(lens)
    cover = {}
    for r, h, tb, te in tm.descriptors.tolist():
        for t in range(tb, te):
            cover[(r, h, t)] = cover.get((r, h, t), 0) + 1
    want = {(r, h, t) for h in range(kv_heads) for r in range(batch) for t in range(-(-lens[r] // ref.TILE))}
    if set(cover) != want or any(c != 1 for c in cover.values()):
        missing, extra = len(want - set(cover)), sum(1 for k, c in cover.items() if k not in want or c != 1)
        out.append(f"dynamic map: tiles not assigned exactly once ({missing} missing, {extra} extra/duplicated)")
    load = tm.per_cta_tiles()
    if load.size and int(load.max()) > tm.budget:
        out.append(f"dynamic map: a CTA holds {int(load.max())} tiles > budget {tm.budget}")
    if tm.nbins > num_ctas:
        out.append(f"dynamic map: {tm.nbins} bins > {num_ctas} CTAs")
    try:
        ref.check_task_map(ref.static_count_task_map(lens, kv_heads, max(1, num_ctas // max(1, batch * kv_heads))))
    except AssertionError as exc:
        out.append(f"static_count map: {str(exc).splitlines()[0]}")
    return out


def check_cpu(cfg: dict) -> dict:
    """Task-map invariants + emulation (the kernel's precision, the dynamic map) vs exact within the
    ``<kv>_vs_exact`` tolerance row; every output finite (unused cache slots hold NaN)."""
    fails = map_failures(cfg["lens"], cfg["kv_heads"], cfg["num_ctas"], cfg["min_tiles"])
    inputs = _inputs(cfg)
    tm = ref.build_task_map(cfg["lens"], cfg["kv_heads"], cfg["num_ctas"], min_tiles=cfg["min_tiles"])
    p_dtype = torch.float16 if cfg["kv_dtype"] == "fp8" else torch.bfloat16  # what the kernel rounds P to
    emu = ref.split_kv_decode_emulation(**inputs, task_map=tm, p_dtype=p_dtype)
    exact = ref.split_kv_decode_ref(**inputs)
    path = f"{cfg['kv_dtype']}_vs_exact"
    res = check(emu, exact, op=OP, path=path)
    if not res.passed:
        fails.append(f"emulation vs exact ({path}): {res}")
    return {"failures": fails, "path": f"cpu emulation {path}"}


def fuzz_run(cfg: dict) -> dict:
    """On an SM90 GPU (cfg drawn with kernel=True): plan + run on guarded buffers (inputs, caches, workspace,
    partials, counters, out poisoned with NaN), then: no guard byte changed, the caches untouched, the device
    task map equal to the host one (dynamic), out vs the emulation within ``<kv>_vs_emulation``. Elsewhere, or for
    a CPU-space config: ``check_cpu``."""
    from hotpaths.reference.common import sm90_skip_reason

    if "variant" not in cfg or sm90_skip_reason() is not None:
        return check_cpu(cfg)
    from hotpaths.kernels import split_kv_decode as K

    dev = torch.device("cuda")
    host = _inputs(cfg)
    g = GuardedBuffers()
    d = {k: (g.adopt(k, v.to(dev)) if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
    k_before, v_before, bt_before = d["k_cache"].clone(), d["v_cache"].clone(), d["block_table"].clone()
    H, Hq, D, q_len = cfg["kv_heads"], cfg["gqa"] * cfg["kv_heads"], cfg["head_dim"], cfg["q_len"]
    p = K.plan(d["kv_lens"], num_kv_heads=H, q_heads=Hq, head_dim=D, num_ctas=cfg["num_ctas"],
               min_tiles=cfg["min_tiles"], mode=cfg["mode"], q_len=q_len, variant=cfg["variant"],
               fuse_max=cfg["fuse_max"] or None, kv_dtype=d["k_cache"].dtype)
    p.workspace = g.adopt("workspace", p.workspace)
    p.partial_o = g.alloc("partial_o", tuple(p.partial_o.shape), p.partial_o.dtype, dev, fill=float("nan"))
    p.partial_lse = g.alloc("partial_lse", tuple(p.partial_lse.shape), p.partial_lse.dtype, dev,
                            fill=float("nan"))
    if p.counters is not None:
        p.counters = g.adopt("counters", p.counters)
    p.update(d["kv_lens"])
    out = g.alloc("out", (len(cfg["lens"]) * q_len, Hq, D), torch.bfloat16, dev, fill=float("nan"))
    K.run(p, d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["kv_lens"], q_scale=d["q_scale"],
          k_scale=d["k_scale"], v_scale=d["v_scale"], q_len=q_len, out=out)
    torch.cuda.synchronize()
    fails = g.violations()
    fails += unchanged(k_before, d["k_cache"], name="k_cache") + unchanged(v_before, d["v_cache"], name="v_cache")
    fails += unchanged(bt_before, d["block_table"], name="block_table")
    lens = cfg["lens"]
    tm = K.host_task_map(p, lens)
    if p.mode == "dynamic":
        bad = ref.compare_workspaces(p.workspace.cpu().numpy(), tm)
        if bad:
            fails.append(f"device task map differs from the host one: {bad}")
    rdev = fuzzing.REF_DEVICE  # the GPU (fast), or the CPU under compute-sanitizer
    dev_inputs = {k: (v.to(rdev) if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
    emu = ref.split_kv_decode_emulation(**dev_inputs, task_map=tm, p_dtype=K.p_dtype_for(cfg["kv_dtype"] == "fp8"))
    path = f"{cfg['kv_dtype']}_vs_emulation"
    res = check(out.to(rdev), emu, op=OP, path=path)
    if not res.passed:
        fails.append(f"kernel vs emulation ({path}): {res}")
    return {"failures": fails, "path": f"kernel {cfg['variant']}/{cfg['mode']} {path}"}


# Fixed launches for compute-sanitizer: the boundary lengths, one token, one long request, the largest GQA / q_len,
# both dtypes, every mode (sizes kept small: the sanitizers slow kernels 10-100x).
SANITIZE_CASES = [
    dict(lens=[1], gqa=8, kv_heads=1, head_dim=128, page_size=64, q_len=1, kv_dtype="fp8", num_ctas=132,
         min_tiles=2, seed=0, mode="dynamic", variant="v3", fuse_max=0),
    dict(lens=[0, 1, 63, 64, 65, 129], gqa=8, kv_heads=1, head_dim=128, page_size=32, q_len=1, kv_dtype="fp8",
         num_ctas=16, min_tiles=1, seed=1, mode="dynamic", variant="v2", fuse_max=0),
    dict(lens=[4097, 5], gqa=16, kv_heads=1, head_dim=128, page_size=16, q_len=4, kv_dtype="fp8", num_ctas=132,
         min_tiles=2, seed=2, mode="dynamic", variant="v3s3c3", fuse_max=2),
    dict(lens=[700, 0, 33], gqa=4, kv_heads=2, head_dim=128, page_size=128, q_len=3, kv_dtype="bf16", num_ctas=8,
         min_tiles=1, seed=3, mode="static_count", variant="v2", fuse_max=0),
    dict(lens=[1500, 64], gqa=12, kv_heads=1, head_dim=128, page_size=64, q_len=2, kv_dtype="fp8", num_ctas=64,
         min_tiles=2, seed=4, mode="batch_invariant", variant="v3s5", fuse_max=0),
    # the warpgroup-MMA kernel: 32 rows on the half-row map with per-token block lookups, split pairs, the fused
    # merge; 48 rows (every M row live) over two KV heads in a static mode
    dict(lens=[4097, 5, 0, 130], gqa=8, kv_heads=1, head_dim=128, page_size=16, q_len=4, kv_dtype="fp8", num_ctas=16,
         min_tiles=2, seed=5, mode="dynamic", variant="v3w", fuse_max=2),
    dict(lens=[1500, 64, 1], gqa=16, kv_heads=2, head_dim=128, page_size=64, q_len=3, kv_dtype="fp8", num_ctas=24,
         min_tiles=1, seed=6, mode="static_count", variant="v3wc3", fuse_max=0),
]

