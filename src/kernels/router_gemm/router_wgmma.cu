// Router GEMM prefill on SM90 tensor cores through wgmma: out[M, N] (fp32) = x[M, K] (bf16) @ (W0 + s1 * W1)^T,
// the FP32 router weight held as two BF16 parts (W ~ W0 + W1 / 256). Two-part (BF16x2) only.
//
// What runs: each CTA owns a BM x BN output tile (BM = 64 per warpgroup, 1 or 2 warpgroups; BN = 96, 128 or
// 192) and a K range (split-K over a (1, 1, S) cluster). Per 64-wide k-tile the whole CTA stages x[BM, 64],
// W0[BN, 64] and W1[BN, 64] into shared memory with cp.async (16 B per thread-chunk, zero-fill for rows past M),
// written in the 128-byte-swizzle layout (16-byte chunk c of row r lands at chunk c ^ (r % 8); each tile
// 1024-byte aligned), so one shared-memory matrix descriptor per operand feeds wgmma directly. Each warpgroup
// then issues, per k16 step, wgmma m64nBNk16 for W0 into acc0 and for W1 into acc1 (the x fragment is read once
// per product by the tensor core; both accumulators fp32, like the emulation's two products), commits them as
// one group and waits for the previous group only (wgmma.wait_group 1), so the tensor cores run the current
// k-tile while the next copies land. Epilogue: acc0 + s1 * acc1 in fp32, float2 stores; with S > 1 splits the
// combined partial tiles are summed over the cluster's ranks in rank order through distributed shared memory
// (hp_router::cluster_splitk_reduce, shared with router_tiled_kernel: no atomics, no workspace, graph-safe).
//
// Pipeline (STAGES slots, prefetch distance STAGES - 2): iteration t waits for its own copies of tile t
// (cp.async.wait_group STAGES - 3), fences them to the async proxy (fence.proxy.async: wgmma reads shared memory
// through the async proxy, cp.async writes through the generic one), and __syncthreads; after that barrier every
// warpgroup has passed wgmma.wait_group 1 of iteration t - 1, so tile t - 2's slot is free and is refilled with
// tile t + STAGES - 2. One barrier per k-tile; no mbarriers, so nothing can wait forever on a lost arrival.
//
// Why cp.async and not TMA: no driver entry point / tensor map per call, rows past M are zero-filled by the
// same instruction, and every thread's address arithmetic stays visible. Cost: ~10 (BN 96) to ~14 (BN 128)
// 16-byte cp.async per thread per k-tile and no cluster multicast of the W tile.
//
// Traffic (L2 -> SM): M * N * K * 2 B * (1 / BN + 2 / BM): the wider the tile, the fewer re-reads of x and W.
// Registers: acc0 + acc1 are 2 * BN / 2 fp32 per thread (96 at BN 96, 128 at BN 128); one CTA per SM
// (__launch_bounds__(..., 1): up to 255 registers).
// Configurations (WGS warpgroups, BM = 64 * WGS, BN, STAGES; shared memory = STAGES * (BM + 2 * BN) * 128 B):
//   wg128n96  2 WG, 128 x  96, 4 stages (160 KB) (a 128 x 128 form, the N = 256 pick until the BN = 128 TMA kernel
//   beat it at every tuned point, was removed)
#include <cooperative_groups.h>
#include <cstdint>

#include "common/launch.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "router_gemm.cuh"
#include "router_variants.cuh"
#include "router_wgmma.cuh"

// HP_ROUTER_TRACE=1 (a diagnostic build: HOTPATHS_NVCC_DEFINES="HP_ROUTER_TRACE=1") compiles the per-CTA timeline
// of router_wgmma_ws_kernel and hp_router_set_trace; production builds carry no trace code at all.
#ifndef HP_ROUTER_TRACE
#define HP_ROUTER_TRACE 0
#endif

namespace cg = cooperative_groups;

namespace {

constexpr int kWgBK = 64;             // k-tile: one 128-byte swizzle row of bf16
constexpr int kRowBytes = kWgBK * 2;  // 128

// The split-K epilogue's first step: this thread's part of the combined partial tile, acc0 + s1 * acc1 in the wgmma
// m64nBN accumulator layout (register j of thread (warp w, lane l) holds row 16 w + l / 4 + 8 ((j >> 1) & 1),
// column 8 (j >> 2) + 2 (l % 4) + (j & 1); row0 / col0 give this thread's first), into red[rows][BN + 4] (padded
// rows: the cross-rank reads that follow are float4 over a row).
template <int BN>
__device__ __forceinline__ void partial_to_smem(float* red, const float (&acc0)[BN / 2], const float (&acc1)[BN / 2],
                                                float s1, int row0, int col0) {
  constexpr int LDR = BN + 4;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * j + 2 * h;
      *reinterpret_cast<float2*>(red + (row0 + 8 * h) * LDR + 8 * j + col0) =
          make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
    }
}

// The unsplit epilogue: acc0 + s1 * acc1 of this thread's accumulators (wgmma m64nBN layout, see partial_to_smem)
// straight to out as float2, rows past M masked.
template <int BN>
__device__ __forceinline__ void store_combined(float* __restrict__ out, const float (&acc0)[BN / 2],
                                               const float (&acc1)[BN / 2], float s1, int M, int N, int m_block,
                                               int n_block, int row0, int col0) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m_block + row0 + 8 * h, e = 4 * j + 2 * h;
      if (row < M)
        *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + n_block + 8 * j + col0) =
            make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
    }
}

// wgmma m64nNk16 bf16 with N / 2 = 48, 64 or 96 fp32 accumulator registers per thread (register lists: the
// HP_WG_REGS_<R> / HP_WG_OPS_<R> tables of common/wgmma.cuh).
// D[64 x N] (fp32, R regs per thread) += A[64 x 16] * B[N x 16]^T, both K-major in shared memory; DA, DB: the
// descriptors' operand numbers ("%R", "%(R + 1)").
#define HP_WGMMA_BF16(N, R, DA, DB)                                     \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N                   \
               "k16.f32.bf16.bf16 "                                     \
               "{" HP_WG_REGS_##R "}, " DA ", " DB ", 1, 1, 1, 0, 0;\n" \
               : HP_WG_OPS_##R                                          \
               : "l"(desc_a), "l"(desc_b))

