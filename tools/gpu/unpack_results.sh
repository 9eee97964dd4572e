#!/usr/bin/env bash
# Unpack the archive that tools/gpu/run_on_gpu.sh wrote on the GPU machine into this repo
# (papermill_runs/<tag>/, data/results/<tag>/, data/profiles/<tag>/, data/dispatch/, build/*/ptxas.txt).
#
# Usage: bash tools/gpu/unpack_results.sh ARCHIVE
# Refuses archives holding absolute paths, '..' or anything outside those folders, so a bad archive cannot
# write elsewhere. Existing files with the same names are replaced; review with `git status` / `git diff`.
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1" ]]; then
    echo "usage: bash tools/gpu/unpack_results.sh ARCHIVE  (the hotpaths_results.tar.gz that run_on_gpu.sh wrote)" >&2
    exit 2
fi
archive="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

bad=$(tar -tzf "$archive" | grep -v -E '^((papermill_runs|data/results|data/profiles|data/dispatch|build)(/|$)|data/?$)' || true)
bad+=$(tar -tzf "$archive" | grep -E '(^/|(^|/)\.\.(/|$))' || true)
if [[ -n "$bad" ]]; then
    echo "unpack_results: refusing $archive: unexpected entries:" >&2
    echo "$bad" >&2
    exit 1
fi
tar -xzf "$archive" -C "$root" --no-same-owner
echo "unpack_results: unpacked $(tar -tzf "$archive" | grep -c -v '/$') files into $root, in:"
tar -tzf "$archive" | grep -v '/$' | xargs -n1 dirname | sort -u | sed 's/^/  /'
