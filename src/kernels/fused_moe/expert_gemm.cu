// Expert GEMMs and the top-k reduce of the fused FP8 MoE.
//
// gate_up: act[s, j] = bf16(silu(g) * u), g/u = rows j and I + j of (e4m3(x[token(s)] / sa) . w13[e]^T) * scales,
//          for every sorted position s of the plan (act is indexed by SORTED position, so a tile's rows are
//          contiguous for the down kernel).
// down:    ybuf[p, h] = bf16((e4m3(act[s] / sa) . w2[e]^T)[h] * scales), written at the ORIGINAL pair index
//          p = sorted_pairs[s], so the reduce reads a token's K slots contiguously.
// reduce:  out[t] = bf16(sum_k w[t,k] * ybuf[t*K+k] over local slots (+ shared_out[t])).
//
// Launch: persistent grids (SMs x resident CTAs of 4 warps) looping over work items (tile, n-tile) read from the
// plan after pdl_wait, each item cut into up to 8 K ranges across CTAs when the items alone leave CTA slots idle
// (split-K, decided on the device from the routed tile count; see kMaxSplit); the reduce is one CTA per token. Traffic: each expert hit reads its weights once per tile
// of block_m pairs (the floor at decode sizes, where an expert has one tile); token rows come from L2.
// Design (DESIGN.md section 4):
//  - "swap AB": the weights fill the 16-row M side of mma.m16n8k32 (row-major, K-contiguous = the weight layout)
//    and the few pairs of an expert ride in N = 8 * NN, so a decode batch with 1-10 rows per expert wastes no
//    tensor-core rows on padding tokens.
//  - occupancy first: one warp group both loads (cp.async 16 B, STAGES deep) and computes; no warp
//    specialisation, several CTAs per SM hide the latency. The 4 warps split each 128-wide K stage into k32 slices
//    (intra-CTA split-K) and sum their accumulators in a fixed order at the end (deterministic), so a CTA's item is
//    a thin slab of weight rows: many items, spread evenly over the SMs.
//  - no gather copy and no quantized activation buffer: token rows are brought as bf16 (cp.async through the
//    routing index) and quantized to e4m3 straight into the B fragments (per-tensor: static scale; block mode:
//    the stage is one 1x128 group, its amax computed from shared memory when the stage lands).
//  - gate and up rows of the same j sit in one item (rows [j, j+BN/2) and [I+j, I+j+BN/2)), so SiLU-and-mul is
//    the epilogue of the gate-up GEMM.
//  - every stage is PDL-chained: each kernel waits (griddepcontrol.wait) before its first dependent read or any
//    write, and lets its successor launch right away.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "common/launch.cuh"
#include "moe_ptx.cuh"
#include "plan_layout.cuh"

