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
// per-item prologue would leave the copy engine idle half the time). STAGES slots, prefetch distance STAGES - 2:
// iteration L waits for its own copies (cp.async.wait_group), fences them to the async proxy, __syncthreads, issues
// this stage's wgmma, then refills the slot of L - 2 (every warpgroup passed wgmma.wait_group 1 at L - 1, so L - 2's
// products are done) with stage L + STAGES - 2, and keeps one wgmma group in flight. All threads load (no producer
// warp): token rows are gathered through the routing index (not a TMA 2D box), and a single barrier per stage has no
// mbarrier phase to lose.
//
// Scales: per-tensor: the fp32 accumulators hold the exact-product sums; the epilogue multiplies by a_scale *
// w_scale[e] (as the mma.sync kernel). Block: each stage's wgmma write a fresh partial (scale-d = 0 on its first
// k32), then acc += partial * (x group scale of the token * weight block scale) in fp32, k-stage order: the
// contract's per-128-K-block accumulation. The two halves of an item each sit inside one 128-row weight block
// (64-row halves on 64-aligned rows).
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
  static constexpr int FIT = (kSmemBudget - 1024 - OUT_BYTES) / STAGE_BYTES;
  static constexpr int STAGES = FIT > 8 ? 8 : FIT;
  static constexpr int SMEM = 1024 + STAGES * STAGE_BYTES + OUT_BYTES;
  static constexpr int A_PER_THREAD = kItemRows * 8 / THREADS;  // 16-byte chunks per thread per stage
  static constexpr int B_PER_THREAD = BM * 8 / THREADS;
  static_assert(STAGES >= 3, "prefetch distance STAGES - 2 >= 1");
  static_assert(WN == 16 || WN == 32 || WN == 64, "wgmma N instantiated: 16, 32, 64");
  static_assert(B_PER_THREAD >= 1 && BM * 8 % THREADS == 0, "every thread loads whole B chunks");
  static constexpr bool WS = false;
  static_assert(SMEM <= 227 * 1024, "shared memory per block (sm_90)");
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
// which runs STAGES - 2 stages ahead, and the compute / epilogue side).
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

// The item's output tile, bf16 in shared memory (out_s [BM][OUT_STRIDE]), to act (by sorted position, 128 bytes
// per token row) or ybuf (at the original pair index, 256 bytes per row; columns past H skipped) as 16-byte stores
// by `nthreads` threads (thread index `t`); rows past the tile's are not stored.
template <class T>
__device__ __forceinline__ void wg_store_tile(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                              const __nv_bfloat16* out_s, int t, int nthreads) {
  constexpr int CPR = T::OUT_COLS * 2 / 16;  // 16-byte chunks per token row
  for (int idx = t; idx < T::BM * CPR; idx += nthreads) {
    const int n = idx / CPR, c = idx - n * CPR;
    if (n >= it.rows) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(out_s + n * T::OUT_STRIDE + c * 8);
    if constexpr (T::GATE_UP) {
      *reinterpret_cast<uint4*>(a.dst + (size_t)(it.start + n) * a.dst_cols + it.nt * kHalfRows + c * 8) = v;
    } else {
      const int col = it.nt * kItemRows + c * 8;
      if (col < a.dst_cols) {
        const int p = plan.sorted()[it.start + n];
        *reinterpret_cast<uint4*>(a.dst + (size_t)p * a.dst_cols + col) = v;
      }
    }
  }
}