// D[64 x BN] (fp32, BN / 2 regs per thread) += A[64 x 16] * B[BN x 16]^T for BN = 96, 128 or 192.
template <int BN>
__device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(BN == 96 || BN == 128 || BN == 192, "wgmma m64nBNk16: BN 96, 128 or 192");
  if constexpr (BN == 96)
    HP_WGMMA_BF16(96, 48, "%48", "%49");
  else if constexpr (BN == 128)
    HP_WGMMA_BF16(128, 64, "%64", "%65");
  else
    HP_WGMMA_BF16(192, 96, "%96", "%97");
}

// One k-tile of both products on this warpgroup's 64 rows: stage st holds x[BM, 64] (A_BYTES), then W0[BN, 64] and
// W1[BN, 64], each 128-byte swizzled; acc0 += x W0^T, acc1 += x W1^T as one commit group, then wait for the
// previous group only (wgmma.wait_group 1): on return the previous k-tile's products are done, this one's in flight.
template <int BN, int A_BYTES>
__device__ __forceinline__ void ktile_mma(float (&acc0)[BN / 2], float (&acc1)[BN / 2], const unsigned char* st,
                                          int wg) {
  const uint64_t da = hp::wg::desc_sw128(st + wg * 64 * kRowBytes);
  const uint64_t db0 = hp::wg::desc_sw128(st + A_BYTES);
  const uint64_t db1 = hp::wg::desc_sw128(st + A_BYTES + BN * kRowBytes);
  hp::wg::pin(acc0);
  hp::wg::pin(acc1);
  hp::wg::fence();
#pragma unroll
  for (int ks = 0; ks < kWgBK / 16; ++ks) {
    wgmma_bn<BN>(acc0, da + 2 * ks, db0 + 2 * ks);
    wgmma_bn<BN>(acc1, da + 2 * ks, db1 + 2 * ks);
  }
  hp::wg::commit();
  hp::wg::wait<1>();
  hp::wg::pin(acc0);
  hp::wg::pin(acc1);
}
// Waits for every committed wgmma group; the accumulators are final after it.
template <int R>
__device__ __forceinline__ void wgmma_drain(float (&acc0)[R], float (&acc1)[R]) {
  hp::wg::wait<0>();
  hp::wg::pin(acc0);
  hp::wg::pin(acc1);
}

template <int WGS, int BN, int STAGES>
constexpr int wg_smem_bytes() {
  constexpr int pipe = STAGES * (64 * WGS + 2 * BN) * kRowBytes;
  constexpr int red = 64 * WGS * (BN + 4) * 4;
  return (pipe > red ? pipe : red) + 1024;  // + 1024: the base is rounded up to the swizzle atom
}

template <int WGS, int BN, int STAGES>
__global__ void __launch_bounds__(WGS * 128, 1)
    router_wgmma_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w0,
                        const __nv_bfloat16* __restrict__ w1, float* __restrict__ out, int M, int N, int K, float s1) {
  constexpr int BM = 64 * WGS, THREADS = 128 * WGS, R = BN / 2;
  constexpr int A_BYTES = BM * kRowBytes, B_BYTES = BN * kRowBytes, STAGE_BYTES = A_BYTES + 2 * B_BYTES;
  static_assert(STAGES >= 3, "prefetch distance STAGES - 2 >= 1");
  static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256 && (BN * kRowBytes) % 1024 == 0, "wgmma N, swizzle atoms");
  static_assert(wg_smem_bytes<WGS, BN, STAGES>() <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
  extern __shared__ unsigned char wg_smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(wg_smem_raw));
  unsigned char* smem = wg_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);

  const int tid = threadIdx.x, wg = tid >> 7;
  const int n_block = blockIdx.x * BN, m_block = blockIdx.y * BM;
  const int splits = gridDim.z, rank = blockIdx.z;  // cluster (1, 1, splits): rank == blockIdx.z
  const int kt_total = K / kWgBK;
  const int kt_begin = static_cast<int>((static_cast<long long>(kt_total) * rank) / splits);
  const int kt_end = static_cast<int>((static_cast<long long>(kt_total) * (rank + 1)) / splits);

  auto load_stage = [&](int slot, int kt) {
    unsigned char* sa = smem + slot * STAGE_BYTES;
    const int k0 = kt * kWgBK;
#pragma unroll
    for (int i = tid; i < BM * 8; i += THREADS) {
      const int r = i >> 3, c = i & 7, gm = m_block + r;
      const __nv_bfloat16* src = x + static_cast<size_t>(gm < M ? gm : 0) * K + k0 + c * 8;
      hp_router::cp_async16(sa + r * kRowBytes + ((c ^ (r & 7)) << 4), src, gm < M);
    }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      unsigned char* sb = sa + A_BYTES + p * B_BYTES;
      const __nv_bfloat16* w = p ? w1 : w0;
#pragma unroll
      for (int i = tid; i < BN * 8; i += THREADS) {
        const int r = i >> 3, c = i & 7;
        hp_router::cp_async16(sb + r * kRowBytes + ((c ^ (r & 7)) << 4),
                              w + static_cast<size_t>(n_block + r) * K + k0 + c * 8, true);
      }
    }
  };

  float acc0[R], acc1[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
    hp_router::cp_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int it = kt - kt_begin;
    hp_router::cp_wait<STAGES - 3>();  // this thread's copies of tile kt have landed
    hp::wg::fence_proxy_async();
    __syncthreads();  // everyone's copies of tile kt visible; every warpgroup is done with tile kt - 2
    const int nk = kt + STAGES - 2;
    if (nk < kt_end) load_stage((it + STAGES - 2) % STAGES, nk);
    hp_router::cp_commit();

    // after this, tile kt - 1's products are done: its slot may be refilled after the next barrier
    ktile_mma<BN, A_BYTES>(acc0, acc1, smem + (it % STAGES) * STAGE_BYTES, wg);
  }
  wgmma_drain(acc0, acc1);
  hp_router::cp_wait<0>();

  // Accumulator layout of wgmma m64nN (per warpgroup): register j of thread (warp w, lane l) holds row
  // 16 w + l / 4 + 8 * ((j >> 1) & 1), column 8 * (j >> 2) + 2 * (l % 4) + (j & 1).
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int row0 = wg * 64 + warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
  if (splits == 1) {
    store_combined<BN>(out, acc0, acc1, s1, M, N, m_block, n_block, row0, col0);
    return;
  }

  // Split-K: combined partial tile -> own shared memory (the pipeline buffers are idle now), then rank r sums
  // its slice of rows over the cluster's ranks in rank order (deterministic) and writes it.
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  partial_to_smem<BN>(red, acc0, acc1, s1, row0, col0);
  hp_router::cluster_splitk_reduce<BM, BN, THREADS>(red, out, M, N, m_block, n_block, rank, splits);
}

