#!/usr/bin/env bash
# One-shot attention-prologue check on an SM90 machine: build (ptxas report), the GPU tests, the decode and prefill
# table with every impl (fused, HPC-Ops, FlashInfer 0.7.2, unfused torch eager / graph) with --check, the 64q/8kv
# heads, and the chain into split-KV decode (with and without the prologue's PDL trigger).
# Usage (repo root, package importable as hotpaths): bash studies/gpu_check_prologue.sh [PARTS]
# PARTS: comma-separated among build,tests,tables,chain,variants (default build,tests,tables,chain), to split the
# check over calls of a limited length. variants: every kernel variant (hotpaths.kernels.attention_prologue.VARIANTS)
# beside the two peers, same inputs per token count, 8q/1kv and 64q/8kv FP8 and 8q/1kv BF16, with --check.
# Peers: HOTPATHS_HPC_OPS_DIR (the unpacked hpc_ops/ folder, default .peers/hpc_ops), HOTPATHS_FLASHINFER_072_DIR
# (the folder holding flashinfer/ 0.7.2, default .peers/flashinfer-0.7.2) and HOTPATHS_TVM_FFI_DIR; a missing peer is
# a row with its reason. Writes under $OUT (default scratch/gpu_check_prologue/).
set -uo pipefail
OUT="${OUT:-scratch/gpu_check_prologue}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
export HOTPATHS_BUILD_DIR="${HOTPATHS_BUILD_DIR:-$PWD/build}" PYTHONUNBUFFERED=1
PARTS=",${1:-build,tests,tables,chain},"
want() { [[ "$PARTS" == *",$1,"* ]]; }

if want build; then
echo "== build"
"$PY" -c "from hotpaths.kernels import _build; print(_build.report(['attention_prologue']))" | tee "$OUT/ptxas.txt"

fi
if want tests; then
echo "== GPU tests"
timeout 420 "$PY" -m pytest -m gpu -q -p no:cacheprovider -rfE --tb=short tests/test_attention_prologue_gpu.py \
  > "$OUT/pytest_prologue_gpu.log" 2>&1
echo "pytest exit $?"; tail -25 "$OUT/pytest_prologue_gpu.log"

fi
if want tables; then
echo "== table 8q/1kv (decode 1-256, prefill 1K-16K), all impls, --check"
timeout 420 "$PY" -m hotpaths prologue --tokens 1,7,64,256,1024,4096,16384 --q-heads 8 --kv-heads 1 --head-dim 128 \
  --page-size 64 --norm-order norm_rope --rope neox --kv-dtype fp8 --check --json \
  --save attention_prologue_8q1kv \
  > "$OUT/prologue_8q1kv.jsonl"; echo "exit $?"
echo "== table 64q/8kv"
timeout 420 "$PY" -m hotpaths prologue --tokens 1,64,256,4096,16384 --q-heads 64 --kv-heads 8 --check --json \
  > "$OUT/prologue_64q8kv.jsonl"; echo "exit $?"
echo "== bf16 cache, rope_norm, interleaved (fused + torch only)"
timeout 120 "$PY" -m hotpaths prologue --tokens 1,64,4096 --kv-dtype bf16 --norm-order rope_norm --rope interleaved \
  --impl fused,torch_unfused_graph,hpc_ops --check --json > "$OUT/prologue_bf16.jsonl"; echo "exit $?"
fi
if want chain; then
echo "== chain into decode (q_len 1 and 4)"
timeout 240 "$PY" -m hotpaths prologue --chain 1x4K,64x0.5K,64x4K,32x4K --json > "$OUT/chain_q1.jsonl"; echo "exit $?"
timeout 180 "$PY" -m hotpaths prologue --chain 64x0.5K,32x4K --q-len 4 --json > "$OUT/chain_q4.jsonl"; echo "exit $?"
fi
if want variants; then
VARS="${VARIANTS:-baseline,pair,tokwarp2}"
echo "== variants $VARS: 8q/1kv fp8, 64q/8kv fp8, 8q/1kv bf16"
timeout 200 "$PY" -m hotpaths prologue --tokens 1,7,64,256,1024,4096,16384 --variants "$VARS" \
  --impl fused,flashinfer_fused,hpc_ops --check --json > "$OUT/variants_8q1kv.jsonl"; echo "exit $?"
timeout 200 "$PY" -m hotpaths prologue --tokens 1,64,256,4096,16384 --q-heads 64 --kv-heads 8 --variants "$VARS" \
  --impl fused,flashinfer_fused,hpc_ops --check --json > "$OUT/variants_64q8kv.jsonl"; echo "exit $?"
timeout 120 "$PY" -m hotpaths prologue --tokens 1,64,4096,16384 --kv-dtype bf16 --variants "$VARS" \
  --impl fused,flashinfer_fused,hpc_ops --check --json > "$OUT/variants_bf16.jsonl"; echo "exit $?"
fi
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    print("--", f.name)
    for line in f.read_text().splitlines():
        r = json.loads(line)
        us = r.get("median_us")
        print(f"{r['case']:>22} {r['impl']:>20} {us if us is None else round(us, 2)!s:>8} us"
              f"  probe% {r.get('pct_of_read_probe') and round(r['pct_of_read_probe'], 1)!s:>6}"
              f"  +floor {r.get('over_floor_us') and round(r['over_floor_us'], 2)!s:>6}"
              f"  saved {r.get('saved_us') and round(r['saved_us'], 2)!s:>6}"
              f"  qmis {r.get('q_mismatch')!s:>5} cmis {r.get('cache_mismatch')!s:>5}  {(r.get('note') or '')[:90]}")
PYEOF
