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
// (split-K, decided on the device from the routed tile count; see kMaxSplit); the reduce is one CTA per (token, 1024
// columns) at decode sizes and a GPU-covering grid of warps looping over (token, slab) units at large batches.
// Traffic: each expert hit reads its weights once per tile of block_m pairs (the floor at decode sizes, where an expert
// has one tile); token rows come from L2.
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

#include <algorithm>
#include <atomic>

#include "common/launch.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"  // fence_proxy_async
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

template <int MW_, int NN_, bool GATE_UP_, bool BLOCK_, bool TMA_ = false>
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
  // TMA (expert_gemm_tma_kernel): the producer warp keeps up to STAGES stages in flight across item boundaries, so
  // the ring is deeper than the per-item prologue of the cp.async kernel can use.
  static constexpr bool TMA = TMA_;
  // cp.async rows are padded to 144 bytes (ldmatrix rows on distinct bank quads); TMA writes 128-byte rows in the
  // 128-byte swizzle instead (chunk c of row r at c ^ (r % 8)), each box 1024-byte aligned (smem_off).
  static constexpr int ROW_BYTES = TMA ? kBK : kAStride;
  static constexpr int A_BYTES = ROWS * ROW_BYTES;
  static constexpr int B_BYTES = BM * ROW_BYTES;  // e4m3 token rows, same layout as the weights: conflict-free
  static constexpr int STAGE_RAW = A_BYTES + B_BYTES + (BLOCK ? BM * 4 : 0);  // + the rows' group scales
  static constexpr int STAGE_BYTES = TMA ? (STAGE_RAW + 1023) / 1024 * 1024 : STAGE_RAW;
  static constexpr int RED_STRIDE = BM + 1;  // floats per reduced row
  static constexpr int RED_BYTES = 4 * ROWS * RED_STRIDE * 4;
  // TMA: slots beside red, the head, the 1024-byte alignment slack and the kernel's static shared memory (the
  // block limit of 227 KB counts static and dynamic together: a ring that fills it exactly fails to launch).
  static constexpr int STATIC_RESERVE = 64;
  static constexpr int TMA_FIT = (hp::kSmemPerBlock - 2048 - STATIC_RESERVE - RED_BYTES) / STAGE_BYTES;
  static constexpr int TMA_STAGES = GATE_UP ? 10 : 8;
  static constexpr int STAGES = TMA       ? (TMA_FIT < TMA_STAGES ? TMA_FIT : TMA_STAGES)
                                : GATE_UP ? (NN == 1   ? 8
                                             : NN == 2 ? 6
                                                       : 4)
                                          : 4;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  static constexpr int HEAD = 1024;  // TMA: full / empty barriers and the per-slot unit fields
  static constexpr int THREADS = TMA ? kThreads + 32 : kThreads;  // TMA: + the producer warp
  // TMA: the ring keeps filling during a unit's reduction, so red has its own region.
  static constexpr int SMEM =
      TMA ? 1024 + HEAD + PIPE_BYTES + RED_BYTES : (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES);
  // Resident CTAs the shared memory allows (227 KB per SM, 1 KB reserved per CTA), capped at 8: the register
  // budget given to ptxas through __launch_bounds__, so registers never cost a CTA that shared memory admits.
  static constexpr int SMEM_CTAS = hp::kSmemPerBlock / (SMEM + 1024 + 2048);
  // 128 accumulators per thread (block_m 64 gate-up) need ~200 registers: 2 CTAs, or ptxas spills in the loop.
  static constexpr int REG_CTAS = MW * NN * 4 >= 128 ? 2 : TMA ? 6 : 8;  // TMA: 160 threads
  static constexpr int CAP_CTAS = SMEM_CTAS < REG_CTAS ? SMEM_CTAS : REG_CTAS;
  static constexpr int MIN_CTAS = CAP_CTAS < 1 ? 1 : CAP_CTAS;
  // rows of the weight matrix an item covers: gate_up n-tile j0 = nt * ROWS/2; down n0 = nt * ROWS
  static constexpr int N_PER_ITEM = GATE_UP ? ROWS / 2 : ROWS;
  static constexpr int BOX_ROWS = GATE_UP ? ROWS / 2 : ROWS;  // TMA: weight rows per box (gate-up: two boxes)
  static_assert(!TMA || (BOX_ROWS * kBK) % 1024 == 0, "TMA boxes on swizzle-atom boundaries");
  static_assert(!TMA || HEAD >= STAGES * (16 + 16) + 4 * BM, "barriers, unit fields and pair_of fit the head");
  static_assert(SMEM + (TMA ? STATIC_RESERVE : 0) <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
};

// Byte offset of (row, byte) in a stage's A or B region: padded rows (cp.async) or the 128-byte swizzle (TMA).
template <class T>
__device__ __forceinline__ int smem_off(int row, int byte) {
  if constexpr (T::TMA)
    return row * kBK + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
  else
    return row * kAStride + byte;
}

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
    const int row = nn * 8 + g;
    b0[nn] = *reinterpret_cast<const uint32_t*>(bs + smem_off<T>(row, ks * 32 + tig * 4));
    b1[nn] = *reinterpret_cast<const uint32_t*>(bs + smem_off<T>(row, ks * 32 + 16 + tig * 4));
  }
