"""How the L2 flush before each timed replay changes what we measure (one GPU, one process).

Usage (repo root, GPU machine): PYTHONPATH=<dir with hotpaths -> src> python studies/gpu_flush_study.py [--out DIR]
For each flush mode of hotpaths.harness.bench ("write": fill a 2x-L2 buffer, leaving dirty lines; "read": read
it, leaving clean lines), in two interleaved rounds (write, read, write, read), time with the same bench():
the 1- and 3-kernel timing floors, a 3 MB copy, torch.sum over 8 / 64 / 128 MB, decode steps (attention +
combine) for a few cases and variants, and the router GEMM at a few M. Writes flush_study.txt / .json to --out.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from _log import Log  # noqa: I001 (a sibling module of the studies)

from hotpaths.harness import bench as B
from hotpaths.bench import split_kv_decode_peers as peers
from hotpaths.harness.shapes import expand_lengths, parse_cases
from hotpaths.kernels import router_gemm as RG
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/flush_study"))
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    log = Log(a.out)
    out_dir, say = log.out_dir, log.say

    props = torch.cuda.get_device_properties(0)
    say(f"{props.name} L2 {props.L2_cache_size / 2**20:.0f} MiB, flush buffer "
        f"{B.l2_flush_buffer().numel() / 2**20:.0f} MiB")
    jobs: dict[str, object] = {}
    x = torch.zeros(1, device="cuda")
    jobs["floor1"] = lambda: x.add_(1)

    def three():
        for _ in range(3):
            x.add_(1)
    jobs["floor3"] = three
    a3, b3 = torch.randn(3 << 18, device="cuda"), torch.empty(3 << 18, device="cuda")  # 3 MB fp32
    jobs["copy3MB"] = lambda: b3.copy_(a3)
    sink = torch.empty((), dtype=torch.float32, device="cuda")
    for mb in (8, 64, 128):
        t = torch.randn(mb << 18, device="cuda")
        jobs[f"sum{mb}MB"] = (lambda t=t: torch.sum(t, dim=0, out=sink))
    for case in ("64x0.5K", "64x4K", "32x0.125K+32x4K", "1x128K+31x4K"):
        inp = R.make_decode_inputs(expand_lengths(parse_cases(case)), kv_dtype="fp8", device="cuda", seed=0)
        for v in ("v2", "v3s2c4"):
            p = K.plan(inp["kv_lens"], num_kv_heads=inp["k_cache"].shape[2], q_heads=inp["q"].shape[1], variant=v)
            o = torch.empty_like(inp["q"], dtype=torch.bfloat16)
            args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
            kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=o,
                      check_inputs=False)
            jobs[f"decode {case} {v}"] = (lambda args=args, kw=kw: K.run(*args, **kw))
        if case in ("64x4K", "1x128K+31x4K"):
            try:  # FlashInfer 0.7.2's tensor-core decode (carried bundle): does the flush change a peer the same way?
                jobs[f"decode {case} flashinfer_tc"] = peers.make_flashinfer_tc(inp)
            except Exception as e:  # noqa: BLE001 - the study goes on without the peer
                say(f"flashinfer {case}: {type(e).__name__}: {e}")
    g = torch.Generator().manual_seed(0)
    w = RG.plan((torch.randn(192, 4096, generator=g) * 0.02).cuda())
    for m, variant, splits in ((2, "auto", 0), (48, "auto", 0), (4096, "auto", 0), (4096, "ws128n192r", 4)):
        xm = torch.randn(m, 4096, generator=g).to(torch.bfloat16).cuda()
        om = torch.empty(m, 192, device="cuda")
        jobs[f"router m{m} {variant}/{splits}"] = (
            lambda xm=xm, om=om, variant=variant, splits=splits:
            RG.router_gemm(xm, w, impl="bf16x2_kernel", out=om, variant=variant, splits=splits))
    res: dict[str, dict[str, list[float]]] = {}
    for rnd in range(2):
        for mode in ("write", "read"):
            B.set_flush_mode(mode)
            for name, fn in jobs.items():
                t = B.bench(fn, iters=a.iters, warmup=5)
                res.setdefault(name, {}).setdefault(mode, []).append(t.median_us)
                say(f"round {rnd} {mode:5s} {name:32s} {t.median_us:7.2f} us (p10 {t.p10_us:.2f} p90 {t.p90_us:.2f})"
                    f" {t.method}")
    B.set_flush_mode(None)
    say("")
    say(f"{'job':32s} {'write':>8s} {'read':>8s} {'read/write':>10s}   (mean of the two rounds' medians)")
    for name, d in res.items():
        wv, rv = sum(d["write"]) / 2, sum(d["read"]) / 2
        say(f"{name:32s} {wv:8.2f} {rv:8.2f} {rv / wv:10.3f}")
    (out_dir / "flush_study.json").write_text(json.dumps(res, indent=1))
    log.write("flush_study.txt")


if __name__ == "__main__":
    main()