// ------------------------------------------------------------------------------------------------------------
// TMA + mbarrier variants, split-K through a global workspace (ws128n192g: the last arrival sums; ws128n192p: K
// pairs summed through DSMEM first; ws128n192r: a reduce-scatter; ws128n128g / r: the same with BN = 128):
// router_wgmma_ws_kernel<BN, STAGES, KP, RS>.
//
// Same math and the same 128-byte-swizzled stage layout as router_wgmma_kernel (TMA's SWIZZLE_128B writes
// 16-byte chunk c of row r at chunk c ^ (r % 8) inside 1024-byte-aligned tiles: exactly what the cp.async loader
// above writes, so the same descriptors feed wgmma); what changes is how the 128 x BN tile is fed (numbers for
// BN = 192, then BN = 128):
//   - thread 0 issues, per k-tile, three cp.async.bulk.tensor (TMA) loads, x[128, 64], W0[BN, 64], W1[BN, 64],
//     completing on the slot's "full" mbarrier (armed with the 64 / 48 KB it will receive); nobody else touches
//     addresses or copies;
//   - both warpgroups (64 x BN each: acc0 + acc1 = 192 / 128 fp32 registers) wait on "full", issue 4 x 2 wgmma
//     m64nBNk16, keep one k-tile of wgmma in flight (wait_group 1) and release the previous slot by arriving on
//     its "empty" mbarrier (one arrival per warp); thread 0 then waits on that "empty" barrier (overlapping its
//     own in-flight wgmma) and refills the slot STAGES tiles ahead.
// So a slot is refilled as soon as both warpgroups are done with it: STAGES - 1 slots (BN 192: 2 of 3, 128 KB per
// SM; BN 128: 3 of 4, 144 KB) are in flight while the tensor cores work on the last, with no __syncthreads in the
// loop (the cp.async kernel keeps one slot in flight, and its time per k-tile grows with the grid: latency, not
// bandwidth, bound). BN = 128 exists for N = 128, 256, 512, which 192 does not divide; its 48 KB stages leave room
// for a fourth slot in the same 194 KB.
// Not a separate producer warpgroup with setmaxnreg: ptxas allocates the whole kernel under the 384-thread cap of
// 168 registers, and the 192 accumulators then spill.
// Launch: grid (ceil(M / 128), N / BN, S), 256 threads, 194 KB of shared memory (3 x 64 KB or 4 x 48 KB stages +
// barriers), one CTA per SM; cluster (1, 1, KP). Rows past M: TMA zero-fills the box, stores are masked.
// Every mbarrier wait is bounded (kHangNs of %globaltimer) and then traps (no printf: see mbar_hang_report), so a
// protocol bug fails the launch with an error instead of hanging the device.

