// Fused attention prologue for sm_90a: one pass over the QKV projection output does, per (token, head), QK-Norm
// (RMSNorm per head), RoPE (neox or interleaved, full or partial), Q to FP8 e4m3 with a per-token-per-head scale
// (or a static scale, or BF16), and K/V into the paged cache (FP8 with per-tensor scales, or BF16) at their slots.
//
// Launch shape: one group of G = head_dim / 8 lanes per (token, head) unit (8, 16 or 32 lanes for head_dim 64, 128,
// 256), every lane holding 8 consecutive elements (one 16-byte bf16 load); units are numbered token-major over the
// q_heads + 2*kv_heads heads of a token, 128 threads per CTA, one unit per lane group. (Deeper per-thread queues
// (2-8 units per group, all loads issued first) and reading the step's parameters before the PDL wait were measured
// and lost or changed nothing: docs/ops/attention_prologue.md.)
// Reductions (sum of squares, amax) are xor butterflies inside the group; neox RoPE takes its partner's 8 elements
// with one indexed shuffle per element (partner lane +-rotary_dim/16); interleaved pairs are adjacent inside a lane.
// Why a lane group per head and not a warp per head or a CTA per token: a warp per head at head_dim 128 gives each
// lane 4 elements (8-byte loads) and at 64 only 2; 16-byte accesses need 8 elements per lane, which fixes the group
// at head_dim / 8 lanes. A CTA per token would put every head of a token on one SM and make decode (1-64 tokens)
// use 1-64 SMs; small units spread the few decode tokens over more SMs and keep every shuffle inside a warp with no
// shared memory and no __syncthreads. Q, K and V units share one code path (V skips the arithmetic by a select), so
// every shuffle runs with the full mask in uniform control flow.
// Traffic: qkv read once (bf16), the cos/sin row and the norm weight per Q/K unit (L2-resident after the first),
// Q (+ scale) written once, K and V written once at their slot (pads skipped).
// Precision: fp32, every multiply / add rounded once (__fmul_rn etc.: no FMA contraction), the sum of squares in a
// fixed order (8 per lane in sequence, then the butterfly), one IEEE sqrt and one correctly rounded reciprocal per
// head for the norm; FP8 is cvt.rn.satfinite.e4m3x2.f32 of x * fp32(1/scale), the reciprocal taken once per
// (token, head) for Q's dynamic scale and once per thread for the static scales (a per-element IEEE division was
// most of the per-element work). hotpaths.reference.attention_prologue.attention_prologue_emulation computes the
// same bits on the CPU.
// PDL: griddepcontrol.wait before reading anything (qkv, slots and the caches may be written by the predecessor).
// Trigger (launch_dependents: the decode kernel launched next may be scheduled; its own wait still waits for this
// grid's completion and memory flush): 0 none, 1 after the loads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/launch.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kElems = 8;  // elements per lane: one 16-byte bf16 access

struct Params {
  const __nv_bfloat16* qkv;       // [T, (Hq + 2 Hkv) * D]
  const __nv_bfloat16* q_norm_w;  // [D]
  const __nv_bfloat16* k_norm_w;  // [D]
  const float* cos_sin;           // [max_pos, rot]
  const void* positions;          // [T] int32 or int64
  const int64_t* slots;           // [T]
  void* k_cache;                  // [pages, page_size, Hkv, D] fp8 or bf16
  void* v_cache;
  void* q_out;                  // [T, Hq, D] fp8 or bf16
  float* q_scale;               // [T, Hq] (fp8 Q) or null
  const float* q_scale_static;  // [1] or null
  const float* k_scale;         // [1] (fp8 cache) or null
  const float* v_scale;
  long long tokens;
  int q_heads, kv_heads, rot, max_pos;
  long long cache_slots;  // num_pages * page_size
  float eps;
  int rope_first;   // 0: norm then RoPE (Hy3), 1: RoPE then norm
  int interleaved;  // 0: neox (rotate half), 1: interleaved pairs
  int q_mode;       // 0: fp8 computed scale, 1: fp8 static scale, 2: bf16
  int kv_fp8;
  int pos64;
  int trigger;  // 0 none, 1 after the loads
};

__device__ __forceinline__ uint16_t fp8x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));  // first source -> upper byte
  return r;
}