#pragma unroll
  for (int mi = 0; mi < T::MW; ++mi) {
    uint32_t af[4];
    ldmatrix_x4(af, stage + smem_off<T>(mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 32 + (lane >> 4) * 16));
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

// The launch's work units: (item, K range) pairs with split-K decided from the routed tile count (device data, so
// one launch serves every batch of a graph): only when the items leave CTA slots idle, at least 2 stages per
// range, no empty range. Unit u = item * split + ks covers K stages [ks * kps, min(kt_count, (ks + 1) * kps)).
struct UnitSchedule {
  int n_tiles, kt_count, split, kps, num_units;
  int* counters;
  float* partials;
};
template <class T>
__device__ __forceinline__ UnitSchedule unit_schedule(const GemmArgs& a, const PlanView& plan) {
  UnitSchedule u;
  u.n_tiles = a.w_rows / T::ROWS;  // gate_up: 2I / ROWS = I / (ROWS/2)
  const int num_items = plan.header()[1] * u.n_tiles;
  u.kt_count = (a.kdim + kBK - 1) / kBK;
  u.kps = u.kt_count;
  u.split = a.splitk != nullptr ? splitk_factor(num_items, (int)gridDim.x, u.kt_count, &u.kps) : 1;
  u.num_units = num_items * u.split;
  u.counters = a.splitk;
  u.partials = u.split > 1 ? reinterpret_cast<float*>(a.splitk + splitk_counter_ints(gridDim.x)) : nullptr;
  return u;
}

// One unit: its item, K range and n-tile (no plan reads), then its tile's expert, first sorted position and rows.
struct UnitInfo {
  int e, start, rows, nt;
};
struct UnitRange {
  int item, kt0, nk, nt, tile;
};
__device__ __forceinline__ UnitRange unit_range(const UnitSchedule& u, int unit) {
  UnitRange r;
  r.item = unit / u.split;
  const int ks = unit - r.item * u.split;
  r.kt0 = ks * u.kps;
  r.nk = min(u.kt_count, r.kt0 + u.kps) - r.kt0;
  r.tile = r.item / u.n_tiles;
  r.nt = r.item - r.tile * u.n_tiles;
  return r;
}
template <class T>
__device__ __forceinline__ UnitInfo unit_info(const PlanView& plan, const UnitRange& r) {
  UnitInfo it;
  it.nt = r.nt;
  it.e = plan.tile_expert()[r.tile];
  it.start = plan.tile_start()[r.tile];
  it.rows = min(T::BM, plan.offsets()[it.e + 1] - it.start);
  return it;
}
// Source row (of xq / aq) of tile row n, -1 past the tile's rows; *pair = its original pair index (or -1).
template <class T>
__device__ __forceinline__ int unit_src_row(const GemmArgs& a, const PlanView& plan, const UnitInfo& it, int n,
                                            int* pair) {
  *pair = -1;
  if (n >= it.rows) return -1;
  *pair = plan.sorted()[it.start + n];
  return T::GATE_UP ? *pair / a.topk : it.start + n;
}
// Block mode: the weight block scale of each m16 tile of the item at K stage kt (1 per-tensor).
template <class T>
__device__ __forceinline__ void stage_wscales(const GemmArgs& a, int e, int nt, int kt, int kt_count,
                                              float (&wsc)[T::MW]) {
#pragma unroll
  for (int mi = 0; mi < T::MW; ++mi) wsc[mi] = 1.0f;
  if constexpr (T::BLOCK) {
    const int row_groups = (a.w_rows + 127) / 128;
#pragma unroll
    for (int mi = 0; mi < T::MW; ++mi)
      wsc[mi] = a.w_scale[((size_t)e * row_groups + weight_row<T>(mi * 16, nt, a.inter) / 128) * kt_count + kt];
  }
}
template <class T>
__device__ __forceinline__ void zero_acc(float (&acc)[T::MW][T::NN][4]) {
#pragma unroll
  for (int mi = 0; mi < T::MW; ++mi)
#pragma unroll
    for (int nn = 0; nn < T::NN; ++nn)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][nn][c] = 0.f;
}

// The end of a work unit, after its last stage: the 4 consumer warps' k32 partials (acc) summed in a fixed order
// through `red` (4 x ROWS x RED_STRIDE floats), with split > 1 published to the split-K workspace and summed by
// the unit of the item that arrives last (returns false on the others: they are done), then the epilogue
// (x sc, the per-tensor scale; SiLU-and-mul into act, or ybuf at pair_of[n]). `sync` is the barrier of the 128
// consumer threads (threads 0-127). Ends with a barrier: red and the row tables may be rewritten after it.
template <class T, class Sync>
__device__ __forceinline__ bool finish_unit(const GemmArgs& a, float* red, const float (&acc)[T::MW][T::NN][4],
                                            int split, int unit, int item, int* counters, float* partials,
                                            int* last_flag, float sc, int nt, int start, int rows, const int* pair_of,
                                            Sync sync) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
  sync();
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
    sync();
    if (tid == 0) *last_flag = atomicAdd(&counters[item], 1) == split - 1;
    sync();
    if (!*last_flag) return false;  // uniform: another unit of this item finishes it
    __threadfence();
    const float* first = partials + (size_t)item * split * UNIT;
    for (int idx = tid; idx < UNIT; idx += kThreads) {
      float v = __ldcg(first + idx);
      for (int k = 1; k < split; ++k) v += __ldcg(first + (size_t)k * UNIT + idx);  // range order
      red[(idx / T::BM) * T::RED_STRIDE + idx % T::BM] = v;
    }
    if (tid == 0) counters[item] = 0;  // every unit of the item has arrived: ready for the next launch
  }
  sync();
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
  sync();  // red and the row tables are rewritten by the next item
  return true;
}

