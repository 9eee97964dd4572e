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
//  - activations quantized ONCE by a pre-pass (quant_rows_kernel: x [T, H] before gate-up, act [pairs, I] before
//    down; e4m3 bytes + 1x128 group scales in block mode), and the GEMMs stream those fp8 rows through the routing
//    index (cp.async, no gather copy) and read B fragments as plain 32-bit shared loads: no conversion in the loop.
//    Quantizing on the fly inside the GEMM redid it for every n-tile of the weights (2I/BN times per x row, H/BN
//    times per act row) and made the GEMM instruction bound (Nsight: 56% SM, 48% DRAM at Hy3 TP8 batch 64).
//  - gate and up rows of the same j sit in one item (rows [j, j+BN/2) and [I+j, I+j+BN/2)), so SiLU-and-mul is
//    the epilogue of the gate-up GEMM.
//  - every stage is PDL-chained: each kernel waits (griddepcontrol.wait) before its first dependent read or any
//    write, and lets its successor launch right away.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "common/launch.cuh"
#include "gemm_args.cuh"
#include "moe_ptx.cuh"
#include "plan_layout.cuh"

namespace hp_moe {

constexpr int kThreads = 128;
constexpr int kBK = 128;            // K elements per pipeline stage = one block-scale group
constexpr int kAStride = kBK + 16;  // bytes per weight row in smem: ldmatrix rows hit distinct bank quads

// Split-K across CTAs (decode sizes, where the items of a launch do not fill its CTA slots): every item's K stages
// are cut into S contiguous ranges, one per work unit; a unit writes its (ROWS x BM) fp32 partial, the LAST unit
// of an item to arrive (per-item counter) sums the S partials in range order (deterministic, whatever the
// arrival order) and runs the epilogue, then puts the counter back to 0, so the workspace is ready for the next
// launch with no memset (CUDA-graph replays included). Workspace: counters[slots] (zeroed once at allocation),
// then partials[slots][ROWS * BM]; slots = the grid's CTA slots, and S > 1 only when items * S <= grid.
constexpr int kMaxSplit = 8;
__host__ __device__ inline int splitk_counter_ints(int slots) {
  return (slots + 3) & ~3;
}  // partials 16-B aligned
// The split factor and K stages per range of a launch with `grid` CTAs: only when the items leave CTA slots idle,
// at least 2 stages per range, no empty range. One function for the kernel and the host query (tests).
__host__ __device__ inline int splitk_factor(int num_items, int grid, int kt_count, int* kps_out) {
  int split = 1, kps = kt_count;
  if (num_items > 0 && num_items < grid) {
    split = min(min(grid / num_items, kMaxSplit), max(kt_count / 2, 1));
    kps = (kt_count + split - 1) / split;
    split = (kt_count + kps - 1) / kps;
  }
  *kps_out = kps;
  return split;
}

template <int MW_, int NN_, bool GATE_UP_, bool BLOCK_>
struct Traits {
  static constexpr int MW = MW_;        // m16 weight tiles per item (gate_up: half gate, half up)
  static constexpr int NN = NN_;        // n8 token tiles per item
  static constexpr int BM = 8 * NN;     // pairs per tile (block_m)
  static constexpr int ROWS = 16 * MW;  // weight rows per item
  static constexpr bool GATE_UP = GATE_UP_;
  static constexpr bool BLOCK = BLOCK_;
  // Deeper pipelines where items are few and long (gate-up at decode sizes: one small tile per expert, K = H):
  // bytes in flight per CTA, not CTAs, are then what the grid lacks. The down GEMM's K (= I) is short, so extra
  // stages would only cost resident CTAs.
  static constexpr int STAGES = GATE_UP ? (NN == 1 ? 8 : NN == 2 ? 6 : 4) : 4;
  static constexpr int A_BYTES = ROWS * kAStride;
  static constexpr int B_BYTES = BM * kAStride;  // e4m3 token rows, same stride as the weights: conflict-free
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES + (BLOCK ? BM * 4 : 0);  // + the rows' group scales
  static constexpr int RED_STRIDE = BM + 1;                                     // floats per reduced row
  static constexpr int RED_BYTES = 4 * ROWS * RED_STRIDE * 4;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  static constexpr int SMEM = (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES);
  // Resident CTAs the shared memory allows (227 KB per SM, 1 KB reserved per CTA), capped at 8: the register
  // budget given to ptxas through __launch_bounds__, so registers never cost a CTA that shared memory admits.
  static constexpr int SMEM_CTAS = (227 * 1024) / (SMEM + 1024 + 2048);
  // 128 accumulators per thread (block_m 64 gate-up) need ~200 registers: 2 CTAs, or ptxas spills in the loop.
  static constexpr int REG_CTAS = MW * NN * 4 >= 128 ? 2 : 8;
  static constexpr int CAP_CTAS = SMEM_CTAS < REG_CTAS ? SMEM_CTAS : REG_CTAS;
  static constexpr int MIN_CTAS = CAP_CTAS < 1 ? 1 : CAP_CTAS;
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

// One stage: ROWS weight rows x 128 bytes and the e4m3 token rows of the occupied n8 blocks (nb of them) x 128
// bytes (+ in block mode each row's group scale of this stage), cp.async, zero-filled past kdim and for missing
// rows of an occupied block. Rows of unoccupied blocks are neither loaded nor read (every reader stops at nb).
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
  for (int c = threadIdx.x; c < nb * 8 * 8; c += kThreads) {
    const int n = c >> 3, q = c & 7, kk = k0 + q * 16;
    const int row = row_src[n];
    const bool ok = row >= 0 && kk < a.kdim;
    cp_async16(bs + n * kAStride + q * 16, ok ? a.src + (size_t)row * a.kdim + kk : a.src, ok);
  }
  if constexpr (T::BLOCK) {
    float* xs = reinterpret_cast<float*>(bs + T::B_BYTES);
    const int groups = (a.kdim + kBK - 1) / kBK;
    for (int n = threadIdx.x; n < nb * 8; n += kThreads) {
      const int row = row_src[n];
      cp_async4(xs + n, row >= 0 ? a.src_scale + (size_t)row * groups + kt : a.src_scale, row >= 0);
    }
  }
}

// The warp's k32 slice of one stage: B fragments as 32-bit shared loads of the pre-quantized rows (k = 4 tig ..
// 4 tig + 3 and 16 more: the m16n8k32 B layout of a K-contiguous row), A by ldmatrix, MW x nb MMAs. n8 blocks past
// nb hold no token of the tile: skipped (a uniform branch), so a tile sized for the busiest expert costs the others
// no tensor-core work; their accumulators stay 0 and are never written out.
template <class T>
__device__ __forceinline__ void compute_slice(const uint8_t* stage, const float (&wsc)[T::MW],
                                              float (&acc)[T::MW][T::NN][4], int nb) {
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const uint8_t* bs = stage + T::A_BYTES;
  const float* xs = reinterpret_cast<const float*>(bs + T::B_BYTES);
  uint32_t b0[T::NN], b1[T::NN];
#pragma unroll
  for (int nn = 0; nn < T::NN; ++nn) {
    if (nn >= nb) break;
    const uint8_t* rp = bs + (nn * 8 + g) * kAStride + ks * 32 + tig * 4;
    b0[nn] = *reinterpret_cast<const uint32_t*>(rp);
    b1[nn] = *reinterpret_cast<const uint32_t*>(rp + 16);
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

template <class T>
__global__ void __launch_bounds__(kThreads, T::MIN_CTAS) expert_gemm_kernel(GemmArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int row_src[T::BM];  // row of src each tile row reads (-1: no row)
  __shared__ int pair_of[T::BM];  // original pair index of each row (down write-back)
  __shared__ int w_row[T::ROWS];
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const int n_tiles = a.w_rows / (T::GATE_UP ? T::ROWS : T::ROWS);  // gate_up: 2I / ROWS = I / (ROWS/2)
  const int num_items = plan.header()[1] * n_tiles;
  const int kt_count = (a.kdim + kBK - 1) / kBK;
  // Split factor from the routed tile count (device data, so one launch serves every batch of a graph): only
  // when the items leave CTA slots idle, at least 2 stages per range, no empty range.
  int kps = kt_count;
  const int split = a.splitk != nullptr ? splitk_factor(num_items, (int)gridDim.x, kt_count, &kps) : 1;
  const int num_units = num_items * split;
  int* counters = a.splitk;
  float* partials = split > 1 ? reinterpret_cast<float*>(a.splitk + splitk_counter_ints(gridDim.x)) : nullptr;
  __shared__ int last_flag;
  const int k_groups = kt_count;
  const int row_groups = (a.w_rows + 127) / 128;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];

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
        off = T::GATE_UP ? p / a.topk : start + n;
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
#pragma unroll
        for (int mi = 0; mi < T::MW; ++mi)
          wsc[mi] = a.w_scale[((size_t)e * row_groups + w_row[mi * 16] / 128) * k_groups + kt];
      }
      if (kt * kBK + warp * 32 < a.kdim) compute_slice<T>(stage, wsc, acc, nb);
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

// Activation pre-pass: dst[r] = e4m3(src[r] / scale) for rows r < nrows (nrows read from the device after the
// wait when nrows_dev is set: the act rows of this step are the plan's valid pairs), one warp per row, 8 elements
// (16 bytes) per lane, so a 1x128 group is 16 lanes. Per-tensor: scale = a_scale[0]. Block: scale = max(amax *
// fp32(1/448), 1e-12), written to gscale[r, c / 128]: a multiply by the rounded reciprocal, NOT the correctly
// rounded quotient amax / 448. That is what the contract's emulation computes on a GPU (torch evaluates
// `cuda_tensor / python_float` as a times fp32(1 / b)), and the two differ by an ulp in about 60% of the groups.
// An ulp matters: bf16 values over a scale with few significant bits land exactly on e4m3 rounding ties (3.6% of
// the elements when amax = 2.625), a tie resolves differently under the two scales, and the next dynamic
// quantization (act groups) amplifies those single-ulp flips to a 1-3% rel L2 difference.
// wait_first = 0 (x, which needs no routing): the rows are quantized while the route kernel still runs, and the
// wait comes at the end, so this grid completes only after its predecessor (the gate-up's wait covers both).
// Safe because the route kernel lets dependents launch only after its own wait (x and the buffers are settled).
template <bool BLOCK>
__global__ void __launch_bounds__(256)
    quant_rows_kernel(const __nv_bfloat16* __restrict__ src, uint8_t* __restrict__ dst, float* __restrict__ gscale,
                      const float* __restrict__ a_scale, const int* __restrict__ nrows_dev, int nrows, int cols,
                      int wait_first) {
  if (wait_first) hp::pdl_wait();
  hp::pdl_launch_dependents();
  if (nrows_dev != nullptr) nrows = min(nrows, nrows_dev[0]);
  const int lane = threadIdx.x & 31;
  const int groups = (cols + 127) / 128;
  const float a_s = BLOCK ? 1.0f : a_scale[0];
  const float a_r = recip(a_s);
  for (int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < nrows; row += (gridDim.x * blockDim.x) >> 5) {
    const __nv_bfloat16* sp = src + (size_t)row * cols;
    uint8_t* dp = dst + (size_t)row * cols;
    for (int c0 = 0; c0 < cols; c0 += 256) {  // uniform per warp: every lane reaches the shuffles
      const int c = c0 + lane * 8;
      const bool ok = c < cols;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (ok) v = *reinterpret_cast<const uint4*>(sp + c);
      float s = a_s, r = a_r;
      if constexpr (BLOCK) {
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(h[i]);
          m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
#pragma unroll
        for (int o = 8; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // the 16-lane group
        s = fmaxf(__fmul_rn(m, 1.0f / 448.0f), 1e-12f);
        r = recip(s);
        if (ok && (lane & 15) == 0) gscale[(size_t)row * groups + c / 128] = s;
      }
      if (ok) {
        uint2 q;
        q.x = quant4(make_uint2(v.x, v.y), s, r);
        q.y = quant4(make_uint2(v.z, v.w), s, r);
        *reinterpret_cast<uint2*>(dp + c) = q;
      }
    }
  }
  if (!wait_first) hp::pdl_wait();
}

// out[t, c:c+8] = bf16(sum over local slots k of w[t,k] * ybuf[t*K+k, c:c+8] (+ shared_out[t, c:c+8])), one
// 16-byte chunk per thread, grid (tokens, column chunks) so even a batch of 1 spreads over H/1024 CTAs; the K slot
// loads are all issued before the sum (no load-to-load chain), and the sum runs in k order with separate multiply
// and add: the reference's fp32 arithmetic.
constexpr int kReduceThreads = 128;
constexpr int kMaxTopk = 16;
__global__ void __launch_bounds__(kReduceThreads)
    reduce_kernel(const int* __restrict__ topk_ids, const float* __restrict__ topk_w,
                  const __nv_bfloat16* __restrict__ ybuf, const __nv_bfloat16* __restrict__ shared_out,
                  __nv_bfloat16* __restrict__ out, int topk, int num_experts, int expert_offset, int hidden) {
  const int t = blockIdx.x;
  const int c = (blockIdx.y * kReduceThreads + threadIdx.x) * 8;
  hp::pdl_wait();
  hp::pdl_launch_dependents();
  if (c >= hidden) return;
  uint4 v[kMaxTopk];
  float wk[kMaxTopk];
  unsigned local = 0;  // slots routed here (the others' ybuf rows are never written)
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) {
    wk[k] = 0.f;
    v[k] = make_uint4(0u, 0u, 0u, 0u);
    if (k < topk) {
      const long long e = (long long)topk_ids[t * topk + k] - expert_offset;
      if (e >= 0 && e < num_experts) {
        local |= 1u << k;
        wk[k] = topk_w[t * topk + k];
        v[k] = *reinterpret_cast<const uint4*>(ybuf + ((size_t)t * topk + k) * hidden + c);
      }
    }
  }
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) {
    if (k >= topk) break;
    if (!(local >> k & 1u)) continue;
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[k]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(wk[k], f.x));
      acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(wk[k], f.y));
    }
  }
  if (shared_out != nullptr) {
    const uint4 sv = *reinterpret_cast<const uint4*>(shared_out + (size_t)t * hidden + c);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&sv);
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

