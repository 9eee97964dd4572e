// Expert GEMMs of the fused FP8 MoE on Hopper warpgroup MMA (wgmma): the same two GEMMs, numerics and buffers as
// expert_gemm.cu's mma.sync kernel (gate-up: act[s, j] = bf16(silu(g) * u) by sorted position s; down: ybuf[p, h]
// at the original pair index p), for tiles of many pairs per expert (prefill-like batches), where the mma.sync
// path does a tile's tokens in n8 steps and stays far off the tensor-core rate.
//
// Shape of the work ("swap AB", as the mma.sync kernel): the weights are the M side (A, 64 rows per wgmma), the
// tile's token rows the N side (B, N = block_m: 16, 32 or 64 per warpgroup; block_m 128 = two warpgroups of 64).
// A work item is (tile, n-tile) with 128 weight rows in two 64-row halves:
//   gate-up: half 0 = gate rows [j0, j0 + 64), half 1 = up rows [I + j0, I + j0 + 64) (j0 = 64 nt), so register j
//            of the gate accumulator and register j of the up accumulator hold g and u of the same (j, token):
//            SiLU-and-mul is the register epilogue;
//   down:    rows [n0, n0 + 128) of w2 (n0 = 128 nt); a last n-tile past H (H % 128 = 64) loads zero rows and
//            stores nothing for them.
// Both operands are K-major in shared memory (the weight rows [rows, K] and the pre-quantized e4m3 token rows
// [*, K] are K-contiguous in memory), written by cp.async in the 128-byte-swizzle layout (one 128-wide K stage =
// one 128-byte row; common/wgmma.cuh), so one descriptor per operand feeds wgmma m64nNk32 directly; k32 step i is
// descriptor + 2 i.
//
// Pipeline: a persistent CTA walks its items in order (item = blockIdx.x + i * gridDim.x) and the (item, K stage)
// sequence is ONE pipeline: the copies of the next item's first stages are in flight while this item's last stages
// compute and its epilogue runs (the down GEMM has only ceil(I / 128) = 2 stages per item at Hy3 TP8: a
// per-item prologue would leave the copy engine idle half the time). STAGES slots, prefetch distance STAGES - 1:
// iteration L waits for its own copies (cp.async.wait_group), fences them to the async proxy, __syncthreads, issues
// this stage's wgmma, then refills the slot of L - 1 (every warpgroup passed wgmma.wait_group 0 at L - 1 before this
// barrier, so L - 1's products are done) with stage L + STAGES - 1, and waits for its own wgmma (the partial joins
// acc). All threads load (no producer warp): token rows are gathered through the routing index (not a TMA 2D box),
// and a single barrier per stage has no mbarrier phase to lose. The loop walks (item, K stage) with counters (no
// division per step); the down GEMM looks up its ybuf rows at an item's first stage.
//
// Scales: every stage's wgmma write a fresh partial (scale-d = 0 on its first k32), which joins the fp32 sum in
// k-stage order: block mode acc += partial * (x group scale of the token * weight block scale), the contract's
// per-128-K-block accumulation; per-tensor acc += partial, the epilogue multiplying by a_scale * w_scale[e] (as the
// mma.sync kernel). Per-tensor needs no scale per stage, but the tensor cores keep only ~14 bits of each k32 sum
// against the running total in d (the limit DeepSeek-V3's training report describes), so an unpromoted whole-K
// chain drifts from the fp32 emulation as K grows; promoting every stage cost nothing measurable on the H200
// (docs/ops/fused_moe.md, "Per-tensor promotion"). The two halves of an item each sit inside one 128-row weight
// block (64-row halves on 64-aligned rows).
// Epilogue: the item's output tile goes through shared memory (bf16 [block_m][64 or 128 + 8]) and leaves as 16-byte
// stores along the output rows (act: 128 contiguous bytes per token, ybuf: 256).
// Launch: grid min(SMs x resident CTAs, max items), 128 threads per warpgroup; see WgTraits for the shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "common/launch.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "gemm_args.cuh"
#include "moe_ptx.cuh"
#include "plan_layout.cuh"