template <class T>
__global__ void __launch_bounds__(kThreads, T::MIN_CTAS) expert_gemm_kernel(GemmArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int row_src[T::BM];  // row of src each tile row reads (-1: no row)
  __shared__ int pair_of[T::BM];  // original pair index of each row (down write-back)
  __shared__ int w_row[T::ROWS];
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x, warp = tid >> 5;

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const UnitSchedule us = unit_schedule<T>(a, plan);
  const int split = us.split;
  __shared__ int last_flag;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];

  for (int unit = blockIdx.x; unit < us.num_units; unit += gridDim.x) {
    const UnitRange ur = unit_range(us, unit);
    const int item = ur.item, kt0 = ur.kt0, nk = ur.nk, nt = ur.nt;
    const UnitInfo ui = unit_info<T>(plan, ur);
    const int e = ui.e, start = ui.start, rows = ui.rows;
    const int nb = (rows + 7) >> 3;  // occupied n8 token blocks
    const uint8_t* w_e = a.w + (size_t)e * a.w_rows * a.kdim;
    for (int n = tid; n < T::BM; n += kThreads) row_src[n] = unit_src_row<T>(a, plan, ui, n, &pair_of[n]);
    for (int r = tid; r < T::ROWS; r += kThreads) w_row[r] = weight_row<T>(r, nt, a.inter);
    __syncthreads();

    float acc[T::MW][T::NN][4];
    zero_acc<T>(acc);

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
      stage_wscales<T>(a, e, nt, kt, us.kt_count, wsc);
      if (kt * kBK + warp * 32 < a.kdim) compute_slice<T>(stage, wsc, acc, nb);
      const int next = li + T::STAGES - 1;
      if (next < nk) load_stage<T>(a, smem + (next % T::STAGES) * T::STAGE_BYTES, w_e, row_src, w_row, kt0 + next, nb);
      cp_commit();
    }
    cp_wait<0>();
    __syncthreads();  // the pipeline buffers become the reduction buffer

    if (!finish_unit<T>(a, reinterpret_cast<float*>(smem), acc, split, unit, item, us.counters, us.partials, &last_flag,
                        T::BLOCK ? 1.0f : a_s * a.w_scale[e], nt, start, rows, pair_of, [] { __syncthreads(); }))
      continue;  // uniform: another unit of this item finishes it
  }
}

// ------------------------------------------------------------------------------------------------------------
// The TMA-fed variant of the mma.sync GEMM (MoEPlan.gemm == "mma_tma"): expert_gemm_tma_kernel<Traits<..., TMA>>.
//
// Why: at decode sizes the weight stream is the whole cost, and the cp.async kernel restarts its pipeline for every
// work unit (plan reads, row tables, a prologue of STAGES - 1 stages, a drain before the reduction): the down GEMM
// has only 2 K stages per unit at Hy3 TP8, so its copies idle through most of each unit, and each thread issues
// ~3 cp.async (address arithmetic included) per 128-byte weight row segment.
// What changes (same units, split-K, numerics and epilogue as expert_gemm_kernel: finish_unit is shared):
//   - warp 4 (the producer) walks the CTA's (unit, K stage) sequence into a ring of STAGES slots ACROSS unit
//     boundaries: lane 0 issues the stage's weight rows as one or two 3-D TMA boxes (w[e, rows, 128 K columns],
//     128-byte swizzle, OOB zero; gate-up: a gate box and an up box of ROWS / 2 rows) and raises the slot's "full"
//     mbarrier by their bytes; the 32 lanes gather the occupied token rows with cp.async (+ block-mode group scales)
//     into the same swizzled layout and arrive LAG stages later, once their copies have landed and been fenced
//     to the async proxy (the protocol of expert_wgmma_ws_kernel);
//   - warps 0-3 consume each slot as before (one k32 slice each, ldmatrix on swizzled rows: smem_off), arrive on
//     its "empty" barrier right after their MMAs (mma.sync is synchronous), and run finish_unit between named
//     barriers of the 128 consumer threads while the producer keeps loading the next unit;
//   - the unit's plan fields are read by the producer (its dependent reads overlap the stages in flight) and handed
//     over in the slot (meta[slot]); the consumers read only the down GEMM's pair indices themselves.
// Bytes in flight per CTA: up to STAGES x ROWS x 128 B of weights (10 x 4 KB at block_m 8-16 gate-up), several
// CTAs per SM (shared memory permitting): the ~40 KB per SM an H200 SM needs to stream at full bandwidth, without
// a per-unit bubble. Every mbarrier wait is bounded and traps (codes: 1 a consumer's "full" wait, 2 the producer's
// "empty" wait).
constexpr int kTmaEpiBar = 1;  // named barrier of the 128 consumer threads