// Resident CTAs per SM of an instantiation (cached per device; also sets its shared-memory attribute).
template <class T>
int ctas_per_sm() {
  static std::atomic<int> occ_slots[16];
  return hp::ctas_per_sm(occ_slots, expert_gemm_kernel<T>, kThreads, T::SMEM);
}

// Split-K workspace of an instantiation in int32 units: counters for every CTA slot, then a partial per slot.
template <class T>
long long splitk_ints() {
  const int slots = hp::sm_count() * ctas_per_sm<T>();
  return splitk_counter_ints(slots) + (long long)slots * T::ROWS * T::BM;
}

// The persistent grid of a launch: every CTA slot, capped at the largest item count the plan can produce.
template <class T>
long long gemm_grid(int num_experts, int max_pairs, int block_m, int w_rows) {
  const long long max_items = (long long)PlanView::max_tiles_of(num_experts, max_pairs, block_m) * (w_rows / T::ROWS);
  const long long grid = (long long)hp::sm_count() * ctas_per_sm<T>();
  return grid < max_items ? grid : max_items;
}

template <class T>
int launch_gemm(const GemmArgs& a, int pdl, cudaStream_t stream) {
  const long long grid = gemm_grid<T>(a.num_experts, a.max_pairs, a.block_m, a.w_rows);
  if (grid < 1) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  return (int)hp::launch(expert_gemm_kernel<T>, dim3((unsigned)grid), dim3(kThreads), T::SMEM, stream, opt, a);
}

