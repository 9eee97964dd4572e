#!/usr/bin/env bash
# Build + A/B time + test the SM90 split-KV decode kernels on a GPU machine (one run, ~4 minutes).
# Usage (repo root): mkdir -p /tmp/hp && ln -sfn $PWD/src /tmp/hp/hotpaths && PYTHONPATH=/tmp/hp bash scripts/gpu_check_decode.sh
# Optional A/B libraries (same C ABI) built beforehand under build/split_kv_decode/ab_*/libsplit_kv_decode.so are
# timed beside the current sources. Logs go to $OUT (default ./scratch/gpu_check_decode), at most 6 files;
# the compact table is printed last.
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

echo "== timing (A/B)"
timeout ${TIMING_S:-90} $PY - > "$OUT/timing.log" 2>&1 <<'EOF'
import ctypes, glob, os, sys, torch
from hotpaths.kernels import _build
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R
from hotpaths.harness.bench import bench, timing_floor
from hotpaths.harness.check import check
from hotpaths.harness.shapes import parse_cases, expand_lengths
libs = {"new": str(_build.compile_op("split_kv_decode"))}
for p in sorted(glob.glob("build/split_kv_decode/ab_*/libsplit_kv_decode.so")):
    libs[p.split("/")[-2][3:]] = p
print("libs", libs, flush=True)
cases = ["64x4K", "1x128K+31x4K", "64x0.5K"]
ITERS = int(os.environ.get("ITERS", "30"))
res = {}
f1 = timing_floor(1); f3 = timing_floor(3)
print("floor1", f1.median_us, "floor3", f3.median_us, flush=True)
for kv in ("fp8", "bf16"):
    for case in cases:
        lens = expand_lengths(parse_cases(case))
        inp = R.make_decode_inputs(lens, kv_dtype=kv, device="cuda", seed=0)
        ref = None
        for name, path in libs.items():
            _build._loaded["split_kv_decode"] = ctypes.CDLL(path); K._lib = None; K._load()
            for mode in ("dynamic", "static_count") if name == "new" else ("dynamic",):
                p = K.plan(inp["kv_lens"], num_kv_heads=1, q_heads=8, mode=mode)
                out = torch.full_like(inp["q"], float("nan"), dtype=torch.bfloat16)
                args = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
                kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out)
                K.run(*args, **kw); torch.cuda.synchronize()
                if ref is None:
                    ref = R.split_kv_decode_ref(**inp)
                c = check(out, ref, op="split_kv_decode", path=kv + "_vs_exact")
                t = bench(lambda: K.run(*args, check_inputs=False, **kw), iters=ITERS, warmup=5)
                res[(kv, case, name, mode)] = (t.median_us, c.passed, c.rel_l2_err)
                line = f"{kv} {case} {name} {mode} {t.median_us:.1f}us pass={c.passed} rel={c.rel_l2_err:.2e}"
                if mode == "dynamic" and kv == "fp8":
                    ta = bench(lambda: K.assign_only(p), iters=ITERS, warmup=5)
                    res[(kv, case, name, "assign")] = (ta.median_us, True, 0.0)
                    line += f" assign {ta.median_us:.1f}us"
                print(line, flush=True)
        del inp
print("\nTABLE (median us, graph replay, cold L2, attention+combine; floor1 %.1f floor3 %.1f)" % (f1.median_us, f3.median_us))
names = list(libs)
print("%-5s %-14s " % ("kv", "case") + " ".join("%10s" % n for n in names) + " %10s %10s" % ("static_new", "assign:" + "/".join(names)))
for kv in ("fp8", "bf16"):
    for case in cases:
        row = [res.get((kv, case, n, "dynamic"), (float("nan"), None, 0))[0] for n in names]
        st = res.get((kv, case, "new", "static_count"), (float("nan"),))[0]
        asg = "/".join("%.1f" % res.get((kv, case, n, "assign"), (float("nan"),))[0] for n in names)
        bad = [k for k, v in res.items() if k[0] == kv and k[1] == case and v[1] is False]
        print("%-5s %-14s " % (kv, case) + " ".join("%10.1f" % x for x in row) + " %10.1f %s%s" % (st, asg, " FAIL" if bad else ""))
EOF
echo "timing rc=$?" >> "$OUT/timing.log"; grep -E "floor|FAIL|Error|error" "$OUT/timing.log" | head -5

echo "== tests"
timeout ${TEST_S:-150} $PY -m pytest tests/test_split_kv_decode_gpu.py -q -x -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/pytest.log"; tail -15 "$OUT/pytest.log"
echo "== summary"
sed -n '/^TABLE/,$p' "$OUT/timing.log"
