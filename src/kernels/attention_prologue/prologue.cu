// Fused attention prologue for sm_90a: one pass over the QKV projection output does, per (token, head), QK-Norm
// (RMSNorm per head), RoPE (neox or interleaved, full or partial), Q to FP8 e4m3 with a per-token-per-head scale
// (or a static scale, or BF16), and K/V into the paged cache (FP8 with per-tensor scales, or BF16) at their slots.
//
// Launch shape: one group of G = head_dim / 8 lanes per (token, head) unit (8, 16 or 32 lanes for head_dim 64, 128,
// 256), every lane holding 8 consecutive elements (one 16-byte bf16 load); units are numbered token-major over the
// q_heads + 2*kv_heads heads of a token, 128 threads per CTA, one unit per lane group. (Deeper per-thread queues
// (2-8 units per group, all loads issued first) and reading the step's parameters before the PDL wait were measured
// and lost or changed nothing: docs/ops/attention_prologue.md.) The pair and tokwarp2 variants below change the
// launch shape and the load schedule, never the per-unit arithmetic or the bytes written.
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
// whole grid's completion and memory flush, so no trigger position can let it read Q, q_scale or a cache row early):
// 0 none, 1 right after the wait. Not "after the loads": every point after them also follows the first use of a
// loaded value (the position that addresses cos/sin, the static scales' reciprocals), so a trigger there waited one
// memory round trip for nothing.
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
  int trigger;  // 0 none, 1 right after the PDL wait
};

__device__ __forceinline__ uint16_t fp8x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));  // first source -> upper byte
  return r;
}

__device__ __forceinline__ void store_bf16x8(void* dst, const float* x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

// x * inv_scale to e4m3 (one fp32 rounding, then RNE, saturating), 8 bytes.
__device__ __forceinline__ void store_fp8x8(void* dst, const float* x, float inv_scale) {
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

// One (token, head) unit: where it is.
struct Unit {
  int t, h, kind;  // kind 0 Q, 1 K, 2 V (the host keeps tokens * heads < 2^31)
  bool active, qk;
};

__device__ __forceinline__ Unit make_unit(const Params& p, int t, int h, bool active) {
  Unit u;
  u.active = active;
  u.t = active ? t : 0;
  u.h = active ? h : 0;
  u.kind = u.h < p.q_heads ? 0 : (u.h < p.q_heads + p.kv_heads ? 1 : 2);
  u.qk = active && u.kind < 2;
  return u;
}

// Unit number `unit` of the token-major numbering (token * heads + head); inactive past the last. 32-bit index
// math (a 64-bit division is a long software sequence; the host keeps tokens * heads < 2^31).
__device__ __forceinline__ Unit unit_at(const Params& p, unsigned unit, int heads) {
  const unsigned units = unsigned(p.tokens) * unsigned(heads);
  const unsigned v = unit < units ? unit : 0u;
  const unsigned t = v / unsigned(heads);
  return make_unit(p, int(t), int(v - t * unsigned(heads)), unit < units);
}

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

// four consecutive floats of a 16-byte aligned row into a[0..3]
__device__ __forceinline__ void load_f4(const float* src, float* a) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  a[0] = v.x;
  a[1] = v.y;
  a[2] = v.z;
  a[3] = v.w;
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
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      load_f4(row + base + 4 * k, r.c + 4 * k);
      load_f4(row + hr + base + 4 * k, r.s + 4 * k);
    }
  } else {
    load_f4(row + sub * 4, r.c);
    load_f4(row + hr + sub * 4, r.s);
  }
}

// The static scales (read once per thread) and their reciprocals; Q's dynamic scale is taken per unit in
// write_unit.
struct Scales {
  float q_static, q_static_inv, k_inv, v_inv;
};

