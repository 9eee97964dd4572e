"""Where the time of the router GEMM prefill kernels goes (a per-CTA timeline), and a same-process A/B of
configurations.

Usage (GPU machine, hotpaths importable): python studies/gpu_router_trace.py [--out DIR] [--configs v/s,...]
    [--ms 2048,4096] [--trace-configs v/s,...] [--no-trace]
1. Timeline: in the HP_ROUTER_TRACE=1 build (rg.load_traced_library(): a separate cached build; production builds
   carry no trace code) router_wgmma_ws_kernel records %globaltimer per CTA (entry, first k-tile landed, last wgmma
   done, partial published, exit; see hp_router_set_trace in router_wgmma.cu). Each configuration runs 7 times after an
   L2 flush (eager launch); the run with the median span is summarised: entry spread, first-tile latency, time per
   k-tile in the main loop, publish, reduction tail of the last arriver (reduce-scatter: of every rank, split into
   the wait for the other ranks and the exchange's reads, sum and stores), span.
2. A/B of configurations (--configs, --ms) in one process with the production build, each checked against the
   emulation on a NaN-poisoned output first (experiments time their temporary switches here: see AB below).
Writes router_trace.txt / .json to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path

TRACE_CFGS = ("ws128n192g/4", "ws128n192p/4", "ws128n192r/4")
WORDS = 9  # trace words per CTA (kTraceWords in router_wgmma.cu)
# A/B list (variant/splits). Experiments add a temporary switch (a compile-time define passed through
# HOTPATHS_NVCC_DEFINES, or a kernel argument set from the host) and time it here beside these, then remove it;
# what was measured that way is in docs/ops/router_gemm.md.
AB = ("ws128n192r/4", "ws128n192g/4", "ws128n192p/4", "ws128n192r/8")


def main() -> None:
    import numpy as np
    import torch

    from hotpaths.harness.bench import bench, flush_l2
    from hotpaths.harness.check import check
    from hotpaths.kernels import router_gemm as rg
    from hotpaths.kernels._build import ptr, stream_ptr
    from hotpaths.reference import router_gemm as ref

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/router_trace"))
    ap.add_argument("--configs", default=",".join(AB),
                    help="A/B configurations variant/splits, comma-separated (default: the AB list)")
    ap.add_argument("--ms", default="2048,4096", help="A/B row counts, comma-separated")
    ap.add_argument("--trace-configs", default=",".join(TRACE_CFGS), help="timeline configurations")
    ap.add_argument("--no-trace", action="store_true", help="only the A/B")
    a = ap.parse_args()
    ab = [c for c in a.configs.split(",") if c]
    ab_ms = [int(m) for m in a.ms.split(",") if m]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = rg._lib()
    tlib = rg.load_traced_library() if not a.no_trace else None

    def parse(c: str) -> tuple[str, int]:  # "variant/splits"
        return c.split("/")[0], int(c.split("/")[1])
    g = torch.Generator().manual_seed(0)
    w = rg.plan((torch.randn(192, 4096, generator=g) * 0.02).cuda())
    lines, rows = [], []

    def say(s: str) -> None:
        lines.append(s)
        print(s, flush=True)

    buf = torch.zeros(2048 * WORDS, dtype=torch.int64, device="cuda")
    for m in () if a.no_trace else (2048, 4096):
        x = torch.randn(m, 4096, generator=g).to(torch.bfloat16).cuda()
        out = torch.empty(m, 192, device="cuda")
        for c in a.trace_configs.split(","):
            v, s = parse(c)
            ctas = -(-m // 128) * s
            vid = rg.VARIANTS[v]
            nws = tlib.hp_router_gemm_workspace_bytes(m, 192, 4096, vid, s)
            ws = torch.zeros(max(nws, 256), dtype=torch.uint8, device="cuda")
            runs = []
            try:
                for _ in range(7):
                    buf.zero_()
                    torch.cuda.synchronize()
                    assert tlib.hp_router_set_trace(ctypes.c_void_p(buf.data_ptr())) == 0
                    flush_l2()
                    code = tlib.hp_router_gemm_ex(ptr(x), ptr(w.w_high), ptr(w.w_low), ptr(None), ptr(out), m, 192,
                                                  4096, 2, 1 / 256, 1 / 256, vid, s, ptr(ws), max(nws, 0),
                                                  stream_ptr())
                    if code:
                        raise RuntimeError(f"hp_router_gemm_ex returned {code}")
                    torch.cuda.synchronize()
                    t = buf[: ctas * WORDS].view(ctas, WORDS).cpu().numpy().astype(np.float64)
                    runs.append(t)
            except Exception as e:  # noqa: BLE001 - e.g. a cooperative grid beyond one wave: report and go on
                say(f"{m:5d} {c:16s} ERROR {type(e).__name__}: {e}")
                continue
            finally:
                assert tlib.hp_router_set_trace(ctypes.c_void_p(0)) == 0
            spans = [r[:, 4].max() - r[:, 0].min() for r in runs]
            t = runs[int(np.argsort(spans)[len(spans) // 2])]
            t0 = t[:, 0].min()
            start, first, loop, pub, end = (t[:, i] - t0 for i in range(5))
            nk = t[:, 7]
            per_tile = (loop - first) / np.maximum(nk - 1, 1)
            last = t[:, 6] > 0
            tail = (end - pub)[last] if last.any() else np.zeros(1)
            waited = t[:, 8] > 0  # reduce-scatter: the wait for the other ranks ended (then the exchange reads)
            wait = (t[:, 8] - t0 - pub)[waited] if waited.any() else np.zeros(1)
            read = (end - (t[:, 8] - t0))[waited] if waited.any() else np.zeros(1)
            d = dict(m=m, cfg=c, ctas=ctas, span_us=float(spans[int(np.argsort(spans)[len(spans) // 2])]) / 1e3,
                     start_max_us=float(start.max()) / 1e3, first_tile_med_us=float(np.median(first - start)) / 1e3,
                     first_tile_max_us=float((first - start).max()) / 1e3,
                     per_tile_med_us=float(np.median(per_tile)) / 1e3, per_tile_max_us=float(per_tile.max()) / 1e3,
                     loop_end_min_us=float(loop.min()) / 1e3, loop_end_med_us=float(np.median(loop)) / 1e3,
                     loop_end_max_us=float(loop.max()) / 1e3, publish_med_us=float(np.median(pub - loop)) / 1e3,
                     tail_med_us=float(np.median(tail)) / 1e3, tail_max_us=float(tail.max()) / 1e3,
                     wait_med_us=float(np.median(wait)) / 1e3, read_med_us=float(np.median(read)) / 1e3,
                     sms=int(len(set(t[:, 5].astype(int).tolist()))))
            rows.append(d)
            say(f"{m:5d} {c:16s} ctas {ctas:3d} on {d['sms']:3d} SMs  span {d['span_us']:6.1f}  entry<= "
                f"{d['start_max_us']:4.1f}  first tile {d['first_tile_med_us']:4.1f} (max {d['first_tile_max_us']:4.1f})"
                f"  per k-tile {d['per_tile_med_us']:5.2f} (max {d['per_tile_max_us']:5.2f})  loop end "
                f"{d['loop_end_min_us']:5.1f}/{d['loop_end_med_us']:5.1f}/{d['loop_end_max_us']:5.1f}  publish "
                f"{d['publish_med_us']:4.1f}  tail {d['tail_med_us']:4.1f} (max {d['tail_max_us']:4.1f}; wait "
                f"{d['wait_med_us']:3.1f}, read+sum {d['read_med_us']:3.1f})")

    # A/B in one process: each (configuration, experiment switches) checked against the emulation on a NaN-poisoned
    # output, then timed (graph replay, events inside, L2 flushed, median of 60).
    say("A/B (bench: graph replay, events inside, L2 flushed, median of 60)")
    for m in ab_ms:
        x = torch.randn(m, 4096, generator=g).to(torch.bfloat16).cuda()
        emu = ref.bf16x2_from_parts(x, w.w_high, w.w_low)
        for c in ab:
            v, s = parse(c)
            vid = rg.VARIANTS[v]
            nws = lib.hp_router_gemm_workspace_bytes(m, 192, 4096, vid, s)
            ws = torch.zeros(max(nws, 256), dtype=torch.uint8, device="cuda")
            out = torch.full((m, 192), float("nan"), device="cuda")

            def direct():
                code = lib.hp_router_gemm_ex(ptr(x), ptr(w.w_high), ptr(w.w_low), ptr(None), ptr(out), m, 192, 4096,
                                             2, 1 / 256, 1 / 256, vid, s, ptr(ws), max(nws, 0), stream_ptr())
                assert code == 0, code

            try:
                direct()
                torch.cuda.synchronize()
                ok = check(out, emu, op="router_gemm", path="bf16x2_vs_emulation").passed
                t = bench(direct, iters=60)
                say(f"{m:5d} {c:16s} {t.median_us:7.2f} us (p10 {t.p10_us:.2f} p90 {t.p90_us:.2f}) pass={ok}")
                rows.append(dict(m=m, cfg=c, us=t.median_us, passed=ok))
            except Exception as e:  # noqa: BLE001 - report and go on
                say(f"{m:5d} {c:16s} ERROR {type(e).__name__}: {e}")
    (out_dir / "router_trace.txt").write_text("\n".join(lines) + "\n")
    (out_dir / "router_trace.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