namespace hp_moe {

constexpr int kThreads = 128;
constexpr int kBK = 128;             // K elements per pipeline stage = one block-scale group
constexpr int kAStride = kBK + 16;   // bytes per weight row in smem: ldmatrix rows hit distinct bank quads
constexpr int kBStride = 2 * kBK + 32;  // bytes per bf16 token row: 8-byte fragment reads conflict-free

struct GemmArgs {
  const int* ws;
  int num_experts, max_pairs, block_m;
  const uint8_t* w;        // [E, w_rows, kdim] e4m3
  const float* w_scale;    // per-tensor [E]; block [E, ceil(w_rows/128), ceil(kdim/128)]
  const float* a_scale;    // per-tensor activation scale [1] (unused in block mode)
  const __nv_bfloat16* src;  // gate_up: x [T, H]; down: act [max_pairs, I]
  __nv_bfloat16* dst;        // gate_up: act [max_pairs, I]; down: ybuf [max_pairs, H]
  int topk;                // K (pair p -> token p / topk)
  int kdim;                // reduction length: H (gate_up) or I (down)
  int inter;               // I
  int w_rows;              // 2I (gate_up) or H (down)
  int dst_cols;            // I (gate_up) or H (down)
  int* splitk;             // split-K workspace (splitk_layout) or nullptr: never split
};

// Split-K across CTAs (decode sizes, where the items of a launch do not fill its CTA slots): every item's K stages
// are cut into S contiguous ranges, one per work unit; a unit writes its (ROWS x BM) fp32 partial, the LAST unit
// of an item to arrive (per-item counter) sums the S partials in range order (deterministic, whatever the
// arrival order) and runs the epilogue, then puts the counter back to 0, so the workspace is ready for the next
// launch with no memset (CUDA-graph replays included). Workspace: counters[slots] (zeroed once at allocation),
// then partials[slots][ROWS * BM]; slots = the grid's CTA slots, and S > 1 only when items * S <= grid.
constexpr int kMaxSplit = 8;
__host__ __device__ inline int splitk_counter_ints(int slots) { return (slots + 3) & ~3; }  // partials 16-B aligned

template <int MW_, int NN_, bool GATE_UP_, bool BLOCK_>
struct Traits {
  static constexpr int MW = MW_;          // m16 weight tiles per item (gate_up: half gate, half up)
  static constexpr int NN = NN_;          // n8 token tiles per item
  static constexpr int BM = 8 * NN;       // pairs per tile (block_m)
  static constexpr int ROWS = 16 * MW;    // weight rows per item
  static constexpr bool GATE_UP = GATE_UP_;
  static constexpr bool BLOCK = BLOCK_;
  // Deeper pipelines where items are few and long (gate-up at decode sizes: one small tile per expert, K = H):
  // bytes in flight per CTA, not CTAs, are then what the grid lacks. The down GEMM's K (= I) is short, so extra
  // stages would only cost resident CTAs.
  static constexpr int STAGES = GATE_UP ? (NN == 1 ? 8 : NN == 2 ? 6 : 4) : 4;
  static constexpr int A_BYTES = ROWS * kAStride;
  static constexpr int STAGE_BYTES = A_BYTES + BM * kBStride;
  static constexpr int RED_STRIDE = BM + 1;  // floats per reduced row
  static constexpr int RED_BYTES = 4 * ROWS * RED_STRIDE * 4;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  static constexpr int SMEM = (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES);
  // Resident CTAs the shared memory allows (227 KB per SM, 1 KB reserved per CTA), capped at 8: the register
  // budget given to ptxas through __launch_bounds__, so registers never cost a CTA that shared memory admits.
  static constexpr int SMEM_CTAS = (227 * 1024) / (SMEM + 1024 + 2048);
  static constexpr int MIN_CTAS = SMEM_CTAS < 1 ? 1 : (SMEM_CTAS > 8 ? 8 : SMEM_CTAS);
  // rows of the weight matrix an item covers: gate_up n-tile j0 = nt * ROWS/2; down n0 = nt * ROWS
  static constexpr int N_PER_ITEM = GATE_UP ? ROWS / 2 : ROWS;
};

template <class T>
__device__ __forceinline__ int weight_row(int r, int nt, int inter) {
  if constexpr (T::GATE_UP) {
    constexpr int half = T::ROWS / 2;
    const int j0 = nt * half;
    return r < half ? j0 + r : inter + j0 + (r - half);
  } else {
    return nt * T::ROWS + r;
  }
}

// One stage: ROWS weight rows x 128 bytes and the token rows of the occupied n8 blocks (nb of them) x 128 bf16,
// 16-byte cp.async, zero-filled past kdim and for missing rows of an occupied block. Rows of unoccupied blocks are
// neither loaded nor read (every reader stops at nb blocks).
template <class T>
__device__ __forceinline__ void load_stage(const GemmArgs& a, uint8_t* stage, const uint8_t* w_e, const int* row_src,
                                           const int* w_row, int kt, int nb) {
  const int k0 = kt * kBK;
  for (int c = threadIdx.x; c < T::ROWS * 8; c += kThreads) {
    const int r = c >> 3, q = c & 7, kk = k0 + q * 16;
    const bool ok = kk < a.kdim;
    cp_async16(stage + r * kAStride + q * 16, ok ? w_e + (size_t)w_row[r] * a.kdim + kk : w_e, ok);
  }
  uint8_t* bs = stage + T::A_BYTES;
  for (int c = threadIdx.x; c < nb * 8 * 16; c += kThreads) {
    const int n = c >> 4, q = c & 15, kk = k0 + q * 8;
    const int off = row_src[n];
    const bool ok = off >= 0 && kk < a.kdim;
    cp_async16(bs + n * kBStride + q * 16, ok ? a.src + (size_t)off + kk : a.src, ok);
  }
}

// Block mode: the 1x128 group scale of every token row of the stage, max(amax * fp32(1/448), 1e-12): a multiply by
// the rounded reciprocal, NOT the correctly rounded quotient amax / 448. That is what the contract's emulation
// computes on a GPU (torch evaluates `cuda_tensor / python_float` as a times fp32(1 / b)), and the two differ by an
// ulp in about 60% of the groups. An ulp matters: bf16 values over a scale with few significant bits land exactly on
// e4m3 rounding ties (3.6% of the elements when amax = 2.625), a tie resolves differently under the two scales,
// and the next dynamic quantization (act groups) amplifies those single-ulp flips to a 1-3% rel L2 difference.
template <class T>
__device__ __forceinline__ void group_scales(const uint8_t* stage, float* xs, int nb) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint8_t* bs = stage + T::A_BYTES;
  for (int n = warp; n < nb * 8; n += kThreads / 32) {
    const uint2 v = *reinterpret_cast<const uint2*>(bs + n * kBStride + lane * 8);
    const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
    const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
    float m = fmaxf(fmaxf(fabsf(f0.x), fabsf(f0.y)), fmaxf(fabsf(f1.x), fabsf(f1.y)));
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) {
      const float sc = fmaxf(__fmul_rn(m, 1.0f / 448.0f), 1e-12f);
      xs[n] = sc;
      xs[T::BM + n] = recip(sc);
    }
  }
}