__device__ __forceinline__ Scales load_scales(const Params& p) {
  float k_scale = 1.f, v_scale = 1.f;
  Scales sc;
  sc.q_static = 1.f;
  if (p.kv_fp8) k_scale = *p.k_scale, v_scale = *p.v_scale;
  if (p.q_mode == 1) sc.q_static = *p.q_scale_static;
  sc.k_inv = __frcp_rn(k_scale);
  sc.v_inv = __frcp_rn(v_scale);
  sc.q_static_inv = __frcp_rn(sc.q_static);
  return sc;
}

// Writes the lane's N chunks of a unit (x[8n..8n+7] is the head's chunk chunk[n], elements chunk[n]*8 ..): Q (FP8
// with the head's scale from `amax`, q_scale written by the `lead` lane, or BF16) or the cache row at `slot` (pads
// and out-of-range slots skipped).
template <int D, int N>
__device__ __forceinline__ void write_unit(const Params& p, const Unit& u, long long slot, float amax, const Scales& sc,
                                           bool lead, const float (&x)[N * kElems], const int (&chunk)[N]) {
  if (!u.active) return;
  const long long t = u.t;  // 64-bit offsets below
  long long off;            // element offset of the head's row
  void* dst;
  bool fp8;
  float inv = 1.f;
  if (u.kind == 0) {
    const long long row = t * p.q_heads + u.h;
    off = row * D;
    dst = p.q_out;
    fp8 = p.q_mode != 2;
    if (fp8) {
      const bool dyn = p.q_mode == 0;
      // floored at the smallest normal float so its reciprocal stays finite (0 * inf would be NaN)
      const float scale = dyn ? (amax > 0.f ? fmaxf(__fdiv_rn(amax, 448.f), 1.17549435e-38f) : 1.f) : sc.q_static;
      inv = dyn ? __frcp_rn(scale) : sc.q_static_inv;
      if (lead) p.q_scale[row] = scale;
    }
  } else {
    long long sl = slot;
    if (sl >= p.cache_slots) sl = -1;  // host validates; an out-of-range slot is never written
    if (sl < 0) return;
    const int hk = u.kind == 1 ? u.h - p.q_heads : u.h - p.q_heads - p.kv_heads;
    off = (sl * p.kv_heads + hk) * D;
    dst = u.kind == 1 ? p.k_cache : p.v_cache;
    fp8 = p.kv_fp8 != 0;
    inv = u.kind == 1 ? sc.k_inv : sc.v_inv;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const long long o = off + chunk[n] * kElems;
    if (fp8) {
      store_fp8x8(static_cast<uint8_t*>(dst) + o, x + n * kElems, inv);
    } else {
      store_bf16x8(static_cast<__nv_bfloat16*>(dst) + o, x + n * kElems);
    }
  }
}

template <int G, int N>
__device__ __forceinline__ float head_amax(const float (&x)[N]) {
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < N; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return amax;
}

// Variant baseline: one (token, head) unit per lane group of G = D/8 lanes, 8 consecutive elements per lane; its
// qkv row (the HBM bytes), position and slot are loaded first, then the norm weight and the cos/sin row
// (L1/L2-resident after the first unit of a token) that depend on the position.
template <int D>
__global__ void __launch_bounds__(kThreads) prologue_kernel(const Params p) {
  constexpr int G = D / kElems;
  constexpr int kUnitsPerChunk = kThreads / G;
  const int heads = p.q_heads + 2 * p.kv_heads;
  const int sub = int(threadIdx.x % G);
  const Unit u = unit_at(p, blockIdx.x * kUnitsPerChunk + threadIdx.x / G, heads);

  hp::pdl_wait();                                   // everything read below may be written by the previous kernel
  if (p.trigger == 1) hp::pdl_launch_dependents();  // as early as is safe: header, "PDL"
  // every independent load first: qkv, position, slot
  const uint4 xr = u.active ? *reinterpret_cast<const uint4*>(p.qkv + ((long long)u.t * heads + u.h) * D + sub * kElems)
                            : make_uint4(0, 0, 0, 0);
  const int pos = u.qk ? load_pos(p, u.t) : 0;
  const long long slot = u.active && u.kind > 0 ? p.slots[u.t] : -1;
  const Scales sc = load_scales(p);
  RopeIn cur;
  load_rope_inputs(p, u, pos, sub, cur);

  const bool interleaved = p.interleaved != 0;
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
  const float amax = head_amax<G>(x);  // every lane shuffles; only Q units use it
  const int chunk[1] = {sub};
  write_unit<D, 1>(p, u, slot, amax, sc, sub == 0, x, chunk);
}

