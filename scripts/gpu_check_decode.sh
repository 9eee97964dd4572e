#!/usr/bin/env bash
# Build + test + quick-time the SM90 split-KV decode kernels on a GPU machine.
# Usage (repo root): mkdir -p /tmp/hp && ln -sfn $PWD/src /tmp/hp/hotpaths && PYTHONPATH=/tmp/hp bash scripts/gpu_check_decode.sh
# Logs go to $OUT (default ./scratch/gpu_check_decode). Each step runs in its own process so a crash in one
# (e.g. an illegal address) does not hide the results of the others.
set -u
OUT=${OUT:-scratch/gpu_check_decode}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv 2>&1 | tee "$OUT/gpu.txt"

echo "== build" | tee "$OUT/build.log"
timeout 200 $PY -c "
from hotpaths.kernels import _build
p = _build.compile_op('split_kv_decode')
print(p)
print((p.parent / 'ptxas.txt').read_text())
" >> "$OUT/build.log" 2>&1; echo "build rc=$?" | tee -a "$OUT/build.log"
grep -E "registers|spill" "$OUT/build.log" | head -20

SMOKE='
import torch, sys
from hotpaths.kernels import split_kv_decode as K
from hotpaths.reference import split_kv_decode as R
from hotpaths.harness.check import check
for kv in ("fp8", "bf16"):
    for mode in ("dynamic", "static_count", "static_chunk"):
        inp = R.make_decode_inputs([1, 63, 65, 0, 300, 1000], kv_dtype=kv, device="cuda", seed=0)
        out = K.split_kv_decode(**inp, mode=mode, num_ctas=5)
        torch.cuda.synchronize()
        ref = R.split_kv_decode_ref(**inp)
        print(kv, mode, check(out, ref, op="split_kv_decode", path=kv + "_vs_exact"), flush=True)
'
echo "== smoke" | tee "$OUT/smoke.log"
timeout 60 $PY -c "$SMOKE" >> "$OUT/smoke.log" 2>&1; echo "smoke rc=$?" >> "$OUT/smoke.log"
tail -8 "$OUT/smoke.log"
if grep -q "smoke rc=0" "$OUT/smoke.log"; then :; elif command -v compute-sanitizer >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "== memcheck" | tee "$OUT/memcheck.log"
  timeout 60 "$CS" --tool memcheck --print-limit 5 $PY -c "$SMOKE" >> "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?" >> "$OUT/memcheck.log"; tail -6 "$OUT/memcheck.log"
fi

echo "== tests"
for k in "workspace or assign" "published or static or zero" "configs" "graph or invariant or malformed"; do
  timeout 55 $PY -m pytest tests/test_split_kv_decode_gpu.py -q -k "$k" --maxfail=6 -p no:cacheprovider \
    > "$OUT/pytest_$(echo $k | tr ' ' '_').log" 2>&1
  echo "pytest -k '$k' rc=$?"; tail -4 "$OUT/pytest_$(echo $k | tr ' ' '_').log"
done

echo "== timing floor (graph replay of 1 and 3 empty kernels, cold L2)"
timeout 60 $PY -c "
from hotpaths.harness import bench
print('floor_1_kernel', bench.timing_floor(1)); print('floor_3_kernels', bench.timing_floor(3))" 2>&1 | tee "$OUT/floor.txt"
echo "== timing"
for kv in fp8 bf16; do
  timeout 65 $PY -m hotpaths decode --cases "64x4K;1x128K+31x4K;64x0.5K" --kv-dtype $kv \
    --impl dynamic,static_count,static_chunk,batch_invariant,assign --check --iters 50 \
    > "$OUT/timing_$kv.txt" 2>&1
  echo "timing $kv rc=$?"; cat "$OUT/timing_$kv.txt" | tail -20
done

echo "== dynamic with one CTA per SM (num_ctas 132) for comparison"
timeout 60 $PY -m hotpaths decode --cases "64x4K;1x128K+31x4K;64x0.5K" --kv-dtype fp8 --impl dynamic --num-ctas 132 \
  --iters 50 > "$OUT/timing_fp8_c132.txt" 2>&1; tail -5 "$OUT/timing_fp8_c132.txt"