template <class T>
__device__ __forceinline__ void tma_gemm_produce(const GemmArgs& a, const hp::tma::TmaMap* wmap, const PlanView& plan,
                                                 const UnitSchedule& us, uint8_t* ring, UnitInfo* meta, uint32_t bars) {
  constexpr int B_PER_LANE = T::BM * 8 / 32 > 0 ? T::BM * 8 / 32 : 1;  // 16-byte token-row chunks per lane
  constexpr int SC_PER_LANE = (T::BM + 31) / 32;
  constexpr int LAG = T::STAGES / 2;
  const int lane = threadIdx.x & 31, q = lane & 7;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  int step = 0;
#pragma unroll 1
  for (int unit = blockIdx.x; unit < us.num_units; unit += gridDim.x) {
    const UnitRange ur = unit_range(us, unit);
    const UnitInfo ui = unit_info<T>(plan, ur);
    const int nrows = ((ui.rows + 7) >> 3) * 8;  // rows of the occupied n8 blocks: the only ones read
    int bsrc[B_PER_LANE], ssrc[SC_PER_LANE], pair;
#pragma unroll
    for (int b = 0; b < B_PER_LANE; ++b) bsrc[b] = unit_src_row<T>(a, plan, ui, (lane >> 3) + 4 * b, &pair);
#pragma unroll
    for (int b = 0; b < SC_PER_LANE; ++b) ssrc[b] = unit_src_row<T>(a, plan, ui, lane + 32 * b, &pair);
#pragma unroll 1
    for (int li = 0; li < ur.nk; ++li, ++step) {
      const int kt = ur.kt0 + li, s = step % T::STAGES;
      if (step >= T::STAGES && !hp::tma::mbar_wait(bars + 8u * (T::STAGES + s), ((step / T::STAGES) & 1) ^ 1))
        hp::tma::mbar_hang_report(2);
      uint8_t* st = ring + s * T::STAGE_BYTES;
      if (lane == 0) {
        meta[s] = ui;
        hp::tma::mbar_expect_tx(full_bar(s), T::A_BYTES);
        const int r0 = weight_row<T>(0, ui.nt, a.inter);
        hp::tma::tma_load_3d(hp::smem_u32(st), wmap, kt * kBK, r0, ui.e, full_bar(s));
        if constexpr (T::GATE_UP)
          hp::tma::tma_load_3d(hp::smem_u32(st + T::BOX_ROWS * kBK), wmap, kt * kBK,
                               weight_row<T>(T::BOX_ROWS, ui.nt, a.inter), ui.e, full_bar(s));
      }
      const int kk = kt * kBK + q * 16;
      const bool k_ok = kk < a.kdim;
      uint8_t* sb = st + T::A_BYTES;
#pragma unroll
      for (int b = 0; b < B_PER_LANE; ++b) {
        const int n = (lane >> 3) + 4 * b;
        if (n < nrows) {
          const bool ok = k_ok && bsrc[b] >= 0;
          cp_async16(sb + smem_off<T>(n, q * 16), ok ? a.src + (size_t)bsrc[b] * a.kdim + kk : a.src, ok);
        }
      }
      if constexpr (T::BLOCK) {
        float* xs = reinterpret_cast<float*>(sb + T::B_BYTES);
#pragma unroll
        for (int b = 0; b < SC_PER_LANE; ++b) {
          const int n = lane + 32 * b;
          if (n < nrows)
            cp_async4(xs + n, ssrc[b] >= 0 ? a.src_scale + (size_t)ssrc[b] * us.kt_count + kt : a.src_scale,
                      ssrc[b] >= 0);
        }
      }
      cp_commit();
      if (step >= LAG) {  // this lane's copies of step - LAG have landed: publish them
        cp_wait<LAG>();
        hp::wg::fence_proxy_async();
        hp::tma::mbar_arrive_local(full_bar((step - LAG) % T::STAGES));
      }
    }
  }
  cp_wait<0>();
  hp::wg::fence_proxy_async();
  for (int t = step > LAG ? step - LAG : 0; t < step; ++t) hp::tma::mbar_arrive_local(full_bar(t % T::STAGES));
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, T::MIN_CTAS)
    expert_gemm_tma_kernel(GemmArgs a, const __grid_constant__ hp::tma::TmaMap wmap) {
  static_assert(T::TMA, "TMA traits");
  extern __shared__ uint8_t tma_smem_raw[];
  const uint32_t raw = hp::smem_u32(tma_smem_raw);
  uint8_t* head = tma_smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t bars = hp::smem_u32(head);  // full[s] at + 8 s, empty[s] at + 8 (STAGES + s)
  UnitInfo* meta = reinterpret_cast<UnitInfo*>(head + 16 * T::STAGES);
  int* pair_of = reinterpret_cast<int*>(head + 32 * T::STAGES);
  uint8_t* ring = head + T::HEAD;  // 1024-aligned slots
  float* red = reinterpret_cast<float*>(ring + T::PIPE_BYTES);
  __shared__ int last_flag;
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (tid == 0) {
    for (int s = 0; s < T::STAGES; ++s) {
      hp::tma::mbar_init(bars + 8u * s, 32);                           // the producer's lanes (+ lane 0's TMA bytes)
      hp::tma::mbar_init(bars + 8u * (T::STAGES + s), kThreads / 32);  // every consumer warp
    }
    hp::tma::fence_mbar_init();
  }
  if (tid == kThreads) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&wmap)) : "memory");
  __syncthreads();

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const UnitSchedule us = unit_schedule<T>(a, plan);
  if (tid >= kThreads) {
    tma_gemm_produce<T>(a, &wmap, plan, us, ring, meta, bars);
    return;
  }
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];
  auto consumer_sync = [] { asm volatile("bar.sync %0, %1;\n" ::"n"(kTmaEpiBar), "n"(kThreads) : "memory"); };
  int step = 0;
