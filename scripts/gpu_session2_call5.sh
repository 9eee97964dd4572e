#!/usr/bin/env bash
# Second H200 session, call 5: decode GPU tests (v3 fused merge + one-round-trip combine) and the A/B of variants.
set -uo pipefail
out="${OUT:-scratch/session2}"; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
mkdir -p /tmp/hp && ln -sfn "$PWD/src" /tmp/hp/hotpaths
export PYTHONPATH=/tmp/site:/tmp/hp PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu tests/test_split_kv_decode_gpu.py -q -p no:cacheprovider -rfE --tb=short --maxfail=20 > "$out/pytest_decode.log" 2>&1
echo "decode pytest rc=$?"; tail -15 "$out/pytest_decode.log"
timeout 230 python3 scripts/gpu_ab_decode.py --out "$out" --iters 40 --variants v2,v3:fuse0,v3,v3s3c3,v3s2c4 2>&1 | tail -50
