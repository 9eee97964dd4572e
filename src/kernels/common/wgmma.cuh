// Hopper warpgroup MMA (wgmma) helpers shared by kernel families: the shared-memory matrix descriptor of a
// K-major tile in the 128-byte-swizzle layout, the fence / commit / wait trio, the generic-to-async proxy fence
// that makes cp.async writes visible to wgmma, a register pin for asynchronously written accumulators, the
// accumulator register lists every wgmma wrapper builds its operands from (HP_WG_REGS_<R> / HP_WG_OPS_<R>), and the
// FP8 (e4m3 x e4m3 -> fp32) m64nNk32 instructions, the bf16 m64n64k16 from shared memory, and the f16 / bf16
// m64n128k16 with A from registers and B MN-major (decode attention's P V product).
//
// The swizzled layout every producer must write (cp.async by hand, or TMA with CU_TENSOR_MAP_SWIZZLE_128B): rows
// of 128 bytes, the 16-byte chunk c of row r stored at chunk c ^ (r % 8), each tile based on a 1024-byte boundary
// (one swizzle atom = 8 rows x 128 B). A descriptor then walks 8-row groups 1024 bytes apart; a k-step inside the
// 128-byte row advances the start address by its byte width (32 B: k16 of bf16 or k32 of fp8 = descriptor + 2).
// Why a common header: the router, the MoE GEMMs and the decode attention all feed wgmma from the same layout; one definition of the
// descriptor bits keeps them from drifting apart.
#pragma once
#include <cstdint>

namespace hp {
namespace wg {

// A 128B-swizzled tile's descriptor at shared address p (1024-byte aligned, or + offsets inside it): start address
// >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29), stride byte offset 1024 B between 8-row groups (bits
// 32-45), base offset 0 (bits 49-51: the atoms are 1024-byte aligned), layout type 1 = 128-byte swizzle (bits 62-63).
__device__ __forceinline__ uint64_t desc_sw128_lbo(const void* p, int lbo_bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Descriptor of a K-major, 128B-swizzled tile: the leading byte offset is not used by a swizzled K-major operand and
// is set to 16 B (1) by convention.
__device__ __forceinline__ uint64_t desc_sw128(const void* p) {
  return desc_sw128_lbo(p, 16);
}

// Descriptor of an MN-major (N-contiguous), 128B-swizzled 16-bit tile: rows of 128 bytes = 64 consecutive N elements
// of one K index, stored as above (chunk c of row r at c ^ (r % 8)); 8 K rows make one 1024-byte atom, and
// consecutive atoms along K are 1024 bytes apart (stride byte offset). An N extent past 64 continues in a second such
// tile `mn_block_bytes` further (leading byte offset). The wgmma reads it with its transpose-B immediate set (16-bit
// types only).
__device__ __forceinline__ uint64_t desc_sw128_mn(const void* p, int mn_block_bytes) {
  return desc_sw128_lbo(p, mn_block_bytes);
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

}  // namespace wg
}  // namespace hp

// Accumulator register lists of the m64nN wgmma (R = N / 2 fp32 registers per thread), shared by every wgmma
// instruction wrapper: HP_WG_REGS_<R> is the instruction's "%0,...,%(R - 1)" and HP_WG_OPS_<R> the matching
// "+f"(d[0]) ... "+f"(d[R - 1]) operands (an array d in scope), so the operands after the accumulators are numbered
// from R on. Built from groups of 16 (HP_WG_R<b>: "%b,...,%(b + 15)"; HP_WG_D16(b): the operands of d[b..b + 15]):
// each register number is written once and the shapes differ only in how many groups they take.
// clang-format off
#define HP_WG_R0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define HP_WG_R16 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define HP_WG_R32 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define HP_WG_R48 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define HP_WG_R64 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
#define HP_WG_R80 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define HP_WG_D16(b)                                                                                              \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7]), "+f"(d[b + 8]), "+f"(d[b + 9]), "+f"(d[b + 10]), "+f"(d[b + 11]), "+f"(d[b + 12]),          \
      "+f"(d[b + 13]), "+f"(d[b + 14]), "+f"(d[b + 15])
#define HP_WG_REGS_8 "%0,%1,%2,%3,%4,%5,%6,%7"
#define HP_WG_OPS_8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define HP_WG_REGS_16 HP_WG_R0
#define HP_WG_OPS_16 HP_WG_D16(0)
#define HP_WG_REGS_32 HP_WG_R0 "," HP_WG_R16
#define HP_WG_OPS_32 HP_WG_D16(0), HP_WG_D16(16)
#define HP_WG_REGS_48 HP_WG_REGS_32 "," HP_WG_R32
#define HP_WG_OPS_48 HP_WG_OPS_32, HP_WG_D16(32)
#define HP_WG_REGS_64 HP_WG_REGS_48 "," HP_WG_R48
#define HP_WG_OPS_64 HP_WG_OPS_48, HP_WG_D16(48)
#define HP_WG_REGS_96 HP_WG_REGS_64 "," HP_WG_R64 "," HP_WG_R80
#define HP_WG_OPS_96 HP_WG_OPS_64, HP_WG_D16(64), HP_WG_D16(80)

// D[64 x N] (fp32, R = N / 2 per thread) (+)= A[64 x 32] . B[N x 32]^T, e4m3, both K-major in shared memory, with
// desc_a, desc_b, scale_d in scope; DA, DB, S: their operand numbers ("%R", "%(R + 1)", "%(R + 2)"). scale_d = 0:
// D = A . B (the accumulator's old value is ignored); otherwise D += A . B.
#define HP_WGMMA_E4M3(N, R, DA, DB, S)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\n"              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " \
               "{" HP_WG_REGS_##R "}, " DA ", " DB ", p, 1, 1;\n}\n"       \
               : HP_WG_OPS_##R                                            \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
// The same with scale-d an immediate (S: "%(R + 2)" bound to an "n" operand SCALE_D in scope): no predicate is
// computed beside the instruction. An ordinary instruction that defines a wgmma input while an earlier group is
// pending makes ptxas serialize every wgmma of the kernel (C7513); this form adds none.
#define HP_WGMMA_E4M3_IMM(N, R, DA, DB, S)                                \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " \
               "{" HP_WG_REGS_##R "}, " DA ", " DB ", " S ", 1, 1;\n"     \
               : HP_WG_OPS_##R                                            \
               : "l"(desc_a), "l"(desc_b), "n"(SCALE_D))
// D[64 x N] (+)= A[64 x 16] . B[N x 16]^T, bf16, both K-major in shared memory, scale-d the immediate SCALE_D in
// scope (S: its operand number); the two transpose immediates 0.
#define HP_WGMMA_BF16_IMM(N, R, DA, DB, S)                                        \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "         \
               "{" HP_WG_REGS_##R "}, " DA ", " DB ", " S ", 1, 1, 0, 0;\n"       \
               : HP_WG_OPS_##R                                                    \
               : "l"(desc_a), "l"(desc_b), "n"(SCALE_D))