// The one switch from runtime (block_m, mode) to a traits instantiation: F<T>::run(args...).
template <template <class> class F, bool GATE_UP, bool BLOCK, class R, class... Args>
R dispatch_bm(int block_m, R bad, Args... args) {
  switch (block_m) {
    case 8:
      return F<Traits<GATE_UP ? 2 : 4, 1, GATE_UP, BLOCK>>::run(args...);
    case 16:
      return F<Traits<GATE_UP ? 2 : 4, 2, GATE_UP, BLOCK>>::run(args...);
    case 32:
      return F<Traits<4, 4, GATE_UP, BLOCK>>::run(args...);
    // down at block_m 64: 32 weight rows, so 64 accumulators + the block-scale rescale fit without spilling
    case 64:
      return F<Traits<GATE_UP ? 4 : 2, 8, GATE_UP, BLOCK>>::run(args...);
    default:
      return bad;
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
// The split factor a launch takes for a routed tile count (what the kernel computes from the plan's header).
template <class T>
struct SplitFactor {
  static long long run(int num_tiles, int num_experts, int max_pairs, int block_m, int w_rows, int kdim) {
    const long long grid = gemm_grid<T>(num_experts, max_pairs, block_m, w_rows);
    int kps = 0;
    return splitk_factor(num_tiles * (w_rows / T::ROWS), (int)grid, (kdim + kBK - 1) / kBK, &kps);
  }
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
    return block ? dispatch_bm<SplitkInts, true, true>(block_m, -1LL)
                 : dispatch_bm<SplitkInts, true, false>(block_m, -1LL);
  return block ? dispatch_bm<SplitkInts, false, true>(block_m, -1LL)
               : dispatch_bm<SplitkInts, false, false>(block_m, -1LL);
}

// The split-K factor a GEMM launch takes when the plan has num_tiles tiles (1: no split), -1 on a bad block_m.
long long hp_moe_split_factor(int gate_up, int block_m, int block, int num_tiles, int num_experts, int max_pairs,
                              int hidden, int inter) {
  using hp_moe::dispatch_bm;
  using hp_moe::SplitFactor;
  const int w_rows = gate_up ? 2 * inter : hidden, kdim = gate_up ? hidden : inter;
  if (gate_up)
    return block ? dispatch_bm<SplitFactor, true, true>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                        w_rows, kdim)
                 : dispatch_bm<SplitFactor, true, false>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                         w_rows, kdim);
  return block ? dispatch_bm<SplitFactor, false, true>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                       w_rows, kdim)
               : dispatch_bm<SplitFactor, false, false>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                        w_rows, kdim);
}