// The warp's k32 slice of one stage: B fragments quantized from bf16, A by ldmatrix, MW x nb MMAs. n8 blocks past
// nb hold no token of the tile: skipped (a uniform branch), so a tile sized for the busiest expert costs the others
// no tensor-core or quantization work; their accumulators stay 0 and are never written out.
template <class T>
__device__ __forceinline__ void compute_slice(const uint8_t* stage, const float* xs, float a_s, float a_r, const float (&wsc)[T::MW],
                                              float (&acc)[T::MW][T::NN][4], int nb) {
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const uint8_t* bs = stage + T::A_BYTES;
  uint32_t b0[T::NN], b1[T::NN];
#pragma unroll
  for (int nn = 0; nn < T::NN; ++nn) {
    if (nn >= nb) break;
    const uint8_t* rp = bs + (nn * 8 + g) * kBStride + ks * 64 + tig * 8;
    const float s = T::BLOCK ? xs[nn * 8 + g] : a_s;
    const float r = T::BLOCK ? xs[T::BM + nn * 8 + g] : a_r;
    b0[nn] = quant4(*reinterpret_cast<const uint2*>(rp), s, r);
    b1[nn] = quant4(*reinterpret_cast<const uint2*>(rp + 32), s, r);
  }
#pragma unroll
  for (int mi = 0; mi < T::MW; ++mi) {
    uint32_t af[4];
    ldmatrix_x4(af, stage + (mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kAStride + ks * 32 + (lane >> 4) * 16);
#pragma unroll
    for (int nn = 0; nn < T::NN; ++nn) {
      if (nn >= nb) break;
      if constexpr (T::BLOCK) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        mma_e4m3(t, af, b0[nn], b1[nn]);
        const float s0 = xs[nn * 8 + tig * 2] * wsc[mi], s1 = xs[nn * 8 + tig * 2 + 1] * wsc[mi];
        acc[mi][nn][0] += t[0] * s0;
        acc[mi][nn][1] += t[1] * s1;
        acc[mi][nn][2] += t[2] * s0;
        acc[mi][nn][3] += t[3] * s1;
      } else {
        mma_e4m3(acc[mi][nn], af, b0[nn], b1[nn]);
      }
    }
  }
}

