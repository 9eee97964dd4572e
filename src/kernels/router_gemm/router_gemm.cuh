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

namespace hp_router {

// D += A * B for one m16n8k16 tile; A row-major (4 regs of bf16x2), B "col" (2 regs), D fp32 (4 regs).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (rows past M) without reading.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
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
