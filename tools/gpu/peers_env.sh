#!/usr/bin/env bash
# Source this on the GPU machine (no package index there) to make the measuring peers importable:
#   . tools/gpu/peers_env.sh
# It unpacks what .carry/peers/ holds into $PEERS_DIR (default /tmp/peers) and exports the variables the peer
# adapters (src/bench/_peers_common.py) read. Preparing .carry/peers/ on a machine with internet:
#   FlashInfer 0.7.2: pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
#     manylinux_2_28_x86_64 --platform any flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2; unzip the
#     flashinfer wheel and repack its flashinfer/ folder as flashinfer-0.7.2.tar.xz (tar -cJf); keep the tvm-ffi .whl.
#   HPC-Ops: the prebuilt sm_90a subset hpc_ops_sm90a_<commit>.tar.gz (not on any index; it holds hpc_ops/hpc/).
# Variables:
#   HOTPATHS_HPC_OPS_DIR     HPC-Ops prebuilt sm_90a subset (hpc_ops_sm90a_*.tar.gz): the folder holding hpc/
#   HOTPATHS_FLASHINFER_072_DIR  FlashInfer 0.7.2 (flashinfer-*.tar.xz, the wheel's flashinfer/ folder repacked)
#   PYTHONPATH, HOTPATHS_TVM_FFI_DIR  + the peers' own wheels (apache-tvm-ffi, flag-gems, sqlalchemy, greenlet)
# A peer that is not carried is simply absent: its table rows say why.
peers_src="${PEERS_SRC:-.carry/peers}"
PEERS_DIR="${PEERS_DIR:-/tmp/peers}"
mkdir -p "$PEERS_DIR"
if compgen -G "$peers_src/hpc_ops_*.tar.gz" > /dev/null; then
    tar xzf "$peers_src"/hpc_ops_*.tar.gz -C "$PEERS_DIR" && export HOTPATHS_HPC_OPS_DIR="$PEERS_DIR/hpc_ops"
fi
if compgen -G "$peers_src/flashinfer-*.tar.xz" > /dev/null; then
    mkdir -p "$PEERS_DIR/flashinfer" && tar xJf "$peers_src"/flashinfer-*.tar.xz -C "$PEERS_DIR/flashinfer" \
        && export HOTPATHS_FLASHINFER_072_DIR="$PEERS_DIR/flashinfer"
    export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS="${MAX_JOBS:-16}" \
        FLASHINFER_WORKSPACE_BASE="$PEERS_DIR/fi_ws" TVM_FFI_CACHE_DIR="$PEERS_DIR/tvm_ffi_cache"
fi
if compgen -G "$peers_src/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PEERS_DIR/site" \
        "$peers_src"/*.whl && export PYTHONPATH="$PEERS_DIR/site${PYTHONPATH:+:$PYTHONPATH}" \
        HOTPATHS_TVM_FFI_DIR="$PEERS_DIR/site"
fi
echo "[peers_env] hpc_ops=${HOTPATHS_HPC_OPS_DIR:-absent} flashinfer_0.7.2=${HOTPATHS_FLASHINFER_072_DIR:-absent}" \
     "site=$(ls "$PEERS_DIR/site" 2>/dev/null | tr '\n' ' ')"