// The item's epilogue: fp32 accumulators (x the per-tensor scale) -> bf16 tile in shared memory -> 16-byte stores.
template <class T>
__device__ __forceinline__ void wg_epilogue(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                            const float (&acc0)[T::R], const float (&acc1)[T::R], float sc,
                                            __nv_bfloat16* out_s) {
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wiw = (tid >> 5) & 3;
#pragma unroll
  for (int j = 0; j < T::R; ++j) {
    const int r = hp::wg::acc_row(wiw, lane, j);
    const int n = wg * T::WN + hp::wg::acc_col(lane, j);
    const float v0 = T::BLOCK ? acc0[j] : acc0[j] * sc;
    const float v1 = T::BLOCK ? acc1[j] : acc1[j] * sc;
    if constexpr (T::GATE_UP) {
      out_s[n * T::OUT_STRIDE + r] = __float2bfloat16_rn(silu_mul(v0, v1));
    } else {
      out_s[n * T::OUT_STRIDE + r] = __float2bfloat16_rn(v0);
      out_s[n * T::OUT_STRIDE + kHalfRows + r] = __float2bfloat16_rn(v1);
    }
  }
  __syncthreads();
  wg_store_tile<T>(a, plan, it, out_s, tid, T::THREADS);
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, 1) expert_wgmma_kernel(GemmArgs a) {
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

  // Loader state: the item whose stages are being issued and the source rows of this thread's B chunks.
  int ld_i = -1;
  ItemInfo ld{};
  int bsrc[T::B_PER_THREAD];
  int ssrc = -1;
  auto issue = [&](int step) {
    if (step < total) {
      const int i = step / kt_count, kt = step - i * kt_count;
      if (i != ld_i) {
        ld_i = i;
        ld = item_info<T>(plan, (int)blockIdx.x + i * (int)gridDim.x, n_tiles);
#pragma unroll
        for (int b = 0; b < T::B_PER_THREAD; ++b)
          bsrc[b] = src_row<T>(plan, ld, (tid >> 3) + b * (T::THREADS / 8), a.topk);
        if (T::BLOCK) ssrc = tid < T::BM ? src_row<T>(plan, ld, tid, a.topk) : -1;
      }
      wg_load_stage<T>(a, ring + (step % T::STAGES) * T::STAGE_BYTES, ld, bsrc, ssrc, kt);
    }
    cp_commit();  // one group per step, empty past the end: the wait counts below stay exact
  };

  float acc0[T::R], acc1[T::R];
  float p0[T::BLOCK ? T::R : 1], p1[T::BLOCK ? T::R : 1];  // block mode: this stage's partials
#pragma unroll
  for (int j = 0; j < T::R; ++j) acc0[j] = acc1[j] = 0.f;
#pragma unroll
  for (int j = 0; j < (T::BLOCK ? T::R : 1); ++j) p0[j] = p1[j] = 0.f;

#pragma unroll 1
  for (int s = 0; s < T::STAGES - 2; ++s) issue(s);

  ItemInfo cur{};
  int cur_i = -1;
  float sc = 1.0f;
#pragma unroll 1
  for (int step = 0; step < total; ++step) {
    const int i = step / kt_count, kt = step - i * kt_count;
    if (i != cur_i) {
      cur_i = i;
      cur = item_info<T>(plan, (int)blockIdx.x + i * (int)gridDim.x, n_tiles);
      sc = T::BLOCK ? 1.0f : a_s * a.w_scale[cur.e];
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
    cp_wait<T::STAGES - 3>();  // this thread's copies of `step` have landed
    hp::wg::fence_proxy_async();
    __syncthreads();  // everyone's copies visible; every warpgroup is done with step - 2's slot

    // This stage's wgmma are issued first, then the refill of step - 2's slot: the loader's plan look-ups at an
    // item change (dependent L2 reads) overlap the tensor cores instead of delaying them.
    const uint8_t* st = ring + (step % T::STAGES) * T::STAGE_BYTES;
    const uint64_t da0 = hp::wg::desc_sw128(st);
    const uint64_t da1 = hp::wg::desc_sw128(st + kHalfRows * kWgBK);
    const uint64_t db = hp::wg::desc_sw128(st + T::A_BYTES + wg * T::WN * kWgBK);
    if constexpr (T::BLOCK) {
      hp::wg::fence();
#pragma unroll
      for (int k = 0; k < kWgBK / 32; ++k) {
        hp::wg::mma_e4m3<T::WN>(p0, da0 + 2 * k, db + 2 * k, k);
        hp::wg::mma_e4m3<T::WN>(p1, da1 + 2 * k, db + 2 * k, k);
      }
      hp::wg::commit();
      issue(step + T::STAGES - 2);
      hp::wg::wait<0>();
      hp::wg::pin(p0);
      hp::wg::pin(p1);
      const float* xs = reinterpret_cast<const float*>(st + T::A_BYTES + T::B_BYTES);
#pragma unroll
      for (int j = 0; j < T::R; ++j) {
        const float x = xs[wg * T::WN + hp::wg::acc_col(lane, j)];
        acc0[j] += p0[j] * (x * ws0);
        acc1[j] += p1[j] * (x * ws1);
      }
    } else {
      hp::wg::pin(acc0);
      hp::wg::pin(acc1);
      hp::wg::fence();
#pragma unroll
      for (int k = 0; k < kWgBK / 32; ++k) {
        hp::wg::mma_e4m3<T::WN>(acc0, da0 + 2 * k, db + 2 * k, 1);
        hp::wg::mma_e4m3<T::WN>(acc1, da1 + 2 * k, db + 2 * k, 1);
      }
      hp::wg::commit();
      issue(step + T::STAGES - 2);
      hp::wg::wait<1>();  // step - 1's products are done: its slot may be refilled after the next barrier
      hp::wg::pin(acc0);
      hp::wg::pin(acc1);
    }
    if (kt == kt_count - 1) {  // uniform: the item's last stage
      hp::wg::wait<0>();
      hp::wg::pin(acc0);
      hp::wg::pin(acc1);
      wg_epilogue<T>(a, plan, cur, acc0, acc1, sc, out_s);
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc0[j] = acc1[j] = 0.f;
      // out_s is rewritten only at the next item's end, after at least one more top-of-loop barrier.
    }
  }
  hp::wg::wait<0>();
  cp_wait<0>();  // no copy may still target this CTA's shared memory when it exits
}

// ------------------------------------------------------------------------------------------------------------
// Warp-specialized variant (MoEPlan.gemm == "wgmma_ws"): expert_wgmma_ws_kernel<WsTraits>.
//
// Same items, numerics, buffers and epilogue layout as expert_wgmma_kernel; what changes is who moves the bytes:
//   - warp 8 (the producer, 32 lanes) walks the CTA's (item, K stage) sequence up to STAGES stages ahead of the
//     tensor cores. Per stage lane 0 raises the slot's "full" mbarrier by the weight bytes and issues two 3-D TMA
//     loads (w[e, rows of half h, 128 K columns], 64 x 128 B each, 128-byte swizzle; OOB rows / K columns zero), and
//     the 32 lanes gather the tile's token rows (xq by token, aq by sorted position) with 16-byte cp.async into the
//     swizzled B layout (+ 4-byte group scales in block mode). A lane arrives on the slot's "full" barrier once its
//     own copies of that stage have landed and been fenced to the async proxy: it waits for them LAG stages later
//     (cp.async.wait_group LAG), so LAG stages of token rows and up to STAGES of weights are in flight;
//   - the item's plan fields (expert, start, rows, n-tile) are read once by the producer, where the dependent reads
//     (tile -> expert -> offsets) overlap earlier stages, and handed to the consumers in the slot (meta[slot]);
//   - warps 0-7 are two consumer warpgroups; warpgroup h computes half h of the item (64 weight rows) against all
//     BM token rows: wgmma m64nBMk32 (N up to 128), per-tensor with one group in flight (the slot of the previous
//     stage is released when wait_group 1 returns), block-wise folding each stage's partial (wait_group 0);
//     releasing = one arrival per warp on the slot's "empty" barrier, which the producer waits on before refilling;
//   - epilogue: the two halves meet in shared memory (gate-up: warpgroup 1 leaves u in fp32, warpgroup 0 forms
//     silu(g) * u; down: each warpgroup writes its 64 columns), then 16-byte stores by all 256 consumer threads
//     (wg_store_tile), between named barriers of the consumers only: the producer keeps loading meanwhile.
// No __syncthreads after the set-up. Every mbarrier wait is bounded (hp::tma::kHangNs) and traps; trap codes: 1 a
// consumer's "full" wait, 2 the producer's "empty" wait.
// Launch: persistent grid min(SMs, items), 288 threads, one CTA per SM (up to ~225 KB of shared memory).
constexpr int kWsConsumers = 256;  // two warpgroups
constexpr int kWsThreads = kWsConsumers + 32;
constexpr int kWsEpiBar = 1;  // named barrier of the consumer threads (0 is __syncthreads)

template <int BM_, bool GATE_UP_, bool BLOCK_>
struct WsTraits {
  static constexpr int BM = BM_;    // token rows per tile = wgmma N of each warpgroup
  static constexpr int R = BM / 2;  // fp32 accumulator registers per thread (one 64-row half)
  static constexpr bool GATE_UP = GATE_UP_;
  static constexpr bool BLOCK = BLOCK_;
  static constexpr int THREADS = kWsThreads;
  static constexpr int A_BYTES = kItemRows * kWgBK;  // two 64-row halves, 8 KB each: one TMA box each
  static constexpr int B_BYTES = BM * kWgBK;
  static constexpr int SC_BYTES = BLOCK ? BM * 4 : 0;
  static constexpr int STAGE_BYTES = (A_BYTES + B_BYTES + SC_BYTES + 1023) / 1024 * 1024;
  static constexpr int OUT_COLS = GATE_UP ? kHalfRows : kItemRows;
  static constexpr int OUT_STRIDE = OUT_COLS + 8;
  static constexpr int XCH_STRIDE = kHalfRows + 1;  // fp32 u of gate-up, [BM][65]: conflict-free column writes
  static constexpr int EPI_BYTES = BM * OUT_STRIDE * 2 + (GATE_UP ? BM * XCH_STRIDE * 4 : 0);
  static constexpr int HEAD = 1024;  // barriers (full, empty) and the per-slot item fields
  static constexpr int FIT = (227 * 1024 - 1024 - HEAD - EPI_BYTES) / STAGE_BYTES;
  static constexpr int STAGES = FIT > 8 ? 8 : FIT;
  static constexpr int LAG = STAGES / 2;  // stages between a token-row copy's issue and its lane's arrival
  static constexpr int SMEM = 1024 + HEAD + STAGES * STAGE_BYTES + EPI_BYTES;
  static constexpr int B_PER_LANE = BM * 8 / 32;  // 16-byte token-row chunks per producer lane per stage
  static constexpr int SC_PER_LANE = (BM + 31) / 32;
  static constexpr bool WS = true;
  static_assert(STAGES >= 3 && LAG >= 1 && LAG <= STAGES - 1, "ring depth");
  static_assert(HEAD >= STAGES * (16 + 16), "barriers + item fields fit the head");
  static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "wgmma N instantiated: 16, 32, 64, 128");
  static_assert(SMEM <= 227 * 1024, "shared memory per block (sm_90)");
};

