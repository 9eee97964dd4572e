// Small PTX wrappers shared by the router GEMM kernels (sm_90a).
//
// Why mma.sync m16n8k16 + ldmatrix instead of wgmma/CUTLASS: the router GEMM is tiny (N = 192..768), the
// decode sizes are memory-bound (the weight read dominates) and the point of the notebook is the two-part
// numerics, so the warp-level MMA keeps every register visible and teachable; its ~60% of the wgmma peak is
// enough for most prefill sizes (~13 GFLOP at M = 4096). The wgmma variants for large M live in router_wgmma.cu.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace hp_router {

using hp::cp_async16;
using hp::cp_commit;
using hp::cp_wait;
using hp::ldmatrix_x4;

// D += A * B for one m16n8k16 tile; A row-major (4 regs of bf16x2), B "col" (2 regs), D fp32 (4 regs).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  hp::mma16816<false>(d, a, b0, b1);
}

// Zeroes an accumulator array of any rank (acc[PARTS][MI][NT][4], acc0[R]); every index is a compile-time constant
// once the loops unroll, so the array stays in registers.
template <int N>
__device__ __forceinline__ void zero_fill(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = 0.f;
}
template <typename T, int N>
__device__ __forceinline__ void zero_fill(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_fill(a[i]);
}

// Streaming 16-byte load for data read exactly once (the weight at decode sizes): do not keep it in L1.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// PDL: wait until the kernel launched before this one (with the programmatic-serialization attribute on this
// launch) has completed and its writes are visible; a no-op when launched without that attribute.
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// The split-K reduction of the tiled kernels (router_tiled_kernel, router_wgmma_kernel): each of the S ranks of a
// (1, 1, S) cluster holds its combined partial BM x BN tile in its own shared memory (`red`, rows padded to BN + 4
// floats so a row read is float4 without bank conflicts); rank r sums rows [r * BM / S, (r + 1) * BM / S) over the
// S ranks in rank order and writes them with float4 stores. Deterministic (the order does not depend on timing), no
// atomics, no workspace, no second kernel: CUDA-graph safe. The first cluster barrier makes every partial visible;
// the second keeps this CTA's shared memory alive until every rank has read it.
template <int BM, int BN, int THREADS>
__device__ __forceinline__ void cluster_splitk_reduce(float* red, float* __restrict__ out, int M, int N, int m_block,
                                                      int n_block, int rank, int splits) {
  constexpr int LDR = BN + 4;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const int rows_per = BM / splits;
  for (int idx = threadIdx.x; idx < rows_per * (BN / 4); idx += THREADS) {
    const int r = rank * rows_per + idx / (BN / 4), c4 = (idx % (BN / 4)) * 4;
    const int row = m_block + r;
    if (row >= M) continue;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float4 t = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q) + r * LDR + c4);
      v.x += t.x;
      v.y += t.y;
      v.z += t.z;
      v.w += t.w;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + n_block + c4) = v;
  }
  cluster.sync();
}

}  // namespace hp_router
