// Tensor memory accelerator (TMA) and mbarrier helpers shared by kernel families (sm_90a): the opaque 128-byte
// tensor map as a kernel parameter, the host encoder of a tiled map (cuTensorMapEncodeTiled through the runtime's
// driver entry-point query: no -lcuda link), mbarrier init / arrive / expect-tx and a bounded wait that traps
// instead of hanging, and 2-D / 3-D TMA loads completing on an mbarrier.
// Why a common header: the router's prefill GEMM and the MoE expert GEMMs both feed wgmma from TMA-written,
// 128-byte-swizzled stages through an mbarrier ring; one definition of the protocol's pieces keeps them alike.
// With CU_TENSOR_MAP_SWIZZLE_128B the box's 16-byte chunk c of row r lands at chunk c ^ (r % 8) of a 1024-byte
// aligned destination: the layout common/wgmma.cuh's descriptors read and cp.async writers produce by hand.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"  // hp::smem_u32
#if !defined(__CUDACC_RTC__)
#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder comes via the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>
#endif

namespace hp {
namespace tma {

// A legitimate wait in these pipelines is microseconds; past this the protocol is broken and the launch traps.
constexpr unsigned long long kHangNs = 4000000000ull;

// The 128-byte CUtensorMap, opaque to the device code (cuda.h is host-only; layout checked by the encoder).
struct alignas(128) TmaMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// CTA scope: enough for this CTA's own TMA completions and its own warps' arrivals.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// A timed-out wait traps (the launch fails with an error instead of hanging the device). The code says which wait
// (each kernel documents its codes). No printf: any call (printf is one) in a kernel after its first wgmma makes
// ptxas serialise every wgmma (warning C7510), so the code is only kept in a register for cuda-gdb / the SASS dump
// of a trapped launch.
__device__ __forceinline__ void mbar_hang_report(int code) {
  asm volatile("mov.b32 %0, %0;\n trap;\n" : "+r"(code)::"memory");
}
// Wait until the phase with parity `parity` of the mbarrier at shared address `bar` has completed; false after
// kHangNs without completing.
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return true;
  const unsigned long long t0 = global_ns();
  while (!mbar_try_wait(bar, parity))
    if (global_ns() - t0 > kHangNs) return false;
  return true;
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Raise the phase's expected transaction bytes without arriving (the issuer arrives later with the other producers).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrive on this CTA's mbarrier (release at CTA scope): a cluster-scope release would put a cluster-wide fence on
// the consumers' path every stage, and the barrier's waiters are in this CTA.
__device__ __forceinline__ void mbar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Makes mbarrier.init visible to the async proxy (TMA's complete_tx) before the first load that signals it.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// 2-D TMA load of the box at (c0 = k, c1 = row) into this CTA's shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same with an L2 cache policy (createpolicy) for the loaded lines.
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
// 3-D TMA load of the box at (c0 = k, c1 = row, c2 = matrix) (e.g. expert e's weight rows), completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TmaMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

#if !defined(__CUDACC_RTC__)
// Host: a tiled tensor map over a row-major tensor of `rank` (2 or 3) dimensions, innermost first: dims[i]
// elements, strides_bytes[i] the byte step of dimension i + 1 (a multiple of 16), box[i] elements per box, the
// 128-byte swizzle (box[0] * element size must be 128 bytes or less), zero fill outside the tensor. Returns
// cudaErrorNotSupported when the driver has no encoder, cudaErrorInvalidValue when it refuses the map or `ptr` is
// not 16-byte aligned. The encoder is resolved once per process.
inline cudaError_t encode_tiled(TmaMap* map, CUtensorMapDataType dtype, int rank, const void* ptr, const uint64_t* dims,
                                const uint64_t* strides_bytes, const uint32_t* box) {
  static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) == alignof(CUtensorMap), "CUtensorMap");
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return cudaErrorNotSupported;
  if (rank < 2 || rank > 3 || reinterpret_cast<uintptr_t>(ptr) % 16) return cudaErrorInvalidValue;
  cuuint64_t d[3], s[2];
  cuuint32_t b[3], elem[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = static_cast<cuuint64_t>(dims[i]);
    b[i] = static_cast<cuuint32_t>(box[i]);
    if (i + 1 < rank) s[i] = static_cast<cuuint64_t>(strides_bytes[i]);
  }
  const CUresult r =
      encode(reinterpret_cast<CUtensorMap*>(map), dtype, static_cast<cuuint32_t>(rank), const_cast<void*>(ptr), d, s, b,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
#endif

}  // namespace tma
}  // namespace hp
