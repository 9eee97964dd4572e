#!/usr/bin/env bash
# One-shot router GEMM check on an SM90 machine: build (ptxas report), kernel tuning + the dispatch crossover table,
# the GPU tests (using that table), and an M sweep of every impl at the Hy3 shape.
# Usage (repo root, package importable as hotpaths):  bash scripts/gpu_check_router.sh
# Writes under $OUT (default scratch/gpu_check_router/): router_gemm_<tag>.json (the dispatch table to copy into
# data/dispatch/), router_gemm_latency.csv/.md, ptxas.txt, pytest.txt.
set -uo pipefail
OUT="${OUT:-scratch/gpu_check_router}"
export OUT
mkdir -p "$OUT"
PY="${PYTHON:-python}"
export HOTPATHS_BUILD_DIR="${HOTPATHS_BUILD_DIR:-$PWD/build}"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader || true

echo "== build"
"$PY" - <<'PYEOF' || exit 1
import time
from hotpaths.kernels import _build
t = time.time()
rows = _build.compile_check("router_gemm")
print(f"built in {time.time() - t:.1f} s; {len(rows)} kernels; max registers "
      f"{max(r.get('registers', 0) for r in rows)}; spills "
      f"{sum(r.get('spill_stores', 0) + r.get('spill_loads', 0) for r in rows)} bytes")
PYEOF
cp "$(dirname "$("$PY" -c 'from hotpaths.kernels import _build; print(_build.library_path("router_gemm"))')")/ptxas.txt" "$OUT/" || true

echo "== tune + crossover (dispatch table)"
timeout 110 "$PY" - <<'PYEOF'
import os, time
from hotpaths.harness import bench
from hotpaths.harness.env import device_tag
from hotpaths.kernels import router_gemm as rg
from hotpaths.reference import router_gemm as ref

out_dir = os.environ["OUT"]
t0 = time.time()
floor = bench.timing_floor(1)
print(f"timing floor (1 trivial kernel, L2 flushed): {floor.median_us:.2f} us")
shapes = [ref.SHAPES[s] for s in ("hy3", "longcat_chat", "longcat_lite", "deepseek_v3")]
table = rg.measure_crossover(shapes, rg.DEFAULT_MS, path=os.path.join(out_dir, f"router_gemm_{device_tag()}.json"))
for s in table["shapes"]:
    print(f"N={s['n']} K={s['k']}  (M: kernel us / fp32 us, best config; * = fp32 chosen)")
    for r in s["rows"]:
        top = sorted(r["candidates_us"].items(), key=lambda kv: kv[1])[:3]
        print(f"  {r['m']:>5}: {r['bf16x2_kernel_us']:7.2f} / {r['fp32_cublas_us']:7.2f}"
              f"{'*' if r['choice'] != 'bf16x2_kernel' else ' '} {r['kernel']['variant']}/{r['kernel']['splits']}"
              f"   next: {', '.join(f'{c}={t:.1f}' for c, t in top[1:])}")
print(f"[{time.time() - t0:.0f} s]")
PYEOF
if [ -f "$OUT/router_gemm_h200.json" ] || ls "$OUT"/router_gemm_*.json >/dev/null 2>&1; then
  export HOTPATHS_DISPATCH_DIR="$OUT"  # tests and sweep use the table just measured
fi

echo "== tests"
timeout 80 "$PY" -m pytest -q tests/test_router_gemm_gpu.py tests/test_router_gemm_api.py -p no:cacheprovider \
  --tb=line -rfE 2>&1 | tee "$OUT/pytest.txt" | tail -30

echo "== sweep (hy3)"
timeout 60 "$PY" - <<'PYEOF'
import os, time
from pathlib import Path
from hotpaths.harness import tables
from hotpaths.kernels import router_gemm as rg

out_dir = os.environ["OUT"]
t0 = time.time()
rows = rg.benchmark_rows(rg.DEFAULT_MS, 192, 4096, ["bf16x2_kernel", "dispatch", "bf16x3_kernel", "fp32_cublas",
                                                    "tf32_cublas", "bf16_cublas"], iters=100)
tables.save(rows, "router_gemm_latency", out_dir=Path(out_dir))
by = {(r["m"], r["impl"]): r for r in rows}
print(f"{'M':>5} {'kernel':>8} {'x3':>8} {'disp':>8} {'fp32':>8} {'tf32':>8} {'bf16':>8} {'vs32':>6} {'vsTF':>6} "
      f"{'err64':>9} {'emu64':>9} {'err32':>9} {'flips':>5} {'eflips':>6} config")
for m in rg.DEFAULT_MS:
    k = by[(m, "bf16x2_kernel")]
    print(f"{m:>5} {k['median_us']:>8.2f} {by[(m, 'bf16x3_kernel')]['median_us']:>8.2f} "
          f"{by[(m, 'dispatch')]['median_us']:>8.2f} {by[(m, 'fp32_cublas')]['median_us']:>8.2f} "
          f"{by[(m, 'tf32_cublas')]['median_us']:>8.2f} {by[(m, 'bf16_cublas')]['median_us']:>8.2f} "
          f"{k['speedup_vs_fp32']:>6.2f} {k['speedup_vs_tf32']:>6.2f} {k['max_abs_err_vs_fp64']:>9.2e} "
          f"{k['emulation_max_abs_err_vs_fp64']:>9.2e} {k['max_abs_err_vs_fp32']:>9.2e} {k['topk_flips']:>5} "
          f"{k['topk_flips_emulation']:>6} {k['config']}")
print(f"[{time.time() - t0:.0f} s]")
PYEOF
ls -la "$OUT"
