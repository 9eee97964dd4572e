#!/usr/bin/env bash
# Nsight Compute on router GEMM prefill configurations at M=4096, N=192, K=4096 (one launch each, after warm-up).
# Usage (GPU machine, hotpaths importable): bash scripts/gpu_router_ncu.sh "ws128n192g/4 wg128n96/2" [OUTDIR]
# Writes <OUTDIR>/router_ncu_<variant>_<splits>.txt (SpeedOfLight, LaunchStats, Occupancy, MemoryWorkloadAnalysis).
set -uo pipefail
cfgs="${1:-ws128n192g/4 wg128n96/2}"
out="${2:-${OUT:-scratch}}"
mkdir -p "$out"
for c in $cfgs; do
  v="${c%/*}"; s="${c#*/}"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats -k regex:router --launch-skip 2 --launch-count 1 \
      python3 - "$v" "$s" > "$out/router_ncu_${v}_${s}.txt" 2>&1 <<'PY'
import sys, torch
from hotpaths.kernels import router_gemm as RG
v, s = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
w = RG.plan((torch.randn(192, 4096, generator=g) * 0.02).cuda())
x = torch.randn(4096, 4096, generator=g).to(torch.bfloat16).cuda()
o = torch.empty(4096, 192, device="cuda")
for _ in range(3):
    RG.router_gemm(x, w, impl="bf16x2_kernel", out=o, variant=v, splits=s)
torch.cuda.synchronize()
PY
  echo "== $c: rc $?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Max Active Clusters|Cluster Size|Waves Per SM|Achieved Occupancy|Registers Per|Grid Size|Executed Ipc|SM Busy" "$out/router_ncu_${v}_${s}.txt"
done