// TMA map, mbarrier protocol pieces and the bounded wait: common/tma.cuh.
using hp::smem_u32;
using hp::tma::global_ns;
using hp::tma::kHangNs;
using hp::tma::mbar_arrive_expect_tx;
using hp::tma::mbar_arrive_local;
using hp::tma::mbar_hang_report;
using hp::tma::mbar_init;
using hp::tma::mbar_wait;
using hp::tma::tma_load_2d;
using hp::tma::tma_load_2d_hint;
using hp::tma::TmaMap;
__device__ __forceinline__ void cluster_sync_all() {  // every thread of every CTA of the cluster (non-.aligned)
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Diagnostic timeline (HP_ROUTER_TRACE builds only; studies/gpu_router_trace.py): once hp_router_set_trace() has
// set a buffer, thread 0 of every CTA of router_wgmma_ws_kernel writes kTraceWords words at
// [CTA linear id * kTraceWords]: %globaltimer at entry, when its first k-tile has landed, after its last wgmma,
// after its partial is published and at exit, then its SM id, whether it reduced the tile, its k-tile count, and
// (reduce-scatter) when its wait for the other ranks ended.
constexpr bool kTrace = HP_ROUTER_TRACE != 0;
#if HP_ROUTER_TRACE
constexpr int kTraceWords = 9;
__device__ unsigned long long* g_ws_trace = nullptr;
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
#endif

// The tile is 128 x BN, BN = 192 (ws128n192*: N = 192, 384, 768) or 128 (ws128n128*: N = 128, 256, 512).
constexpr int kWsBM = 128, kWsThreads = 256;
constexpr int kWsABytes = kWsBM * kRowBytes;  // 16 KB
template <int BN>
constexpr int ws_b_bytes() {  // one W part's k-tile: 24 KB at BN 192, 16 KB at 128
  return BN * kRowBytes;
}
// Global split-K workspace: tile counters (padded to 256 B), then S fp32 partial tiles of 128 x BN per output tile
// of the grid. With K pairs (KP = 2): four counters per tile (ticket and stored count per 64-row half) and S / 2
// pair sums per tile; nothing at S = 2. The reduce-scatter (RS) needs no counters: its ranks meet at a grid barrier.
constexpr int ws_gred_counters_per_tile(int kp) {
  return kp == 2 ? 4 : 1;
}
constexpr size_t ws_gred_counter_bytes(int counters) {
  return (static_cast<size_t>(counters) * 4 + 255) / 256 * 256;
}
constexpr int ws_grid_tiles(int M, int N, int bn) {
  return ((M + kWsBM - 1) / kWsBM) * (N / bn);
}
constexpr int ws_gred_counters(int M, int N, int bn, int kp, int rs) {
  return rs ? 0 : ws_grid_tiles(M, N, bn) * ws_gred_counters_per_tile(kp);
}
constexpr size_t ws_gred_workspace_bytes(int M, int N, int bn, int splits, int kp, int rs) {
  return splits / kp <= 1 ? 0
                          : ws_gred_counter_bytes(ws_gred_counters(M, N, bn, kp, rs)) +
                                static_cast<size_t>(ws_grid_tiles(M, N, bn)) * (splits / kp) * kWsBM * bn * 4;
}

template <int BN>
constexpr int ws_stage_bytes() {  // the "full" tx count: 64 KB at BN 192, 48 KB at 128
  return kWsABytes + 2 * ws_b_bytes<BN>();
}

template <int BN, int STAGES>
constexpr int ws_smem_bytes() {
  return 1024 /* alignment slack */ + 1024 /* barriers */ + STAGES * ws_stage_bytes<BN>();
}
// The reduce-scatter split-K epilogue of router_wgmma_ws_kernel<..., RS = 1> (S = splits; see there). Workspace slot of
// rank q: float2 number p (= 2 j + h, BN / 4 per thread: 48 at BN 192) of lane l of warp w (rows 16 w .. 16 w + 15) at
// [(w * 48 + p) * 32 + l], so the rows rank k owns, warps [k * 8 / S, (k + 1) * 8 / S), are one contiguous run
// of 8 / S * 32 * BN B and every thread of the owner reads it as float4 at [i * 256 + tid] (coalesced). A float4 f of the
// run is lanes 2 m, 2 m + 1 of one (w, p): one row, 4 consecutive columns, so the output store is a float4 too.
template <int BN, int S>
__device__ __forceinline__ void rs_reduce(const float (&acc0)[BN / 2], const float (&acc1)[BN / 2], float s1,
                                          unsigned char* stages, float* __restrict__ partials, float* __restrict__ out,
                                          int M, int N, int tile, int rank_k, int m_block, int n_block,
                                          unsigned long long* trace) {
  constexpr int P = BN / 4;               // float2 per thread
  constexpr int WPC = 8 / S;              // warps (16-row bands) per owned run
  constexpr int RUN4 = WPC * P * 32 / 2;  // float4 per owned run
  constexpr int F4 = RUN4 / kWsThreads;   // float4 per thread per rank (BN 192: 12, 6, 3; BN 128: 8, 4, 2)
  static_assert(RUN4 % kWsThreads == 0, "the run splits evenly over the threads");
  const int tid = threadIdx.x, lane = tid & 31, gw = tid >> 5;
  float2* slots = reinterpret_cast<float2*>(partials) + static_cast<size_t>(tile) * S * P * kWsThreads;
  float2* own = reinterpret_cast<float2*>(stages);  // this rank's run, same layout, in the idle stage buffers
  __syncthreads();  // both warpgroups are past their last wgmma: the stage buffers may be overwritten
  const int owner = gw / WPC;
  float2* dst = owner == rank_k
                    ? own + static_cast<size_t>(gw - owner * WPC) * P * 32
                    : slots + static_cast<size_t>(rank_k) * P * kWsThreads + static_cast<size_t>(gw) * P * 32;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * j + 2 * h;
      const float2 v = make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
      if (owner == rank_k)
        dst[(2 * j + h) * 32 + lane] = v;
      else
        __stcg(dst + (2 * j + h) * 32 + lane, v);
    }
  // Publication: one grid barrier (cooperative launch) instead of per-tile counters: the whole grid ends with its
  // slowest rank anyway, and the barrier needs no zeroed counters, so the launcher needs no memset node either.
  // cooperative_groups' barrier is a release / acquire pair on a word the driver provides; the CTA barriers around
  // it order every thread's stores before it and every thread's reads after it (no per-thread fences).
  __syncthreads();  // (and the own run is in shared memory for every thread)
  if (kTrace && tid == 0 && trace) trace[3] = global_ns();
  cg::this_grid().sync();
  if (kTrace && tid == 0 && trace) trace[6] = 1;
  __syncthreads();
  if (kTrace && tid == 0 && trace) trace[8] = global_ns();
  // Sum the run over the S ranks in rank order (own from shared memory): the bits do not depend on arrival order.
  const float4* own4 = reinterpret_cast<const float4*>(own);
  float4 v[S][F4];
#pragma unroll
  for (int q = 0; q < S; ++q) {
    const float4* src = reinterpret_cast<const float4*>(slots + static_cast<size_t>(q) * P * kWsThreads +
                                                        static_cast<size_t>(rank_k) * WPC * P * 32);
#pragma unroll
    for (int i = 0; i < F4; ++i)
      v[q][i] = q == rank_k ? own4[i * kWsThreads + tid] : __ldcg(src + i * kWsThreads + tid);
  }
#pragma unroll
  for (int i = 0; i < F4; ++i) {
    float4 a = v[0][i];
#pragma unroll
    for (int q = 1; q < S; ++q) a = make_float4(a.x + v[q][i].x, a.y + v[q][i].y, a.z + v[q][i].z, a.w + v[q][i].w);
    const int f = i * kWsThreads + tid, e2 = 2 * f;  // first float2 of this float4 in the run
    const int w = e2 / (P * 32), p = (e2 / 32) % P, l = e2 % 32;
    const int row = m_block + (rank_k * WPC + w) * 16 + (l >> 2) + 8 * (p & 1);
    const int col = n_block + 8 * (p >> 1) + 2 * (l & 3);
    if (row < M) *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + col) = a;
  }
}