namespace hp_moe {
namespace {

constexpr int kWgBK = 128;  // K elements (bytes) per stage = one swizzle row = one block-scale group
constexpr int kHalfRows = 64;
constexpr int kItemRows = 2 * kHalfRows;  // weight rows per item
constexpr int kSmemBudget = 200 * 1024;   // pipeline + epilogue tile (+ 1 KB alignment slack) per CTA
// One-warpgroup tiles (block_m <= 64) run two CTAs per SM (~113 KB each: 3-5 stages), so one CTA's per-stage chain
// (copy wait, barrier, wgmma wait, epilogue) runs under the other's tensor work: at 4096 tokens (Hy3 TP8) the 64-row
// tile took 571 us per layer this way against 752 with one CTA of 7 stages (docs/ops/fused_moe.md).
constexpr int kWg1Ctas = 2;
constexpr int kSmemPerSm = 233472;  // sm_90: 228 KB per SM, 1 KB of it reserved per resident CTA

template <int BM_, bool GATE_UP_, bool BLOCK_>
struct WgTraits {
  static constexpr int BM = BM_;               // token rows per tile (block_m)
  static constexpr int WGS = BM > 64 ? 2 : 1;  // warpgroups: each takes WN of the tile's token rows
  static constexpr int WN = BM / WGS;          // wgmma N
  static constexpr int THREADS = 128 * WGS;
  static constexpr int R = WN / 2;  // fp32 accumulator registers per half per thread
  static constexpr bool GATE_UP = GATE_UP_;
  static constexpr bool BLOCK = BLOCK_;
  static constexpr int A_BYTES = kItemRows * kWgBK;  // 16 KB: two 64-row halves, 8 KB each (1024-aligned)
  static constexpr int B_BYTES = BM * kWgBK;         // a multiple of 1024 for BM >= 8
  static constexpr int SC_BYTES = BLOCK ? BM * 4 : 0;
  static constexpr int STAGE_BYTES = (A_BYTES + B_BYTES + SC_BYTES + 1023) / 1024 * 1024;  // slots 1024-aligned
  static constexpr int OUT_COLS = GATE_UP ? kHalfRows : kItemRows;  // bf16 outputs per token row of an item
  static constexpr int OUT_STRIDE = OUT_COLS + 8;                   // bf16; rows stay 16-byte aligned
  static constexpr int OUT_BYTES = BM * OUT_STRIDE * 2;
  static constexpr int MIN_CTAS = WGS == 1 ? kWg1Ctas : 1;
  static constexpr int BUDGET = MIN_CTAS == 1 ? kSmemBudget : kSmemPerSm / MIN_CTAS - 1024;
  static constexpr int FIT = (BUDGET - 1024 - OUT_BYTES) / STAGE_BYTES;
  static constexpr int STAGES = FIT > 8 ? 8 : FIT;
  static constexpr int SMEM = 1024 + STAGES * STAGE_BYTES + OUT_BYTES;
  static constexpr int A_PER_THREAD = kItemRows * 8 / THREADS;  // 16-byte chunks per thread per stage
  static constexpr int B_PER_THREAD = BM * 8 / THREADS;
  static constexpr int CPR = OUT_COLS * 2 / 16;             // 16-byte output chunks per token row
  static constexpr int ST_PER_THREAD = BM * CPR / THREADS;  // output chunks per thread per item
  static_assert(STAGES >= 3, "prefetch distance STAGES - 1 >= 2");
  static_assert(BM * CPR % THREADS == 0, "every thread stores whole chunks");
  static_assert(WN == 16 || WN == 32 || WN == 64, "wgmma N instantiated: 16, 32, 64");
  static_assert(B_PER_THREAD >= 1 && BM * 8 % THREADS == 0, "every thread loads whole B chunks");
  static constexpr bool WS = false;
  static_assert(SMEM <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
};

// n-tiles (items per tile) of a GEMM: gate-up I / 64 (gate and up halves of 64 rows), down ceil(H / 128).
template <class T>
__host__ __device__ __forceinline__ int item_n_tiles(const GemmArgs& a) {
  return T::GATE_UP ? a.inter / kHalfRows : (a.w_rows + kItemRows - 1) / kItemRows;
}
// This CTA's work: items blockIdx.x + i * gridDim.x of the plan, each kt_count K stages, `total` (item, K stage)
// steps in one pipeline.
struct ItemSeq {
  int n_tiles, kt_count, total;
};
template <class T>
__device__ __forceinline__ ItemSeq item_sequence(const GemmArgs& a, const PlanView& plan) {
  ItemSeq q;
  q.n_tiles = item_n_tiles<T>(a);
  const int num_items = plan.header()[1] * q.n_tiles;
  q.kt_count = (a.kdim + kWgBK - 1) / kWgBK;
  const int my_items = num_items > (int)blockIdx.x ? (num_items - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  q.total = my_items * q.kt_count;
  return q;
}

// Where an item's tile and rows come from (read from the plan once per item by each of its two users: the loader,
// which runs STAGES - 1 stages ahead, and the compute / epilogue side).
struct ItemInfo {
  int e, start, rows, nt;
};
template <class T>
__device__ __forceinline__ ItemInfo item_info(const PlanView& plan, int unit, int n_tiles) {
  ItemInfo it;
  const int tile = unit / n_tiles;
  it.nt = unit - tile * n_tiles;
  it.e = plan.tile_expert()[tile];
  it.start = plan.tile_start()[tile];
  it.rows = min(T::BM, plan.offsets()[it.e + 1] - it.start);
  return it;
}

// Weight row of item row r (0..127) and whether it exists (down: rows past H of a last half n-tile do not).
template <class T>
__device__ __forceinline__ int item_weight_row(int r, int nt, int inter, int w_rows, bool& ok) {
  if constexpr (T::GATE_UP) {
    ok = true;
    const int j0 = nt * kHalfRows;
    return r < kHalfRows ? j0 + r : inter + j0 + (r - kHalfRows);
  } else {
    const int row = nt * kItemRows + r;
    ok = row < w_rows;
    return row;
  }
}

// One stage into slot `st`: 128 weight rows x 128 bytes and BM token rows x 128 bytes (zero-filled past kdim, past
// the tile's rows and for missing weight rows), 16-byte chunk q of row r at chunk q ^ (r % 8); in block mode each
// token row's group scale of this stage after the B tile (0 for missing rows).
template <class T>
__device__ __forceinline__ void wg_load_stage(const GemmArgs& a, uint8_t* st, const ItemInfo& it,
                                              const int (&bsrc)[T::B_PER_THREAD], int ssrc, int kt) {
  const int tid = threadIdx.x, q = tid & 7;
  const int kk = kt * kWgBK + q * 16;
  const bool k_ok = kk < a.kdim;
  const uint8_t* w_e = a.w + (size_t)it.e * a.w_rows * a.kdim;
#pragma unroll
  for (int i = 0; i < T::A_PER_THREAD; ++i) {
    const int r = (tid >> 3) + i * (T::THREADS / 8);
    bool row_ok;
    const int wr = item_weight_row<T>(r, it.nt, a.inter, a.w_rows, row_ok);
    const bool ok = k_ok && row_ok;
    cp_async16(st + r * kWgBK + ((q ^ (r & 7)) << 4), ok ? w_e + (size_t)wr * a.kdim + kk : a.w, ok);
  }
  uint8_t* sb = st + T::A_BYTES;
#pragma unroll
  for (int i = 0; i < T::B_PER_THREAD; ++i) {
    const int n = (tid >> 3) + i * (T::THREADS / 8);
    const int row = bsrc[i];
    const bool ok = k_ok && row >= 0;
    cp_async16(sb + n * kWgBK + ((q ^ (n & 7)) << 4), ok ? a.src + (size_t)row * a.kdim + kk : a.src, ok);
  }
  if constexpr (T::BLOCK) {
    if (tid < T::BM) {
      const int groups = (a.kdim + kWgBK - 1) / kWgBK;
      float* xs = reinterpret_cast<float*>(sb + T::B_BYTES);
      cp_async4(xs + tid, ssrc >= 0 ? a.src_scale + (size_t)ssrc * groups + kt : a.src_scale, ssrc >= 0);
    }
  }
}

// The source row (of xq / aq) of tile row n, -1 past the tile's rows: gate-up reads token p / K of pair p =
// sorted[start + n]; down reads the act row of sorted position start + n.
template <class T>
__device__ __forceinline__ int src_row(const PlanView& plan, const ItemInfo& it, int n, int topk) {
  if (n >= it.rows) return -1;
  if constexpr (T::GATE_UP)
    return plan.sorted()[it.start + n] / topk;
  else
    return it.start + n;
}

// Gate-up: one 16-byte chunk v of act (sorted position s, columns col..col+8) to a.dst, and, per-tensor with a.q_dst
// set, also as e4m3(v / q_scale[0]) into aq: the bytes quant_rows_kernel<false> writes for them (same quant4, same
// reciprocal), so the down GEMM reads them without that pre-pass (one launch and its wait fewer per layer). Both
// wgmma epilogues store through it; ActQ is the scale and its reciprocal, read once per epilogue.
struct ActQ {
  float s, r;
};
template <class T>
__device__ __forceinline__ ActQ act_q(const GemmArgs& a) {
  const float s = T::GATE_UP && !T::BLOCK && a.q_dst != nullptr ? a.q_scale[0] : 1.0f;
  return ActQ{s, recip(s)};
}
template <class T>
__device__ __forceinline__ void store_act(const GemmArgs& a, size_t s, int col, const uint4& v, const ActQ& q) {
  *reinterpret_cast<uint4*>(a.dst + s * a.dst_cols + col) = v;
  if constexpr (!T::BLOCK) {  // per-tensor only (the entry points refuse q_dst in block mode)
    if (a.q_dst != nullptr) {
      uint2 b;
      b.x = quant4(make_uint2(v.x, v.y), q.s, q.r);
      b.y = quant4(make_uint2(v.z, v.w), q.s, q.r);
      *reinterpret_cast<uint2*>(a.q_dst + s * a.dst_cols + col) = b;
    }
  }
}

// The item's output tile, bf16 in shared memory (out_s [BM][OUT_STRIDE]), to act (by sorted position, 128 bytes
// per token row) or ybuf (at the original pair index, 256 bytes per row; columns past H skipped) as 16-byte stores
// by `nthreads` threads (thread index `t`); rows past the tile's are not stored.
template <class T>
__device__ __forceinline__ void wg_store_tile(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                              const __nv_bfloat16* out_s, int t, int nthreads) {
  constexpr int CPR = T::OUT_COLS * 2 / 16;  // 16-byte chunks per token row
  const ActQ q = act_q<T>(a);
  for (int idx = t; idx < T::BM * CPR; idx += nthreads) {
    const int n = idx / CPR, c = idx - n * CPR;
    if (n >= it.rows) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(out_s + n * T::OUT_STRIDE + c * 8);
    if constexpr (T::GATE_UP) {
      store_act<T>(a, (size_t)(it.start + n), it.nt * kHalfRows + c * 8, v, q);
    } else {
      const int col = it.nt * kItemRows + c * 8;
      if (col < a.dst_cols) {
        const int p = plan.sorted()[it.start + n];
        *reinterpret_cast<uint4*>(a.dst + (size_t)p * a.dst_cols + col) = v;
      }
    }
  }
}

// Down, expert_wgmma_kernel: the ybuf row (original pair index) of each of thread tid's store chunks of the item
// (chunk k = tid + k THREADS, token row (chunk) / CPR; -1 past the item's rows), read at the item's first stage so
// that the look-ups are in flight while its wgmma run instead of in the epilogue's store loop.
template <class T>
__device__ __forceinline__ void wg_pair_ids(const PlanView& plan, const ItemInfo& it, int tid,
                                            int (&pid)[T::ST_PER_THREAD]) {
#pragma unroll
  for (int k = 0; k < T::ST_PER_THREAD; ++k) {
    const int n = (tid + k * T::THREADS) / T::CPR;
    pid[k] = n < it.rows ? plan.sorted()[it.start + n] : -1;
  }
}
template <class T>
__device__ __forceinline__ void wg_store_tile_pids(const GemmArgs& a, const ItemInfo& it, const __nv_bfloat16* out_s,
                                                   int tid, const int (&pid)[T::ST_PER_THREAD]) {
#pragma unroll
  for (int k = 0; k < T::ST_PER_THREAD; ++k) {
    const int idx = tid + k * T::THREADS, n = idx / T::CPR, c = idx - n * T::CPR;
    const int col = it.nt * kItemRows + c * 8;
    if (pid[k] < 0 || col >= a.dst_cols) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(out_s + n * T::OUT_STRIDE + c * 8);
    *reinterpret_cast<uint4*>(a.dst + (size_t)pid[k] * a.dst_cols + col) = v;
  }
}

// The item's epilogue: fp32 accumulators (x the per-tensor scale) -> bf16 tile in shared memory -> 16-byte stores.
// The accumulators hold (weight row, token) and out_s is token-major, so each 8 x 8 block goes in transposed by
// stmatrix .trans: per warp and 16 token columns one x4 (two 8-column groups x the warp's two 8-row halves) per
// accumulator written, instead of one 2-byte shared store per value. Rows of out_s are 16-byte aligned and
// OUT_STRIDE * 2 bytes = 4 banks apart, so the 8 rows of a matrix hit 8 distinct bank quads.
template <class T>
__device__ __forceinline__ void wg_epilogue(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                            const float (&acc0)[T::R], const float (&acc1)[T::R], float sc,
                                            __nv_bfloat16* out_s, const int (&pid)[T::ST_PER_THREAD]) {
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wiw = (tid >> 5) & 3;
  const int mi = lane >> 3, mk = lane & 7;  // the matrix and the row of its transpose this lane addresses
  const uint32_t base = hp::smem_u32(out_s);
  auto v0 = [&](int j) { return T::BLOCK ? acc0[j] : acc0[j] * sc; };
  auto v1 = [&](int j) { return T::BLOCK ? acc1[j] : acc1[j] * sc; };
#pragma unroll
  for (int q = 0; q < T::WN / 16; ++q) {
    // matrix m is (column group 2 q + m / 2, row half m % 2); its fragment pair is registers j and j + 1 for
    // j = 4 (2 q + m / 2) + 2 (m % 2); this lane addresses row mk of matrix mi's transpose
    const int col = wg * T::WN + 8 * (2 * q + (mi >> 1)) + mk;
    const uint32_t row = base + 2u * (col * T::OUT_STRIDE + 16 * wiw + 8 * (mi & 1));
    uint32_t r[4];
    if constexpr (T::GATE_UP) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = 8 * q + 4 * (m >> 1) + 2 * (m & 1);
        r[m] = bf16x2(silu_mul(v0(j), v1(j)), silu_mul(v0(j + 1), v1(j + 1)));
      }
      stmatrix_x4_trans(row, r[0], r[1], r[2], r[3]);
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = 8 * q + 4 * (m >> 1) + 2 * (m & 1);
        r[m] = bf16x2(v0(j), v0(j + 1));
      }
      stmatrix_x4_trans(row, r[0], r[1], r[2], r[3]);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = 8 * q + 4 * (m >> 1) + 2 * (m & 1);
        r[m] = bf16x2(v1(j), v1(j + 1));
      }
      stmatrix_x4_trans(row + 2u * kHalfRows, r[0], r[1], r[2], r[3]);
    }
  }
  __syncthreads();
  if constexpr (T::GATE_UP)
    wg_store_tile<T>(a, plan, it, out_s, tid, T::THREADS);
  else
    wg_store_tile_pids<T>(a, it, out_s, tid, pid);
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, T::MIN_CTAS) expert_wgmma_kernel(GemmArgs a) {
  extern __shared__ uint8_t wg_smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(wg_smem_raw));
  uint8_t* ring = wg_smem_raw + ((1024u - (raw & 1023u)) & 1023u);  // swizzle atoms need 1024-byte alignment
  __nv_bfloat16* out_s = reinterpret_cast<__nv_bfloat16*>(ring + T::STAGES * T::STAGE_BYTES);
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const ItemSeq seq = item_sequence<T>(a, plan);
  const int n_tiles = seq.n_tiles, kt_count = seq.kt_count, total = seq.total;
  const int row_groups = (a.w_rows + 127) / 128;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];

  // Loader state: the item and K stage of the next step to issue (steps are issued once each, in order), the
  // item's plan fields and the source rows of this thread's B chunks.
  int ld_i = 0, ld_kt = 0;
  ItemInfo ld{};
  int bsrc[T::B_PER_THREAD];
  int ssrc = -1;
  auto issue = [&](int step) {
    if (step < total) {
      if (ld_kt == 0) {
        ld = item_info<T>(plan, (int)blockIdx.x + ld_i * (int)gridDim.x, n_tiles);
#pragma unroll
        for (int b = 0; b < T::B_PER_THREAD; ++b)
          bsrc[b] = src_row<T>(plan, ld, (tid >> 3) + b * (T::THREADS / 8), a.topk);
        if (T::BLOCK) ssrc = tid < T::BM ? src_row<T>(plan, ld, tid, a.topk) : -1;
      }
      wg_load_stage<T>(a, ring + (step % T::STAGES) * T::STAGE_BYTES, ld, bsrc, ssrc, ld_kt);
      if (++ld_kt == kt_count) {
        ld_kt = 0;
        ++ld_i;
      }
    }
    cp_commit();  // one group per step, empty past the end: the wait counts below stay exact
  };

  float acc0[T::R], acc1[T::R];
  float p0[T::R], p1[T::R];  // this stage's partials (both formats)