// (g * sigmoid(g)) * u in fp32 with sigmoid = 1 / (1 + exp(-g)) correctly rounded: the contract's
// g * torch.sigmoid(g) * u operation for operation (torch's sigmoid is that division), so the bf16 act agrees with
// the emulation to the accumulation order of g and u. A denominator of +inf (g very negative) gives sigmoid 0.
__device__ __forceinline__ float silu_mul(float g, float u) {
  const float d = 1.0f + expf(-g);
  const float sig = isinf(d) ? 0.0f : div_by(1.0f, d, recip(d));
  return __fmul_rn(__fmul_rn(g, sig), u);
}

template <class T>
__global__ void __launch_bounds__(kThreads, T::MIN_CTAS) expert_gemm_kernel(GemmArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int row_src[T::BM];    // element offset of each token row in src (-1: no row)
  __shared__ int pair_of[T::BM];    // original pair index of each row (down write-back)
  __shared__ int w_row[T::ROWS];
  __shared__ float xs[2 * T::BM];  // block mode: group scale of each row, then its reciprocal
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const int n_tiles = a.w_rows / (T::GATE_UP ? T::ROWS : T::ROWS);  // gate_up: 2I / ROWS = I / (ROWS/2)
  const int num_items = plan.header()[1] * n_tiles;
  const int kt_count = (a.kdim + kBK - 1) / kBK;
  // Split factor from the routed tile count (device data, so one launch serves every batch of a graph): only
  // when the items leave CTA slots idle, at least 2 stages per range, no empty range.
  int split = 1, kps = kt_count;
  if (a.splitk != nullptr && num_items > 0 && num_items < (int)gridDim.x) {
    split = min(min((int)gridDim.x / num_items, kMaxSplit), max(kt_count / 2, 1));
    kps = (kt_count + split - 1) / split;
    split = (kt_count + kps - 1) / kps;
  }
  const int num_units = num_items * split;
  int* counters = a.splitk;
  float* partials = split > 1 ? reinterpret_cast<float*>(a.splitk + splitk_counter_ints(gridDim.x)) : nullptr;
  __shared__ int last_flag;
  const int k_groups = kt_count;
  const int row_groups = (a.w_rows + 127) / 128;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];
  const float a_r = recip(a_s);

  for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x) {
    const int item = unit / split, ks = unit - item * split;
    const int kt0 = ks * kps, nk = min(kt_count, kt0 + kps) - kt0;  // this unit's K stages [kt0, kt0 + nk)
    const int tile = item / n_tiles, nt = item - tile * n_tiles;
    const int e = plan.tile_expert()[tile];
    const int start = plan.tile_start()[tile];
    const int rows = min(T::BM, plan.offsets()[e + 1] - start);
    const int nb = (rows + 7) >> 3;  // occupied n8 token blocks
    const uint8_t* w_e = a.w + (size_t)e * a.w_rows * a.kdim;
    for (int n = tid; n < T::BM; n += kThreads) {
      int off = -1, p = -1;
      if (n < rows) {
        p = plan.sorted()[start + n];
        off = T::GATE_UP ? (p / a.topk) * a.kdim : (start + n) * a.kdim;
      }
      row_src[n] = off;
      pair_of[n] = p;
    }
    for (int r = tid; r < T::ROWS; r += kThreads) w_row[r] = weight_row<T>(r, nt, a.inter);
    __syncthreads();

    float acc[T::MW][T::NN][4];
#pragma unroll
    for (int mi = 0; mi < T::MW; ++mi)
#pragma unroll
      for (int nn = 0; nn < T::NN; ++nn)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mi][nn][c] = 0.f;