// Split-K without a cluster along K, so all S * tiles CTAs can be resident at once (a cluster of S CTAs of 194 KB
// each fits far fewer times than the SMs, and the grid then runs in waves). Each rank stores its combined partial
// tile to a global workspace in the fragment layout (coalesced), counts itself in on the tile's counter, and the
// last rank to arrive sums the S partials in rank order (deterministic whatever the arrival order) and writes the
// tile (ws128n192g).
// KP = 2 (ws128n192p): the cluster is (1, 1, 2), pairing K ranks 2g and 2g + 1 of one tile. After the main loop
// both write their combined partial into their own shared memory, and rank k of the pair sums rows
// [64 k, 64 k + 64) of the two (rank 0's first) through DSMEM. Each half then goes through the global workspace as
// above, but with S / 2 pair sums per half and both CTAs of the pair publishing and reducing at once: a quarter of
// the bytes per CTA that one last arrival of KP = 1 reads, and half the partial stores. The sum is
// ((p0 + p1) + (p2 + p3)) + ... in fixed order: deterministic, though not bit-equal to KP = 1's.
// RS = 1 (ws128n192r; KP = 1): reduce-scatter instead of one last arrival. Rank k of a tile owns rows
// [k * 128 / S, (k + 1) * 128 / S) (the 8 / S warps whose accumulators hold them); every rank publishes the rows
// it does not own, keeps its own in shared memory, waits at one grid barrier until all have published, and sums
// its rows over the S ranks in rank order (bit-equal to ws128n192g at the same S). The last CTA of a tile then
// reads (S - 1) / S of one tile instead of S tiles, and all S read at once. Every rank waits for its peers, so
// they must be resident together: a cooperative launch (the grid must fit in one wave, checked by the launcher).
template <int BN, int STAGES, int KP, int RS>
__global__ void __launch_bounds__(kWsThreads, 1)
    router_wgmma_ws_kernel(const __grid_constant__ TmaMap map_x, const __grid_constant__ TmaMap map_w0,
                           const __grid_constant__ TmaMap map_w1, float* __restrict__ out, int M, int N, int K,
                           float s1, float* __restrict__ partials, int* __restrict__ counters) {
  constexpr int R = BN / 2;  // fp32 per accumulator per thread: 96 at BN 192, 64 at 128
  constexpr int kWsBBytes = ws_b_bytes<BN>(), kWsStageBytes = ws_stage_bytes<BN>();
  static_assert(BN == 128 || BN == 192, "the TMA box and the wgmma N: 128 or 192");
  static_assert(KP == 1 || KP == 2, "K pairs");
  static_assert(RS == 0 || (RS == 1 && KP == 1), "reduce-scatter: no K pairs");
  static_assert(ws_smem_bytes<BN, STAGES>() <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
  static_assert(kWsBM * (BN + 4) * 4 <= STAGES * kWsStageBytes, "split-K buffer reuses the stages");
  extern __shared__ unsigned char ws_smem_raw[];
  unsigned char* base = ws_smem_raw + ((1024u - (smem_u32(ws_smem_raw) & 1023u)) & 1023u);
  const uint32_t bar_base = smem_u32(base);  // full[s] at + 8 s, empty[s] at + 8 (STAGES + s)
  unsigned char* stages = base + 1024;
  auto full_bar = [&](int s) { return bar_base + 8u * s; };
  auto empty_bar = [&](int s) { return bar_base + 8u * (STAGES + s); };

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, warp = (tid >> 5) & 3;
  unsigned long long t_entry = 0;
  if constexpr (kTrace) t_entry = global_ns();
  // The trace pointer is a global load, and right after the timing convention's L2 flush its line is cold: it is
  // loaded once the first TMA loads are issued, so no thread waits a DRAM round trip for it first.
  unsigned long long* trace = nullptr;
  const int bx = blockIdx.x, by = blockIdx.y;                        // the tile
  const int splits = gridDim.z, rank_k = blockIdx.z;                 // this CTA's K rank
  const uint32_t cluster_rank = static_cast<uint32_t>(rank_k % KP);  // the cluster is the K pair (KP = 2) or one CTA
  const int n_block = by * BN, m_block = bx * kWsBM;
  const int kt_total = K / kWgBK;
  const int kt_begin = static_cast<int>((static_cast<long long>(kt_total) * rank_k) / splits);
  const int kt_end = static_cast<int>((static_cast<long long>(kt_total) * (rank_k + 1)) / splits);
  const int nk = kt_end - kt_begin;
  const int x_row = m_block, w_row = n_block;

  // x tiles are read once: loaded with an L2 evict_first policy, so the lines they allocate are the first victims
  // when later loads need room, rather than lines that must be written back first (after the timing convention's
  // flush, L2 is full of dirty lines) or the W tiles every M tile re-reads (an evict_last policy on the W tiles
  // changes nothing: they stay in L2 either way).
  uint64_t pol_x;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol_x));
  // Thread 0 is the TMA issuer: arm slot s's "full" barrier with the 64 KB it will receive, then load x and W.
  auto issue = [&](int t) {
    const int s = t % STAGES;
    const uint32_t st = smem_u32(stages + s * kWsStageBytes), fb = full_bar(s);
    mbar_arrive_expect_tx(fb, kWsStageBytes);
    // k-tile rotation, once 16 or more M tiles share the W tiles: every tile starts with the first k-tile of its
    // K range (one cold W tile shared by all at the start; rotating that one too is slower), then M tile i walks
    // the others from k-tile 1 + i % (nk - 1) on, so the CTAs that share the W tiles do not all ask the same L2
    // lines for the same k-tile at once; the order is fixed per tile (deterministic).
    const int i = bx;
    const bool rot = gridDim.x >= 16;
    const int kt = rot && t > 0 && nk > 1 ? 1 + (t - 1 + i) % (nk - 1) : t;
    const int k0 = (kt_begin + kt) * kWgBK;
    tma_load_2d_hint(st, &map_x, k0, x_row, fb, pol_x);
    tma_load_2d(st + kWsABytes, &map_w0, k0, w_row, fb);
    tma_load_2d(st + kWsABytes + kWsBBytes, &map_w1, k0, w_row, fb);
  };

  if (tid == 0) {
    // The pair arithmetic (rank_k % KP is the cluster rank) is what the DSMEM pair sum relies on: check it.
    uint32_t hw_rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(hw_rank));
    if (hw_rank != cluster_rank) __trap();  // (no printf: see mbar_hang_report)
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar(s), 1);   // the local issuer's arrive.expect_tx
      mbar_init(empty_bar(s), 8);  // every warp of this CTA
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // Barriers initialised before the first loads complete on them. (Issuing the first loads before this barrier
  // was no faster for ws128n192r and slower for ws128n192g; requesting only the first k-tile at the start, the
  // others once it had landed, was slower: docs/ops/router_gemm.md.)
  cluster_sync_all();
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w0)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w1)) : "memory");
    for (int t = 0; t < STAGES && t < nk; ++t) issue(t);  // the slots start empty
  }
