#!/usr/bin/env bash
# Second H200 session, call 3: router wgmma variants check + router GPU tests (+ re-tune when they pass), decode
# time breakdown. Run from the repo root with .whl and build carried; writes under $OUT.
set -uo pipefail
out="${OUT:-scratch/session2}"; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
mkdir -p /tmp/hp && ln -sfn "$PWD/src" /tmp/hp/hotpaths
export PYTHONPATH=/tmp/site:/tmp/hp PYTHONUNBUFFERED=1
timeout 170 python3 scripts/gpu_check_router_wgmma.py --iters 30 --out "$out/wgmma" > "$out/router_wgmma.log" 2>&1
echo "wgmma check rc=$?"; grep -E "SUMMARY|RESULT|FAIL|TIMEOUT|CRASH" "$out/router_wgmma.log" | head -40
timeout 110 python3 -m pytest -m gpu tests/test_router_gemm_gpu.py -q -p no:cacheprovider -rfE --tb=short --maxfail=20 > "$out/pytest_router.log" 2>&1
rc=$?; echo "router pytest rc=$rc"; tail -12 "$out/pytest_router.log"
if grep -q "RESULT: PASS" "$out/router_wgmma.log" && [ $rc -eq 0 ]; then
  timeout 130 python3 -m hotpaths router --tune > "$out/tune.log" 2>&1; echo "tune rc=$?"; tail -5 "$out/tune.log"
  cp data/dispatch/router_gemm_h200.json "$out/" 2>/dev/null
fi
timeout 110 python3 scripts/gpu_decode_breakdown.py --out "$out" --iters 30 2>&1 | tail -20