// Activation pre-pass (quant_rows_kernel): rows of `cols` bf16 -> e4m3 (+ block group scales [rows, cols/128]).
// nrows_dev (may be null) caps the row count on the device; wait_first = 0 overlaps the predecessor (x only).
int hp_moe_quant(const void* src, void* dst, float* gscale, const float* a_scale, const int* nrows_dev, int max_rows,
                 int cols, int block, int wait_first, int pdl, cudaStream_t stream) {
  if (max_rows <= 0) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  long long grid = ((long long)max_rows + 7) / 8;  // 8 warps (rows) per CTA
  const long long cap = 16LL * hp::sm_count();
  if (grid > cap) grid = cap;
  const auto* s = static_cast<const __nv_bfloat16*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (block)
    return (int)hp::launch(hp_moe::quant_rows_kernel<true>, dim3((unsigned)grid), dim3(256), 0, stream, opt, s, d,
                           gscale, a_scale, nrows_dev, max_rows, cols, wait_first);
  return (int)hp::launch(hp_moe::quant_rows_kernel<false>, dim3((unsigned)grid), dim3(256), 0, stream, opt, s, d,
                         gscale, a_scale, nrows_dev, max_rows, cols, wait_first);
}

// The gate-up GEMM (src = xq, src_scale = x_scale, w = w13, a_scale = a1_scale, dst = act) and the down GEMM (src =
// aq, src_scale = act_scale, w = w2, a_scale = a2_scale, dst = ybuf); arguments: hp_moe::gemm_args.
HP_MOE_GEMM_ENTRY(hp_moe_gate_up, true, hp_moe::dispatch)
HP_MOE_GEMM_ENTRY(hp_moe_down, false, hp_moe::dispatch)

int hp_moe_reduce(const int* topk_ids, const float* topk_weights, const void* ybuf, const void* shared_out, void* out,
                  int num_tokens, int topk, int num_experts, int expert_offset, int hidden, int pdl,
                  cudaStream_t stream) {
  if (num_tokens <= 0) return 0;
  if (topk > hp_moe::kMaxTopk) return (int)cudaErrorInvalidValue;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  const int chunks = (hidden / 8 + hp_moe::kReduceThreads - 1) / hp_moe::kReduceThreads;
  return (int)hp::launch(hp_moe::reduce_kernel, dim3(num_tokens, chunks), dim3(hp_moe::kReduceThreads), 0, stream, opt,
                         topk_ids, topk_weights, static_cast<const __nv_bfloat16*>(ybuf),
                         static_cast<const __nv_bfloat16*>(shared_out), static_cast<__nv_bfloat16*>(out), topk,
                         num_experts, expert_offset, hidden);
}

}  // extern "C"