#pragma unroll
  for (int j = 0; j < T::R; ++j) acc0[j] = acc1[j] = p0[j] = p1[j] = 0.f;

#pragma unroll 1
  for (int s = 0; s < T::STAGES - 1; ++s) issue(s);

  ItemInfo cur{};
  float sc = 1.0f;
  int pid[T::ST_PER_THREAD];  // down: the ybuf rows of this thread's store chunks, looked up at the item's start
  int i = 0, kt = 0;          // item and K stage of `step`
#pragma unroll 1
  for (int step = 0; step < total; ++step) {
    if (kt == 0) {
      cur = item_info<T>(plan, (int)blockIdx.x + i * (int)gridDim.x, n_tiles);
      sc = T::BLOCK ? 1.0f : a_s * a.w_scale[cur.e];
      if constexpr (!T::GATE_UP) wg_pair_ids<T>(plan, cur, tid, pid);  // used at the item's end
    }
    float ws0 = 0.f, ws1 = 0.f;  // block mode: the two halves' weight block scales of this stage
    if constexpr (T::BLOCK) {
      const float* wsc = a.w_scale + (size_t)cur.e * row_groups * kt_count;
      bool ok0, ok1;
      const int r0 = item_weight_row<T>(0, cur.nt, a.inter, a.w_rows, ok0);
      const int r1 = item_weight_row<T>(kHalfRows, cur.nt, a.inter, a.w_rows, ok1);
      ws0 = wsc[(r0 / 128) * kt_count + kt];
      ws1 = ok1 ? wsc[(r1 / 128) * kt_count + kt] : 0.f;
    }
    cp_wait<T::STAGES - 2>();  // this thread's copies of `step` have landed
    hp::wg::fence_proxy_async();
    __syncthreads();  // everyone's copies visible; every warpgroup is done with step - 1's slot

    // This stage's wgmma are issued first, then the refill of step - 1's slot: the loader's plan look-ups at an
    // item change (dependent L2 reads) overlap the tensor cores instead of delaying them.
    const uint8_t* st = ring + (step % T::STAGES) * T::STAGE_BYTES;
    const uint64_t da0 = hp::wg::desc_sw128(st);
    const uint64_t da1 = hp::wg::desc_sw128(st + kHalfRows * kWgBK);
    const uint64_t db = hp::wg::desc_sw128(st + T::A_BYTES + wg * T::WN * kWgBK);
    // This stage's products into fresh registers (scale-d 0 on the first k32), then into acc in fp32; per-tensor,
    // an item's first stage writes acc itself (0 + partial would be the same sum).
    const bool direct = !T::BLOCK && kt == 0;
    hp::wg::fence();
    if (direct) {
#pragma unroll
      for (int k = 0; k < kWgBK / 32; ++k) {
        hp::wg::mma_e4m3<T::WN>(acc0, da0 + 2 * k, db + 2 * k, k);
        hp::wg::mma_e4m3<T::WN>(acc1, da1 + 2 * k, db + 2 * k, k);
      }
    } else if (!T::GATE_UP && a.kdim - kt * kWgBK <= kWgBK / 2) {
      // down, a last K stage of at most 64 columns (I % 128 = 64: Hy3 TP8 I = 192): its upper two k32 steps are
      // zero-filled, so only the lower two run (same bits; the gate-up never has such a stage at the model shapes)
#pragma unroll
      for (int k = 0; k < kWgBK / 64; ++k) {
        hp::wg::mma_e4m3<T::WN>(p0, da0 + 2 * k, db + 2 * k, k);
        hp::wg::mma_e4m3<T::WN>(p1, da1 + 2 * k, db + 2 * k, k);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kWgBK / 32; ++k) {
        hp::wg::mma_e4m3<T::WN>(p0, da0 + 2 * k, db + 2 * k, k);
        hp::wg::mma_e4m3<T::WN>(p1, da1 + 2 * k, db + 2 * k, k);
      }
    }
    hp::wg::commit();
    issue(step + T::STAGES - 1);
    hp::wg::wait<0>();
    hp::wg::pin(acc0);
    hp::wg::pin(acc1);
    hp::wg::pin(p0);
    hp::wg::pin(p1);
    if constexpr (T::BLOCK) {
      const float* xs = reinterpret_cast<const float*>(st + T::A_BYTES + T::B_BYTES);
#pragma unroll
      for (int j = 0; j < T::R; ++j) {
        const float x = xs[wg * T::WN + hp::wg::acc_col(lane, j)];
        acc0[j] += p0[j] * (x * ws0);
        acc1[j] += p1[j] * (x * ws1);
      }
    } else if (!direct) {
#pragma unroll
      for (int j = 0; j < T::R; ++j) {
        acc0[j] += p0[j];
        acc1[j] += p1[j];
      }
    }
    if (kt == kt_count - 1) {  // uniform: the item's last stage
      wg_epilogue<T>(a, plan, cur, acc0, acc1, sc, out_s, pid);
      if constexpr (T::BLOCK) {
#pragma unroll
        for (int j = 0; j < T::R; ++j) acc0[j] = acc1[j] = 0.f;
      }
      // out_s is rewritten only at the next item's end, after at least one more top-of-loop barrier.
    }
    if (++kt == kt_count) {
      kt = 0;
      ++i;
    }
  }
  hp::wg::wait<0>();
  cp_wait<0>();  // no copy may still target this CTA's shared memory when it exits
}