__device__ __forceinline__ void store_bf16x8(void* dst, const float (&x)[kElems]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

// x * inv_scale to e4m3 (one fp32 rounding, then RNE, saturating), 8 bytes.
__device__ __forceinline__ void store_fp8x8(void* dst, const float (&x)[kElems], float inv_scale) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint16_t a = fp8x2(__fmul_rn(x[4 * i], inv_scale), __fmul_rn(x[4 * i + 1], inv_scale));
    const uint16_t b = fp8x2(__fmul_rn(x[4 * i + 2], inv_scale), __fmul_rn(x[4 * i + 3], inv_scale));
    w[i] = uint32_t(a) | (uint32_t(b) << 16);
  }
  *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

// RMSNorm of the head held by the G lanes: sum of squares 8-in-sequence then xor butterfly (the emulation's order).
// Every lane runs the shuffles; `apply` only selects whether x changes (V units pass through).
template <int G>
__device__ __forceinline__ void rms_norm(float (&x)[kElems], const float (&w)[kElems], float eps, bool apply) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kElems; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
  const float ms = __fmul_rn(ss, 1.0f / float(G * kElems));     // 1/D exact: D is a power of two
  const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(ms, eps)));  // = __fdiv_rn(1, .): both correctly rounded
  if (apply) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
  }
}

// RoPE on the lane's 8 elements. neox: lane `sub` < rot/16 holds first-half elements, its partner sub + rot/16 the
// matching second-half ones; lanes at or past rot/8 pass through. interleaved: pairs (2j, 2j+1) inside the lane,
// angles j = sub*4 .. sub*4+3. c/s hold this lane's 8 (neox) or 4 (interleaved) angles.
template <int G>
__device__ __forceinline__ void rope(float (&x)[kElems], const float (&c)[kElems], const float (&s)[kElems], int sub,
                                     int rot, bool interleaved, bool apply) {
  if (!interleaved) {  // grid-uniform branch: the shuffles below run on every lane of the warp
    const int half_lanes = rot / 16;
    const bool first = sub < half_lanes;
    const bool rotated = sub < 2 * half_lanes;
    const int partner = rotated ? (first ? sub + half_lanes : sub - half_lanes) : sub;
    const int src = (threadIdx.x & 31 & ~(G - 1)) | partner;
    float y[kElems];
#pragma unroll
    for (int i = 0; i < kElems; ++i) y[i] = __shfl_sync(0xffffffffu, x[i], src);
    if (apply && rotated) {
#pragma unroll
      for (int i = 0; i < kElems; ++i)
        x[i] = first ? __fsub_rn(__fmul_rn(x[i], c[i]), __fmul_rn(y[i], s[i]))
                     : __fadd_rn(__fmul_rn(x[i], c[i]), __fmul_rn(y[i], s[i]));
    }
  } else if (apply && sub * kElems < rot) {
#pragma unroll
    for (int j = 0; j < kElems / 2; ++j) {
      const float a = x[2 * j], b = x[2 * j + 1];
      x[2 * j] = __fsub_rn(__fmul_rn(a, c[j]), __fmul_rn(b, s[j]));
      x[2 * j + 1] = __fadd_rn(__fmul_rn(b, c[j]), __fmul_rn(a, s[j]));
    }
  }
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&x)[kElems]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// One (token, head) unit of this lane group: where it is.
struct Unit {
  int t, h, kind;  // kind 0 Q, 1 K, 2 V (the host keeps tokens * heads < 2^31)
  bool active, qk;
};

// What RoPE and the norm need for one unit: the norm weight (raw bf16) and the lane's cos/sin angles.
struct RopeIn {
  uint4 w;
  float c[kElems], s[kElems];
};

__device__ __forceinline__ int load_pos(const Params& p, int t) {
  const long long pos =
      p.pos64 ? static_cast<const int64_t*>(p.positions)[t] : (long long)static_cast<const int32_t*>(p.positions)[t];
  return int(pos < 0 ? 0 : (pos >= p.max_pos ? p.max_pos - 1 : pos));  // host validates; never read out of bounds
}