#if HP_ROUTER_TRACE
  trace = g_ws_trace;
  if (trace) {
    trace += (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * kTraceWords;
    if (tid == 0) trace[0] = t_entry;
  }
#endif

  float acc0[R], acc1[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = 0.f;
  auto release = [&](int s) {  // this warp is done reading slot s (its wgmma groups completed)
    __syncwarp();
    if (lane == 0) mbar_arrive_local(empty_bar(s));
  };
  int hang = 0;  // see mbar_hang_report
  for (int t = 0; t < nk; ++t) {
    const int s = t % STAGES;
    if (!mbar_wait(full_bar(s), (t / STAGES) & 1)) {
      if (!hang) hang = t + 1;
      break;  // every thread of the CTA times out on the same barrier: no wgmma is issued by part of a warpgroup
    }
    if (kTrace && trace && t == 0 && tid == 0) trace[1] = global_ns();
    __syncwarp();  // the wgmma instructions below are .sync.aligned: the warp must be converged
    // after this, tile t - 1's products are done: its slot goes back to the issuer(s)
    ktile_mma<BN, kWsABytes>(acc0, acc1, stages + s * kWsStageBytes, wg);
    if (t > 0) {
      const int sp = (t - 1) % STAGES;
      release(sp);
      // Refill the slot of tile t - 1 with tile t - 1 + STAGES once every warp has released it;
      // the wait overlaps this warpgroup's in-flight wgmma of tile t.
      if (tid == 0 && !hang && t - 1 + STAGES < nk) {
        if (mbar_wait(empty_bar(sp), ((t - 1) / STAGES) & 1))
          issue(t - 1 + STAGES);
        else
          hang = -t;  // stop issuing; keep computing until the "full" waits time out too (warpgroup stays whole)
      }
      __syncwarp();  // lane 0 of warp 0 may have waited / issued: reconverge before the next aligned instructions
    }
  }
  wgmma_drain(acc0, acc1);
  if (nk > 0 && !hang) release((nk - 1) % STAGES);  // keeps every empty barrier's phase count uniform
  if (kTrace && trace && tid == 0) {
#if HP_ROUTER_TRACE
    trace[2] = global_ns();
    trace[5] = sm_id();
    trace[7] = static_cast<unsigned long long>(nk);
#endif
  }

  const int row0 = wg * 64 + warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
  if (splits == 1) {
    store_combined<BN>(out, acc0, acc1, s1, M, N, m_block, n_block, row0, col0);
    if (hang) mbar_hang_report(hang);  // here the accumulators are dead: no call inside the wgmma pipeline
    if (kTrace && trace && tid == 0) trace[3] = trace[4] = global_ns();
    return;
  }

  if constexpr (KP == 2) {
    __syncthreads();  // both warpgroups are past their last wgmma: the stage buffers can take the partial tile
    constexpr int LDR = BN + 4, C4 = BN / 4, H4 = 64 * C4 / kWsThreads;  // H4 float4 per thread: 12 (BN 192), 8
    static_assert(64 * C4 % kWsThreads == 0, "a 64-row half splits evenly over the threads");
    float* red = reinterpret_cast<float*>(stages);
    partial_to_smem<BN>(red, acc0, acc1, s1, row0, col0);
    if (hang) mbar_hang_report(hang);
    cg::cluster_group cluster = cg::this_cluster();
    cluster_sync_all();  // both partials of the K pair are complete
    const int kp = rank_k & 1, grp = rank_k >> 1, groups = splits >> 1;
    const int tile = by * gridDim.x + bx;
    // Ticket first (groups > 1): the pair sum that arrives last (ticket groups - 1) is never stored; the others
    // store theirs, then count themselves in on the half's second counter, and the last one waits for that count.
    // It waits only on CTAs that already hold a ticket, i.e. are running and need nothing else to finish their
    // store: no co-residency assumption. Counters: [tile][half][ticket, stored], zeroed by the launcher.
    int* ctr = counters + (tile * 2 + kp) * 2;
    __shared__ int last_half;
    if (tid == 0) {
      int last = 1;
      if (groups > 1) {
        last = atomicAdd(ctr, 1) == groups - 1;
        if (last) {
          const unsigned long long t0 = global_ns();
          while (atomicAdd(ctr + 1, 0) < groups - 1)
            if (global_ns() - t0 > kHangNs) mbar_hang_report(1 << 30);  // a lost store count: fail, do not hang
        }
      }
      last_half = last;
    }
    __syncthreads();
    const bool store = last_half;
    // This CTA's half of the pair sum, rank 0's partial first, through distributed shared memory.
    const float* p0 = cluster.map_shared_rank(red, 0u);  // pair rank 0
    const float* p1 = cluster.map_shared_rank(red, 1u);  // pair rank 1
    float4 v[H4];
#pragma unroll
    for (int i = 0; i < H4; ++i) {
      const int idx = i * kWsThreads + tid, r = 64 * kp + idx / C4, c4 = (idx % C4) * 4;
      const float4 a = *reinterpret_cast<const float4*>(p0 + r * LDR + c4);
      const float4 b = *reinterpret_cast<const float4*>(p1 + r * LDR + c4);
      v[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    if (kTrace && trace && tid == 0) {
      trace[3] = global_ns();
      trace[6] = store;
    }
    if (groups > 1) {
      // Workspace: [tile][half][group] slots of 64 x BN fp32, float4 i of thread tid at [i * kWsThreads + tid].
      float4* slot0 =
          reinterpret_cast<float4*>(partials) + (static_cast<size_t>(tile) * 2 + kp) * groups * H4 * kWsThreads;
      if (!store) {
#pragma unroll
        for (int i = 0; i < H4; ++i) __stcg(slot0 + (static_cast<size_t>(grp) * H4 + i) * kWsThreads + tid, v[i]);
        __threadfence();  // this thread's pair sum is visible GPU-wide before the CTA counts it as stored
        __syncthreads();
        if (tid == 0) atomicAdd(ctr + 1, 1);
      } else {
        __threadfence();  // acquire side (thread 0 saw every store count): the sums are read through L2 (ld.cg)
        // Sum the groups in order; this group's own sum comes from registers.
        float4 acc[H4];
        for (int q = 0; q < groups; ++q) {
#pragma unroll
          for (int i = 0; i < H4; ++i) {
            const float4 t = q == grp ? v[i] : __ldcg(slot0 + (static_cast<size_t>(q) * H4 + i) * kWsThreads + tid);
            acc[i] = q ? make_float4(acc[i].x + t.x, acc[i].y + t.y, acc[i].z + t.z, acc[i].w + t.w) : t;
          }
        }
#pragma unroll
        for (int i = 0; i < H4; ++i) v[i] = acc[i];
      }
    }
    if (store) {
#pragma unroll
      for (int i = 0; i < H4; ++i) {
        const int idx = i * kWsThreads + tid, row = m_block + 64 * kp + idx / C4, c4 = (idx % C4) * 4;
        if (row < M) *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + n_block + c4) = v[i];
      }
    }
    cluster_sync_all();  // the partner has read this CTA's partial: its shared memory may go
    if (kTrace && trace && tid == 0) trace[4] = global_ns();
    return;
  } else if constexpr (RS != 0) {
    if (hang) mbar_hang_report(hang);
    const int tile = by * gridDim.x + bx;
    switch (splits) {  // the loop trip counts below are compile-time per split count: the sums stay in registers
      case 2:
        rs_reduce<BN, 2>(acc0, acc1, s1, stages, partials, out, M, N, tile, rank_k, m_block, n_block, trace);
        break;
      case 4:
        rs_reduce<BN, 4>(acc0, acc1, s1, stages, partials, out, M, N, tile, rank_k, m_block, n_block, trace);
        break;
      default:
        rs_reduce<BN, 8>(acc0, acc1, s1, stages, partials, out, M, N, tile, rank_k, m_block, n_block, trace);
        break;
    }
    if (kTrace && trace && tid == 0) trace[4] = global_ns();
    return;
  } else {
    // Fragment layout: float2 number p = 2 j + h of thread tid sits at [p * kWsThreads + tid] of the rank's slot.
    constexpr int P = BN / 4;  // float2 per thread
    const int tile = by * gridDim.x + bx;
    float2* slot0 = reinterpret_cast<float2*>(partials) + static_cast<size_t>(tile) * splits * P * kWsThreads;
    float2* mine = slot0 + static_cast<size_t>(rank_k) * P * kWsThreads;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h;
        __stcg(mine + (2 * j + h) * kWsThreads + tid,
               make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]));
      }
    if (hang) mbar_hang_report(hang);
    __threadfence();  // this thread's partial is visible GPU-wide before the CTA counts itself in
    __shared__ int last;
    __syncthreads();
    if (tid == 0) last = atomicAdd(counters + tile, 1) == splits - 1;
    __syncthreads();
    if (kTrace && trace && tid == 0) {
      trace[3] = global_ns();
      trace[6] = last;
      if (!last) trace[4] = trace[3];
    }
    if (!last) return;
    __threadfence();  // acquire side: the other ranks' partials (read through L2 with ld.cg below)
    // Sum the S slots in rank order (this rank's own slot re-read from L2 too, so the order and the bits do not
    // depend on which rank arrived last). A slot's BN / 4 float2 per thread are loaded together into acc1 (dead after
    // the combine above): one L2 round trip per slot (looping q inside each element would cost a round trip per
    // element, BN / 4 x (S - 1) of them).
    for (int q = 0; q < splits; ++q) {
      const float2* src = slot0 + static_cast<size_t>(q) * P * kWsThreads + tid;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const float2 u = __ldcg(src + p * kWsThreads);
        acc1[2 * p] = u.x;
        acc1[2 * p + 1] = u.y;
      }
#pragma unroll
      for (int e = 0; e < R; ++e) acc0[e] = q ? acc0[e] + acc1[e] : acc1[e];
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h, row = m_block + row0 + 8 * h;
        if (row < M)
          *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + n_block + 8 * j + col0) =
              make_float2(acc0[e], acc0[e + 1]);
      }
    if (kTrace && trace && tid == 0) trace[4] = global_ns();
  }
}
#if !defined(__CUDACC_RTC__)
template <int WGS, int BN, int STAGES>
cudaError_t launch_wg(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1, float* out, int M,
                      int N, int K, float s1, int splits, cudaStream_t stream) {
  hp::LaunchOptions opt;
  opt.cluster_z = splits;  // the K ranks of one output tile
  return hp::launch(router_wgmma_kernel<WGS, BN, STAGES>, dim3(N / BN, (M + 64 * WGS - 1) / (64 * WGS), splits),
                    dim3(128 * WGS), wg_smem_bytes<WGS, BN, STAGES>(), stream, opt, x, w0, w1, out, M, N, K, s1);
}