#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) {
      if (s < nk) load_stage<T>(a, smem + s * T::STAGE_BYTES, w_e, row_src, w_row, kt0 + s, nb);
      cp_commit();
    }
    for (int li = 0; li < nk; ++li) {
      const int kt = kt0 + li;
      cp_wait<T::STAGES - 2>();
      __syncthreads();
      const uint8_t* stage = smem + (li % T::STAGES) * T::STAGE_BYTES;
      float wsc[T::MW];
#pragma unroll
      for (int mi = 0; mi < T::MW; ++mi) wsc[mi] = 1.0f;
      if constexpr (T::BLOCK) {
        group_scales<T>(stage, xs, nb);
#pragma unroll
        for (int mi = 0; mi < T::MW; ++mi)
          wsc[mi] = a.w_scale[((size_t)e * row_groups + w_row[mi * 16] / 128) * k_groups + kt];
        __syncthreads();
      }
      if (kt * kBK + warp * 32 < a.kdim) compute_slice<T>(stage, xs, a_s, a_r, wsc, acc, nb);
      const int next = li + T::STAGES - 1;
      if (next < nk) load_stage<T>(a, smem + (next % T::STAGES) * T::STAGE_BYTES, w_e, row_src, w_row, kt0 + next, nb);
      cp_commit();
    }
    cp_wait<0>();
    __syncthreads();  // the pipeline buffers become the reduction buffer

    float* red = reinterpret_cast<float*>(smem);
    {
      const int g = lane >> 2, tig = lane & 3;
#pragma unroll
      for (int mi = 0; mi < T::MW; ++mi)
#pragma unroll
        for (int nn = 0; nn < T::NN; ++nn) {
          float* r0 = red + (warp * T::ROWS + mi * 16 + g) * T::RED_STRIDE + nn * 8 + tig * 2;
          float* r8 = r0 + 8 * T::RED_STRIDE;
          r0[0] = acc[mi][nn][0];
          r0[1] = acc[mi][nn][1];
          r8[0] = acc[mi][nn][2];
          r8[1] = acc[mi][nn][3];
        }
    }
    __syncthreads();
    // The 4 warps' k32 partials folded in a fixed order (the result does not depend on scheduling) into warp 0's
    // region: each element is read and rewritten by one thread.
    constexpr int W = T::ROWS * T::RED_STRIDE;
    for (int idx = tid; idx < T::ROWS * T::BM; idx += kThreads) {
      float* p = red + (idx / T::BM) * T::RED_STRIDE + idx % T::BM;
      p[0] = ((p[0] + p[W]) + p[2 * W]) + p[3 * W];
    }
    if (split > 1) {
      constexpr int UNIT = T::ROWS * T::BM;
      float* mine = partials + (size_t)unit * UNIT;  // unit = item * split + ks: an item's ranges are adjacent
      for (int idx = tid; idx < UNIT; idx += kThreads) mine[idx] = red[(idx / T::BM) * T::RED_STRIDE + idx % T::BM];
      __threadfence();  // this unit's partial is visible device-wide before its arrival is counted
      __syncthreads();
      if (tid == 0) last_flag = atomicAdd(&counters[item], 1) == split - 1;
      __syncthreads();
      if (!last_flag) continue;  // uniform: another unit of this item finishes it
      __threadfence();
      const float* first = partials + (size_t)item * split * UNIT;
      for (int idx = tid; idx < UNIT; idx += kThreads) {
        float v = __ldcg(first + idx);
        for (int k = 1; k < split; ++k) v += __ldcg(first + (size_t)k * UNIT + idx);  // range order
        red[(idx / T::BM) * T::RED_STRIDE + idx % T::BM] = v;
      }
      if (tid == 0) counters[item] = 0;  // every unit of the item has arrived: ready for the next launch
    }
    __syncthreads();
    const float sc = T::BLOCK ? 1.0f : a_s * a.w_scale[e];
    auto reduced = [red, sc](int r, int n) { return red[r * T::RED_STRIDE + n] * sc; };
    if constexpr (T::GATE_UP) {
      constexpr int half = T::ROWS / 2;
      const int j0 = nt * half;
      for (int idx = tid; idx < half * T::BM; idx += kThreads) {
        const int n = idx / half, j = idx - n * half;
        if (n < rows) {
          const float gv = reduced(j, n), uv = reduced(half + j, n);
          a.dst[(size_t)(start + n) * a.dst_cols + j0 + j] = __float2bfloat16_rn(silu_mul(gv, uv));
        }
      }
    } else {
      const int n0 = nt * T::ROWS;
      for (int idx = tid; idx < T::ROWS * T::BM; idx += kThreads) {
        const int n = idx / T::ROWS, r = idx - n * T::ROWS;
        if (n < rows) a.dst[(size_t)pair_of[n] * a.dst_cols + n0 + r] = __float2bfloat16_rn(reduced(r, n));
      }
    }
    __syncthreads();  // red and the row tables are rewritten by the next item
  }
}