#pragma unroll 1
  for (int unit = blockIdx.x; unit < us.num_units; unit += gridDim.x) {
    const UnitRange ur = unit_range(us, unit);
    UnitInfo ui{};
    float acc[T::MW][T::NN][4];
    zero_acc<T>(acc);
#pragma unroll 1
    for (int li = 0; li < ur.nk; ++li, ++step) {
      const int kt = ur.kt0 + li, s = step % T::STAGES;
      if (!hp::tma::mbar_wait(bars + 8u * s, (step / T::STAGES) & 1)) hp::tma::mbar_hang_report(1);
      if (li == 0) {
        ui = meta[s];
        // the down epilogue's pair indices (read in finish_unit, after its barriers; the previous unit's readers
        // passed its last barrier)
        if (!T::GATE_UP && tid < T::BM) pair_of[tid] = tid < ui.rows ? plan.sorted()[ui.start + tid] : -1;
      }
      float wsc[T::MW];
      stage_wscales<T>(a, ui.e, ui.nt, kt, us.kt_count, wsc);
      if (kt * kBK + warp * 32 < a.kdim) compute_slice<T>(ring + s * T::STAGE_BYTES, wsc, acc, (ui.rows + 7) >> 3);
      __syncwarp();
      if (lane == 0) hp::tma::mbar_arrive_local(bars + 8u * (T::STAGES + s));
    }
    if (!finish_unit<T>(a, red, acc, us.split, unit, ur.item, us.counters, us.partials, &last_flag,
                        T::BLOCK ? 1.0f : a_s * a.w_scale[ui.e], ui.nt, ui.start, ui.rows, pair_of, consumer_sync))
      continue;  // uniform: another unit of this item finishes it
  }
}

// Activation pre-pass: dst[r] = e4m3(src[r] / scale) for rows r < nrows (nrows read from the device after the
// wait when nrows_dev is set: the act rows of this step are the plan's valid pairs). Work unit = (row, 256-column
// chunk), one per warp at a time, 8 elements (16 bytes) per lane, so a 1x128 group is 16 lanes. Units, not rows:
// with a warp per row, a row of H = 4096 was 16 dependent load-quantize-store rounds (the x pass took ~10 us on the
// H200 at any decode batch, longer than the route it overlaps, and the gate-up waits for it); spread over the
// grid's warps every chunk's load is in flight at once. Per-tensor: scale = a_scale[0]. Block: scale = max(amax *
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
  const int chunks = (cols + 255) / 256;
  const float a_s = BLOCK ? 1.0f : a_scale[0];
  const float a_r = recip(a_s);
  // int: rows x cols < 2^31 (checked by the host), so rows x chunks is far inside int range
  const int units = nrows * chunks;
  for (int u = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; u < units; u += (gridDim.x * blockDim.x) >> 5) {
    // uniform per warp: every lane reaches the shuffles
    const int row = u / chunks, c = (u - row * chunks) * 256 + lane * 8;
    const __nv_bfloat16* sp = src + (size_t)row * cols;
    uint8_t* dp = dst + (size_t)row * cols;
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
  if (!wait_first) hp::pdl_wait();
}

// acc[0..8) += w * the 8 bf16 of v, a separate fp32 multiply and add per element (the reference's arithmetic; the
// shared expert's output is added with w = 1, exact: 1 * x == x).
__device__ __forceinline__ void add_weighted8(float* acc, const uint4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(w, f.x));
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(w, f.y));
  }
}

__device__ __forceinline__ uint4 pack8(const float* acc) {
  uint4 o;
  __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) oh[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return o;
}

// out[t, c:c+8] = bf16(sum over local slots k of w[t,k] * ybuf[t*K+k, c:c+8] (+ shared_out[t, c:c+8])), one
// 16-byte chunk per thread, grid (tokens, column chunks) so even a batch of 1 spreads over H/1024 CTAs; the K slot
// loads are all issued before the sum (no load-to-load chain), and the sum runs in k order with separate multiply
// and add: the reference's fp32 arithmetic. The decode sizes (reduce_wide_kernel from kReduceWideMinTokens).
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
    if (local >> k & 1u) add_weighted8(acc, v[k], wk[k]);
  }
  if (shared_out != nullptr)
    add_weighted8(acc, *reinterpret_cast<const uint4*>(shared_out + (size_t)t * hidden + c), 1.0f);
  *reinterpret_cast<uint4*>(out + (size_t)t * hidden + c) = pack8(acc);
}