__device__ __forceinline__ void consumer_bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kWsEpiBar), "n"(kWsConsumers) : "memory");
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

// The producer warp: every (item, K stage) of this CTA into the ring, see the block comment above.
template <class T>
__device__ __forceinline__ void ws_produce(const GemmArgs& a, const hp::tma::TmaMap* wmap, const PlanView& plan,
                                           uint8_t* ring, ItemInfo* meta, uint32_t bars, int n_tiles, int kt_count,
                                           int total) {
  const int lane = threadIdx.x & 31, q = lane & 7;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (T::STAGES + s); };
  int ld_i = -1;
  ItemInfo ld{};
  int bsrc[T::B_PER_LANE];
  int ssrc[T::SC_PER_LANE];
#pragma unroll 1
  for (int step = 0; step < total; ++step) {
    const int i = step / kt_count, kt = step - i * kt_count, s = step % T::STAGES;
    if (i != ld_i) {
      ld_i = i;
      ld = item_info<T>(plan, (int)blockIdx.x + i * (int)gridDim.x, n_tiles);
#pragma unroll
      for (int b = 0; b < T::B_PER_LANE; ++b) bsrc[b] = src_row<T>(plan, ld, (lane >> 3) + 4 * b, a.topk);
      if constexpr (T::BLOCK) {
#pragma unroll
        for (int b = 0; b < T::SC_PER_LANE; ++b) ssrc[b] = src_row<T>(plan, ld, lane + 32 * b, a.topk);
      }
    }
    if (step >= T::STAGES && !hp::tma::mbar_wait(empty_bar(s), ((step / T::STAGES) & 1) ^ 1))
      hp::tma::mbar_hang_report(2);
    uint8_t* st = ring + s * T::STAGE_BYTES;
    if (lane == 0) {
      meta[s] = ld;
      hp::tma::mbar_expect_tx(full_bar(s), T::A_BYTES);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        hp::tma::tma_load_3d(hp::smem_u32(st + h * kHalfRows * kWgBK), wmap, kt * kWgBK, half_row<T>(ld, h, a.inter),
                             ld.e, full_bar(s));
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
    cp_commit();
    if (step >= T::LAG) {  // this lane's copies of step - LAG have landed: publish them
      cp_wait<T::LAG>();
      hp::wg::fence_proxy_async();
      hp::tma::mbar_arrive_local(full_bar((step - T::LAG) % T::STAGES));
    }
  }
  cp_wait<0>();
  hp::wg::fence_proxy_async();
  for (int step = total > T::LAG ? total - T::LAG : 0; step < total; ++step)
    hp::tma::mbar_arrive_local(full_bar(step % T::STAGES));
}