// out[t, :] = bf16(sum over local slots k of w[t,k] * ybuf[t*K+k, :] (+ shared_out[t, :])), 8 columns per thread
// (16-byte loads), slots in k order with separate multiply and add: the reference's fp32 arithmetic.
__global__ void __launch_bounds__(256) reduce_kernel(const int* __restrict__ topk_ids, const float* __restrict__ topk_w,
                                                     const __nv_bfloat16* __restrict__ ybuf,
                                                     const __nv_bfloat16* __restrict__ shared_out,
                                                     __nv_bfloat16* __restrict__ out, int topk, int num_experts,
                                                     int expert_offset, int hidden) {
  const int t = blockIdx.x;
  hp::pdl_wait();
  hp::pdl_launch_dependents();
  for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (int k = 0; k < topk; ++k) {
      const long long e = (long long)topk_ids[t * topk + k] - expert_offset;
      if (e < 0 || e >= num_experts) continue;
      const float wk = topk_w[t * topk + k];
      const uint4 v = *reinterpret_cast<const uint4*>(ybuf + ((size_t)t * topk + k) * hidden + c);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(wk, f.x));
        acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(wk, f.y));
      }
    }
    if (shared_out != nullptr) {
      const uint4 v = *reinterpret_cast<const uint4*>(shared_out + (size_t)t * hidden + c);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        acc[2 * i] = __fadd_rn(acc[2 * i], f.x);
        acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], f.y);
      }
    }
    uint4 o;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) oh[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    *reinterpret_cast<uint4*>(out + (size_t)t * hidden + c) = o;
  }
}

// Resident CTAs per SM of an instantiation (cached per device; also sets its shared-memory attribute).
template <class T>
int ctas_per_sm() {
  static std::atomic<int> occ_slots[16];
  return hp::per_device_cached(occ_slots, [](int) {
    int n = 0;
    cudaFuncSetAttribute(expert_gemm_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::SMEM);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, expert_gemm_kernel<T>, kThreads, T::SMEM) != cudaSuccess)
      n = 1;
    return n > 0 ? n : 1;
  });
}

// Split-K workspace of an instantiation in int32 units: counters for every CTA slot, then a partial per slot.
template <class T>
long long splitk_ints() {
  const int slots = hp::sm_count() * ctas_per_sm<T>();
  return splitk_counter_ints(slots) + (long long)slots * T::ROWS * T::BM;
}

template <class T>
int launch_gemm(const GemmArgs& a, int pdl, cudaStream_t stream) {
  const int per_sm = ctas_per_sm<T>();
  const int n_tiles = a.w_rows / T::ROWS;
  const long long max_items = (long long)PlanView::max_tiles_of(a.num_experts, a.max_pairs, a.block_m) * n_tiles;
  long long grid = (long long)hp::sm_count() * per_sm;
  if (grid > max_items) grid = max_items;
  if (grid < 1) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  return (int)hp::launch(expert_gemm_kernel<T>, dim3((unsigned)grid), dim3(kThreads), T::SMEM, stream, opt, a);
}

// The one switch from runtime (block_m, mode) to a traits instantiation: F<T>::run(args...).
template <template <class> class F, bool GATE_UP, bool BLOCK, class R, class... Args>
R dispatch_bm(int block_m, R bad, Args... args) {
  switch (block_m) {
    case 8: return F<Traits<GATE_UP ? 2 : 4, 1, GATE_UP, BLOCK>>::run(args...);
    case 16: return F<Traits<GATE_UP ? 2 : 4, 2, GATE_UP, BLOCK>>::run(args...);
    case 32: return F<Traits<4, 4, GATE_UP, BLOCK>>::run(args...);
    // down at block_m 64: 32 weight rows, so 64 accumulators + the block-scale rescale fit without spilling
    case 64: return F<Traits<GATE_UP ? 4 : 2, 8, GATE_UP, BLOCK>>::run(args...);
    default: return bad;
  }
}
template <class T>
struct Launch {
  static int run(const GemmArgs& a, int pdl, cudaStream_t stream) { return launch_gemm<T>(a, pdl, stream); }
};
template <class T>
struct SplitkInts {
  static long long run() { return splitk_ints<T>(); }
};
template <bool GATE_UP, bool BLOCK>
int dispatch(const GemmArgs& a, int pdl, cudaStream_t stream) {
  return dispatch_bm<Launch, GATE_UP, BLOCK>(a.block_m, (int)cudaErrorInvalidValue, a, pdl, stream);
}

}  // namespace hp_moe

