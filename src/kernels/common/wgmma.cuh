// Hopper warpgroup MMA (wgmma) helpers shared by kernel families: the shared-memory matrix descriptor of a
// K-major tile in the 128-byte-swizzle layout, the fence / commit / wait trio, the generic-to-async proxy fence
// that makes cp.async writes visible to wgmma, a register pin for asynchronously written accumulators, and the FP8
// (e4m3 x e4m3 -> fp32) m64nNk32 instructions (N = 16, 32, 64, 128).
//
// The swizzled layout every producer must write (cp.async by hand, or TMA with CU_TENSOR_MAP_SWIZZLE_128B): rows
// of 128 bytes, the 16-byte chunk c of row r stored at chunk c ^ (r % 8), each tile based on a 1024-byte boundary
// (one swizzle atom = 8 rows x 128 B). A descriptor then walks 8-row groups 1024 bytes apart; a k-step inside the
// 128-byte row advances the start address by its byte width (32 B: k16 of bf16 or k32 of fp8 = descriptor + 2).
// Why a common header: the router and the MoE GEMMs both feed wgmma from the same layout; one definition of the
// descriptor bits keeps them from drifting apart.
#pragma once
#include <cstdint>

namespace hp {
namespace wg {

// Descriptor of a K-major, 128B-swizzled tile at shared address p (1024-byte aligned, or p = aligned base + k
// offset inside the row): start address >> 4 (bits 0-13), leading byte offset 16 B (bits 16-29; not used by a
// swizzled K-major operand, set to 1 by convention), stride byte offset 1024 B between 8-row groups (bits
// 32-45), base offset 0 (bits 49-51: the atoms are 1024-byte aligned), layout type 1 = 128-byte swizzle (bits
// 62-63).
__device__ __forceinline__ uint64_t desc_sw128(const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Orders this warpgroup's earlier register / shared-memory accesses before the wgmma that follow (required before
// the first wgmma, and whenever the accumulators were touched by ordinary instructions in between).
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async / st.shared writes (generic proxy) -> visible to wgmma's shared-memory reads (async proxy). Each
// writing thread fences its own writes, then a barrier publishes them.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins accumulators in registers across the asynchronous wgmma (the compiler may not move their reads or writes
// over this point).
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Accumulator layout of every m64nN fp32 wgmma (per warpgroup): register j of thread (warp w = warp % 4 inside the
// warpgroup, lane l) holds row 16 w + l / 4 + 8 ((j >> 1) & 1), column 8 (j >> 2) + 2 (l % 4) + (j & 1).
__device__ __forceinline__ int acc_row(int warp_in_wg, int lane, int j) {
  return 16 * warp_in_wg + (lane >> 2) + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int acc_col(int lane, int j) {
  return 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
}

// D[64 x 16] (fp32, 8 per thread) (+)= A[64 x 32] . B[16 x 32]^T, e4m3, both K-major in shared memory.
// scale_d = 0: D = A . B (the accumulator's old value is ignored); otherwise D += A . B.
__device__ __forceinline__ void wgmma_m64n16k32_e4m3(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 32] (fp32, 16 per thread) (+)= A[64 x 32] . B[32 x 32]^T, e4m3, both K-major in shared memory.
// scale_d = 0: D = A . B (the accumulator's old value is ignored); otherwise D += A . B.
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 64] (fp32, 32 per thread) (+)= A[64 x 32] . B[64 x 32]^T, e4m3, both K-major in shared memory.
// scale_d = 0: D = A . B (the accumulator's old value is ignored); otherwise D += A . B.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 128] (fp32, 64 per thread) (+)= A[64 x 32] . B[128 x 32]^T, e4m3, both K-major in shared memory.
// scale_d = 0: D = A . B (the accumulator's old value is ignored); otherwise D += A . B.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

template <int N>
__device__ __forceinline__ void mma_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "instantiated N: 16, 32, 64, 128");
  if constexpr (N == 16)
    wgmma_m64n16k32_e4m3(d, desc_a, desc_b, scale_d);
  else if constexpr (N == 32)
    wgmma_m64n32k32_e4m3(d, desc_a, desc_b, scale_d);
  else if constexpr (N == 64)
    wgmma_m64n64k32_e4m3(d, desc_a, desc_b, scale_d);
  else
    wgmma_m64n128k32_e4m3(d, desc_a, desc_b, scale_d);
}

}  // namespace wg
}  // namespace hp
