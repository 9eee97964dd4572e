// Inline-PTX wrappers of the MoE kernels: 16-byte cp.async with zero-fill, ldmatrix and the FP8 m16n8k32 MMA
// (shared with split_kv_decode, from common/ptx.cuh), the saturating RNE FP32 -> e4m3 pair conversion, and the
// transposing stmatrix of the wgmma epilogue.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

#include "common/ptx.cuh"

namespace hp_moe {

using hp::cp_async16;
using hp::cp_async4;
using hp::cp_commit;
using hp::cp_wait;
using hp::ldmatrix_x4;

// D = A (16x32 e4m3, row) * B (32x8 e4m3, col) + C, fp32.
__device__ __forceinline__ void mma_e4m3(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  hp::mma_e4m3_16832(c, a, b0, b1);
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

// Four 8 x 8 bf16 matrices from the mma accumulator fragment (thread l holds row l / 4, columns 2 (l % 4) and + 1
// of each, packed low / high in r0..r3) stored transposed: lane 8 i + k gives the address of row k of matrix i's
// transpose (16 bytes = column k of the fragment matrix).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// Two floats -> one bf16x2 word (lo in the low half), each rounded to nearest even as __float2bfloat16_rn.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
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