// The consumers' epilogue of one item: halves meet in shared memory, then wg_store_tile by the 256 consumers.
template <class T>
__device__ __forceinline__ void ws_epilogue(const GemmArgs& a, const PlanView& plan, const ItemInfo& it,
                                            const float (&acc)[T::R], float sc, __nv_bfloat16* out_s, float* xch) {
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
  wg_store_tile<T>(a, plan, it, out_s, tid, kWsConsumers);
}

// One stage of wgmma for warpgroup-half descriptor da against the token rows db: 4 k32 steps of m64nNk32 with N the
// narrowest instantiated width (16, 32, 64, BM) holding the item's `rows` (a uniform choice per item), so a tile that
// is mostly empty (an expert's last, partial tile) costs the tensor cores and the B reads only its occupied rows.
// The m64nN accumulator layout puts columns < N in registers < N / 2 for every N, so the narrower instruction
// writes a prefix of d; the registers past it keep their zeros (per-tensor) and only reach columns never stored.
// fresh: block mode, the first k32 overwrites d (scale-d 0); else every k32 accumulates.
template <class T, int N>
__device__ __forceinline__ void ws_mma_n(float (&d)[T::R], uint64_t da, uint64_t db, bool fresh) {
  auto& dn = *reinterpret_cast<float (*)[N / 2]>(&d[0]);
#pragma unroll
  for (int k = 0; k < kWgBK / 32; ++k) hp::wg::mma_e4m3<N>(dn, da + 2 * k, db + 2 * k, fresh ? k : 1);
}
template <class T>
__device__ __forceinline__ void ws_mma_stage(float (&d)[T::R], uint64_t da, uint64_t db, int rows, bool fresh) {
  if constexpr (T::BM >= 128) {
    if (rows > 64) return ws_mma_n<T, 128>(d, da, db, fresh);
  }
  if constexpr (T::BM >= 64) {
    if (rows > 32) return ws_mma_n<T, 64>(d, da, db, fresh);
  }
  if constexpr (T::BM >= 32) {
    if (rows > 16) return ws_mma_n<T, 32>(d, da, db, fresh);
  }
  ws_mma_n<T, 16>(d, da, db, fresh);
}

