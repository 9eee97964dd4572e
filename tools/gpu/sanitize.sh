#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over each kernel family on its fixed edge cases
# (hotpaths.bench.<op>_fuzz.SANITIZE_CASES: boundary lengths, one token, the largest sizes kept small), eager
# launches, no CUDA graphs. Writes data/results/<device>/sanitizer.csv/.md (tool, op, case, errors; a row per
# (tool, op) with the ERROR SUMMARY total, or saying the tool refused) and the raw logs under $OUT/sanitizer_logs.
#
# One command on the GPU machine:   bash tools/gpu/sanitize.sh            (about 5 minutes on an H200)
#   OPS="split_kv_decode router_gemm" TOOLS="memcheck" bash tools/gpu/sanitize.sh    a subset
# Environment: SANITIZER (default /usr/local/cuda/bin/compute-sanitizer, else the one on PATH), PYTHON (python3),
#   PER_RUN_TIMEOUT seconds per sanitizer run (default 150), OUT (default ./gpu_out), SANITIZER_FLAGS extra options
#   for every tool (default "--print-limit 50"), RESULTS_DIR (default data/results/<device tag>).
# Exit status: 0 when every (tool, op) reports 0 errors, 1 otherwise, 2 when nothing could run.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
py="${PYTHON:-python3}"
san="${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
[ -x "$san" ] || san="$(command -v compute-sanitizer || true)"
ops="${OPS:-split_kv_decode attention_prologue router_gemm fused_moe}"
tools="${TOOLS:-memcheck racecheck synccheck initcheck}"
per_run="${PER_RUN_TIMEOUT:-150}"
out="${OUT:-$root/gpu_out}"
logs="$out/sanitizer_logs"
mkdir -p "$logs"
rm -f "$logs"/*__*.log
export PYTHONUNBUFFERED=1

# this checkout's package first (works without `pip install -e .`, and wins over another installed copy)
link="${HP_LINK_DIR:-/tmp/hp}"
mkdir -p "$link" && ln -sfn "$root/src" "$link/hotpaths"
export PYTHONPATH="$link${PYTHONPATH:+:$PYTHONPATH}"

# Build the kernels and check the cases once without a sanitizer (compilation must not count against the tools'
# time, and a case that fails its own checks is worth knowing before reading sanitizer reports).
for op in $ops; do
  echo "== $op: build + plain run"
  "$py" -m hotpaths.bench.fuzz --sanitize-case "$op" || echo "== $op: plain run failed (exit $?)"
done

if [ -z "$san" ]; then
  for tool in $tools; do for op in $ops; do
    echo "compute-sanitizer not found (SANITIZER=$san)" > "$logs/${tool}__${op}.log"
  done; done
else
  "$san" --version | head -2
  for op in $ops; do
    start=$(date +%s)
    for tool in $tools; do  # the four tools of one op side by side (each mostly waits on its own instrumentation)
      # shellcheck disable=SC2086  # SANITIZER_FLAGS is a list of options
      timeout "$per_run" "$san" --tool "$tool" ${SANITIZER_FLAGS---print-limit 50} \
        "$py" -m hotpaths.bench.fuzz --sanitize-case "$op" > "$logs/${tool}__${op}.log" 2>&1 &
    done
    wait
    echo "== $op: sanitizers done in $(( $(date +%s) - start )) s"
  done
fi

tag="$("$py" -c 'from hotpaths.reference.common import device_tag; print(device_tag())')"
"$py" -m hotpaths.bench.fuzz --sanitize-table "$logs" --out-dir "${RESULTS_DIR:-$root/data/results/$tag}"
