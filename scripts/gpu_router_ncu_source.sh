#!/usr/bin/env bash
# Nsight Compute with source-level stall sampling on the router GEMM prefill at M=4096, N=192, K=4096, beside the
# one-product BF16 cuBLAS GEMM of the same shape (what the tensor cores and L2 do for a library kernel here).
# Usage (GPU machine, hotpaths importable): bash scripts/gpu_router_ncu_source.sh "ws128n192g/4 bf16_cublas" [OUTDIR]
# Writes per configuration: ncu_src_<cfg>.details.txt (every section, with the stall-reason breakdown) and
# ncu_src_<cfg>.sass.csv (per-SASS-instruction stall samples), from a --set full profile of one launch.
set -uo pipefail
cfgs="${1:-ws128n192g/4 ws128n192r/4 bf16_cublas}"
out="${2:-${OUT:-scratch}}"
mkdir -p "$out"
for c in $cfgs; do
  tag="${c//\//_}"
  rep="/tmp/ncu_src_${tag}"
  timeout 240 ncu --clock-control none --set full --import-source no -k "regex:router|gemm|nvjet|sm90|cutlass" \
      --launch-skip 2 --launch-count 1 -f -o "$rep" python3 - "$c" > "$out/ncu_src_${tag}.log" 2>&1 <<'PY'
import sys, torch
from hotpaths.kernels import router_gemm as RG
c = sys.argv[1]
g = torch.Generator().manual_seed(0)
w = RG.plan((torch.randn(192, 4096, generator=g) * 0.02).cuda())
x = torch.randn(4096, 4096, generator=g).to(torch.bfloat16).cuda()
o = torch.empty(4096, 192, device="cuda")
for _ in range(3):
    if c == "bf16_cublas":
        RG.router_gemm(x, w, impl="bf16_cublas", out=o)
    else:
        v, s = c.split("/")
        RG.router_gemm(x, w, impl="bf16x2_kernel", out=o, variant=v, splits=int(s))
torch.cuda.synchronize()
PY
  echo "== $c: rc $?"
  ncu -i "$rep.ncu-rep" --page details --print-details all > "$out/ncu_src_${tag}.details.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$out/ncu_src_${tag}.sass.csv" 2>&1
  grep -E "^  [a-zA-Z_<].*\(|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Grid Size|Registers Per|Stall" "$out/ncu_src_${tag}.details.txt" | head -40
done
