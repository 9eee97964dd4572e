#!/usr/bin/env bash
# Run `hotpaths` on the GPU machine (Python 3.12, torch preinstalled, no package index) and pack what it wrote
# into ONE archive, since only a few files come back from that machine.
#
# One line, with the device tool (after `bash tools/gpu/build_wheels.sh` here, and a CPU-side kernel build in
# build/ if wanted):
#   run  command: "bash tools/gpu/run_on_gpu.sh reproduce --profile full"   carry: [".whl", "build", ".carry"]
# then here:
#   bash tools/gpu/unpack_results.sh <files_at>/hotpaths_results.tar.gz
#
# Arguments are passed to `python3 -m hotpaths` (default: reproduce --profile full --device cuda).
# Environment: OUT (where the archive and run.log go; the device tool sets it; default ./gpu_out),
#   RUN_TIMEOUT=S stops `hotpaths` after S seconds (the archive is still written),
#   GPU_TESTS=1 also runs `pytest -m gpu tests` (log: $OUT/pytest_gpu.log),
#   PYTHON (default python3), SITE (default /tmp/site), HP_LINK_DIR (default /tmp/hp: holds the hotpaths -> src
#   link), JK_PREFIX (default /tmp/jk: the kernelspec prefix).
# Exit status: that of `hotpaths` (or of pytest when it fails and hotpaths did not); the archive is written
# either way, so a failed run still brings back whatever it left.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
out="${OUT:-$root/gpu_out}"
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
py="${PYTHON:-python3}"
site="${SITE:-/tmp/site}"
hp="${HP_LINK_DIR:-/tmp/hp}"
jk="${JK_PREFIX:-/tmp/jk}"

say() { printf '[run_on_gpu] %s\n' "$*"; }

# 1. The notebook stack travels as wheels in .whl/ (carried); install them beside the image's packages.
if compgen -G ".whl/*.whl" > /dev/null; then
    say "installing $(ls .whl/*.whl | wc -l) wheels into $site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { say "wheel install failed"; exit 3; }
elif ! "$py" -c "import papermill, ipykernel" 2>/dev/null; then
    say "papermill/ipykernel missing and no .whl/: run 'bash tools/gpu/build_wheels.sh' here and carry .whl"
    exit 3
fi

# 1b. Measuring peers (FlashInfer 0.7.2, HPC-Ops) travel as bundles in .carry/peers/: peers_env.sh unpacks them
#     and exports the folders the peer adapters read, so their rows are measured instead of "not available".
if [ -d .carry/peers ]; then
    . tools/gpu/peers_env.sh || say "peers unpack failed: the peer rows will say why"
fi
# 2. Import root `hotpaths` -> src/ without installing the project (no index there for its build backend).
mkdir -p "$hp" && ln -sfn "$root/src" "$hp/hotpaths"
export PYTHONPATH="$site:$hp${PYTHONPATH:+:$PYTHONPATH}"

# 3. A Jupyter kernel named python3 running this machine's python3; the kernel inherits PYTHONPATH.
export JUPYTER_PLATFORM_DIRS=1 JUPYTER_PATH="$jk/share/jupyter" IPYTHONDIR="$jk/ipython"
"$py" -m ipykernel install --prefix "$jk" --name python3 --display-name "Python 3 (GPU machine)" > /dev/null \
    || { say "ipykernel install failed"; exit 3; }

say "python: $("$py" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
"$py" -c 'import torch; print("[run_on_gpu] torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible")' || true
command -v ncu > /dev/null && say "ncu: $(ncu --version | tail -1)" || say "ncu: not on PATH"

# 4. The run itself.
if [[ $# -eq 0 ]]; then set -- reproduce --profile full --device cuda; fi
say "python3 -m hotpaths $*"
start=$(date +%s)
# RUN_TIMEOUT (seconds) stops hotpaths early enough that the results still get packed below.
if [[ -n "${RUN_TIMEOUT:-}" ]]; then
    timeout "$RUN_TIMEOUT" "$py" -m hotpaths "$@"
else
    "$py" -m hotpaths "$@"
fi
rc=$?
say "hotpaths exited $rc after $(( $(date +%s) - start )) s"

if [[ "${GPU_TESTS:-0}" == "1" ]]; then
    say "pytest -m gpu tests"
    "$py" -m pytest -m gpu tests -q -rs -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.log"
    trc=${PIPESTATUS[0]}
    say "pytest exited $trc"
    if [[ $rc -eq 0 && $trc -ne 0 ]]; then rc=$trc; fi
fi

# 5. Pack results: the device tag decides the folders (fallback h200, the machine this script is for).
tag="$("$py" -c 'from hotpaths.harness.env import device_tag; print(device_tag())' 2>/dev/null || true)"
tag="${tag:-h200}"
paths=()
for p in "papermill_runs/$tag" "data/results/$tag" "data/profiles/$tag" data/dispatch; do
    [[ -e "$p" ]] && paths+=("$p")
done
# ptxas reports of the kernels as built on this machine (small; tells whether anything was rebuilt here).
for p in build/*/ptxas.txt; do [[ -e "$p" ]] && paths+=("$p"); done
if [[ ${#paths[@]} -gt 0 ]]; then
    tar -czf "$out/hotpaths_results.tar.gz" "${paths[@]}" && say "packed ${paths[*]} into $out/hotpaths_results.tar.gz"
else
    say "nothing to pack (no papermill_runs/$tag, data/results/$tag, data/profiles/$tag, data/dispatch)"
fi
exit "$rc"