// ------------------------------------------------------------------------------------------------------------
// Warp-specialized variant (MoEPlan.gemm == "wgmma_ws"): expert_wgmma_ws_kernel<WsTraits>.
//
// Same items, numerics, buffers and epilogue layout as expert_wgmma_kernel; what changes is who moves the bytes and
// how the work is cut:
//   - work: the launch's units (tile, n-tile) are ordered tile-major, n-tile-minor, and their (unit, K stage) steps
//     form one sequence of S = units x K stages; CTA c takes the contiguous steps [c S / G, (c + 1) S / G) (WsWork).
//     Contiguous: consecutive units of a CTA share their tile, so its plan look-ups (tile -> expert -> offsets,
//     the token rows) are made once per tile instead of once per unit. Steps, not units: a unit may be cut at a
//     CTA boundary ("stream-K"), so every CTA streams the same number of weight bytes and no round of the grid
//     runs on a few SMs (gate-up at decode batches has 2-5 units per CTA: one more unit on some CTAs is a 20-50%
//     longer kernel). A cut unit is finished by the CTA that holds its first step: each later CTA holding a piece
//     of it (at the start of its range, so early) leaves its fp32 partial accumulators in the split workspace and
//     raises its flag; the finisher adds the pieces in CTA order (deterministic) before the epilogue and lowers the
//     flags again. Only gate-up units below 128-row tiles and of at least kWsSplitMinStages K stages are cut
//     (WsTraits::SPLIT); elsewhere the ranges fall on unit boundaries (the down GEMM has H / 128 short units per
//     tile, which balance whole);
//   - warps 8.. (the producers, WsTraits::PRODUCERS warps: 1, 2 at 64-row and 4 at 128-row tiles, each taking every
//     PRODUCERS-th step) walk the CTA's steps up to STAGES stages ahead of the tensor cores. Per stage the filling
//     warp's lane 0 stores the unit's plan fields in the slot (meta[slot]), arrives on the slot's "full" mbarrier
//     raising it by the weight bytes and issues two 3-D TMA loads (w[e, rows of half h, 128 K columns], 64 x 128 B
//     each, 128-byte swizzle; OOB rows / K columns zero); the 32 lanes gather the tile's token rows (xq by token, aq by
//     sorted position) with 16-byte cp.async into the swizzled B layout (+ 4-byte group scales in block mode), and each
//     lane's cp.async.mbarrier.arrive.noinc makes the slot's barrier wait for its copies: the producer never waits for
//     its own copies, only for free slots, so all STAGES slots can be in flight;
//   - warps 0-7 are two consumer warpgroups; warpgroup h computes half h of the unit (64 weight rows) against all
//     BM token rows: after the "full" wait a proxy fence (the token rows were written by cp.async, a generic-proxy
//     write that wgmma's async-proxy reads must be ordered after), wgmma m64nBMk32 (N narrowed to the tile's rows),
//     each stage's partial folded into acc after wait_group 0 (both formats), then the slot released = one arrival
//     per warp on its "empty" barrier, which the producer waits on before refilling;
//   - epilogue: the two halves meet in shared memory (gate-up: warpgroup 1 leaves u in fp32, warpgroup 0 forms
//     silu(g) * u; down: each warpgroup writes its 64 columns), then 16-byte stores by all 256 consumer threads
//     between named barriers of the consumers only: the producer keeps loading meanwhile. The down GEMM's ybuf rows
//     (original pair ids) are looked up once per tile, at the tile's first step, not at each store.
// No __syncthreads after the set-up. Every wait is bounded (hp::tma::kHangNs) and traps; trap codes: 1 a consumer's
// "full" wait, 2 the producer's "empty" wait, 3 a finisher's wait for a partial of a cut unit.
// Launch: persistent grid min(SMs x resident CTAs, items), 256 + 32 x PRODUCERS threads; one or two CTAs per SM by
// the ring depth (WsTraits::DEPTH).
constexpr int kWsConsumers = 256;     // two warpgroups
constexpr int kWsEpiBar = 1;          // named barrier of the consumer threads (0 is __syncthreads)
constexpr int kWsMaxCtas = 512;       // partial slots of the split workspace (a splitting grid is clamped to it)
constexpr int kWsSplitMinStages = 8;  // units of fewer K stages are never cut
constexpr int kWsMinSteps = 8;        // a launch that cuts units gives every CTA at least this many steps

