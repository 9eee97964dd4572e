// Inline-PTX wrappers of the MoE kernels (the same techniques as split_kv_decode/attention.cu, kept per op so the
// two families can change independently): 16-byte cp.async with zero-fill, ldmatrix, the FP8 m16n8k32 MMA and
// the saturating RNE FP32 -> e4m3 pair conversion.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

namespace hp_moe {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// pred false: 16 zero bytes land in shared memory (src-size 0), so K tails and missing token rows read as 0.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const int sz = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(sz));
}
// 4-byte variant (a group scale per row); pred false: 0 lands.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool pred) {
  const int sz = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(sz));
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// D = A (16x32 e4m3, row) * B (32x8 e4m3, col) + C, fp32.
__device__ __forceinline__ void mma_e4m3(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> two e4m3 bytes (lo in the low byte), round-to-nearest-even, saturating to +-448: exactly
// e4m3(clamp(v, -448, 448)) of the reference.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// 1 / b without rcp.rn's out-of-line slow path (a call in SASS, which makes ptxas spill around it inside the GEMM
// loop): approximate reciprocal plus one Newton step, accurate to an ulp for the normal-range scales used here.
__device__ __forceinline__ float recip(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(b));
  return __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
}
// a / b given r = recip(b): product plus one FMA residual correction (Markstein), the correctly rounded quotient in
// all but rare last-ulp cases; quotients beyond +-512 skip the correction (they saturate to +-448 in e4m3 anyway,
// and the residual of an overflowed product would be NaN).
__device__ __forceinline__ float div_by(float a, float b, float r) {
  const float q = __fmul_rn(a, r);
  if (!(fabsf(q) <= 512.0f)) return q;
  return __fmaf_rn(__fmaf_rn(-q, b, a), r, q);
}

// Four bf16 (8 bytes, k order) quantized with scale s (division, as the reference: v / s) into one B register.
__device__ __forceinline__ uint32_t quant4(uint2 v, float s, float r) {
  const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v.x);
  const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
  const float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
  const uint32_t lo = e4m3x2(div_by(fa.x, s, r), div_by(fa.y, s, r));
  const uint32_t hi = e4m3x2(div_by(fb.x, s, r), div_by(fb.y, s, r));
  return lo | (hi << 16);
}

// (g * sigmoid(g)) * u in fp32 with sigmoid = 1 / (1 + exp(-g)) correctly rounded: the contract's
// g * torch.sigmoid(g) * u operation for operation (torch's sigmoid is that division), so the bf16 act agrees with
// the emulation to the accumulation order of g and u. A denominator of +inf (g very negative) gives sigmoid 0.
__device__ __forceinline__ float silu_mul(float g, float u) {
  const float d = 1.0f + expf(-g);
  const float sig = isinf(d) ? 0.0f : div_by(1.0f, d, recip(d));
  return __fmul_rn(__fmul_rn(g, sig), u);
}

}  // namespace hp_moe