extern "C" {

// Weight rows per item (BN): the n-tile the shapes must divide (gate_up: I % (rows/2); down: H % rows).
int hp_moe_item_rows(int gate_up, int block_m) {
  if (block_m != 8 && block_m != 16 && block_m != 32 && block_m != 64) return -1;
  if (gate_up) return block_m <= 16 ? 32 : 64;
  return block_m == 64 ? 32 : 64;
}

// int32 elements of the split-K workspace a GEMM launch needs (its counters must start at 0), -1 on a bad block_m.
long long hp_moe_splitk_ints(int gate_up, int block_m, int block) {
  using hp_moe::dispatch_bm;
  using hp_moe::SplitkInts;
  if (gate_up)
    return block ? dispatch_bm<SplitkInts, true, true>(block_m, -1LL) : dispatch_bm<SplitkInts, true, false>(block_m, -1LL);
  return block ? dispatch_bm<SplitkInts, false, true>(block_m, -1LL) : dispatch_bm<SplitkInts, false, false>(block_m, -1LL);
}

int hp_moe_gate_up(const int* ws, const void* x, const void* w13, const float* w13_scale, const float* a1_scale,
                   void* act, int topk, int num_experts, int hidden, int inter, int max_pairs, int block_m, int block,
                   int pdl, void* splitk, cudaStream_t stream) {
  hp_moe::GemmArgs a{ws, num_experts, max_pairs, block_m, static_cast<const uint8_t*>(w13), w13_scale, a1_scale,
                     static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(act), topk, hidden, inter,
                     2 * inter, inter, static_cast<int*>(splitk)};
  return block ? hp_moe::dispatch<true, true>(a, pdl, stream) : hp_moe::dispatch<true, false>(a, pdl, stream);
}

int hp_moe_down(const int* ws, const void* act, const void* w2, const float* w2_scale, const float* a2_scale,
                void* ybuf, int topk, int num_experts, int hidden, int inter, int max_pairs, int block_m, int block,
                int pdl, void* splitk, cudaStream_t stream) {
  hp_moe::GemmArgs a{ws, num_experts, max_pairs, block_m, static_cast<const uint8_t*>(w2), w2_scale, a2_scale,
                     static_cast<const __nv_bfloat16*>(act), static_cast<__nv_bfloat16*>(ybuf), topk, inter, inter,
                     hidden, hidden, static_cast<int*>(splitk)};
  return block ? hp_moe::dispatch<false, true>(a, pdl, stream) : hp_moe::dispatch<false, false>(a, pdl, stream);
}

int hp_moe_reduce(const int* topk_ids, const float* topk_weights, const void* ybuf, const void* shared_out, void* out,
                  int num_tokens, int topk, int num_experts, int expert_offset, int hidden, int pdl,
                  cudaStream_t stream) {
  if (num_tokens <= 0) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  int threads = hidden / 8;
  if (threads > 256) threads = 256;
  threads = (threads + 31) / 32 * 32;
  return (int)hp::launch(hp_moe::reduce_kernel, dim3(num_tokens), dim3(threads), 0, stream, opt, topk_ids,
                         topk_weights, static_cast<const __nv_bfloat16*>(ybuf),
                         static_cast<const __nv_bfloat16*>(shared_out), static_cast<__nv_bfloat16*>(out), topk,
                         num_experts, expert_offset, hidden);
}

}  // extern "C"