// The same sums for large batches (HBM bound: T*K*H bf16 read once, 268 MB at Hy3 TP8 and 4096 tokens). A grid that
// covers the GPU once (SMs x resident CTAs of 8 warps), each warp looping over units (token t, slab of 32 lanes x CH
// 16-byte chunks); per unit a lane issues all KMAX x CH slot loads (streaming: read once) and the shared_out chunks
// before any sum, then fetches the NEXT unit's routing (lane k: slot k's id and weight) while they are in flight, so
// the load-to-load chain (ids -> ybuf rows) of the one-unit CTAs is off the critical path; the weights reach the
// lanes by shuffle, the sum runs in k order (add_weighted8: the same bits), stores are 16 bytes per lane, 512
// contiguous bytes per warp. KMAX x CH = 16 chunks in flight per lane (256 B).
constexpr int kReduceWideThreads = 256;
// Below it the narrow kernel (one wave of its short CTAs covers the work). Measured on the H200 (layer us, narrow /
// wide, one process): Hy3 TP8 per-tensor 128 tokens 142.0 / 142.5, 256 156.0 / 154.6, 384 165.6 / 164.3; TP1/EP8
// 256 144.6 / 143.4; block-wise 256 164.9 / 163.1; Qwen3 TP8 256 118.7 / 116.8; DSv3 TP8 256 387.3 / 385.2.
constexpr int kReduceWideMinTokens = 256;

template <int KMAX, int CH>
__global__ void __launch_bounds__(kReduceWideThreads, 2)
    reduce_wide_kernel(const int* __restrict__ topk_ids, const float* __restrict__ topk_w,
                       const __nv_bfloat16* __restrict__ ybuf, const __nv_bfloat16* __restrict__ shared_out,
                       __nv_bfloat16* __restrict__ out, int num_tokens, int topk, int num_experts, int expert_offset,
                       int hidden) {
  constexpr int kWarps = kReduceWideThreads / 32, kSlab = 32 * CH * 8;  // columns per unit
  hp::pdl_wait();
  hp::pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int slabs = (hidden + kSlab - 1) / kSlab;
  const long long units = (long long)num_tokens * slabs, stride = (long long)gridDim.x * kWarps;
  long long u = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
  bool ok = false;  // this lane's slot (k = lane) of the unit's token is routed here
  float w = 0.f;
  auto fetch = [&](long long uu) {
    ok = false;
    w = 0.f;
    if (uu < units && lane < topk) {
      const size_t slot = (size_t)(uu / slabs) * topk + lane;
      const long long e = (long long)topk_ids[slot] - expert_offset;
      if (e >= 0 && e < num_experts) {
        ok = true;
        w = topk_w[slot];
      }
    }
  };
  fetch(u);
  for (; u < units; u += stride) {  // warp-uniform: the ballot and shuffles see every lane
    const int t = (int)(u / slabs);
    const int c0 = (int)(u - (long long)t * slabs) * kSlab + lane * 8;
    const unsigned local = __ballot_sync(0xffffffffu, ok);  // bit k: slot k routed here (k < topk <= KMAX)
    const float w_lane = w;
    const __nv_bfloat16* row = ybuf + (size_t)t * topk * hidden;
    uint4 v[KMAX][CH], sv[CH];
#pragma unroll
    for (int k = 0; k < KMAX; ++k)
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int c = c0 + j * 256;
        v[k][j] = make_uint4(0u, 0u, 0u, 0u);
        if ((local >> k & 1u) && c < hidden)
          v[k][j] = __ldcs(reinterpret_cast<const uint4*>(row + (size_t)k * hidden + c));
      }
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int c = c0 + j * 256;
      sv[j] = make_uint4(0u, 0u, 0u, 0u);
      if (shared_out != nullptr && c < hidden)
        sv[j] = __ldcs(reinterpret_cast<const uint4*>(shared_out + (size_t)t * hidden + c));
    }
    fetch(u + stride);
    float acc[CH][8];
#pragma unroll
    for (int j = 0; j < CH; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[j][i] = 0.f;
#pragma unroll
    for (int k = 0; k < KMAX; ++k) {
      if (!(local >> k & 1u)) continue;
      const float wk = __shfl_sync(0xffffffffu, w_lane, k);
#pragma unroll
      for (int j = 0; j < CH; ++j) add_weighted8(acc[j], v[k][j], wk);
    }
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int c = c0 + j * 256;
      if (c >= hidden) continue;
      if (shared_out != nullptr) add_weighted8(acc[j], sv[j], 1.0f);
      *reinterpret_cast<uint4*>(out + (size_t)t * hidden + c) = pack8(acc[j]);
    }
  }
}