// clang-format on

namespace hp {
namespace wg {

// D[64 x N] (fp32, N / 2 per thread) (+)= A[64 x 32] . B[N x 32]^T, e4m3 (the wgmma m64nNk32 for N = 16, 32, 64,
// 128).
template <int N>
__device__ __forceinline__ void mma_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "instantiated N: 16, 32, 64, 128");
  if constexpr (N == 16)
    HP_WGMMA_E4M3(16, 8, "%8", "%9", "%10");
  else if constexpr (N == 32)
    HP_WGMMA_E4M3(32, 16, "%16", "%17", "%18");
  else if constexpr (N == 64)
    HP_WGMMA_E4M3(64, 32, "%32", "%33", "%34");
  else
    HP_WGMMA_E4M3(128, 64, "%64", "%65", "%66");
}
// As mma_e4m3 with scale_d a compile-time 0 (D = A . B) or 1 (D += A . B).
template <int N, int SCALE_D>
__device__ __forceinline__ void mma_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(N == 64, "instantiated N: 64");
  static_assert(SCALE_D == 0 || SCALE_D == 1, "scale-d: 0 or 1");
  HP_WGMMA_E4M3_IMM(64, 32, "%32", "%33", "%34");
}
// D[64 x 64] (fp32) (+)= A[64 x 16] . B[64 x 16]^T, bf16 from K-major shared-memory tiles, scale_d a compile-time 0
// (D = A . B) or 1 (D += A . B).
template <int N, int SCALE_D>
__device__ __forceinline__ void mma_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(N == 64, "instantiated N: 64");
  static_assert(SCALE_D == 0 || SCALE_D == 1, "scale-d: 0 or 1");
  HP_WGMMA_BF16_IMM(64, 32, "%32", "%33", "%34");
}

}  // namespace wg
}  // namespace hp

// D[64 x N] (fp32, R = N / 2 per thread) += A[64 x 16] . B[16 x N], 16-bit operands (T = f16 or bf16): A from
// registers (a[0..3] in scope: the m16n8k16 A fragment of the warp's 16 rows, a0 = (row g, k 2t..2t+1), a1 = (row
// g + 8, same k), a2 / a3 = the same rows at k 8 + 2t..), B MN-major in shared memory (desc_b in scope; transpose-B
// immediate 1: B[16 x N] stored N-contiguous, as a row-major V tile [tokens][dims] is for O += P V); A0..A3 / DB:
// their operand numbers. The accumulator always adds (D starts from its registers; zero them for D = A . B).
// clang-format off
#define HP_WGMMA_RS_TB(T, N, R, A0, A1, A2, A3, DB)                                         \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T " "             \
               "{" HP_WG_REGS_##R "}, {" A0 "," A1 "," A2 "," A3 "}, " DB ", 1, 1, 1, 1;\n" \
               : HP_WG_OPS_##R                                                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
// clang-format on

namespace hp {
namespace wg {

// D[64 x N] += A[64 x 16] . B[16 x N], bf16, A from registers and B MN-major in shared memory (desc_sw128_mn):
// decode's O += P V with V read in place. An earlier wgmma's accumulator rounded to 16 bits needs no trip through
// shared memory, since its m64nN fragment is this A fragment with k = the accumulator's columns.
template <int N>
__device__ __forceinline__ void mma_bf16_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 128, "instantiated N: 128 (decode's P V over 128 head dims)");
  HP_WGMMA_RS_TB(bf16, 128, 64, "%64", "%65", "%66", "%67", "%68");
}
// As mma_bf16_rs_tb for f16 operands (decode's FP8 V converted to f16 in its token-major order).
template <int N>
__device__ __forceinline__ void mma_f16_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 128, "instantiated N: 128 (decode's P V over 128 head dims)");
  HP_WGMMA_RS_TB(f16, 128, 64, "%64", "%65", "%66", "%67", "%68");
}

}  // namespace wg
}  // namespace hp
