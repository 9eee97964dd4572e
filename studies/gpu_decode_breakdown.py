"""Where the split-KV decode time goes (one GPU run): full step vs attention alone vs combine alone, shuffled vs
sequential pages, per variant. Same bench as everywhere (CUDA-graph replay, L2 flushed before each replay, median).

Attention alone: run(stages="attention"); combine alone: run(stages="combine") (it merges the partials the previous
launch left). (The committed data/profiles/h200/decode_breakdown.* were measured by an earlier form of this script
that replaced the other launch with a no-op; same launches.) Writes breakdown.txt/json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from hotpaths.harness.bench import bench, timing_floor
from hotpaths.harness.shapes import expand_lengths, parse_cases
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="v2,v3")
    ap.add_argument("--cases", default="64x0.5K;64x4K;1x128K+31x4K;1x16K+15x64")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/breakdown"))
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines, rows = [], []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    f1, f2 = timing_floor(1), timing_floor(2)
    say(f"floor1 {f1.median_us:.2f} floor2 {f2.median_us:.2f} us")
    for mb in (8, 64, 128):  # pure read of the same bytes under the same convention: torch.sum over float32
        x = torch.rand(mb * 2**20 // 4, device="cuda")
        y = torch.empty((), device="cuda")
        t = bench(lambda: torch.sum(x, dim=0, out=y), iters=a.iters).median_us
        say(f"read floor: torch.sum over {mb} MB {t:.2f} us = {mb * 2**20 / (t * 1e3):.0f} GB/s (incl. the floor)")
        rows.append(dict(case=f"read_{mb}MB", us=t))
        del x
    for case in a.cases.split(";"):
        lens = expand_lengths(parse_cases(case))
        for pages in ("shuffled", "sequential"):
            inp = R.make_decode_inputs(lens, kv_dtype="fp8", device="cuda", seed=0)
            if pages == "sequential":  # same data, pages renumbered so each request's pages are consecutive
                bt = inp["block_table"]
                ps = inp["k_cache"].shape[1]
                used = torch.zeros_like(bt, dtype=torch.bool)
                for r, L in enumerate(lens):
                    used[r, :-(-L // ps)] = True
                order = bt[used].long()
                n = order.numel()
                kc, vc = inp["k_cache"].clone(), inp["v_cache"].clone()
                kc[:n] = inp["k_cache"][order]
                vc[:n] = inp["v_cache"][order]
                nb = bt.clone()
                nb[used] = torch.arange(n, dtype=bt.dtype, device=bt.device)
                inp.update(k_cache=kc, v_cache=vc, block_table=nb)
            for v in a.variants.split(","):
                p = K.plan(inp["kv_lens"], num_kv_heads=1, q_heads=8, variant=v)
                out = torch.empty_like(inp["q"], dtype=torch.bfloat16)
                args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
                kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out,
                          check_inputs=False)
                K.run(*args, **kw)
                t_full = bench(lambda: K.run(*args, **kw), iters=a.iters).median_us
                t_att = bench(lambda: K.run(*args, stages="attention", **kw), iters=a.iters).median_us
                t_comb = bench(lambda: K.run(*args, stages="combine", **kw), iters=a.iters).median_us
                row = dict(case=case, pages=pages, variant=v, full_us=t_full, attention_us=t_att, combine_us=t_comb)
                rows.append(row)
                say(f"{case:14s} {pages:10s} {v:4s} full {t_full:6.1f} attention {t_att:6.1f} combine {t_comb:5.1f} us")
            del inp
    (out_dir / "breakdown.json").write_text(json.dumps(dict(floor1=f1.median_us, floor2=f2.median_us, rows=rows), indent=1))
    (out_dir / "breakdown.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