// norm weight, and the cos/sin row of `pos` (the lane's 8 neox angles or 4 interleaved ones); lanes that use none
// of them (V units, lanes past rotary_dim) keep zeros
__device__ __forceinline__ void load_rope_inputs(const Params& p, const Unit& u, int pos, int sub, RopeIn& r) {
  r.w = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int e = 0; e < kElems; ++e) r.c[e] = r.s[e] = 0.f;
  if (!u.qk) return;
  r.w = *reinterpret_cast<const uint4*>((u.kind == 0 ? p.q_norm_w : p.k_norm_w) + sub * kElems);
  const float* row = p.cos_sin + (long long)pos * p.rot;
  const int hr = p.rot / 2;
  if (sub * kElems >= p.rot) return;
  if (!p.interleaved) {
    const int base = sub * kElems < hr ? sub * kElems : sub * kElems - hr;
    const float4* cp = reinterpret_cast<const float4*>(row + base);
    const float4* sp = reinterpret_cast<const float4*>(row + hr + base);
    const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
    r.c[0] = c0.x;
    r.c[1] = c0.y;
    r.c[2] = c0.z;
    r.c[3] = c0.w;
    r.c[4] = c1.x;
    r.c[5] = c1.y;
    r.c[6] = c1.z;
    r.c[7] = c1.w;
    r.s[0] = s0.x;
    r.s[1] = s0.y;
    r.s[2] = s0.z;
    r.s[3] = s0.w;
    r.s[4] = s1.x;
    r.s[5] = s1.y;
    r.s[6] = s1.z;
    r.s[7] = s1.w;
  } else {
    const float4 c0 = *reinterpret_cast<const float4*>(row + sub * 4);
    const float4 s0 = *reinterpret_cast<const float4*>(row + hr + sub * 4);
    r.c[0] = c0.x;
    r.c[1] = c0.y;
    r.c[2] = c0.z;
    r.c[3] = c0.w;
    r.s[0] = s0.x;
    r.s[1] = s0.y;
    r.s[2] = s0.z;
    r.s[3] = s0.w;
  }
}

// One (token, head) unit per lane group: its qkv row (the HBM bytes), position and slot are loaded first, then the
// norm weight and the cos/sin row (L1/L2-resident after the first unit of a token) that depend on the position.
template <int D>
__global__ void __launch_bounds__(kThreads) prologue_kernel(const Params p) {
  constexpr int G = D / kElems;
  constexpr int kUnitsPerChunk = kThreads / G;
  const int heads = p.q_heads + 2 * p.kv_heads;
  const unsigned units = unsigned(p.tokens) * unsigned(heads);  // < 2^31: the host checks
  const int sub = int(threadIdx.x % G);
  Unit u;
  {
    // 32-bit index math (a 64-bit division is a long software sequence)
    const unsigned unit = blockIdx.x * kUnitsPerChunk + threadIdx.x / G;
    u.active = unit < units;
    const unsigned v = u.active ? unit : 0u;
    u.t = int(v / unsigned(heads));
    u.h = int(v - unsigned(u.t) * unsigned(heads));
    u.kind = u.h < p.q_heads ? 0 : (u.h < p.q_heads + p.kv_heads ? 1 : 2);
    u.qk = u.active && u.kind < 2;
  }

  const bool kv_fp8 = p.kv_fp8 != 0;
  float k_scale = 1.f, v_scale = 1.f, q_static = 1.f;
  hp::pdl_wait();  // everything read below may be written by the previous kernel
  // every independent load first: qkv, position, slot
  const uint4 xr = u.active ? *reinterpret_cast<const uint4*>(p.qkv + ((long long)u.t * heads + u.h) * D + sub * kElems)
                            : make_uint4(0, 0, 0, 0);
  const int pos = u.qk ? load_pos(p, u.t) : 0;
  const long long slot = u.active && u.kind > 0 ? p.slots[u.t] : -1;
  // the static scales, their reciprocals taken once per thread below
  if (kv_fp8) k_scale = *p.k_scale, v_scale = *p.v_scale;
  if (p.q_mode == 1) q_static = *p.q_scale_static;
  RopeIn cur;
  load_rope_inputs(p, u, pos, sub, cur);
  if (p.trigger == 1) hp::pdl_launch_dependents();

  const bool interleaved = p.interleaved != 0;
  const float k_inv = __frcp_rn(k_scale), v_inv = __frcp_rn(v_scale), q_static_inv = __frcp_rn(q_static);
  float x[kElems], w[kElems];
  unpack8(xr, x);
  unpack8(cur.w, w);
  const bool qk = u.qk;
  if (p.rope_first) {
    rope<G>(x, cur.c, cur.s, sub, p.rot, interleaved, qk);
    rms_norm<G>(x, w, p.eps, qk);
  } else {
    rms_norm<G>(x, w, p.eps, qk);
    rope<G>(x, cur.c, cur.s, sub, p.rot, interleaved, qk);
  }
  // Q amax over the head (every lane shuffles; only Q units use it)
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < kElems; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));

  if (!u.active) return;
  const long long t = u.t;  // 64-bit offsets below
  const int h = u.h;
  if (u.kind == 0) {
    const long long row = t * p.q_heads + h;
    if (p.q_mode == 2) {
      store_bf16x8(static_cast<__nv_bfloat16*>(p.q_out) + row * D + sub * kElems, x);
    } else {
      const bool dyn = p.q_mode == 0;
      // floored at the smallest normal float so its reciprocal stays finite (0 * inf would be NaN)
      const float scale = dyn ? (amax > 0.f ? fmaxf(__fdiv_rn(amax, 448.f), 1.17549435e-38f) : 1.f) : q_static;
      const float inv = dyn ? __frcp_rn(scale) : q_static_inv;
      store_fp8x8(static_cast<uint8_t*>(p.q_out) + row * D + sub * kElems, x, inv);
      if (sub == 0) p.q_scale[row] = scale;
    }
  } else {
    long long sl = slot;
    if (sl >= p.cache_slots) sl = -1;  // host validates; an out-of-range slot is never written
    if (sl < 0) return;
    const int hk = u.kind == 1 ? h - p.q_heads : h - p.q_heads - p.kv_heads;
    const long long off = (sl * p.kv_heads + hk) * D + sub * kElems;
    void* cache = u.kind == 1 ? p.k_cache : p.v_cache;
    if (kv_fp8) {
      store_fp8x8(static_cast<uint8_t*>(cache) + off, x, u.kind == 1 ? k_inv : v_inv);
    } else {
      store_bf16x8(static_cast<__nv_bfloat16*>(cache) + off, x);
    }
  }
}

