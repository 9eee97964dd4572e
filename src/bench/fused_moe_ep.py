"""``hotpaths moe --ep N``: the expert-parallel MoE layer (hotpaths.reference.fused_moe_ep) around our fused per-rank
kernel, launched as N processes (torch.multiprocessing spawn), timed per batch and split into dispatch, expert
compute and combine, beside the single-GPU layer (all experts on one GPU, the same tokens per GPU).

GPU path: NCCL, one process per GPU, the fused kernel as the expert compute; phases timed with CUDA events around
eager calls (no CUDA graph: the ragged split sizes need a host sync; L2 warm), median over --iters, the maximum over
ranks reported. With fewer CUDA devices than N it exits 2 saying so.
CPU path (no CUDA device): gloo and the staged emulation, CPU wall time, a small shape unless one is given; each
batch also checks that the EP output equals the single-process emulation bit for bit (column ``bit_exact``).
NVLink multicast stays off in the launcher and in every worker (MULTICAST_OFF).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

OP = "fused_moe_ep"
CPU_SMALL = dict(hidden=256, inter=128)  # the CPU emulation path's default shape (Hy3 would take hours in fp64)


@dataclass
class EPConfig:
    world: int
    batches: list
    model: str = "hy3"
    scales: str = "pertensor"
    experts: int | None = None
    topk: int | None = None
    hidden: int | None = None
    inter: int | None = None
    seed: int = 0
    iters: int = 20
    gpu: bool = False
    port: int = 0
    as_json: bool = False
    save: str | None = None


# Rendezvous and collective deadline: a rank that never arrives (or a collective that never completes) raises in
# the others within a minute instead of holding the GPUs; every collective here takes milliseconds.
INIT_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layer_inputs(cfg: EPConfig, device) -> dict:
    """The whole layer at the largest batch (world * max(batches) tokens, every expert at full intermediate), seeded
    so every rank builds the same tensors; static FP8 activation scales calibrated on the whole batch (shared by
    all ranks, as a deployed layer's are)."""
    from hotpaths.reference.fused_moe import EP_RANKS, make_moe_inputs

    over = dict(experts=cfg.experts, topk=cfg.topk, hidden=cfg.hidden, inter=cfg.inter)
    if not cfg.gpu:
        over = {k: (v if v is not None else CPU_SMALL.get(k)) for k, v in over.items()}
        over["experts"] = over["experts"] or 4 * cfg.world
    from hotpaths.reference.fused_moe import MODELS

    inter = over["inter"] or MODELS[cfg.model]["inter"]
    # tp8ep1 keeps every expert and divides the intermediate by 8: asking for 8x gives the full one per expert
    return make_moe_inputs(cfg.world * max(cfg.batches), model=cfg.model, mode="tp8ep1", scales=cfg.scales,
                           experts=over["experts"], topk=over["topk"], hidden=over["hidden"], inter=inter * EP_RANKS,
                           seed=cfg.seed, device=device, shared=True)


def _local(inp: dict, rank: int, e: int) -> dict:
    loc = {n: inp[n] for n in ("scales", "a1_scale", "a2_scale")}
    for n in ("w13", "w2", "w13_scale", "w2_scale"):
        loc[n] = inp[n][rank * e:(rank + 1) * e].contiguous()
    return loc


def kernel_expert_fn(km, local: dict, expert_offset: int):
    """The GPU expert compute: ``fn(recv_x bf16 [R, H], recv_ids int32 [R]) -> bf16 [R, H]`` through the fused
    kernel (plan + run per call), one pair per row with weight 1.0 (the kernel's reduce returns the un-weighted
    output; the home rank weighs it)."""
    import torch

    def fn(recv_x, recv_ids):
        if recv_x.shape[0] == 0:
            return recv_x.clone()
        ones = torch.ones(recv_x.shape[0], 1, dtype=torch.float32, device=recv_x.device)
        return km.fused_moe(recv_x, recv_ids[:, None].contiguous(), ones, local["w13"], local["w2"],
                            scales=local["scales"], w13_scale=local["w13_scale"], w2_scale=local["w2_scale"],
                            a1_scale=local["a1_scale"], a2_scale=local["a2_scale"], expert_offset=expert_offset)
    return fn


class _Clock:
    """Phase marks: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.marks: list = []

    def _now(self):
        if self.gpu:
            import torch
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def spans_us(self) -> dict:
        if self.gpu:
            import torch
            torch.cuda.synchronize()
            d = lambda a, b: a.elapsed_time(b) * 1e3  # noqa: E731
        else:
            d = lambda a, b: (b - a) * 1e6  # noqa: E731
        out = {name: d(self.marks[i][1], t) for i, (name, t) in enumerate(self.marks[1:])}
        out["total"] = d(self.marks[0][1], self.marks[-1][1])
        return out


def _time_layer(run, clock: _Clock, iters: int, barrier) -> dict:
    """Median per phase over iters calls of run(mark) (one warm-up call first; ranks start together)."""
    samples: dict = {}
    for it in range(iters + 1):
        barrier()
        clock.start()
        run(clock.mark)
        spans = clock.spans_us()
        if it:
            for k, v in spans.items():
                samples.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in samples.items()}


def _worker(rank: int, cfg: EPConfig) -> None:
    import torch
    import torch.distributed as dist

    from hotpaths.harness import env
    from hotpaths.reference import fused_moe as fm
    from hotpaths.reference import fused_moe_ep as ep

    ep.multicast_off()  # also when started by torchrun rather than by this launcher
    if cfg.gpu:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cfg.gpu else "gloo", init_method=f"tcp://127.0.0.1:{cfg.port}", rank=rank,
                            world_size=cfg.world, timeout=timedelta(seconds=INIT_TIMEOUT_S),
                            **({"device_id": device} if cfg.gpu else {}))
    try:
        inp = layer_inputs(cfg, device)
        e_total = inp["num_experts"]
        e = e_total // cfg.world
        loc = _local(inp, rank, e)
        km = None
        if cfg.gpu:
            import hotpaths.kernels.fused_moe as km
            expert_fn = kernel_expert_fn(km, loc, rank * e)
        else:
            expert_fn = ep.emulation_expert_fn(loc, rank * e)
        clock = _Clock(cfg.gpu)
        gpus = (f"{cfg.world}x {torch.cuda.get_device_name(device)}" if cfg.gpu else f"{cfg.world}x cpu (gloo)")
        rows = []
        for t in cfg.batches:
            sl = slice(rank * t, (rank + 1) * t)
            x, ids, tw, sh = inp["x"][sl], inp["topk_ids"][sl], inp["topk_weights"][sl], inp["shared_out"][sl]

            def layer(mark, mb=1):
                return ep.ep_moe(x, ids, tw, experts_per_rank=e, expert_fn=expert_fn, shared_out=sh,
                                 micro_batches=mb, mark=mark)
            seq = _time_layer(layer, clock, cfg.iters, dist.barrier)
            ovl = _time_layer(lambda mark: layer(mark, 2), clock, cfg.iters, dist.barrier)
            out = layer(None)
            full = {n: inp[n] for n in ("w13", "w2", "w13_scale", "w2_scale", "a1_scale", "a2_scale", "scales")}
            if cfg.gpu and t == 0:
                single_us, err, exact = 0.0, fm.error_vs(out, out), None
            elif cfg.gpu:  # the single-GPU layer: all experts on this GPU, this rank's tokens
                p = km.plan(ids, num_experts=e_total)
                o1 = torch.empty_like(x)
                kw = {n: full[n] for n in ("scales", "w13_scale", "w2_scale", "a1_scale", "a2_scale")}
                single = lambda: km.run(p, x, full["w13"], full["w2"], tw, shared_out=sh, out=o1, **kw)  # noqa: E731
                from hotpaths.harness.bench import bench
                single_us = bench(single, iters=cfg.iters, cold_l2=False).median_us
                want = single()
                err = fm.error_vs(out, want)
                exact = None
            else:
                c0 = time.perf_counter()
                want = fm.fused_moe_emulation(x, ids, tw, full["w13"], full["w2"], scales=full["scales"],
                                              w13_scale=full["w13_scale"], w2_scale=full["w2_scale"],
                                              a1_scale=full["a1_scale"], a2_scale=full["a2_scale"], shared_out=sh)
                single_us = (time.perf_counter() - c0) * 1e6
                err = fm.error_vs(out, want)
                exact = bool(torch.equal(out, want))
            recv = fm.valid_pairs(inp["topk_ids"][: cfg.world * t], num_experts=e, expert_offset=rank * e)
            vals = [seq.get("dispatch", 0.0), seq.get("compute", 0.0), seq.get("combine", 0.0), seq["total"],
                    ovl["total"], float(recv), -err["cosine"], err["max_rel_err"],
                    0.0 if exact in (None, True) else 1.0]
            red = torch.tensor(vals, dtype=torch.float64, device=device)
            dist.all_reduce(red, op=dist.ReduceOp.MAX)  # the slowest rank decides the layer
            r = red.tolist()
            rows.append({"op": OP, "case": f"{cfg.model} ep{cfg.world} t{t}", "impl": "ep_kernel" if cfg.gpu else
                         "ep_emulation (cpu wall, not a GPU timing)", "dtype": f"fp8_{cfg.scales}",
                         "device": env.device_tag() if cfg.gpu else "cpu", "gpus": gpus, "ep": cfg.world, "batch": t,
                         "tokens_total": cfg.world * t, "dispatch_us": r[0], "compute_us": r[1], "combine_us": r[2],
                         "median_us": r[3], "overlap2_us": r[4], "single_gpu_us": single_us if rank == 0 else None,
                         "recv_rows_max": int(r[5]), "cosine": -r[6], "max_rel_err": r[7],
                         "bit_exact": None if exact is None else r[8] == 0.0,
                         "timing": ("EP: cuda events around eager calls (plan + launches in compute), warm L2, max "
                                    "over ranks; single_gpu: CUDA graph, warm L2") if cfg.gpu else "cpu_wall",
                         "repro": f"python -m hotpaths moe --ep {cfg.world} --batch {t} --scales {cfg.scales}"})
        if rank == 0:
            _emit(rows, cfg)
    finally:
        dist.destroy_process_group()


def _emit(rows: list, cfg: EPConfig) -> None:
    if cfg.save:
        from hotpaths.harness import tables
        tables.save(rows, cfg.save)
    if cfg.as_json:
        for r in rows:
            print(json.dumps(r))
        return
    f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"# {OP}: {rows[0]['gpus']}, {rows[0]['impl']}, {rows[0]['timing']}")
    print(f"{'batch/rank':>10} {'dispatch_us':>11} {'compute_us':>10} {'combine_us':>10} {'total_us':>9} "
          f"{'overlap2_us':>11} {'single_gpu_us':>13} {'recv_max':>8} {'cosine':>9} bit_exact")
    for r in rows:
        print(f"{r['batch']:>10} {f(r['dispatch_us']):>11} {f(r['compute_us']):>10} {f(r['combine_us']):>10} "
              f"{f(r['median_us']):>9} {f(r['overlap2_us']):>11} {f(r['single_gpu_us']):>13} {r['recv_rows_max']:>8} "
              f"{r['cosine']:9.6f} {r['bit_exact']}")
    sys.stdout.flush()


def run_ep(world: int, batches, *, model="hy3", scales="pertensor", experts=None, topk=None, hidden=None,
           inter=None, seed=0, iters=20, as_json=False, save=None) -> int:
    """Launch ``world`` processes of the EP layer (NCCL on GPUs when CUDA is present, gloo otherwise) and print the
    table from rank 0. Returns the exit status: 0, 2 with fewer CUDA devices than world.
    Raises ValueError on world < 1, experts not divisible by world, an empty batch list or iters < 1."""
    import torch
    import torch.multiprocessing as mp

    from hotpaths.reference.fused_moe_ep import multicast_off

    if not isinstance(world, int) or world < 1:
        raise ValueError(f"--ep: expected an int >= 1, got {world!r}")
    if not batches or min(batches) < 0:
        raise ValueError(f"--batch: expected token counts >= 0, got {batches!r}")
    if iters < 1:
        raise ValueError(f"--iters: expected >= 1, got {iters}")
    from hotpaths.reference.fused_moe import MODELS

    if model not in MODELS:
        raise ValueError(f"--model: expected one of {sorted(MODELS)}, got {model!r}")
    gpu = torch.cuda.is_available()
    e_total = experts or (MODELS[model]["experts"] if gpu else 4 * world)  # as layer_inputs chooses
    if e_total % world:
        raise ValueError(f"--ep: {e_total} experts do not split evenly over {world} ranks")
    if gpu and torch.cuda.device_count() < world:
        print(f"hotpaths moe --ep {world}: needs {world} CUDA devices, this machine has "
              f"{torch.cuda.device_count()}", file=sys.stderr)
        return 2
    cfg = EPConfig(world, list(batches), model, scales, experts, topk, hidden, inter, seed,
                   iters if gpu else min(iters, 3), gpu, _free_port(), as_json, save)
    multicast_off()  # inherited by the spawned workers
    mp.start_processes(_worker, args=(cfg,), nprocs=world, join=True, start_method="spawn")
    return 0