template <int BM_, bool GATE_UP_, bool BLOCK_>
struct WsTraits {
  static constexpr int BM = BM_;    // token rows per tile = wgmma N of each warpgroup
  static constexpr int R = BM / 2;  // fp32 accumulator registers per thread (one 64-row half)
  static constexpr bool GATE_UP = GATE_UP_;
  static constexpr bool BLOCK = BLOCK_;
  // Producer warps: each takes every PRODUCERS-th step with its own plan look-ups, copies and arrivals. A stage's
  // token-row gather is BM x 8 16-byte cp.async issued by one warp one after another (64 rows: 16 per lane), and
  // from 64-row tiles it, not the weight TMA, sets the stage time. Measured on the H200 (Hy3 per-tensor, layer us,
  // one / more producer warps): 64-row tiles TP8 batch 1024 246.1 / 217.3 (2), Qwen3 TP8 512 167.2 / 150.0 (2),
  // TP1/EP8 1024 208.4 / 181.1 (2); 128-row tiles (forced ws path) TP8 1536 349.4 (2) / 321.0 (4), TP1/EP8 2048
  // 282.9 (2) / 243.4 (4). Tiles up to 32 rows gain nothing (batch 256: 159.8 / 159.3) and keep one. Four warps at
  // 128 rows are 384 threads at 168 registers, the whole register file of the SM for its one CTA.
  static constexpr int PRODUCERS = BM == 128 ? 4 : (BM == 64 ? 2 : 1);
  static constexpr int THREADS = kWsConsumers + 32 * PRODUCERS;
  static constexpr int A_BYTES = kItemRows * kWgBK;  // two 64-row halves, 8 KB each: one TMA box each
  static constexpr int B_BYTES = BM * kWgBK;
  static constexpr int SC_BYTES = BLOCK ? BM * 4 : 0;
  static constexpr int STAGE_BYTES = (A_BYTES + B_BYTES + SC_BYTES + 1023) / 1024 * 1024;
  static constexpr int OUT_COLS = GATE_UP ? kHalfRows : kItemRows;
  static constexpr int OUT_STRIDE = OUT_COLS + 8;
  static constexpr int XCH_STRIDE = kHalfRows + 1;  // fp32 u of gate-up, [BM][65]: conflict-free column writes
  static constexpr int EPI_BYTES = BM * OUT_STRIDE * 2 + (GATE_UP ? BM * XCH_STRIDE * 4 : 0);
  static constexpr int HEAD = 1024;  // barriers (full, empty) and the per-slot item fields
  static constexpr int FIT = (hp::kSmemPerBlock - 1024 - HEAD - EPI_BYTES) / STAGE_BYTES;
  // Ring depth: two CTAs per SM beat one CTA with twice the ring wherever the launch has units for both (measured
  // on the H200, Hy3 TP8 per-tensor, layer us at batch 16 / 64 / 256: 87.1 / 142.1 / 158.8 with 4 stages, two CTAs
  // per SM, against 91.9 / 154.7 / 188.6 with 8 stages, one CTA), so tiles up to 32 rows take 4 stages and the
  // 64-row down GEMM 3; the 64-row gate-up (1024 tokens: 148 us with 8 stages, 159 with 3) and 128-row tiles keep
  // 8. A one-CTA-per-SM launch of few units (batch 4: 90 units for 132 SMs) loses ~3 us by the shallow ring.
  static constexpr int DEPTH = BM <= 32 ? 4 : (BM == 64 && !GATE_UP ? 3 : 8);
  static constexpr int STAGES = FIT > DEPTH ? DEPTH : FIT;
  static constexpr int MIN_CTAS = STAGES <= 4 ? 2 : 1;  // CTAs per SM the register budget is set for
  static constexpr int SMEM = 1024 + HEAD + STAGES * STAGE_BYTES + EPI_BYTES;
  static constexpr int B_PER_LANE = BM * 8 / 32;  // 16-byte token-row chunks per producer lane per stage
  static constexpr int SC_PER_LANE = (BM + 31) / 32;
  static constexpr int CPR = OUT_COLS * 2 / 16;  // 16-byte output chunks per token row
  static constexpr int CHUNKS = BM * CPR;        // 16-byte output chunks per item
  static constexpr int ST_PER_THREAD = (CHUNKS + kWsConsumers - 1) / kWsConsumers;  // per consumer thread
  // down: the ybuf rows of a thread's chunks kept in registers from the tile's first step (small tiles; a 128-row
  // tile has 8 per thread, which its 64 accumulators and block-mode partials leave no registers for: looked up at
  // the store there)
  static constexpr int PIDS = !GATE_UP && ST_PER_THREAD <= 2 ? ST_PER_THREAD : 1;
  static constexpr bool PID_CACHED = !GATE_UP && ST_PER_THREAD <= 2;
  // Gate-up units may be cut across CTAs (stream-K) below 128-row tiles. The down GEMM's units are many (H / 128
  // n-tiles per tile) and short, so whole units balance it; a 128-row tile comes with many units per CTA, and its
  // block-mode consumer has no registers left for the partial path.
  static constexpr bool SPLIT = GATE_UP && BM < 128;
  static constexpr bool WS = true;
  static_assert(STAGES >= 3, "ring depth");
  // A producer at step i + STAGES waits on the slot's "empty" parity. Its previous step (i + STAGES - PRODUCERS)
  // waited for the release of step i - PRODUCERS, and consumers release in order, so step i - STAGES of this slot
  // is released: the slot is at most one phase behind and the parity wait cannot pass early.
  static_assert(PRODUCERS >= 1 && PRODUCERS <= STAGES, "producer warps <= ring stages");
  static_assert(HEAD >= STAGES * (16 + 16), "barriers + item fields fit the head");
  static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "wgmma N instantiated: 16, 32, 64, 128");
  static_assert(R % 4 == 0, "partials move as float4");
  static_assert(SMEM <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
};

// The split workspace of one launch (int32 words): flags [kWsMaxCtas] (0 between launches), then fp32 partials
// [kWsMaxCtas][kWsConsumers][R] (slot c: the piece of a cut unit at the start of CTA c's range).
__host__ __device__ constexpr long long ws_split_ints(int block_m) {
  return kWsMaxCtas + (long long)kWsMaxCtas * kWsConsumers * (block_m / 2);
}

__device__ __forceinline__ void consumer_bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kWsEpiBar), "n"(kWsConsumers) : "memory");
}

// This CTA's part of the launch's (unit, K stage) steps; producer and consumers derive the same from the plan.
// int steps: at most max_tiles x n-tiles x K stages (~1.2e5 at 16384 Hy3 tokens), far inside int range.
struct WsWork {
  int s0, s1;                    // this CTA's global steps [s0, s1)
  int S;                         // all steps of the launch
  int kt_count, n_tiles, total;  // K stages per unit, units per tile, this CTA's steps
  int G;                         // CTAs sharing the steps (CTA c: start_of(c) .. start_of(c + 1)); the rest idle
  bool split;                    // units may be cut at CTA boundaries

  // Global step of local step l.
  __device__ __forceinline__ int global(int l) const { return s0 + l; }
  // First step of CTA c's range: any step when units may be cut, else a unit boundary.
  __device__ __forceinline__ int start_of(int c) const {
    return split ? (int)((long long)c * S / G) : (int)((long long)c * (S / kt_count) / G) * kt_count;
  }
};

template <class T>
__device__ __forceinline__ WsWork ws_work(const GemmArgs& a, const PlanView& plan) {
  WsWork w;
  w.n_tiles = item_n_tiles<T>(a);
  w.kt_count = (a.kdim + kWgBK - 1) / kWgBK;
  const int units = plan.header()[1] * w.n_tiles;
  w.S = units * w.kt_count;
  const int c = (int)blockIdx.x;
  w.split = T::SPLIT && a.splitk != nullptr && w.kt_count >= kWsSplitMinStages;
  w.G = (int)gridDim.x;
  if (w.split && w.S / kWsMinSteps < w.G) w.G = w.S / kWsMinSteps > 0 ? w.S / kWsMinSteps : 1;
  w.s0 = c < w.G ? w.start_of(c) : 0;
  w.s1 = c < w.G ? (c + 1 == w.G ? w.S : w.start_of(c + 1)) : 0;
  w.total = w.s1 - w.s0;
  return w;
}

// First weight row of half h of an item (gate-up: gate rows j0.. or up rows I + j0..; down: n0 + 64 h, which
// may lie past H: the TMA box then reads zeros).
template <class T>
__device__ __forceinline__ int half_row(const ItemInfo& it, int h, int inter) {
  if constexpr (T::GATE_UP)
    return h * inter + it.nt * kHalfRows;
  else
    return it.nt * kItemRows + h * kHalfRows;
}

// Arrive on the mbarrier once all of this thread's earlier cp.async copies have landed (the pending count is not
// raised: the arrival is one of the barrier's expected ones).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The producer warp: every step of this CTA into the ring, see the block comment above. A new tile's look-ups are a
// chain of dependent loads (tile -> expert and first sorted position; then the expert's end offset and the sorted
// pairs -> token rows); the weight boxes need only the expert, so they are issued after the first link
// (mbarrier.expect_tx raises the slot's bytes without arriving) and the rest of the chain runs under their flight;
// the offset and the sorted pairs are loaded together (the pairs unconditionally, masked by the row count after).
// Lane 0 writes the slot's item fields and then arrives (release): with the 32 copy arrivals the slot's 33.
template <class T>
__device__ __forceinline__ void ws_produce(const GemmArgs& a, const hp::tma::TmaMap* wmap, const PlanView& plan,
                                           uint8_t* ring, ItemInfo* meta, uint32_t bars, const WsWork& w) {
  const int lane = threadIdx.x & 31, q = lane & 7, pw = ((int)threadIdx.x - kWsConsumers) >> 5;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (T::STAGES + s); };
  int ld_unit = -1, ld_tile = -1;
  bool fresh = false;  // the tile's rows and token rows are still to be looked up
  ItemInfo ld{};
  int bsrc[T::B_PER_LANE];
  int ssrc[T::SC_PER_LANE];