// ---------------------------------------------------------------------------------------------------------------
// Pair layout (variants pair and tokwarp): lane `sub` of a group of P = D/16 lanes holds two 8-element chunks, ca
// and cb = ca | m (16 elements, two 16-byte loads), with m = rotary_dim/16 for neox (a chunk of the first rotary
// half and its partner in the second: the rotation needs no shuffle) and 1 for interleaved (16 consecutive
// elements, pairs inside a chunk); chunks past rotary_dim pair the same way and pass through. ca has bit m clear:
// the lane index is ca with that bit squeezed out. Neox needs m a power of two (every full rotary, and partial
// ones such as 64 of 128); the host runs the baseline kernel otherwise.
__device__ __forceinline__ int pair_chunk(int sub, int m) {
  return (sub & (m - 1)) | ((sub & ~(m - 1)) << 1);
}

// The lane's 8 angles (neox: those of chunk ca, shared with cb; interleaved: 4 for ca then 4 for cb, contiguous);
// zeros for lanes past rotary_dim.
struct PairAngles {
  float c[kElems], s[kElems];
};

__device__ __forceinline__ bool pair_rotated(const Params& p, int ca, int m) {
  return p.interleaved ? ca * kElems < p.rot : ca < m;
}

__device__ __forceinline__ void load_pair_angles(const Params& p, bool use, int pos, int ca, int m, PairAngles& r) {
#pragma unroll
  for (int e = 0; e < kElems; ++e) r.c[e] = r.s[e] = 0.f;
  if (!use || !pair_rotated(p, ca, m)) return;
  const float* row = p.cos_sin + (long long)pos * p.rot + (p.interleaved ? ca * 4 : ca * kElems);
  const int hr = p.rot / 2;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    load_f4(row + 4 * k, r.c + 4 * k);
    load_f4(row + hr + 4 * k, r.s + 4 * k);
  }
}

// The emulation's sum of squares (per chunk 8 in sequence, then the xor butterfly over the D/8 chunks, offsets
// NC/2 .. 1) in the pair layout: chunk offsets above m combine both partial sums with lane offset o/2, offset m is
// the lane's own two chunks, offsets below m the merged sum with lane offset o. Same tree, same bits.
template <int NC>
__device__ __forceinline__ float pair_sum(float a, float b, int m) {
#pragma unroll
  for (int o = NC / 2; o >= 1; o /= 2) {
    if (o > m) {  // m is grid-uniform: every branch runs on the whole warp
      a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, o / 2));
      b = __fadd_rn(b, __shfl_xor_sync(0xffffffffu, b, o / 2));
    } else if (o == m) {
      a = __fadd_rn(a, b);
    } else {
      a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, o));
    }
  }
  return a;
}

template <int NC>
__device__ __forceinline__ void pair_norm(float (&x)[2 * kElems], const float (&w)[2 * kElems], float eps, int m,
                                          bool apply) {
  float a = 0.f, b = 0.f;
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    a = __fadd_rn(a, __fmul_rn(x[i], x[i]));
    b = __fadd_rn(b, __fmul_rn(x[kElems + i], x[kElems + i]));
  }
  const float ss = pair_sum<NC>(a, b, m);
  const float ms = __fmul_rn(ss, 1.0f / float(NC * kElems));
  const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(ms, eps)));
  if (apply) {
#pragma unroll
    for (int i = 0; i < 2 * kElems; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
  }
}

// (a, b) -> (a c - b s, b c + a s), each product and sum rounded once (the emulation's order)
__device__ __forceinline__ void rotate_pair(float& a, float& b, float c, float s) {
  const float a0 = a;
  a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b, s));
  b = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a0, s));
}