// Host: a 2-D bf16 tensor map over a row-major [rows, K] matrix with a box of 64 (K) x box_rows and the
// 128-byte swizzle; rows past `rows` read as zeros. cuTensorMapEncodeTiled comes from the driver through the
// runtime's entry-point query (no -lcuda link); resolved once per process.
cudaError_t encode_bf16_map(TmaMap* map, const void* ptr, int rows, int K, int box_rows) {
  const uint64_t dims[2] = {static_cast<uint64_t>(K), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(K) * 2};  // bytes, row to row (K % 64 == 0: 16 B multiple)
  const uint32_t box[2] = {static_cast<uint32_t>(kWgBK), static_cast<uint32_t>(box_rows)};
  return hp::tma::encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, dims, strides, box);
}

template <int BN, int STAGES, int KP, int RS>
cudaError_t launch_ws(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1, float* out, int M,
                      int N, int K, float s1, int splits, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  if (splits > 8 || splits % KP) return cudaErrorInvalidValue;  // K pairs
  if (RS && splits < 2) return cudaErrorInvalidValue;           // reduce-scatter: >= 2 ranks
  float* partials = nullptr;
  int* counters = nullptr;
  if (splits / KP > 1) {
    if (!workspace || workspace_bytes < ws_gred_workspace_bytes(M, N, BN, splits, KP, RS) ||
        reinterpret_cast<uintptr_t>(workspace) % 256)
      return cudaErrorInvalidValue;
    const int ncounters = ws_gred_counters(M, N, BN, KP, RS);
    counters = static_cast<int*>(workspace);
    partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + ws_gred_counter_bytes(ncounters));
    // Zeroed before every launch (a memset node in a graph): a zeroing kernel overlapped with the GEMM through PDL
    // was no faster, and a persistent workspace that needs no zeroing would not be graph- or stream-safe.
    if (ncounters > 0) {  // (the reduce-scatter meets at a grid barrier: no counters)
      cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(int) * ncounters, stream);
      if (e != cudaSuccess) return e;
    }
  }
  // Tensor maps are encoded per call on the host (a few us of CPU, no stream work): the kernel parameters carry
  // them, so a captured graph keeps the ones of its capture, like the raw pointers of the other variants.
  TmaMap mx, mw0, mw1;
  cudaError_t e = encode_bf16_map(&mx, x, M, K, kWsBM);
  if (e == cudaSuccess) e = encode_bf16_map(&mw0, w0, N, K, BN);
  if (e == cudaSuccess) e = encode_bf16_map(&mw1, w1, N, K, BN);
  if (e != cudaSuccess) return e;
  constexpr int smem = ws_smem_bytes<BN, STAGES>();
  auto kernel = router_wgmma_ws_kernel<BN, STAGES, KP, RS>;
  const dim3 grid((M + kWsBM - 1) / kWsBM, N / BN, splits);
  hp::LaunchOptions opt;
  if (RS == 1) {
    // Every CTA waits for the other ranks of its tile: the whole grid must be resident at once. A cooperative
    // launch guarantees it (or fails); refuse up front a grid larger than one wave on this device.
    static std::atomic<int> fit_slots[16];
    const int fit = hp::per_device_cached(fit_slots, [&](int dev) {
      int sms = 0, per_sm = 0;  // the occupancy query needs the shared-memory attribute set first
      if (hp::FuncAttributeCache::instance().ensure(kernel, smem, 1) != cudaSuccess ||
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWsThreads, smem) != cudaSuccess)
        return 0;
      return sms * per_sm;
    });
    if (static_cast<long long>(grid.x) * grid.y * grid.z > fit) return cudaErrorInvalidValue;
    opt.cooperative = true;
  } else {
    opt.cluster_z = KP;  // the K pair, or a one-CTA cluster
  }
  return hp::launch(kernel, grid, dim3(kWsThreads), smem, stream, opt, mx, mw0, mw1, out, M, N, K, s1, partials,
                    counters);
}
#endif

}  // namespace