#pragma unroll 1
  for (int step = T::PRODUCERS > 1 ? pw : 0; step < w.total; step += T::PRODUCERS) {
    const int g = w.global(step);
    const int unit = g / w.kt_count, kt = g - unit * w.kt_count, s = step % T::STAGES;
    if (unit != ld_unit) {
      ld_unit = unit;
      const int tile = unit / w.n_tiles;
      ld.nt = unit - tile * w.n_tiles;
      if (tile != ld_tile) {  // a new tile (consecutive units share it): its expert and first row now
        ld_tile = tile;
        ld.e = plan.tile_expert()[tile];
        ld.start = plan.tile_start()[tile];
        fresh = true;
      }
    }
    if (step >= T::STAGES && !hp::tma::mbar_wait(empty_bar(s), ((step / T::STAGES) & 1) ^ 1))
      hp::tma::mbar_hang_report(2);
    uint8_t* st = ring + s * T::STAGE_BYTES;
    if (lane == 0) {
      hp::tma::mbar_expect_tx(full_bar(s), T::A_BYTES);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        hp::tma::tma_load_3d(hp::smem_u32(st + h * kHalfRows * kWgBK), wmap, kt * kWgBK, half_row<T>(ld, h, a.inter),
                             ld.e, full_bar(s));
    }
    if (fresh) {
      fresh = false;
      const int end = plan.offsets()[ld.e + 1];
      int pair[T::B_PER_LANE];
      int spair[T::SC_PER_LANE];
      if constexpr (T::GATE_UP) {
#pragma unroll
        for (int b = 0; b < T::B_PER_LANE; ++b)
          pair[b] = plan.sorted()[min(ld.start + (lane >> 3) + 4 * b, a.max_pairs - 1)];
        if constexpr (T::BLOCK) {
#pragma unroll
          for (int b = 0; b < T::SC_PER_LANE; ++b)
            spair[b] = plan.sorted()[min(ld.start + lane + 32 * b, a.max_pairs - 1)];
        }
      }
      ld.rows = min(T::BM, end - ld.start);
#pragma unroll
      for (int b = 0; b < T::B_PER_LANE; ++b) {
        const int n = (lane >> 3) + 4 * b;
        bsrc[b] = n >= ld.rows ? -1 : (T::GATE_UP ? pair[b] / a.topk : ld.start + n);
      }
      if constexpr (T::BLOCK) {
#pragma unroll
        for (int b = 0; b < T::SC_PER_LANE; ++b) {
          const int n = lane + 32 * b;
          ssrc[b] = n >= ld.rows ? -1 : (T::GATE_UP ? spair[b] / a.topk : ld.start + n);
        }
      }
    }
    const int kk = kt * kWgBK + q * 16;
    const bool k_ok = kk < a.kdim;
    uint8_t* sb = st + T::A_BYTES;
#pragma unroll
    for (int b = 0; b < T::B_PER_LANE; ++b) {
      const int n = (lane >> 3) + 4 * b, row = bsrc[b];
      const bool ok = k_ok && row >= 0;
      cp_async16(sb + n * kWgBK + ((q ^ (n & 7)) << 4), ok ? a.src + (size_t)row * a.kdim + kk : a.src, ok);
    }
    if constexpr (T::BLOCK) {
      const int groups = (a.kdim + kWgBK - 1) / kWgBK;
      float* xs = reinterpret_cast<float*>(sb + T::B_BYTES);
#pragma unroll
      for (int b = 0; b < T::SC_PER_LANE; ++b) {
        const int n = lane + 32 * b;
        if (n < T::BM)
          cp_async4(xs + n, ssrc[b] >= 0 ? a.src_scale + (size_t)ssrc[b] * groups + kt : a.src_scale, ssrc[b] >= 0);
      }
    }
    cp_async_mbar_arrive(full_bar(s));
    if (lane == 0) {
      meta[s] = ld;
      hp::tma::mbar_arrive_local(full_bar(s));  // releases meta[s] to the consumers
    }
  }
  cp_commit();
  cp_wait<0>();  // no copy may still target this CTA's shared memory when its issuer exits
}

// The ybuf rows (original pair ids) of this consumer thread's output chunks of a down tile (-1 past its rows).
template <class T>
__device__ __forceinline__ void ws_pair_ids(const PlanView& plan, const ItemInfo& it, int (&pid)[T::PIDS]) {
#pragma unroll
  for (int i = 0; i < T::PIDS; ++i) {
    const int idx = (int)threadIdx.x + i * kWsConsumers, n = idx / T::CPR;
    pid[i] = idx < T::CHUNKS && n < it.rows ? plan.sorted()[it.start + n] : -1;
  }
}

