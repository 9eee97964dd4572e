#!/usr/bin/env bash
# Build + time v1 vs v2 + test the SM90 split-KV decode kernels on a GPU machine (one run, ~5 minutes).
# Usage (repo root): mkdir -p /tmp/hp && ln -sfn $PWD/src /tmp/hp/hotpaths && PYTHONPATH=/tmp/hp bash scripts/gpu_check_decode.sh
# Times the two attention variants (plan(variant="v1"/"v2")) of the current sources side by side, then runs the GPU
# tests (both variants). Logs go to $OUT (default ./scratch/gpu_check_decode), at most 6 files; the compact table is
# printed last.
set -u
OUT=${OUT:-scratch/gpu_check_decode}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee "$OUT/build.log"

echo "== build" | tee -a "$OUT/build.log"
timeout 150 $PY -c "
from hotpaths.kernels import _build
p = _build.compile_op('split_kv_decode')
print(p)
print((p.parent / 'ptxas.txt').read_text())
" >> "$OUT/build.log" 2>&1; echo "build rc=$?" | tee -a "$OUT/build.log"
grep -E "spill" "$OUT/build.log" | sort | uniq -c | head -5

echo "== timing (v1 vs v2)"
timeout ${TIMING_S:-120} $PY - > "$OUT/timing.log" 2>&1 <<'EOF'
# 3 cases x 2 dtypes x (v1, v2 dynamic + v1 static_count) x 30 graph replays + assign: ~60-90 s of GPU time.
import os, torch
from hotpaths.kernels import _build
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R
from hotpaths.harness.bench import bench, timing_floor
from hotpaths.harness.check import check
from hotpaths.harness.shapes import parse_cases, expand_lengths
print("lib", _build.compile_op("split_kv_decode"), flush=True)
lib = K._load()
print("smem/CTA v1 fp8 %d bf16 %d | v2 fp8 %d bf16 %d" % (lib.hp_decode_smem_bytes(1), lib.hp_decode_smem_bytes(0),
      lib.hp_decode_smem_bytes_v2(1), lib.hp_decode_smem_bytes_v2(0)), flush=True)
cases = ["64x4K", "1x128K+31x4K", "64x0.5K"]
ITERS = int(os.environ.get("ITERS", "30"))
res = {}
f1 = timing_floor(1); f3 = timing_floor(3)
print("floor1", f1.median_us, "floor3", f3.median_us, flush=True)
for kv in ("fp8", "bf16"):
    for case in cases:
        lens = expand_lengths(parse_cases(case))
        inp = R.make_decode_inputs(lens, kv_dtype=kv, device="cuda", seed=0)
        ref = R.split_kv_decode_ref(**inp)
        outs = {}
        for variant, mode in (("v1", "dynamic"), ("v2", "dynamic"), ("v1", "static_count")):
            p = K.plan(inp["kv_lens"], num_kv_heads=1, q_heads=8, mode=mode, variant=variant)
            out = torch.full_like(inp["q"], float("nan"), dtype=torch.bfloat16)
            args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
            kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out)
            K.run(*args, **kw); torch.cuda.synchronize()
            c = check(out, ref, op="split_kv_decode", path=kv + "_vs_exact")
            outs[(variant, mode)] = out.clone()
            t = bench(lambda: K.run(*args, check_inputs=False, **kw), iters=ITERS, warmup=5)
            res[(kv, case, variant, mode)] = (t.median_us, c.passed, c.rel_l2_err)
            line = f"{kv} {case} {variant} {mode} {t.median_us:.1f}us pass={c.passed} rel={c.rel_l2_err:.2e}"
            if mode == "dynamic" and kv == "fp8" and variant == "v1":
                ta = bench(lambda: K.assign_only(p), iters=ITERS, warmup=5)
                res[(kv, case, "assign")] = ta.median_us
                line += f" assign {ta.median_us:.1f}us"
            print(line, flush=True)
        d = (outs[("v2", "dynamic")].float() - outs[("v1", "dynamic")].float()).abs().max().item()
        res[(kv, case, "v1v2_maxdiff")] = d
        print(f"{kv} {case} v2-v1 max abs diff {d:.3e} bit_identical={d == 0.0}", flush=True)
        del inp, ref, outs
print("\nTABLE (median us, graph replay, cold L2, attention+combine; floor1 %.1f floor3 %.1f)" % (f1.median_us, f3.median_us))
print("%-5s %-14s %8s %8s %7s %10s %8s %11s" % ("kv", "case", "v1", "v2", "v2/v1", "static_v1", "assign", "v2-v1 diff"))
for kv in ("fp8", "bf16"):
    for case in cases:
        t1 = res.get((kv, case, "v1", "dynamic"), (float("nan"),))[0]
        t2 = res.get((kv, case, "v2", "dynamic"), (float("nan"),))[0]
        st = res.get((kv, case, "v1", "static_count"), (float("nan"),))[0]
        bad = [k for k, v in res.items() if k[:2] == (kv, case) and isinstance(v, tuple) and v[1] is False]
        print("%-5s %-14s %8.1f %8.1f %7.3f %10.1f %8.1f %11.2e%s" % (kv, case, t1, t2, t2 / t1, st,
              res.get((kv, case, "assign"), float("nan")), res.get((kv, case, "v1v2_maxdiff"), float("nan")),
              " FAIL" if bad else ""))
EOF
echo "timing rc=$?" >> "$OUT/timing.log"; grep -E "floor|FAIL|Error|error" "$OUT/timing.log" | head -5

echo "== tests"
timeout ${TEST_S:-240} $PY -m pytest tests/test_split_kv_decode_gpu.py -q --maxfail=10 -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/pytest.log"; tail -15 "$OUT/pytest.log"
echo "== summary"
sed -n '/^TABLE/,$p' "$OUT/timing.log"