#if !defined(__CUDACC_RTC__)
#if HP_ROUTER_TRACE
// Sets (or with null clears) the diagnostic timeline buffer of router_wgmma_ws_kernel: kTraceWords (9) uint64 per
// CTA of the next launches (grid x * y * z). Not stream-ordered: call it with the device idle. Only in
// HP_ROUTER_TRACE builds (the Python side checks for the symbol).
extern "C" int hp_router_set_trace(void* buffer) {
  return static_cast<int>(cudaMemcpyToSymbol(g_ws_trace, &buffer, sizeof(buffer)));
}
#endif

namespace hp_router {

size_t router_wgmma_workspace_bytes(int variant, int M, int N, int splits) {
  return global_splitk(variant) && splits > 1 && M > 0 && N > 0
             ? ws_gred_workspace_bytes(M, N, info(variant).bn, splits, pair_splitk(variant) ? 2 : 1,
                                       reduce_scatter(variant) ? 1 : 0)
             : 0;
}

// The wgmma half of the dispatch switch, generated from router_variants.cuh.
#define HP_ROUTER_WG_kAutoFamily(...)
#define HP_ROUTER_WG_kDecodeFamily(...)
#define HP_ROUTER_WG_kTiledFamily(...)
#define HP_ROUTER_WG_kWgFamily(Ident, bm, bn, bk, WGS, STAGES)                       \
  case k##Ident:                                                                     \
    static_assert(bm == 64 * WGS && bk == kWgBK, "router_variants.cuh: wgmma tile"); \
    return launch_wg<WGS, bn, STAGES>(x, w0, w1, out, M, N, K, s1, splits, stream);
#define HP_ROUTER_WG_kWsFamily(Ident, bm, bn, bk, STAGES, KP, RS)                            \
  case k##Ident:                                                                             \
    static_assert(bm == kWsBM && bk == kWgBK, "router_variants.cuh: the TMA kernel's tile"); \
    return launch_ws<bn, STAGES, KP, RS>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
#define HP_ROUTER_WG_(Ident, name, family, bm, bn, bk, parts, splitk, ...) \
  HP_ROUTER_WG_##family(Ident, bm, bn, bk, __VA_ARGS__)

cudaError_t launch_router_wgmma(int variant, const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                                float* out, int M, int N, int K, float s1, int splits, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  if (!is_wgmma(variant)) return cudaErrorInvalidValue;
  const int bn = info(variant).bn, bk = info(variant).bk;
  if (M < 1 || N < bn || N % bn || K < bk || K % bk || !x || !w0 || !w1 || !out) return cudaErrorInvalidValue;
  if (splits != 1 && splits != 2 && splits != 4 && splits != 8) return cudaErrorInvalidValue;  // divides BM
  switch (variant) {
    HP_ROUTER_VARIANTS(HP_ROUTER_WG_)
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace hp_router
#endif