// The consumers' epilogue of one item: halves meet in shared memory, then 16-byte stores by the 256 consumers
// (act by sorted position; ybuf at the pair ids `pid`, columns past H skipped).
template <class T>
__device__ __forceinline__ void ws_epilogue(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                            const float (&acc)[T::R], float sc, __nv_bfloat16* out_s, float* xch,
                                            const int (&pid)[T::PIDS]) {
  const int tid = threadIdx.x, lane = tid & 31, h = tid >> 7, wiw = (tid >> 5) & 3;
  consumer_bar_sync();  // the previous item's stores have read out_s / xch
  if constexpr (T::GATE_UP) {
    if (h == 1) {
#pragma unroll
      for (int j = 0; j < T::R; ++j)
        xch[hp::wg::acc_col(lane, j) * T::XCH_STRIDE + hp::wg::acc_row(wiw, lane, j)] = T::BLOCK ? acc[j] : acc[j] * sc;
    }
    consumer_bar_sync();
    if (h == 0) {
#pragma unroll
      for (int j = 0; j < T::R; ++j) {
        const int r = hp::wg::acc_row(wiw, lane, j), n = hp::wg::acc_col(lane, j);
        const float g = T::BLOCK ? acc[j] : acc[j] * sc;
        out_s[n * T::OUT_STRIDE + r] = __float2bfloat16_rn(silu_mul(g, xch[n * T::XCH_STRIDE + r]));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < T::R; ++j) {
      const int r = hp::wg::acc_row(wiw, lane, j), n = hp::wg::acc_col(lane, j);
      out_s[n * T::OUT_STRIDE + h * kHalfRows + r] = __float2bfloat16_rn(T::BLOCK ? acc[j] : acc[j] * sc);
    }
  }
  consumer_bar_sync();
  const ActQ q = act_q<T>(a);
#pragma unroll
  for (int i = 0; i < T::ST_PER_THREAD; ++i) {
    const int idx = tid + i * kWsConsumers, n = idx / T::CPR, c = idx - n * T::CPR;
    if (idx >= T::CHUNKS || n >= it.rows) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(out_s + n * T::OUT_STRIDE + c * 8);
    if constexpr (T::GATE_UP) {
      store_act<T>(a, (size_t)(it.start + n), it.nt * kHalfRows + c * 8, v, q);
    } else {
      const int col = it.nt * kItemRows + c * 8;
      if (col < a.dst_cols) {
        const int p = T::PID_CACHED ? pid[T::PID_CACHED ? i : 0] : plan.sorted()[it.start + n];
        *reinterpret_cast<uint4*>(a.dst + (size_t)p * a.dst_cols + col) = v;
      }
    }
  }
}

// A cut unit's piece at the start of this CTA's range: the fp32 accumulators to partial slot blockIdx.x, then the
// slot's flag (release after every consumer's stores).
template <class T>
__device__ __forceinline__ void ws_put_partial(const GemmArgs& a, const float (&acc)[T::R]) {
  const int tid = threadIdx.x;
  float4* dst = reinterpret_cast<float4*>(reinterpret_cast<float*>(a.splitk + kWsMaxCtas) +
                                          ((size_t)blockIdx.x * kWsConsumers + tid) * T::R);
#pragma unroll
  for (int j = 0; j < T::R / 4; ++j)
    __stcg(dst + j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  __threadfence();
  consumer_bar_sync();
  if (tid == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(a.splitk + blockIdx.x), "r"(1) : "memory");
}

// The finisher of a cut unit ending at global step u_end: add the pieces of the next CTAs (those whose ranges start
// before u_end), in CTA order, then lower their flags (each flag is read by this CTA alone).
template <class T>
__device__ __forceinline__ void ws_take_partials(const GemmArgs& a, const WsWork& w, int u_end, float (&acc)[T::R]) {
  const int tid = threadIdx.x;
  const float* parts = reinterpret_cast<const float*>(a.splitk + kWsMaxCtas);
  int c = (int)blockIdx.x + 1;
  for (; c < w.G && w.start_of(c) < u_end; ++c) {
    if (tid == 0) {
      const unsigned long long t0 = hp::tma::global_ns();
      for (;;) {
        int f;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(f) : "l"(a.splitk + c) : "memory");
        if (f) break;
        if (hp::tma::global_ns() - t0 > hp::tma::kHangNs) hp::tma::mbar_hang_report(3);
      }
    }
    consumer_bar_sync();
    const float4* src = reinterpret_cast<const float4*>(parts + ((size_t)c * kWsConsumers + tid) * T::R);
#pragma unroll  // fully: a runtime index would put acc in local memory
    for (int j = 0; j < T::R / 4; ++j) {
      const float4 v = __ldcg(src + j);
      acc[4 * j] += v.x;
      acc[4 * j + 1] += v.y;
      acc[4 * j + 2] += v.z;
      acc[4 * j + 3] += v.w;
    }
  }
  consumer_bar_sync();  // every consumer has read the partials before their flags drop
  if (tid == 0)
    for (int k = (int)blockIdx.x + 1; k < c; ++k) a.splitk[k] = 0;
}

// One stage of wgmma for warpgroup-half descriptor da against the token rows db: 4 k32 steps of m64nNk32. Tiles of
// BM >= 64 rows run N = BM; 16- and 32-row tiles (decode batches, where an expert's tile is often mostly empty) take
// the narrowest instantiated width (16 or BM) holding the item's `rows` (a uniform choice per item), so such a tile
// costs the tensor cores and the B reads only its occupied rows. The m64nN accumulator layout puts columns < N in
// registers < N / 2 for every N, so the narrower instruction writes a prefix of d; the registers past it keep an
// earlier item's values and only reach columns never stored. The first k32 overwrites d (scale-d 0): d is this
// stage's partial. With a run-time N the fence, commit and wait sit inside each branch: around the branches, ptxas
// cannot prove the wgmma warp-uniform and serializes every wgmma of the kernel (C7520); at BM >= 64 the same form
// runs out of registers for the wgmma pipeline (C7511). The narrowing above 32 rows did not pay (H200, per-tensor
// and block-wise, docs/ops/fused_moe.md): N = BM there is the form without either warning.
template <class T>
constexpr bool kWsNarrowN = T::BM <= 32;
template <class T, int N>
__device__ __forceinline__ void ws_mma_n(float (&d)[T::R], uint64_t da, uint64_t db) {
  auto& dn = *reinterpret_cast<float (*)[N / 2]>(&d[0]);
  if constexpr (kWsNarrowN<T>) hp::wg::fence();
#pragma unroll
  for (int k = 0; k < kWgBK / 32; ++k) hp::wg::mma_e4m3<N>(dn, da + 2 * k, db + 2 * k, k);
  if constexpr (kWsNarrowN<T>) {
    hp::wg::commit();
    hp::wg::wait<0>();
  }
}
// The stage's products into d (fenced, committed and waited for, either way).
template <class T>
__device__ __forceinline__ void ws_mma_stage(float (&d)[T::R], uint64_t da, uint64_t db, int rows) {
  if constexpr (!kWsNarrowN<T>) {
    hp::wg::fence();
    ws_mma_n<T, T::BM>(d, da, db);
    hp::wg::commit();
    hp::wg::wait<0>();
  } else {
    if constexpr (T::BM >= 32) {
      if (rows > 16) return ws_mma_n<T, 32>(d, da, db);
    }
    ws_mma_n<T, 16>(d, da, db);
  }
}

// Consumer warpgroup h (threads 0-255): every stage of the ring in order, half h of each item.
template <class T>
__device__ __forceinline__ void ws_consume(const GemmArgs& a, const PlanView& plan, const uint8_t* ring,
                                           const ItemInfo* meta, uint32_t bars, __nv_bfloat16* out_s, float* xch,
                                           const WsWork& w) {
  const int tid = threadIdx.x, lane = tid & 31, h = tid >> 7;
  const int kt_count = w.kt_count;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (T::STAGES + s); };
  auto release = [&](int s) {  // this warp's wgmma reads of slot s (and its scale reads) are complete
    __syncwarp();
    if (lane == 0) hp::tma::mbar_arrive_local(empty_bar(s));
  };
  const int row_groups = (a.w_rows + 127) / 128;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];
  float acc[T::R];
  float p[T::R];  // this stage's partial (both formats)
#pragma unroll
  for (int j = 0; j < T::R; ++j) acc[j] = p[j] = 0.f;
  ItemInfo cur{};
  float sc = 1.0f;
  int sc_e = -1, pid_start = -1;
  int pid[T::PIDS];
#pragma unroll
  for (int i = 0; i < T::PIDS; ++i) pid[i] = -1;
  const int total = w.total;
  int kt = w.global(0) % kt_count;  // K stage of the current step (advanced below, no division per step)
#pragma unroll 1
  for (int step = 0; step < total; ++step) {
    const int s = step % T::STAGES;
    if (!hp::tma::mbar_wait(full_bar(s), (step / T::STAGES) & 1)) hp::tma::mbar_hang_report(1);
    // The token rows came by cp.async (generic proxy); wgmma reads them through the async proxy.
    hp::wg::fence_proxy_async();
    if (kt == 0 || step == 0) {
      // Lane 0 reads the slot's item fields and shuffles them to the warp: the lane that arrives on the slot's
      // empty barrier (release) is then the only reader, so the producer's next write of meta[s] is ordered after
      // the read by that arrive alone (with every lane reading, the other lanes' reads were ordered before it only
      // through __syncwarp, which compute-sanitizer's racecheck does not count: it reported the reuse as a race).
      ItemInfo m{};
      if (lane == 0) m = meta[s];
      cur.e = __shfl_sync(0xffffffffu, m.e, 0);
      cur.start = __shfl_sync(0xffffffffu, m.start, 0);
      cur.rows = __shfl_sync(0xffffffffu, m.rows, 0);
      cur.nt = __shfl_sync(0xffffffffu, m.nt, 0);
      if (!T::BLOCK && cur.e != sc_e) {
        sc_e = cur.e;
        sc = a_s * a.w_scale[cur.e];
      }
      if (T::PID_CACHED && cur.start != pid_start) {  // used at the epilogue, a stage or more later
        pid_start = cur.start;
        ws_pair_ids<T>(plan, cur, pid);
      }
    }
    const uint8_t* st = ring + s * T::STAGE_BYTES;
    const uint64_t da = hp::wg::desc_sw128(st + h * kHalfRows * kWgBK);
    const uint64_t db = hp::wg::desc_sw128(st + T::A_BYTES);
    float wsc = 1.0f;  // block mode: this half's weight block scale of this stage
    if constexpr (T::BLOCK) {
      const int r0 = half_row<T>(cur, h, a.inter);
      wsc = r0 < a.w_rows ? a.w_scale[((size_t)cur.e * row_groups + r0 / 128) * kt_count + kt] : 0.f;
    }
    // Both formats: this stage's products into a fresh partial, then into acc in fp32 (see the file comment).
    ws_mma_stage<T>(p, da, db, cur.rows);
    hp::wg::pin(p);
    if constexpr (T::BLOCK) {
      const float* xs = reinterpret_cast<const float*>(st + T::A_BYTES + T::B_BYTES);
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc[j] += p[j] * (xs[hp::wg::acc_col(lane, j)] * wsc);
    } else {
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc[j] += p[j];
    }
    release(s);
    if (kt == kt_count - 1 || step == total - 1) {  // uniform: the unit's last step in this CTA's range
      bool finish = true;
      if (T::SPLIT && a.splitk != nullptr && kt_count >= kWsSplitMinStages) {  // w.split, from kernel parameters
        const WsWork ww = ws_work<T>(a, plan);  // the rare path re-derives the split instead of holding registers
        const int u_end = ww.global(step) + kt_count - kt;
        if (u_end - kt_count < ww.s0) {  // a later piece of a unit an earlier CTA finishes
          ws_put_partial<T>(a, acc);
          finish = false;
        } else if (u_end > ww.s1) {  // this CTA finishes a unit whose last pieces are the next CTAs'
          ws_take_partials<T>(a, ww, u_end, acc);
        }
      }
      if (finish) ws_epilogue<T>(a, plan, cur, acc, sc, out_s, xch, pid);
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc[j] = 0.f;
    }
    if (++kt == kt_count) kt = 0;
  }
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, T::MIN_CTAS)
    expert_wgmma_ws_kernel(GemmArgs a, const __grid_constant__ hp::tma::TmaMap wmap) {
  extern __shared__ uint8_t ws_smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(ws_smem_raw));
  uint8_t* head = ws_smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t bars = hp::smem_u32(head);  // full[s] at + 8 s, empty[s] at + 8 (STAGES + s)
  ItemInfo* meta = reinterpret_cast<ItemInfo*>(head + 16 * T::STAGES);
  uint8_t* ring = head + T::HEAD;  // 1024-aligned slots
  auto* out_s = reinterpret_cast<__nv_bfloat16*>(ring + T::STAGES * T::STAGE_BYTES);
  float* xch = reinterpret_cast<float*>(ring + T::STAGES * T::STAGE_BYTES + T::BM * T::OUT_STRIDE * 2);
  const PlanView plan{const_cast<int*>(a.ws), a.num_experts, a.max_pairs, a.block_m};
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < T::STAGES; ++s) {
      // full: the filling producer warp's 32 lanes (+ lane 0's arrive with the TMA bytes when the copies arrive on
      // their own): one warp fills a given step
      hp::tma::mbar_init(bars + 8u * s, 33);
      hp::tma::mbar_init(bars + 8u * (T::STAGES + s), kWsConsumers / 32);  // every consumer warp
    }
    hp::tma::fence_mbar_init();
  }
  if (tid == kWsConsumers)
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&wmap)) : "memory");
  __syncthreads();

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const WsWork w = ws_work<T>(a, plan);
  if (tid >= kWsConsumers)
    ws_produce<T>(a, &wmap, plan, ring, meta, bars, w);
  else
    ws_consume<T>(a, plan, ring, meta, bars, out_s, xch, w);
}