template <int D>
int launch_d(const Params& p, int pdl, cudaStream_t stream) {
  constexpr long long kUnitsPerCta = kThreads / (D / kElems);
  const long long units = p.tokens * (p.q_heads + 2 * p.kv_heads);
  if (units > 0x7fffffffLL) return int(cudaErrorInvalidValue);  // the kernel indexes units in 32 bits
  const long long blocks = (units + kUnitsPerCta - 1) / kUnitsPerCta;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  return int(hp::launch(prologue_kernel<D>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, opt, p));
}

}  // namespace

extern "C" int hp_attention_prologue(const void* qkv, const void* q_norm_w, const void* k_norm_w, const void* cos_sin,
                                     const void* positions, int pos64, const void* slots, void* k_cache, void* v_cache,
                                     void* q_out, void* q_scale, const void* q_scale_static, const void* k_scale,
                                     const void* v_scale, long long tokens, int q_heads, int kv_heads, int head_dim,
                                     int rot, long long cache_slots, int max_pos, float eps, int rope_first,
                                     int interleaved, int q_mode, int kv_fp8, int pdl, int trigger, void* stream) {
  if (tokens <= 0) return 0;
  Params p;
  p.qkv = static_cast<const __nv_bfloat16*>(qkv);
  p.q_norm_w = static_cast<const __nv_bfloat16*>(q_norm_w);
  p.k_norm_w = static_cast<const __nv_bfloat16*>(k_norm_w);
  p.cos_sin = static_cast<const float*>(cos_sin);
  p.positions = positions;
  p.slots = static_cast<const int64_t*>(slots);
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.q_out = q_out;
  p.q_scale = static_cast<float*>(q_scale);
  p.q_scale_static = static_cast<const float*>(q_scale_static);
  p.k_scale = static_cast<const float*>(k_scale);
  p.v_scale = static_cast<const float*>(v_scale);
  p.tokens = tokens;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.rot = rot;
  p.max_pos = max_pos;
  p.cache_slots = cache_slots;
  p.eps = eps;
  p.rope_first = rope_first;
  p.interleaved = interleaved;
  p.q_mode = q_mode;
  p.kv_fp8 = kv_fp8;
  p.pos64 = pos64;
  p.trigger = trigger;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (head_dim) {
    case 64:
      return launch_d<64>(p, pdl, s);
    case 128:
      return launch_d<128>(p, pdl, s);
    case 256:
      return launch_d<256>(p, pdl, s);
    default:
      return int(cudaErrorInvalidValue);
  }
}
