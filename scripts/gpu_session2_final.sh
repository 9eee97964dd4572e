#!/usr/bin/env bash
# Second H200 session, final call: router wgmma check (+ re-tune only if every variant passes), decode GPU tests,
# decode variant A/B (v2 / v3 / v3 fused / v3s2c4) choosing the default (v3 only if its tests pass and it is faster
# in total over the nine cases), then notebooks 02 and 04 under papermill. Carry .whl, build, .carry; writes $OUT.
set -uo pipefail
out="${OUT:-scratch/session2}"; mkdir -p "$out"
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
mkdir -p /tmp/hp && ln -sfn "$PWD/src" /tmp/hp/hotpaths
export PYTHONPATH=/tmp/site:/tmp/hp PYTHONUNBUFFERED=1
if [ "${ROUTER:-1}" = 1 ]; then
  timeout 150 python3 scripts/gpu_check_router_wgmma.py --variants ws128n192g,ws128n192r --iters 30 --out "$out/wgmma" > "$out/router_wgmma.log" 2>&1
  echo "wgmma check rc=$?"; grep -E "SUMMARY|RESULT|TIMEOUT|CRASH" "$out/router_wgmma.log" | head -24
  timeout 90 python3 -m pytest -m gpu tests/test_router_gemm_gpu.py -q -p no:cacheprovider -rfE --tb=line --maxfail=10 > "$out/pytest_router.log" 2>&1
  rc=$?; echo "router pytest rc=$rc"; tail -4 "$out/pytest_router.log"
  if grep -q "RESULT: PASS" "$out/router_wgmma.log" && [ $rc -eq 0 ]; then
    timeout 120 python3 -m hotpaths router --tune > "$out/tune.log" 2>&1; echo "tune rc=$?"; head -14 "$out/tune.log"
  fi
fi
timeout 120 python3 -m pytest -m gpu tests/test_split_kv_decode_gpu.py -q -p no:cacheprovider -rfE --tb=line --maxfail=10 > "$out/pytest_decode.log" 2>&1
drc=$?; echo "decode pytest rc=$drc"; tail -3 "$out/pytest_decode.log"
timeout 100 python3 scripts/gpu_ab_decode.py --out "$out" --iters 30 --variants v2,v3,v3:fuse8,v3s2c4 > "$out/ab.log" 2>&1
echo "ab rc=$?"
choice=$(python3 - "$out/ab_decode.json" "$drc" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception:
    print("v2"); sys.exit()
tot = {}
for r in rows:
    tot.setdefault(r["variant"], []).append(r["us"] if r["passed"] else 1e9)
ok = sys.argv[2] == "0" and len(tot.get("v3", [])) == len(tot.get("v2", [])) == 9
print("v3" if ok and sum(tot["v3"]) < sum(tot["v2"]) else "v2")
PY
)
echo "DECODE DEFAULT CHOICE: $choice"; tail -40 "$out/ab.log" | cut -c1-120
echo "$choice" > "$out/decode_choice.txt"
HOTPATHS_DECODE_VARIANT=$choice RUN_TIMEOUT=${NB_TIMEOUT:-250} bash tools/gpu/run_on_gpu.sh reproduce --only 02,04 --profile full --device cuda 2>&1 | grep -v IPKernelApp | tail -8
