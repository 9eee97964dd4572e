"""A/B timing of the split-KV decode attention variants on one GPU, in one process (same inputs, same run).

Usage (repo root, GPU machine): PYTHONPATH=<dir with hotpaths -> src> python studies/gpu_ab_decode.py \
    [--variants v2,v3,...] [--kv fp8,bf16] [--cases "64x4K;1x128K+31x4K"] [--q-lens 1,2] [--min-tiles 2] \
    [--iters 50] [--no-assign] [--out DIR]
    or --preset mtp: in one process, FP8 {auto_q1, auto, v3m, v3m:fuse0} at q_len 1-4 on 32x4K, 64x4K, 64x0.5K,
    1x128K+31x4K (about 2 minutes).
Variant names: a plan variant, "auto", or "auto_q1" (auto as it chose before the MTP configurations: the 8-row
estimate, v3s2c4 / v2, fuse-all at <= AUTO_FUSE_ALL_MAX_CHUNKS chunks), each optionally ':fuseN' or ':fuse0'.
Per (kv dtype, case, variant): correctness against the exact fp32 reference on the same quantized inputs (output
NaN-poisoned before the first launch; rel L2 within the tolerance table), then the median of CUDA-graph replays with
L2 flushed before each (attention + combine, as in notebook 02), GB/s and the fraction of the copy ceiling measured
in the same run, and the ratio to the first variant. Also assign alone and the 1- and 3-kernel timing floors.
Writes ab_decode.json and ab_decode.txt (the log, then one compact table per kv dtype: rows case x q_len, columns
variants, median us and the ratio to the first variant) under --out.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from _log import Log  # noqa: I001 (a sibling module of the studies)

from hotpaths.harness.bench import bench, timing_floor
from hotpaths.harness.check import check
from hotpaths.harness.shapes import expand_lengths, parse_cases
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R

CASES = "64x0.5K;64x4K;32x0.125K+32x4K;2x32K+30x4K;1x64K+15x4K;1x128K+31x4K;1x16K+15x64;1x64K+7x4K;1x64K+31x4K"


def copy_ceiling_gbps(nbytes: int = 1 << 30) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a), graph=False, iters=10, warmup=3)
    return 2 * nbytes / (t.median_us * 1e3)


# --preset mtp: (kv dtype, cases, q_lens, variants) groups of the MTP A/B (auto against the MTP configuration and
# against what auto chose before it).
PRESETS = {
    "mtp": [
        ("fp8", "32x4K;64x4K;64x0.5K;1x128K+31x4K", "1,2,3,4", "auto_q1,auto,v3m,v3m:fuse0"),
    ],
}


def make_plan(inp, name: str, fz: str, q_len: int, min_tiles: int):
    """plan() for one A/B variant (see the module docstring for auto_q1 and :fuseN)."""
    H, qh = inp["k_cache"].shape[2], inp["q"].shape[1]
    fuse = int(fz) if fz else None
    if name == "auto_q1":  # what auto chose before the MTP configurations: the 8-row estimate at every q_len
        name, longest = K._auto_choice(inp["kv_lens"], num_kv_heads=H, kv_dtype=inp["k_cache"].dtype,
                                       min_tiles=min_tiles, rows=8)
        if fuse is None and name == K.AUTO_FINE and longest <= K.AUTO_FUSE_ALL_MAX_CHUNKS:
            fuse = K.FUSE_ALL
    return K.plan(inp["kv_lens"], num_kv_heads=H, q_heads=qh, q_len=q_len, min_tiles=min_tiles, variant=name,
                  fuse_max=fuse, kv_dtype=inp["k_cache"].dtype)


def compact_tables(rows: list[dict]) -> list[str]:
    """One table per kv dtype: a line per (case, q_len), a column per variant (us, x ratio to the first variant)."""
    out = []
    for kv in dict.fromkeys(r["kv"] for r in rows):
        rs = [r for r in rows if r["kv"] == kv]
        variants = list(dict.fromkeys(r["variant"] for r in rs))
        out.append(f"-- {kv}: median us (x vs {variants[0]}); chosen plan variant in [] --")
        out.append(f"{'case':18s} {'q':>2s} " + " ".join(f"{v:>22s}" for v in variants))
        for key in dict.fromkeys((r["case"], r["q_len"]) for r in rs):
            cells = []
            for v in variants:
                m = [r for r in rs if (r["case"], r["q_len"], r["variant"]) == (*key, v)]
                cells.append(f"{m[0]['us']:7.1f} x{m[0]['ratio_to_first']:.3f} [{m[0]['plan_variant']}]"[:22]
                             if m else "ERROR")
            out.append(f"{key[0]:18s} {key[1]:2d} " + " ".join(f"{c:>22s}" for c in cells))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="v2,v3,v3s3c3,v3s5,v3s2c4",
                    help="comma-separated plan variants, each optionally ':fuseN' (v3 fused-merge bound)")
    ap.add_argument("--kv", default="fp8")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--q-lens", default="1", help="comma-separated q_len values (1..4)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="run these groups instead of the flags")
    ap.add_argument("--no-assign", action="store_true", help="skip timing the assign kernel alone")
    ap.add_argument("--min-tiles", type=int, default=K.DEFAULT_MIN_TILES)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "scratch/ab_decode"))
    a = ap.parse_args()
    groups = PRESETS[a.preset] if a.preset else [(kv, a.cases, a.q_lens, a.variants) for kv in a.kv.split(",")]
    log = Log(a.out)
    out_dir, say = log.out_dir, log.say

    f1, f3 = timing_floor(1), timing_floor(3)
    ceil = copy_ceiling_gbps()
    say(f"{torch.cuda.get_device_name()} floor1 {f1.median_us:.2f} us floor3 {f3.median_us:.2f} us "
        f"copy ceiling {ceil:.0f} GB/s (torch eager copy); min_tiles {a.min_tiles}")
    rows = []
    for kv, cases, q_lens, variant_list in groups:
        variants = variant_list.split(",")
        for case in cases.split(";"):
            lens = expand_lengths(parse_cases(case))
            for q_len in (int(x) for x in q_lens.split(",")):
                inp = R.make_decode_inputs(lens, kv_dtype=kv, q_len=q_len, device="cuda", seed=0)
                ref = R.split_kv_decode_ref(**inp)
                nbytes = (sum(lens) * inp["k_cache"].shape[2] * inp["k_cache"].shape[3] * inp["k_cache"].element_size()
                          * 2)
                base = None
                for v in variants:  # "name" or "name:fuseN" (v3 fused-merge bound)
                    name, _, fz = v.partition(":fuse")
                    out = torch.full_like(inp["q"], float("nan"), dtype=torch.bfloat16)
                    kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out,
                              q_len=q_len)
                    try:
                        p = make_plan(inp, name, fz, q_len, a.min_tiles)
                        args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
                        K.run(*args, **kw)
                        torch.cuda.synchronize()
                        c = check(out, ref, op="split_kv_decode", path=kv + "_vs_exact")
                        t = bench(lambda: K.run(*args, check_inputs=False, **kw), iters=a.iters, warmup=5)
                        ta = None if a.no_assign else bench(lambda: K.assign_only(p), iters=a.iters, warmup=5)
                    except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                        say(f"{kv} {case} q{q_len} {v} ERROR {type(e).__name__}: {e}")
                        continue
                    us = t.median_us
                    base = us if base is None else base
                    gbps = nbytes / (us * 1e3)
                    assign_us = None if ta is None else ta.median_us
                    row = dict(kv=kv, case=case, q_len=q_len, variant=v, plan_variant=p.variant, fuse_max=p.fuse_max,
                               us=us, p10=t.p10_us, p90=t.p90_us, assign_us=assign_us, gbps=gbps,
                               frac_copy=gbps / ceil, ratio_to_first=us / base, passed=c.passed,
                               rel_l2=c.rel_l2_err, max_abs=c.max_abs_err, num_ctas=p.num_ctas,
                               mbytes=nbytes / 2**20)
                    rows.append(row)
                    say(f"{kv:4s} {case:16s} q{q_len} {v:10s} [{p.variant} fuse {p.fuse_max}] {us:7.1f} us "
                        f"(p10 {t.p10_us:.1f} p90 {t.p90_us:.1f}) {gbps:6.0f} GB/s {100 * gbps / ceil:4.0f}% "
                        f"x{us / base:.3f}" + ("" if ta is None else f" assign {assign_us:.1f}") +
                        f" pass={c.passed} rel={c.rel_l2_err:.2e} C={p.num_ctas}")
                del inp, ref
    for line in compact_tables(rows):
        say(line)
    (out_dir / "ab_decode.json").write_text(json.dumps(dict(floor1_us=f1.median_us, floor3_us=f3.median_us,
                                                            copy_gbps=ceil, min_tiles=a.min_tiles, rows=rows), indent=1))
    log.write("ab_decode.txt")


if __name__ == "__main__":
    main()