// RoPE in the pair layout: neox rotates (x[i], x[8+i]) by angle i, interleaved (x[2j], x[2j+1]) by angle j; the
// baseline's operations in the same order.
__device__ __forceinline__ void pair_rope(float (&x)[2 * kElems], const PairAngles& r, bool interleaved, bool apply) {
  if (!apply) return;
  // two loops, not a runtime index: x must stay in registers
  if (interleaved) {
#pragma unroll
    for (int j = 0; j < kElems; ++j) rotate_pair(x[2 * j], x[2 * j + 1], r.c[j], r.s[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kElems; ++j) rotate_pair(x[j], x[kElems + j], r.c[j], r.s[j]);
  }
}

// Norm, RoPE (either order) and the Q amax of one unit in the pair layout. w_raw: the lane's two chunks of the
// norm weight (bf16).
template <int D>
__device__ __forceinline__ float pair_compute(const Params& p, float (&x)[2 * kElems], const uint4 (&w_raw)[2],
                                              const PairAngles& r, int m, bool qk, bool rotated) {
  constexpr int NC = D / kElems;
  float w[2 * kElems];
  unpack8(w_raw[0], *reinterpret_cast<float (*)[kElems]>(w));
  unpack8(w_raw[1], *reinterpret_cast<float (*)[kElems]>(w + kElems));
  const bool interleaved = p.interleaved != 0;
  if (p.rope_first) {
    pair_rope(x, r, interleaved, qk && rotated);
    pair_norm<NC>(x, w, p.eps, m, qk);
  } else {
    pair_norm<NC>(x, w, p.eps, m, qk);
    pair_rope(x, r, interleaved, qk && rotated);
  }
  return head_amax<D / (2 * kElems)>(x);
}

__device__ __forceinline__ void load_pair(const __nv_bfloat16* row, int ca, int cb, uint4 (&raw)[2]) {
  raw[0] = *reinterpret_cast<const uint4*>(row + ca * kElems);
  raw[1] = *reinterpret_cast<const uint4*>(row + cb * kElems);
}

__device__ __forceinline__ void unpack16(const uint4 (&raw)[2], float (&x)[2 * kElems]) {
  unpack8(raw[0], *reinterpret_cast<float (*)[kElems]>(x));
  unpack8(raw[1], *reinterpret_cast<float (*)[kElems]>(x + kElems));
}

// Bytes in flight per SM (H200 wants ~30-40 KB): the baseline at 54 registers runs 9 CTAs x 128 threads x 16 B =
// 18 KB of qkv loads; pair at 68 registers 7 x 128 x 32 B = 28 KB (a cap at 64 registers spills); tokwarp at <= 128
// registers (depth 2) 4 CTAs = 16 warps x 32 lanes x 64 B = 32 KB, at <= 168 (depth 4) 3 CTAs x 128 x 128 B = 48 KB.
// Variant pair: the baseline's grid (one (token, head) unit per lane group, units token-major) in the pair layout:
// D/16 lanes per unit with two 16-byte qkv loads each (twice the bytes in flight per thread), no RoPE shuffles, and
// half the cos/sin loads per element (a lane's 8 angles serve its 16 elements).
template <int D>
__global__ void __launch_bounds__(kThreads) pair_kernel(const Params p) {
  constexpr int P = D / (2 * kElems);
  constexpr int kUnitsPerCta = kThreads / P;
  const int heads = p.q_heads + 2 * p.kv_heads;
  const int sub = int(threadIdx.x % P);
  const int m = p.interleaved ? 1 : p.rot / 16;
  const int ca = pair_chunk(sub, m), cb = ca | m;
  const Unit u = unit_at(p, blockIdx.x * kUnitsPerCta + threadIdx.x / P, heads);

  hp::pdl_wait();                                   // everything read below may be written by the previous kernel
  if (p.trigger == 1) hp::pdl_launch_dependents();  // as early as is safe: header, "PDL"
  uint4 xr[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (u.active) load_pair(p.qkv + ((long long)u.t * heads + u.h) * D, ca, cb, xr);
  const int pos = u.qk ? load_pos(p, u.t) : 0;
  const long long slot = u.active && u.kind > 0 ? p.slots[u.t] : -1;
  const Scales sc = load_scales(p);
  uint4 wr[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  PairAngles ang;
  if (u.qk) load_pair(u.kind == 0 ? p.q_norm_w : p.k_norm_w, ca, cb, wr);
  load_pair_angles(p, u.qk, pos, ca, m, ang);

  float x[2 * kElems];
  unpack16(xr, x);
  const float amax = pair_compute<D>(p, x, wr, ang, m, u.qk, pair_rotated(p, ca, m));
  const int chunk[2] = {ca, cb};
  write_unit<D, 2>(p, u, slot, amax, sc, sub == 0, x, chunk);
}

// Variant tokwarp: one warp per token, in the pair layout, 32/P head slots per pass over the token's heads. What
// depends on the token alone is read once per warp and reused by all its heads: position, slot, the lane's 8
// cos/sin angles (16 registers) and both norm weights (read once per thread). The qkv loads run kDepth passes
// ahead (a ring of kDepth x 32 bytes per thread, refilled as each pass is unpacked), so a thread keeps up to
// kDepth x 32 bytes in flight instead of the baseline's 16.
template <int D, int kDepth>
__global__ void __launch_bounds__(kThreads, kDepth <= 2 ? 4 : 3) token_warp_kernel(const Params p) {
  constexpr int P = D / (2 * kElems);
  constexpr int kSlots = 32 / P;
  constexpr int kWarps = kThreads / 32;
  const int heads = p.q_heads + 2 * p.kv_heads;
  const int passes = (heads + kSlots - 1) / kSlots;
  const int lane = int(threadIdx.x % 32);
  const int hslot = lane / P, sub = lane % P;
  const int m = p.interleaved ? 1 : p.rot / 16;
  const int ca = pair_chunk(sub, m), cb = ca | m;
  const long long t = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= p.tokens) return;  // the whole warp: no shuffle or barrier is left behind

  hp::pdl_wait();                                   // everything read below may be written by the previous kernel
  if (p.trigger == 1) hp::pdl_launch_dependents();  // as early as is safe: header, "PDL"
  const __nv_bfloat16* row = p.qkv + t * heads * D;
  uint4 ring[kDepth][2];
#pragma unroll
  for (int k = 0; k < kDepth; ++k) {
    const int h = k * kSlots + hslot;
    ring[k][0] = ring[k][1] = make_uint4(0, 0, 0, 0);
    if (h < heads) load_pair(row + (long long)h * D, ca, cb, ring[k]);
  }
  const int pos = load_pos(p, int(t));
  const long long slot = p.slots[t];
  const Scales sc = load_scales(p);
  uint4 qw[2], kw[2];
  load_pair(p.q_norm_w, ca, cb, qw);
  load_pair(p.k_norm_w, ca, cb, kw);
  PairAngles ang;
  load_pair_angles(p, true, pos, ca, m, ang);
  const bool rotated = pair_rotated(p, ca, m);

  for (int base = 0; base < passes; base += kDepth) {
#pragma unroll
    for (int k = 0; k < kDepth; ++k) {
      const int pass = base + k;
      if (pass >= passes) continue;  // warp-uniform
      const int h = pass * kSlots + hslot;
      const Unit u = make_unit(p, int(t), h, h < heads);
      float x[2 * kElems];
      unpack16(ring[k], x);
      const int next = (pass + kDepth) * kSlots + hslot;
      if (next < heads) load_pair(row + (long long)next * D, ca, cb, ring[k]);
      // both weights held in registers, not re-read per pass: re-reading them here (108 instead of 122 registers,
      // 4 CTAs per SM either way) measured 70.5 / 255.8 us at 4K / 16K tokens of 64q/8kv against 60.2 / 214.7 held,
      // most likely because a load issued after the refill above is answered only behind that refill's round trip
      uint4 wr[2];
      wr[0] = u.kind == 0 ? qw[0] : kw[0];
      wr[1] = u.kind == 0 ? qw[1] : kw[1];
      const float amax = pair_compute<D>(p, x, wr, ang, m, u.qk, rotated);
      const int chunk[2] = {ca, cb};
      write_unit<D, 2>(p, u, u.kind > 0 ? slot : -1, amax, sc, sub == 0, x, chunk);
    }
  }
}

template <int D>
int launch_d(const Params& p, int variant, int pdl, cudaStream_t stream) {
  const long long heads = p.q_heads + 2 * p.kv_heads;
  const long long units = p.tokens * heads;
  if (units > 0x7fffffffLL) return int(cudaErrorInvalidValue);  // the kernels index units in 32 bits
  // the pair layout pairs chunk c with c | rot/16 (neox): rot/16 must be a power of two
  const int m = p.interleaved ? 1 : p.rot / 16;
  if ((m & (m - 1)) != 0) variant = 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  if (variant == 2) {
    const dim3 grid(unsigned((p.tokens + kThreads / 32 - 1) / (kThreads / 32)));
    return int(hp::launch(token_warp_kernel<D, 2>, grid, dim3(kThreads), 0, stream, opt, p));
  }
  const long long per_cta = variant == 1 ? kThreads / (D / (2 * kElems)) : kThreads / (D / kElems);
  const long long blocks = (units + per_cta - 1) / per_cta;
  if (variant == 1) return int(hp::launch(pair_kernel<D>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, opt, p));
  return int(hp::launch(prologue_kernel<D>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, opt, p));
}

}  // namespace

// variant: 0 baseline (one unit per D/8 lanes), 1 pair (one unit per D/16 lanes, rotate-half pairs in a lane),
// 2 tokwarp2 (one warp per token, pair layout, qkv loads 2 passes ahead; 4 passes ahead was never faster: 3 CTAs
// per SM at 149 registers); 1-2 run the baseline for neox with rotary_dim/16 not a power of two.
extern "C" int hp_attention_prologue(const void* qkv, const void* q_norm_w, const void* k_norm_w, const void* cos_sin,
                                     const void* positions, int pos64, const void* slots, void* k_cache, void* v_cache,
                                     void* q_out, void* q_scale, const void* q_scale_static, const void* k_scale,
                                     const void* v_scale, long long tokens, int q_heads, int kv_heads, int head_dim,
                                     int rot, long long cache_slots, int max_pos, float eps, int rope_first,
                                     int interleaved, int q_mode, int kv_fp8, int pdl, int trigger, int variant,
                                     void* stream) {
  if (tokens <= 0) return 0;
  if (variant < 0 || variant > 2) return int(cudaErrorInvalidValue);
  // one aggregate in the struct's field order
  const Params p{static_cast<const __nv_bfloat16*>(qkv),
                 static_cast<const __nv_bfloat16*>(q_norm_w),
                 static_cast<const __nv_bfloat16*>(k_norm_w),
                 static_cast<const float*>(cos_sin),
                 positions,
                 static_cast<const int64_t*>(slots),
                 k_cache,
                 v_cache,
                 q_out,
                 static_cast<float*>(q_scale),
                 static_cast<const float*>(q_scale_static),
                 static_cast<const float*>(k_scale),
                 static_cast<const float*>(v_scale),
                 tokens,
                 q_heads,
                 kv_heads,
                 rot,
                 max_pos,
                 cache_slots,
                 eps,
                 rope_first,
                 interleaved,
                 q_mode,
                 kv_fp8,
                 pos64,
                 trigger};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (head_dim) {
    case 64:
      return launch_d<64>(p, variant, pdl, s);
    case 128:
      return launch_d<128>(p, variant, pdl, s);
    case 256:
      return launch_d<256>(p, variant, pdl, s);
    default:
      return int(cudaErrorInvalidValue);
  }
}