template <int KMAX, int CH>
int launch_reduce_wide(const hp::LaunchOptions& opt, cudaStream_t stream, const int* topk_ids, const float* topk_w,
                       const __nv_bfloat16* ybuf, const __nv_bfloat16* shared_out, __nv_bfloat16* out, int num_tokens,
                       int topk, int num_experts, int expert_offset, int hidden) {
  static std::atomic<int> occ_slots[16];
  constexpr int kWarps = kReduceWideThreads / 32, kSlab = 32 * CH * 8;
  const long long units = (long long)num_tokens * ((hidden + kSlab - 1) / kSlab);
  const long long cap =
      (long long)hp::sm_count() * hp::ctas_per_sm(occ_slots, reduce_wide_kernel<KMAX, CH>, kReduceWideThreads, 0);
  const long long grid = std::min((units + kWarps - 1) / kWarps, cap);
  return (int)hp::launch(reduce_wide_kernel<KMAX, CH>, dim3((unsigned)grid), dim3(kReduceWideThreads), 0, stream, opt,
                         topk_ids, topk_w, ybuf, shared_out, out, num_tokens, topk, num_experts, expert_offset, hidden);
}

// Resident CTAs per SM of an instantiation (cached per device; also sets its shared-memory attribute).
template <class T>
int ctas_per_sm() {
  static std::atomic<int> occ_slots[16];
  if constexpr (T::TMA)
    return hp::ctas_per_sm(occ_slots, expert_gemm_tma_kernel<T>, T::THREADS, T::SMEM);
  else
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
  if constexpr (T::TMA) {
    // The weights as a 3-D map [E][w_rows][kdim] e4m3, box 128 K columns x BOX_ROWS rows of one expert, 128-byte
    // swizzle. Encoded per call on the host (no stream work): a captured graph keeps the map of its capture.
    hp::tma::TmaMap wmap;
    const uint64_t dims[3] = {(uint64_t)a.kdim, (uint64_t)a.w_rows, (uint64_t)a.num_experts};
    const uint64_t strides[2] = {(uint64_t)a.kdim, (uint64_t)a.kdim * a.w_rows};  // bytes (kdim % 64 == 0)
    const uint32_t box[3] = {(uint32_t)kBK, (uint32_t)T::BOX_ROWS, 1};
    const cudaError_t e = hp::tma::encode_tiled(&wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, a.w, dims, strides, box);
    if (e != cudaSuccess) return (int)e;
    return (int)hp::launch(expert_gemm_tma_kernel<T>, dim3((unsigned)grid), dim3(T::THREADS), T::SMEM, stream, opt, a,
                           wmap);
  } else {
    return (int)hp::launch(expert_gemm_kernel<T>, dim3((unsigned)grid), dim3(kThreads), T::SMEM, stream, opt, a);
  }
}

// The one switch from runtime (block_m, mode) to a traits instantiation: F<T>::run(args...).
template <template <class> class F, bool GATE_UP, bool BLOCK, bool TMA, class R, class... Args>
R dispatch_bm(int block_m, R bad, Args... args) {
  switch (block_m) {
    case 8:
      return F<Traits<GATE_UP ? 2 : 4, 1, GATE_UP, BLOCK, TMA>>::run(args...);
    case 16:
      return F<Traits<GATE_UP ? 2 : 4, 2, GATE_UP, BLOCK, TMA>>::run(args...);
    case 32:
      return F<Traits<4, 4, GATE_UP, BLOCK, TMA>>::run(args...);
    // down at block_m 64: 32 weight rows, so 64 accumulators + the block-scale rescale fit without spilling
    case 64:
      return F<Traits<GATE_UP ? 4 : 2, 8, GATE_UP, BLOCK, TMA>>::run(args...);
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
template <bool GATE_UP, bool BLOCK, bool TMA>
int dispatch(const GemmArgs& a, int pdl, cudaStream_t stream) {
  return dispatch_bm<Launch, GATE_UP, BLOCK, TMA>(a.block_m, (int)cudaErrorInvalidValue, a, pdl, stream);
}
// The int32 split-K workspace of (gate_up, block_m, block, tma), -1 on a bad block_m.
template <bool TMA>
long long splitk_ints_of(int gate_up, int block_m, int block) {
  if (gate_up)
    return block ? dispatch_bm<SplitkInts, true, true, TMA>(block_m, -1LL)
                 : dispatch_bm<SplitkInts, true, false, TMA>(block_m, -1LL);
  return block ? dispatch_bm<SplitkInts, false, true, TMA>(block_m, -1LL)
               : dispatch_bm<SplitkInts, false, false, TMA>(block_m, -1LL);
}
template <bool TMA>
long long split_factor_of(int gate_up, int block_m, int block, int num_tiles, int num_experts, int max_pairs,
                          int hidden, int inter) {
  const int w_rows = gate_up ? 2 * inter : hidden, kdim = gate_up ? hidden : inter;
  if (gate_up)
    return block ? dispatch_bm<SplitFactor, true, true, TMA>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                             w_rows, kdim)
                 : dispatch_bm<SplitFactor, true, false, TMA>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                              w_rows, kdim);
  return block ? dispatch_bm<SplitFactor, false, true, TMA>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                            w_rows, kdim)
               : dispatch_bm<SplitFactor, false, false, TMA>(block_m, -1LL, num_tiles, num_experts, max_pairs, block_m,
                                                             w_rows, kdim);
}
// The launchers of the two kernels, as HP_MOE_GEMM_ENTRY takes them (RUN<GATE_UP, BLOCK>).
template <bool GATE_UP, bool BLOCK>
constexpr auto mma_dispatch = &dispatch<GATE_UP, BLOCK, false>;
template <bool GATE_UP, bool BLOCK>
constexpr auto tma_dispatch = &dispatch<GATE_UP, BLOCK, true>;

}  // namespace hp_moe