// Consumer warpgroup h (threads 0-255): every stage of the ring in order, half h of each item.
template <class T>
__device__ __forceinline__ void ws_consume(const GemmArgs& a, const PlanView& plan, const uint8_t* ring,
                                           const ItemInfo* meta, uint32_t bars, __nv_bfloat16* out_s, float* xch,
                                           int kt_count, int total) {
  const int tid = threadIdx.x, lane = tid & 31, h = tid >> 7;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (T::STAGES + s); };
  auto release = [&](int s) {  // this warp's wgmma reads of slot s (and its scale reads) are complete
    __syncwarp();
    if (lane == 0) hp::tma::mbar_arrive_local(empty_bar(s));
  };
  const int row_groups = (a.w_rows + 127) / 128;
  const float a_s = T::BLOCK ? 1.0f : a.a_scale[0];
  float acc[T::R];
  float p[T::BLOCK ? T::R : 1];
#pragma unroll
  for (int j = 0; j < T::R; ++j) acc[j] = 0.f;
#pragma unroll
  for (int j = 0; j < (T::BLOCK ? T::R : 1); ++j) p[j] = 0.f;
  ItemInfo cur{};
  float sc = 1.0f;
  int pending = -1;  // per-tensor: the slot whose wgmma group is still in flight
#pragma unroll 1
  for (int step = 0; step < total; ++step) {
    const int kt = step % kt_count, s = step % T::STAGES;
    if (!hp::tma::mbar_wait(full_bar(s), (step / T::STAGES) & 1)) hp::tma::mbar_hang_report(1);
    if (kt == 0) {
      cur = meta[s];
      sc = T::BLOCK ? 1.0f : a_s * a.w_scale[cur.e];
    }
    const uint8_t* st = ring + s * T::STAGE_BYTES;
    const uint64_t da = hp::wg::desc_sw128(st + h * kHalfRows * kWgBK);
    const uint64_t db = hp::wg::desc_sw128(st + T::A_BYTES);
    if constexpr (T::BLOCK) {
      const int r0 = half_row<T>(cur, h, a.inter);
      const float wsc = r0 < a.w_rows ? a.w_scale[((size_t)cur.e * row_groups + r0 / 128) * kt_count + kt] : 0.f;
      hp::wg::fence();
      ws_mma_stage<T>(p, da, db, cur.rows, true);
      hp::wg::commit();
      hp::wg::wait<0>();
      hp::wg::pin(p);
      const float* xs = reinterpret_cast<const float*>(st + T::A_BYTES + T::B_BYTES);
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc[j] += p[j] * (xs[hp::wg::acc_col(lane, j)] * wsc);
      release(s);
    } else {
      hp::wg::pin(acc);
      hp::wg::fence();
      ws_mma_stage<T>(acc, da, db, cur.rows, false);
      hp::wg::commit();
      hp::wg::wait<1>();
      hp::wg::pin(acc);
      if (pending >= 0) release(pending);
      pending = s;
    }
    if (kt == kt_count - 1) {  // uniform: the item's last stage
      hp::wg::wait<0>();
      hp::wg::pin(acc);
      if (pending >= 0) release(pending);
      pending = -1;
      ws_epilogue<T>(a, plan, cur, acc, sc, out_s, xch);
#pragma unroll
      for (int j = 0; j < T::R; ++j) acc[j] = 0.f;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kWsThreads, 1)
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
      hp::tma::mbar_init(bars + 8u * s, 32);  // the producer's 32 lanes (lane 0 adds the TMA bytes)
      hp::tma::mbar_init(bars + 8u * (T::STAGES + s), kWsConsumers / 32);  // every consumer warp
    }
    hp::tma::fence_mbar_init();
  }
  if (tid == kWsConsumers)
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&wmap)) : "memory");
  __syncthreads();

  hp::pdl_wait();
  hp::pdl_launch_dependents();

  const ItemSeq seq = item_sequence<T>(a, plan);
  const int n_tiles = seq.n_tiles, kt_count = seq.kt_count, total = seq.total;
  if (tid >= kWsConsumers)
    ws_produce<T>(a, &wmap, plan, ring, meta, bars, n_tiles, kt_count, total);
  else
    ws_consume<T>(a, plan, ring, meta, bars, out_s, xch, kt_count, total);
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

// The wgmma gate-up and down GEMMs: arguments as hp_moe_gate_up and hp_moe_down. _wg: expert_wgmma_kernel (every
// thread loads, cp.async); _ws: expert_wgmma_ws_kernel (a TMA producer warp and two consumer warpgroups).
HP_MOE_GEMM_ENTRY(hp_moe_gate_up_wg, true, hp_moe::wg_dispatch)
HP_MOE_GEMM_ENTRY(hp_moe_down_wg, false, hp_moe::wg_dispatch)
HP_MOE_GEMM_ENTRY(hp_moe_gate_up_ws, true, hp_moe::ws_dispatch)
HP_MOE_GEMM_ENTRY(hp_moe_down_ws, false, hp_moe::ws_dispatch)

}  // extern "C"
