"""Sweep the decode plan's minimum-work floor (min_tiles) and persistent grid size on an SM90 GPU.

Prints one line per (case, kv dtype, num_ctas, min_tiles): attention + combine median us (graph replay, L2 flushed
before each replay). Usage: python3 scripts/decode_sweep_min_tiles.py [case ...]
"""

import sys

import torch

from hotpaths.harness.bench import bench
from hotpaths.harness.shapes import expand_lengths
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference.split_kv_decode import make_decode_inputs

cases = sys.argv[1:] or ["64x0.5K", "1x16K+15x64", "32x0.125K+32x4K", "64x4K", "1x128K+31x4K"]
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"{'case':>16} {'kv':>5} {'ctas':>5} " + " ".join(f"min{m:>3}" for m in (1, 2, 4, 8, 16, 32)))
for case in cases:
    for kv in ("fp8", "bf16"):
        inp = make_decode_inputs(expand_lengths(case), kv_dtype=kv, device="cuda", seed=2)
        for ctas in (sms, 2 * sms):
            ts = []
            for mt in (1, 2, 4, 8, 16, 32):
                p = K.plan(inp["kv_lens"], num_kv_heads=1, q_heads=8, head_dim=128, num_ctas=ctas, min_tiles=mt)
                out = torch.empty(inp["q"].shape, dtype=torch.bfloat16, device="cuda")
                a = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
                kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out)
                ts.append(bench(lambda: K.run(*a, **kw), iters=40).median_us)
            print(f"{case:>16} {kv:>5} {ctas:>5} " + " ".join(f"{t:6.1f}" for t in ts))
