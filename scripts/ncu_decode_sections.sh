#!/usr/bin/env bash
# Nsight Compute sections (speed of light, memory, warp stall reasons, scheduler, occupancy) of the dynamic
# split-KV attention kernel, one launch per case: the diagnosis behind CHANGELOG.md (split_kv_decode).
# Usage on an SM90 machine (hotpaths importable): bash scripts/ncu_decode_sections.sh [OUTDIR] ["case:kv" ...]
set -uo pipefail
out="${1:-${OUT:-scratch/ncu}}"; shift || true
mkdir -p "$out"
specs=("$@"); [[ ${#specs[@]} -eq 0 ]] && specs=("64x4K:fp8" "64x4K:bf16" "64x0.5K:fp8")
for spec in "${specs[@]}"; do
  case_="${spec%%:*}"; kv="${spec##*:}"
  snip=$(mktemp /tmp/ncu_snip_XXXX.py)
  cat > "$snip" <<PY
import torch
from hotpaths.reference.split_kv_decode import make_decode_inputs
from hotpaths.harness.shapes import expand_lengths
from hotpaths.kernels import split_kv_decode as K
inp = make_decode_inputs(expand_lengths("$case_"), kv_dtype="$kv", device="cuda")
p = K.plan(inp["kv_lens"], num_kv_heads=1, q_heads=8, head_dim=128, mode="dynamic")
for _ in range(2):
    K.run(p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"],
          q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"])
torch.cuda.synchronize()
PY
  safe="${case_//+/_}"; safe="${safe//./p}"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section SourceCounters -k regex:attention -s 1 -c 1 python3 "$snip" > "$out/ncu_${safe}_${kv}.txt" 2>&1
  echo "ncu $case_ $kv: exit $? -> $out/ncu_${safe}_${kv}.txt"
  rm -f "$snip"
done