// Resident CTAs per SM of an instantiation of either kernel (cached per device; also sets its shared memory).
template <class T>
int wg_ctas_per_sm() {
  static std::atomic<int> occ_slots[16];
  if constexpr (T::WS)
    return hp::ctas_per_sm(occ_slots, expert_wgmma_ws_kernel<T>, T::THREADS, T::SMEM);
  else
    return hp::ctas_per_sm(occ_slots, expert_wgmma_kernel<T>, T::THREADS, T::SMEM);
}

// The weights as a 3-D tensor map [E][w_rows][kdim] e4m3 with a box of 128 K columns x 64 rows of one expert (one
// half of an item), 128-byte swizzle; rows past w_rows and columns past kdim read as zeros.
inline cudaError_t encode_weight_map(hp::tma::TmaMap* map, const GemmArgs& a) {
  const uint64_t dims[3] = {(uint64_t)a.kdim, (uint64_t)a.w_rows, (uint64_t)a.num_experts};
  const uint64_t strides[2] = {(uint64_t)a.kdim, (uint64_t)a.kdim * a.w_rows};  // bytes (kdim % 64 == 0)
  const uint32_t box[3] = {(uint32_t)kWgBK, (uint32_t)kHalfRows, 1};
  return hp::tma::encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, a.w, dims, strides, box);
}

template <class T>
int launch_wgmma(const GemmArgs& a, int pdl, cudaStream_t stream) {
  const int n_tiles = item_n_tiles<T>(a);
  const long long max_items = (long long)PlanView::max_tiles_of(a.num_experts, a.max_pairs, a.block_m) * n_tiles;
  long long grid = (long long)hp::sm_count() * wg_ctas_per_sm<T>();
  if (grid > max_items) grid = max_items;
  if constexpr (T::WS) {
    if (T::SPLIT && a.splitk != nullptr && grid > kWsMaxCtas) grid = kWsMaxCtas;  // the split workspace's slots
  }
  if (grid < 1) return 0;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  if constexpr (T::WS) {
    // Encoded per call on the host (no stream work): a captured graph keeps the map of its capture, like the raw
    // pointers of the other kernels.
    hp::tma::TmaMap wmap;
    const cudaError_t e = encode_weight_map(&wmap, a);
    if (e != cudaSuccess) return (int)e;
    return (int)hp::launch(expert_wgmma_ws_kernel<T>, dim3((unsigned)grid), dim3(T::THREADS), T::SMEM, stream, opt, a,
                           wmap);
  } else {
    return (int)hp::launch(expert_wgmma_kernel<T>, dim3((unsigned)grid), dim3(T::THREADS), T::SMEM, stream, opt, a);
  }
}

// a.splitk is not used: these tiles are many and long. The tiles are 64-row halves of the weights and k32 steps of
// 128-wide stages: H and I (kdim and dst_cols, in either order) must be multiples of 64. Tr: the traits family of
// the kernel (WgTraits: expert_wgmma_kernel; WsTraits: expert_wgmma_ws_kernel).
template <template <int, bool, bool> class Tr, bool GATE_UP, bool BLOCK>
int family_dispatch(const GemmArgs& a, int pdl, cudaStream_t stream) {
  if (a.kdim % 64 != 0 || a.dst_cols % 64 != 0) return (int)cudaErrorInvalidValue;
  switch (a.block_m) {
    case 16:
      return launch_wgmma<Tr<16, GATE_UP, BLOCK>>(a, pdl, stream);
    case 32:
      return launch_wgmma<Tr<32, GATE_UP, BLOCK>>(a, pdl, stream);
    case 64:
      return launch_wgmma<Tr<64, GATE_UP, BLOCK>>(a, pdl, stream);
    case 128:
      return launch_wgmma<Tr<128, GATE_UP, BLOCK>>(a, pdl, stream);
    default:
      return (int)cudaErrorInvalidValue;
  }
}
// The launchers of the two kernels, as HP_MOE_GEMM_ENTRY takes them (RUN<GATE_UP, BLOCK>).
template <bool GATE_UP, bool BLOCK>
constexpr auto wg_dispatch = &family_dispatch<WgTraits, GATE_UP, BLOCK>;
template <bool GATE_UP, bool BLOCK>
constexpr auto ws_dispatch = &family_dispatch<WsTraits, GATE_UP, BLOCK>;

}  // namespace
}  // namespace hp_moe

extern "C" {

// block_m values the wgmma GEMMs (both kernels) are instantiated for (1) or not (0).
int hp_moe_wgmma_block_m_ok(int block_m) {
  return block_m == 16 || block_m == 32 || block_m == 64 || block_m == 128;
}

// int32 words of the warp-specialized GEMM's split workspace at this block_m (flags, then fp32 partials): zeroed once,
// every launch leaves the flags at 0 again. 0 where units are never cut, -1 for a block_m the kernel is not
// instantiated for.
long long hp_moe_ws_split_ints(int block_m) {
  switch (block_m) {  // 0 where the gate-up never cuts units (WsTraits::SPLIT): no workspace to pass
    case 16:
      return hp_moe::WsTraits<16, true, false>::SPLIT ? hp_moe::ws_split_ints(16) : 0;
    case 32:
      return hp_moe::WsTraits<32, true, false>::SPLIT ? hp_moe::ws_split_ints(32) : 0;
    case 64:
      return hp_moe::WsTraits<64, true, false>::SPLIT ? hp_moe::ws_split_ints(64) : 0;
    case 128:
      return hp_moe::WsTraits<128, true, false>::SPLIT ? hp_moe::ws_split_ints(128) : 0;
    default:
      return -1;
  }
}
// The flags at the head of that workspace (mirrored as WS_SPLIT_FLAGS in Python).
int hp_moe_ws_split_flags() {
  return hp_moe::kWsMaxCtas;
}

// The wgmma gate-up and down GEMMs: arguments as hp_moe_gate_up and hp_moe_down. _wg: expert_wgmma_kernel (every
// thread loads, cp.async); _ws: expert_wgmma_ws_kernel (a TMA producer warp and two consumer warpgroups).
HP_MOE_GEMM_ENTRY(hp_moe_gate_up_wg, true, hp_moe::wg_dispatch, true)
HP_MOE_GEMM_ENTRY(hp_moe_down_wg, false, hp_moe::wg_dispatch, true)
HP_MOE_GEMM_ENTRY(hp_moe_gate_up_ws, true, hp_moe::ws_dispatch, true)
HP_MOE_GEMM_ENTRY(hp_moe_down_ws, false, hp_moe::ws_dispatch, true)

}  // extern "C"
