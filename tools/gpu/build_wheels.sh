#!/usr/bin/env bash
# Download the wheel bundle for the GPU machine (Python 3.12, x86-64 Linux, no package index there) into the
# ignored folder .whl/, from the pins in tools/gpu/wheels.txt, then check it (one wheel per pin, every
# Requires-Dist carried or already on the GPU image) with tools/gpu/check_wheels.py.
#
# Usage (repo root, on a machine that reaches PyPI):  bash tools/gpu/build_wheels.sh [DEST]   (DEST: .whl)
# Then run on the GPU machine as described at the top of tools/gpu/run_on_gpu.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
dest="${1:-.whl}"
list="tools/gpu/wheels.txt"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi

mkdir -p "$dest"
# Stale wheels of other versions would make two versions of one name travel; start clean.
rm -f "$dest"/*.whl

# pip matches manylinux_2_N tags exactly, so name the usual N; pure-python wheels come as py3-none-any.
grep -v '^[[:space:]]*\(#\|$\)' "$list" | sed 's/[[:space:]]*#.*//' > "$dest/.requirements.txt"
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform linux_x86_64 --platform any \
    -d "$dest" -r "$dest/.requirements.txt" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
rm -f "$dest/.requirements.txt"

"$py" tools/gpu/check_wheels.py --wheels-txt "$list" --wheel-dir "$dest"
n=$(ls "$dest"/*.whl | wc -l)
size=$(du -sh "$dest" | cut -f1)
echo "build_wheels: $n wheels, $size in $dest"