extern "C" {

// Weight rows per item (BN): the n-tile the shapes must divide (gate_up: I % (rows/2); down: H % rows).
int hp_moe_item_rows(int gate_up, int block_m) {
  if (block_m != 8 && block_m != 16 && block_m != 32 && block_m != 64) return -1;
  if (gate_up) return block_m <= 16 ? 32 : 64;
  return block_m == 64 ? 32 : 64;
}

// int32 elements of the split-K workspace a GEMM launch of either mma.sync kernel needs (its counters must start at
// 0), -1 on a bad block_m.
long long hp_moe_splitk_ints(int gate_up, int block_m, int block) {
  const long long a = hp_moe::splitk_ints_of<false>(gate_up, block_m, block);
  const long long b = hp_moe::splitk_ints_of<true>(gate_up, block_m, block);
  return a < 0 || b < 0 ? -1LL : (a > b ? a : b);
}

// The split-K factor a GEMM launch takes when the plan has num_tiles tiles (1: no split), -1 on a bad block_m;
// tma: of the TMA-fed kernel (its grid differs).
long long hp_moe_split_factor(int gate_up, int block_m, int block, int num_tiles, int num_experts, int max_pairs,
                              int hidden, int inter, int tma) {
  return tma ? hp_moe::split_factor_of<true>(gate_up, block_m, block, num_tiles, num_experts, max_pairs, hidden, inter)
             : hp_moe::split_factor_of<false>(gate_up, block_m, block, num_tiles, num_experts, max_pairs, hidden,
                                              inter);
}

// Activation pre-pass (quant_rows_kernel): rows of `cols` bf16 -> e4m3 (+ block group scales [rows, cols/128]).
// nrows_dev (may be null) caps the row count on the device; wait_first = 0 overlaps the predecessor (x only).
int hp_moe_quant(const void* src, void* dst, float* gscale, const float* a_scale, const int* nrows_dev, int max_rows,
                 int cols, int block, int wait_first, int pdl, cudaStream_t stream) {
  if (max_rows <= 0) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  long long grid = ((long long)max_rows * ((cols + 255) / 256) + 7) / 8;  // 8 warps (row chunks) per CTA
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
// aq, src_scale = act_scale, w = w2, a_scale = a2_scale, dst = ybuf); arguments: hp_moe::gemm_args. _tma: the
// TMA-fed kernel (expert_gemm_tma_kernel).
HP_MOE_GEMM_ENTRY(hp_moe_gate_up, true, hp_moe::mma_dispatch, false)
HP_MOE_GEMM_ENTRY(hp_moe_down, false, hp_moe::mma_dispatch, false)
HP_MOE_GEMM_ENTRY(hp_moe_gate_up_tma, true, hp_moe::tma_dispatch, false)
HP_MOE_GEMM_ENTRY(hp_moe_down_tma, false, hp_moe::tma_dispatch, false)

// The top-k reduce. variant: 0 = by batch (reduce_wide_kernel from kReduceWideMinTokens tokens), 1 = reduce_kernel,
// 2 = reduce_wide_kernel (both give the same bits).
int hp_moe_reduce(const int* topk_ids, const float* topk_weights, const void* ybuf, const void* shared_out, void* out,
                  int num_tokens, int topk, int num_experts, int expert_offset, int hidden, int variant, int pdl,
                  cudaStream_t stream) {
  if (num_tokens <= 0) return 0;
  if (topk < 1 || topk > hp_moe::kMaxTopk || variant < 0 || variant > 2) return (int)cudaErrorInvalidValue;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  const auto* y = static_cast<const __nv_bfloat16*>(ybuf);
  const auto* so = static_cast<const __nv_bfloat16*>(shared_out);
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (variant == 2 || (variant == 0 && num_tokens >= hp_moe::kReduceWideMinTokens)) {
    if (topk <= 8)
      return hp_moe::launch_reduce_wide<8, 2>(opt, stream, topk_ids, topk_weights, y, so, o, num_tokens, topk,
                                              num_experts, expert_offset, hidden);
    return hp_moe::launch_reduce_wide<16, 1>(opt, stream, topk_ids, topk_weights, y, so, o, num_tokens, topk,
                                             num_experts, expert_offset, hidden);
  }
  const int chunks = (hidden / 8 + hp_moe::kReduceThreads - 1) / hp_moe::kReduceThreads;
  return (int)hp::launch(hp_moe::reduce_kernel, dim3(num_tokens, chunks), dim3(hp_moe::kReduceThreads), 0, stream, opt,
                         topk_ids, topk_weights, y, so, o, topk, num_experts, expert_offset, hidden);
}

}  // extern "C"
