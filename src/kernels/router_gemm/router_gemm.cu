// Router GEMM with a split FP32 weight: out[M, N] (fp32) = x[M, K] (bf16) @ W[N, K]^T, where the FP32 router
// weight is held as two (or three) BF16 parts, W ~ W0 + s1 * W1 (+ s1 * s2 * W2), s1 = s2 = 1/256.
//
// What runs: per CTA, each activation fragment is loaded once and fed to PARTS bf16 tensor-core products
// (mma.sync m16n8k16, fp32 accumulate) into PARTS separate fp32 accumulators; the epilogue forms
// acc0 + s1 * acc1 (or acc0 + s1 * (acc1 + s2 * acc2)) in fp32 and writes the scores once. Two kernels share that idea:
//
// 1. router_decode_kernel (M <= 64, memory bound: the weight read, 2 * N * K * 2 B = 3.1 MB at N=192, K=4096,
//    is the whole cost). Launch: grid (8, N / (8 * NT)), cluster (8, 1, 1), 128 threads. Every warp owns an
//    n8*NT slab of W and a strided set of 32-wide K chunks; the 8 CTAs of a cluster split K, so
//    N/(8*NT) * 8 CTAs (192 at N=192) stream the weight from every SM. No shared-memory staging: a thread
//    loads 16 contiguous bytes of one weight row and of one activation row, and both MMA operands use the same
//    permutation of k inside the 32-chunk (the dot product does not care about k order), so global loads go
//    straight into MMA fragments. Reduction: warps -> smem (fixed order), then across the cluster through
//    distributed shared memory (each CTA sums a slice of the tile over the 8 ranks in rank order):
//    deterministic, no workspace, no atomics, no second kernel; CUDA-graph safe.
//    Traffic: weight once from HBM; x (M*K*2 B) read by each of the N/(8*NT) column groups, mostly from L2.
//    The same kernel, templated, gives the tuner's decode candidates: cluster of 8 or 16 (non-portable) CTAs, 4 or
//    8 warps, CTAs of 8 to 64 experts (warps split over n as well as k), weight loads issued before the PDL wait.
//
// 2. router_tiled_kernel (prefill, M > 64): BM x 64 output tile per CTA (BM = 64 or 128), 256 threads,
//    4-stage cp.async pipeline over BK = 32 or 64 with padded rows (80 / 144 B stride: ldmatrix conflict-free),
//    ldmatrix.x4 fragments (the first H200 run showed ~0.6 us per k-step whatever the grid: the loop waits on
//    memory round trips, so the BK = 64 variants keep twice the bytes in flight per stage); the x tile is staged once per k-step and multiplied by both weight tiles. When the grid has
//    too few tiles for 132 SMs (M in the low hundreds), K is split over a cluster of S <= 8 CTAs
//    (grid z = S) reduced through distributed shared memory, as in (1).
//    Traffic: x once per N/64 column tile (L2 absorbs the repeats), W once per BM row tile.
//    Wide-N tiles (BN = 96 or 192, N % BN == 0; warp tile 32 x 48 or 16 x 48): at N = 192 the BM x 64 tiles give
//    only 96 CTAs at M = 4096 and stream ~200 MB from L2 ((BM + 2 * 64) * K * 2 B per CTA); a 128 x 96 tile split
//    over 2 K halves gives 128 CTAs and ~170 MB, a 64 x 192 tile reads x exactly once, and the 32 x 48 warp tile
//    issues 8 ldmatrix.x4 per 24 mma (BN = 64: 6 per 16 or 4 per 8). Which wins is measured by the tuner.
//
// 3. router_wgmma_kernel (router_wgmma.cu; variants wg128n96, wg128n192, wg64n192, wg128n128, two parts only):
//    the same two-accumulator prefill tile on wgmma (m64nBNk16, shared-memory descriptors over 128-byte-swizzled
//    cp.async tiles), for the compute-bound M in the thousands where mma.sync tops out; see that file's header.
//    router_wgmma_ws_kernel (same file; ws128n192, ws128n192m2, ws128n192g, ws128n192m2g, ws128n192p,
//    ws128n192m2p, ws128n192r, ws128n192t): TMA + mbarrier pipeline, optional W multicast over an M pair of CTAs,
//    split-K through the cluster, a global workspace (one last arrival sums, or a reduce-scatter over the ranks),
//    or K pairs in the cluster and then the workspace.
//
// Numerics measured on H200 (run 2): against the cuBLAS-SGEMM emulation of the same two products, the kernel
// differs by rel L2 ~4.4e-6 (max abs 2.5e-5, logits of std ~1) when one CTA accumulates all of K = 4096 in the
// MMA accumulators (splits = 1), ~2.1e-6 with 2 splits and below 2e-6 with 8: the tensor core's FP32
// accumulation is not IEEE round-to-nearest, so error grows with the length of the accumulation chain. The
// BF16x2 representation error itself is ~5e-6 rel L2; in the run-2 tests the kernel's error vs FP64 stayed
// within 1.5x of the emulation's at every M tested up to 1000 (M = 4096 not re-checked on the device).
// A promotion step (fresh accumulators per few k-steps added into FP32 registers) would remove it; not done.
//
// Entry points (C ABI, return cudaError_t): hp_router_gemm (auto config, or forced variant/splits for
// experiments), hp_router_gemm_config (reports the config the auto path picks).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "router_gemm.cuh"
#include "router_wgmma.cuh"

namespace cg = cooperative_groups;
using hp_router::cp_async_16;
using hp_router::cp_async_commit;
using hp_router::cp_async_wait;
using hp_router::grid_dependency_wait;
using hp_router::ldg_stream;
using hp_router::ldmatrix_x4;
using hp_router::mma_bf16_16816;

namespace {

constexpr int kClusterK = 8;      // decode: CTAs per cluster splitting K (portable cluster size limit)
constexpr int kDecodeWarps = 4;   // decode: warps per CTA (all split K)

template <int PARTS>
__device__ __forceinline__ float combine(const float (&acc)[PARTS][4], int i, float s1, float s2) {
  // Small terms first, as the emulation does: acc0 + s1 * (acc1 + s2 * acc2).
  if constexpr (PARTS == 3) return acc[0][i] + s1 * (acc[1][i] + s2 * acc[2][i]);
  return acc[0][i] + s1 * acc[1][i];
}

// ------------------------------------------------------------------------------------------------------------
// Decode kernel (M <= 64): MT = m16 tiles (M <= 16 * MT), NT = n8 tiles per warp. The cluster size CS
// (8 or 16: 16 is a non-portable size, allowed per kernel by an attribute) comes from the launch, so more,
// smaller CTAs can share the weight read; WARPS warps per CTA as WN n-slabs x KW = WARPS / WN k-phases (WN > 1:
// a CTA covers 8 * NT * WN experts, so x is re-read by fewer column groups, which matters at M = 48: x is then
// 0.4 MB against the 3.1 MB weight; warps of one k-phase share x chunks through L1). U: K chunks each warp loads
// (all weight words first, then x) before its first MMA; at K = 4096 every configuration below covers its whole
// K slice in one or two loop trips, so the weight stream is entirely in flight at once (3.1 MB over ~132 SMs is
// ~24 KB per SM). PDL-ready: the weight loads (a constant, not produced by the previous kernel) are issued before
// griddepcontrol.wait and x is read / out written after it (a no-op when not launched with the PDL attribute).
// Reduction: warps of a CTA in fixed k-phase order through smem, then the CS ranks in rank order through DSMEM
// (pushed into each element's owner, one cluster barrier; see the epilogue):
// deterministic, no atomics, no workspace. The built-in "decode" configuration (variants decode / decode_n1 /
// decode_n2) is the instantiation CS = 8, WARPS = 4, WN = 1 (each warp its own k-phase), U = 4 (2 at MT = 3, 4).

template <int MT, int NT, int PARTS, int WARPS, int WN, int U>
__global__ void __launch_bounds__(WARPS * 32)
    router_decode_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w0,
                          const __nv_bfloat16* __restrict__ w1, const __nv_bfloat16* __restrict__ w2,
                          float* __restrict__ out, int M, int N, int K, float s1, float s2) {
  constexpr int KW = WARPS / WN;
  static_assert(KW * WN == WARPS && KW >= 1, "WN divides WARPS");
  constexpr int WTN = 8 * NT, TILE_M = 16 * MT, TILE_N = WTN * WN, TILE = TILE_M * TILE_N;
  static_assert((KW + 1) * TILE * 4 + 64 <= 48 * 1024, "static shared memory");
  __shared__ float part[KW][TILE];
  __shared__ float recv[TILE + 16];  // the slices the other ranks send this one, [rank][slot]
  // Arrive now on the cluster barrier that guarantees every CTA of the cluster is running before the first remote
  // store into its shared memory; its wait, in the epilogue, then costs nothing.
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");

  cg::cluster_group cluster = cg::this_cluster();
  const int cs = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane >> 2, c = lane & 3;
  const int n_cta = blockIdx.y * TILE_N, n0 = n_cta + wn * WTN;
  const int kc_total = K >> 5;  // 32-wide chunks
  const int stride = cs * KW;
  const __nv_bfloat16* wp[3] = {w0, w1, w2};

  float acc[PARTS][MT][NT][4];
#pragma unroll
  for (int p = 0; p < PARTS; ++p)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[p][i][j][e] = 0.f;

  bool waited = false;
  for (int c0 = rank * KW + wk; c0 < kc_total; c0 += stride * U) {
    uint4 wv[U][PARTS][NT];
    uint4 xv[U][MT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int chunk = c0 + u * stride;
      const bool ok = chunk < kc_total;
      const int kofs = chunk * 32 + c * 8;  // this thread's 8 consecutive k (16 B)
#pragma unroll
      for (int p = 0; p < PARTS; ++p)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          wv[u][p][j] = ok ? ldg_stream(wp[p] + static_cast<size_t>(n0 + j * 8 + g) * K + kofs)
                           : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // x may be the previous kernel's output: wait only after the weight loads are in flight
      grid_dependency_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int chunk = c0 + u * stride;
      const bool ok = chunk < kc_total;
      const int kofs = chunk * 32 + c * 8;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i * 16 + h * 8 + g;
          xv[u][i][h] = (ok && row < M)
                            ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * K + kofs))
                            : make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int p = 0; p < PARTS; ++p)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma_bf16_16816(acc[p][i][j], xv[u][i][0].x, xv[u][i][1].x, xv[u][i][0].y, xv[u][i][1].y,
                           wv[u][p][j].x, wv[u][p][j].y);
            mma_bf16_16816(acc[p][i][j], xv[u][i][0].z, xv[u][i][1].z, xv[u][i][0].w, xv[u][i][1].w,
                           wv[u][p][j].z, wv[u][p][j].w);
          }
  }
  if (!waited) grid_dependency_wait();  // this warp had no chunk: still order the out write after the producer

  // Epilogue 1: per-warp combined partial -> part[k-phase] at its n-slab's columns.
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float a[PARTS][4];
#pragma unroll
      for (int p = 0; p < PARTS; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[p][e] = acc[p][i][j][e];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = i * 16 + g + (e >= 2 ? 8 : 0);
        const int col = wn * WTN + j * 8 + 2 * c + (e & 1);
        part[wk][row * TILE_N + col] = combine<PARTS>(a, e, s1, s2);
      }
    }
  __syncthreads();
  const int rows = min(M, TILE_M);
  if constexpr (KW > 1) {  // k-phases summed in fixed order into part[0] (one thread per element: no race)
    for (int e = threadIdx.x; e < rows * TILE_N; e += blockDim.x) {
      float v = part[0][e];
#pragma unroll
      for (int w = 1; w < KW; ++w) v += part[w][e];
      part[0][e] = v;
    }
  }
  // Epilogue 2: cluster-wide reduction over DSMEM; rank r owns elements r, r + cs, ... and sums them in fixed rank
  // order. Pushed: every rank stores each element into its owner's recv (remote stores, fire-and-forget), one
  // cluster barrier (release / acquire), then each owner sums its slots from its own shared memory; nobody touches
  // another CTA's shared memory after that barrier, so no second one is needed. Pulling instead (one cluster sync,
  // every owner loading its elements from the S ranks' shared memory, a second sync before exit) was 0.15-0.9 us
  // slower at M = 1-16 and 1.0-1.5 us at M = 48 (data/profiles/h200/router_small_m_session5.txt).
  asm volatile("barrier.cluster.wait;\n" ::: "memory");  // every CTA of the cluster is running
  const int sl = (rows * TILE_N + cs - 1) / cs;           // slots per rank
  for (int e = threadIdx.x; e < rows * TILE_N; e += blockDim.x)
    cluster.map_shared_rank(recv, static_cast<unsigned>(e % cs))[rank * sl + e / cs] = part[0][e];
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
  for (int i = threadIdx.x; rank + cs * i < rows * TILE_N; i += blockDim.x) {
    const int e = rank + cs * i;
    float v = 0.f;
    for (int q = 0; q < cs; ++q) v += recv[q * sl + i];
    out[static_cast<size_t>(e / TILE_N) * N + n_cta + (e % TILE_N)] = v;
  }
}

// ------------------------------------------------------------------------------------------------------------
// Tiled kernel (prefill). BM x BN tile, 8 warps as WARPS_M x (8 / WARPS_M); warp tile WM x WN
// (WM = BM / WARPS_M = 16 or 32: MI = WM / 16 m16 tiles; WN = BN / WARPS_N: NT = WN / 8 n8 tiles, even).
// BN = 64 (the original configurations, warp tile 32 x 16/32) or 96 / 192 (wider warp tiles, 32 x 48 or
// 16 x 48: fewer ldmatrix per mma, and x re-read by only N / BN column tiles: 2 or 1 at N = 192).
constexpr int kTiledThreads = 256, kBN = 64;

// BK: k-tile width (32 or 64); STAGES: cp.async pipeline depth. Rows are padded by 8 bf16 (16 B) so the 8 row
// addresses of one ldmatrix phase fall in distinct banks (stride 80 B or 144 B).
template <int BM, int BN, int PARTS, int BK, int STAGES>
constexpr int tiled_smem_bytes() {
  constexpr int pipe = STAGES * (BM + PARTS * BN) * (BK + 8) * 2;
  constexpr int red = BM * (BN + 4) * 4;
  return pipe > red ? pipe : red;
}

template <int BM, int BN, int WARPS_M, int PARTS, int BK, int STAGES>
__global__ void __launch_bounds__(kTiledThreads)
    router_tiled_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w0,
                        const __nv_bfloat16* __restrict__ w1, const __nv_bfloat16* __restrict__ w2,
                        float* __restrict__ out, int M, int N, int K, float s1, float s2) {
  constexpr int kBK = BK, kLDS = BK + 8, kStages = STAGES, CPR = BK / 8;  // CPR: 16-byte chunks per row
  constexpr int kBN = BN;
  constexpr int WARPS_N = 8 / WARPS_M, WM = BM / WARPS_M, MI = WM / 16, WN = kBN / WARPS_N, NT = WN / 8;
  static_assert(WARPS_M * WARPS_N == 8 && WM * WARPS_M == BM && WN * WARPS_N == kBN, "8 warps tile BM x BN");
  static_assert(WM % 16 == 0 && MI >= 1 && MI <= 2, "warp tile rows: 16 or 32");
  static_assert(NT % 2 == 0, "B fragments are loaded 16 columns at a time");
  static_assert(tiled_smem_bytes<BM, BN, PARTS, BK, STAGES>() <= 227 * 1024, "shared memory per block (sm_90)");
  constexpr int A_ELEMS = BM * kLDS, B_ELEMS = kBN * kLDS, STAGE_ELEMS = A_ELEMS + PARTS * B_ELEMS;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int n_block = blockIdx.x * kBN, m_block = blockIdx.y * BM;
  const int splits = gridDim.z, rank = blockIdx.z;  // cluster (1, 1, splits): rank == blockIdx.z
  const int kt_total = K / kBK;
  const int kt_begin = static_cast<int>((static_cast<long long>(kt_total) * rank) / splits);
  const int kt_end = static_cast<int>((static_cast<long long>(kt_total) * (rank + 1)) / splits);
  const __nv_bfloat16* wp[3] = {w0, w1, w2};

  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = smem + stage * STAGE_ELEMS;
    const int k0 = kt * kBK;
    for (int i = tid; i < BM * CPR; i += kTiledThreads) {
      const int r = i / CPR, ch = i % CPR;
      const int gm = m_block + r;
      const __nv_bfloat16* src = x + static_cast<size_t>(gm < M ? gm : 0) * K + k0 + ch * 8;
      cp_async_16(sa + r * kLDS + ch * 8, src, gm < M ? 16 : 0);
    }
#pragma unroll
    for (int p = 0; p < PARTS; ++p) {
      __nv_bfloat16* sb = sa + A_ELEMS + p * B_ELEMS;
      for (int i = tid; i < kBN * CPR; i += kTiledThreads) {
        const int r = i / CPR, ch = i % CPR;
        cp_async_16(sb + r * kLDS + ch * 8, wp[p] + static_cast<size_t>(n_block + r) * K + k0 + ch * 8, 16);
      }
    }
  };

  float acc[PARTS][MI][NT][4];
#pragma unroll
  for (int p = 0; p < PARTS; ++p)
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[p][i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
    cp_async_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; everyone is done with the stage we refill next
    const int nk = kt + kStages - 1;
    if (nk < kt_end) load_stage((nk - kt_begin) % kStages, nk);
    cp_async_commit();

    const __nv_bfloat16* sa = smem + ((kt - kt_begin) % kStages) * STAGE_ELEMS;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        ldmatrix_x4(a[i], sa + (wm * WM + i * 16 + (lane & 15)) * kLDS + ks * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int p = 0; p < PARTS; ++p) {
        const __nv_bfloat16* sb = sa + A_ELEMS + p * B_ELEMS;
#pragma unroll
        for (int jj = 0; jj < NT / 2; ++jj) {
          uint32_t b[4];  // b0/b1 of n8 tile 2jj, then of tile 2jj+1
          ldmatrix_x4(b, sb + (wn * WN + jj * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLDS + ks * 16 +
                             ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            mma_bf16_16816(acc[p][i][2 * jj], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
            mma_bf16_16816(acc[p][i][2 * jj + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, c = lane & 3;
  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float a[PARTS][4];
#pragma unroll
        for (int p = 0; p < PARTS; ++p)
#pragma unroll
          for (int e = 0; e < 4; ++e) a[p][e] = acc[p][i][j][e];
        const int col = n_block + wn * WN + j * 8 + 2 * c;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m_block + wm * WM + i * 16 + g + h * 8;
          if (row < M)
            *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + col) =
                make_float2(combine<PARTS>(a, 2 * h, s1, s2), combine<PARTS>(a, 2 * h + 1, s1, s2));
        }
      }
    return;
  }

  // Split-K: partial tile -> own smem (reusing the pipeline buffers), then rank r sums its row block over the
  // cluster's ranks in rank order (deterministic) and writes it.
  __syncthreads();
  constexpr int LDR = kBN + 4;
  float* red = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float a[PARTS][4];
#pragma unroll
      for (int p = 0; p < PARTS; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[p][e] = acc[p][i][j][e];
      const int col = wn * WN + j * 8 + 2 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * WM + i * 16 + g + h * 8;
        red[row * LDR + col] = combine<PARTS>(a, 2 * h, s1, s2);
        red[row * LDR + col + 1] = combine<PARTS>(a, 2 * h + 1, s1, s2);
      }
    }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rows_per = BM / splits;
  for (int idx = tid; idx < rows_per * (kBN / 4); idx += kTiledThreads) {
    const int r = rank * rows_per + idx / (kBN / 4), c4 = (idx % (kBN / 4)) * 4;
    const int row = m_block + r;
    if (row >= M) continue;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float4 t = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q) + r * LDR + c4);
      v.x += t.x; v.y += t.y; v.z += t.z; v.w += t.w;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + n_block + c4) = v;
  }
  cluster.sync();
}

// ------------------------------------------------------------------------------------------------------------
// Host side.
// Deep = BK 64 / 4 stages; Xdeep = BK 64 / 6 (BM 64) or 5 (BM 128; 4 for three parts) stages, for more bytes in
// flight per SM. DecodeN1 / DecodeN2 force the decode kernel's n8 tiles per warp (1: more CTAs, 2: fewer x reads).
// Wide-N variants (need N % BN == 0): BM x BN, warp tile, BK, stages (two parts; three parts where different):
//   kT128n96  128 x  96, 32x48, BK 32, 4      kT128n96d 128 x 96, 32x48, BK 64, 4 (3)
//   kT64n96d   64 x  96, 16x48, BK 64, 4      kT64n192  64 x 192, 32x48, BK 32, 4
//   kT64n192d  64 x 192, 32x48, BK 64, 3 (2)
// At N = 192, K = 4096, M = 4096: kT128n96 = 64 CTAs (128 with 2 K splits), kT64n96d = 128 CTAs, kT64n192 = 64
// CTAs (x read exactly once; 128 with 2 splits).
// Decode configurations (router_decode_kernel): cluster size CS, warps, n-slabs per CTA WN, n8 tiles per
// warp NT, chunks in flight U; grid (CS, N / (8 * NT * WN)), at N = 192:
//   kDecC16    16, 4 warps, WN 1, NT 1, U 2: 384 CTAs      kDecC16N2  16, 4 warps, WN 1, NT 2, U 2: 192 CTAs
//   kDecW8      8, 8 warps, WN 1, NT 1, U 2: 192 CTAs      kDecC16W8  16, 8 warps, WN 1, NT 1, U 1: 384 CTAs
//   kDecN32    16, 8 warps, WN 4, NT 1, U 4 (2 at M > 32): 96 CTAs of 32 experts (x read by 6 column groups)
//   kDecN64    16, 8 warps, WN 8, NT 1, U 4 (2 at M > 32): 48 CTAs of 64 experts (x read by 3 column groups)
// More tiled configurations (BM x BN, BK, stages; resident CTAs per SM at two parts, by shared memory and the
// ptxas register counts; aimed at M ~ 2048 where the grid is 32..96 tiles and latency, not bandwidth, limits):
//   kT64n96    64 x 96, 32, 4 (2/SM)    kT64n96d3  64 x 96, 64, 3 (2/SM)    kT128n96d3 128 x 96, 64, 3 (1/SM)
//   kTiled128s3 128 x 64, 32, 3 (2/SM, registers)  kTiled128s6 128 x 64, 32, 6 (1/SM)  kTiled64s6 64 x 64, 32, 6 (2/SM)
enum Variant {
  kAuto = 0, kDecode = 1, kTiled64 = 2, kTiled128 = 3, kTiled64Deep = 4, kTiled128Deep = 5, kTiled64X = 6,
  kTiled128X = 7, kDecodeN1 = 8, kDecodeN2 = 9, kT128n96 = 10, kT128n96d = 11, kT64n96d = 12, kT64n192 = 13,
  kT64n192d = 14, kDecC16 = 15, kDecC16N2 = 16, kDecW8 = 17, kDecC16W8 = 18, kDecN32 = 19, kDecN64 = 20,
  kT64n96 = 21, kT64n96d3 = 22, kT128n96d3 = 23, kTiled128s3 = 24, kTiled128s6 = 25, kTiled64s6 = 26,
  // 27 .. 38: the wgmma variants of router_wgmma.cu (hp_router::kWg128n96 ... kWs128n192t)
  kNumVariants = hp_router::kWgEnd
};
static_assert(kTiled64s6 + 1 == hp_router::kWg128n96, "wgmma variant ids continue enum Variant");
bool is_decode(int v) { return v == kDecode || v == kDecodeN1 || v == kDecodeN2 || (v >= kDecC16 && v <= kDecN64); }
// Shape of a generalised decode variant: cluster size, warps, n-slabs per CTA, n8 tiles per warp.
struct Decode2 {
  int cs, warps, wn, nt;
};
Decode2 decode2_of(int v) {
  switch (v) {
    case kDecC16: return {16, 4, 1, 1};
    case kDecC16N2: return {16, 4, 1, 2};
    case kDecW8: return {8, 8, 1, 1};
    case kDecC16W8: return {16, 8, 1, 1};
    case kDecN32: return {16, 8, 4, 1};
    case kDecN64: return {16, 8, 8, 1};
    default: return {0, 0, 0, 0};
  }
}
constexpr int kTargetCtas = 132;  // H100/H200 SXM SM count: enough CTAs to read from every SM

// Output tile of a tiled variant (BM rows x BN columns); {0, 0} for the decode variants.
struct Tile {
  int bm, bn;
};
Tile tile_of(int variant) {
  switch (variant) {
    case kTiled64: case kTiled64Deep: case kTiled64X: return {64, 64};
    case kTiled128: case kTiled128Deep: case kTiled128X: return {128, 64};
    case kT128n96: case kT128n96d: return {128, 96};
    case kT64n96d: return {64, 96};
    case kT64n192: case kT64n192d: return {64, 192};
    case kT64n96: case kT64n96d3: return {64, 96};
    case kT128n96d3: return {128, 96};
    case kTiled128s3: case kTiled128s6: return {128, 64};
    case kTiled64s6: return {64, 64};
    default: {
      const hp_router::WgTile t = hp_router::wgmma_tile(variant);
      return {t.bm, t.bn};
    }
  }
}

struct Config {
  int variant, splits, mt, nt;
};

Config choose(int M, int N, int K, int variant, int splits) {
  Config cfg{variant, splits, 0, 0};
  if (cfg.variant == kAuto) {
    if (M <= 64) {
      cfg.variant = kDecode;
    } else {
      const int tiles128 = ((M + 127) / 128) * (N / kBN);
      cfg.variant = tiles128 >= kTargetCtas ? kTiled128 : kTiled64;
    }
  }
  if (decode2_of(cfg.variant).cs) {
    const Decode2 d = decode2_of(cfg.variant);
    cfg.mt = M <= 16 ? 1 : M <= 32 ? 2 : M <= 48 ? 3 : 4;  // 48 rows: 3 m16 tiles, not 4
    cfg.nt = d.nt;
    cfg.splits = d.cs;
  } else if (cfg.variant == kDecode || cfg.variant == kDecodeN1 || cfg.variant == kDecodeN2) {
    cfg.mt = M <= 16 ? 1 : M <= 32 ? 2 : M <= 48 ? 3 : 4;  // 48 rows: 3 m16 tiles, not 4
    cfg.nt = cfg.variant == kDecodeN1 ? 1 : cfg.variant == kDecodeN2 ? 2 : ((N / 8) * kClusterK >= 4 * kTargetCtas ? 2 : 1);
    if (cfg.nt == 2 && N % 16) cfg.nt = 1;
    cfg.variant = kDecode;
    cfg.splits = kClusterK;
  } else if (cfg.splits <= 0 && hp_router::is_wgmma_variant(cfg.variant)) {
    // wgmma tiles run one CTA per SM: split K while the grid fits in one wave and each split keeps >= 4 k-tiles.
    // ws128n192m2: M tiles padded to pairs, cluster (2, 1, splits) of at most 8 CTAs.
    const Tile t = tile_of(cfg.variant);
    const int cm = hp_router::wgmma_cluster_m(cfg.variant);
    const int base = ((M + t.bm * cm - 1) / (t.bm * cm)) * cm * (N / t.bn);
    int s = 1;
    while (hp_router::wgmma_cluster_size(cfg.variant, 2 * s) <= 8 && 2 * s <= 8 && base * 2 * s <= kTargetCtas &&
           (K / 64) / (2 * s) >= 4)
      s *= 2;
    if ((hp_router::wgmma_pair_splitk(cfg.variant) || hp_router::wgmma_reduce_scatter(cfg.variant)) && s < 2)
      s = 2;  // a K pair, a reduce-scatter need two ranks
    cfg.splits = s;
  } else if (cfg.splits <= 0) {
    const Tile t = tile_of(cfg.variant);
    const int base = ((M + t.bm - 1) / t.bm) * (N / t.bn);
    int s = 1;
    // Split K while the grid is short of one CTA per SM and each split keeps >= 8 k-steps of pipeline work.
    while (s < 8 && base * s < kTargetCtas && (K / 32) / (2 * s) >= 8) s *= 2;
    cfg.splits = s;
  }
  return cfg;
}

template <int MT, int NT, int PARTS, int WARPS, int WN, int U>
cudaError_t launch_decode_cs(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                           const __nv_bfloat16* w2, float* out, int M, int N, int K, float s1, float s2, int cs,
                           cudaStream_t stream) {
  auto kernel = router_decode_kernel<MT, NT, PARTS, WARPS, WN, U>;
  static bool configured = false;  // cluster size 16 is non-portable: allowed per kernel, once (host-side)
  if (!configured) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
    configured = true;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cs, N / (8 * NT * WN));
  lc.blockDim = dim3(WARPS * 32);
  lc.dynamicSmemBytes = 0;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cs;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, x, w0, w1, w2, out, M, N, K, s1, s2);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

// The built-in decode configuration: cluster of kClusterK CTAs, kDecodeWarps warps each on its own k-phase.
template <int MT, int NT, int PARTS>
cudaError_t launch_decode(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                          const __nv_bfloat16* w2, float* out, int M, int N, int K, float s1, float s2,
                          cudaStream_t stream) {
  return launch_decode_cs<MT, NT, PARTS, kDecodeWarps, 1, MT >= 3 ? 2 : 4>(x, w0, w1, w2, out, M, N, K, s1, s2,
                                                                         kClusterK, stream);
}

template <int NT, int PARTS, int WARPS, int WN, int U1, int U4>
cudaError_t launch_decode_mt(const Config& cfg, const __nv_bfloat16* x, const __nv_bfloat16* w0,
                              const __nv_bfloat16* w1, const __nv_bfloat16* w2, float* out, int M, int N, int K,
                              float s1, float s2, cudaStream_t st) {
  // U1: chunks in flight at MT = 1, 2; U4 at MT = 3, 4 (x fragments for 48 / 64 rows cost 3-4x the registers)
  if (cfg.mt == 1)
    return launch_decode_cs<1, NT, PARTS, WARPS, WN, U1>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
  if (cfg.mt == 2)
    return launch_decode_cs<2, NT, PARTS, WARPS, WN, U1>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
  if (cfg.mt == 3)
    return launch_decode_cs<3, NT, PARTS, WARPS, WN, U4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
  return launch_decode_cs<4, NT, PARTS, WARPS, WN, U4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
}

template <int BM, int BN, int WARPS_M, int PARTS, int BK, int STAGES>
cudaError_t launch_tiled(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                         const __nv_bfloat16* w2, float* out, int M, int N, int K, float s1, float s2, int splits,
                         cudaStream_t stream) {
  constexpr int smem = tiled_smem_bytes<BM, BN, PARTS, BK, STAGES>();
  static bool configured = false;  // attribute set once per instantiation (host-side, not a stream op)
  if (!configured) {
    cudaError_t e = cudaFuncSetAttribute(router_tiled_kernel<BM, BN, WARPS_M, PARTS, BK, STAGES>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    configured = true;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(N / BN, (M + BM - 1) / BM, splits);
  lc.blockDim = dim3(kTiledThreads);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = splits;
  lc.attrs = attr;
  lc.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&lc, router_tiled_kernel<BM, BN, WARPS_M, PARTS, BK, STAGES>, x, w0, w1, w2, out, M, N, K, s1, s2);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

template <int PARTS>
cudaError_t run(const Config& cfg, const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                const __nv_bfloat16* w2, float* out, int M, int N, int K, float s1, float s2,
                cudaStream_t st) {
  if (cfg.variant == kDecode) {
    if (cfg.nt == 1) {
      if (cfg.mt == 1) return launch_decode<1, 1, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
      if (cfg.mt == 2) return launch_decode<2, 1, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
      if (cfg.mt == 3) return launch_decode<3, 1, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
      return launch_decode<4, 1, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
    }
    if (cfg.mt == 1) return launch_decode<1, 2, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
    if (cfg.mt == 2) return launch_decode<2, 2, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
    if (cfg.mt == 3) return launch_decode<3, 2, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
    return launch_decode<4, 2, PARTS>(x, w0, w1, w2, out, M, N, K, s1, s2, st);
  }
  // Template arguments: NT, PARTS, WARPS, WN, U (MT <= 2), U (MT = 3, 4); the cluster size is cfg.splits.
  switch (cfg.variant) {
    case kDecC16: return launch_decode_mt<1, PARTS, 4, 1, 2, 2>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    case kDecC16N2: return launch_decode_mt<2, PARTS, 4, 1, 2, 2>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    case kDecW8: return launch_decode_mt<1, PARTS, 8, 1, 2, 2>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    case kDecC16W8: return launch_decode_mt<1, PARTS, 8, 1, 1, 1>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    case kDecN32: return launch_decode_mt<1, PARTS, 8, 4, 4, 2>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    case kDecN64: return launch_decode_mt<1, PARTS, 8, 8, 4, 2>(cfg, x, w0, w1, w2, out, M, N, K, s1, s2, st);
    default: break;
  }
  // Template arguments: BM, BN, WARPS_M, PARTS, BK, STAGES (BN = 64 variants: warp tile 32 rows).
  switch (cfg.variant) {
    case kT64n96: return launch_tiled<64, 96, 4, PARTS, 32, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kT64n96d3: return launch_tiled<64, 96, 4, PARTS, 64, 3>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kT128n96d3:
      return launch_tiled<128, 96, 4, PARTS, 64, 3>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled128s3:
      return launch_tiled<128, 64, 4, PARTS, 32, 3>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled128s6:
      return launch_tiled<128, 64, 4, PARTS, 32, 6>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled64s6: return launch_tiled<64, 64, 2, PARTS, 32, 6>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled128: return launch_tiled<128, 64, 4, PARTS, 32, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled64Deep: return launch_tiled<64, 64, 2, PARTS, 64, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled128Deep:
      return launch_tiled<128, 64, 4, PARTS, 64, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled64X: return launch_tiled<64, 64, 2, PARTS, 64, 6>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kTiled128X:
      return launch_tiled<128, 64, 4, PARTS, 64, PARTS == 2 ? 5 : 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits,
                                                                     st);
    case kT128n96: return launch_tiled<128, 96, 4, PARTS, 32, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kT128n96d:
      return launch_tiled<128, 96, 4, PARTS, 64, PARTS == 2 ? 4 : 3>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits,
                                                                     st);
    case kT64n96d: return launch_tiled<64, 96, 4, PARTS, 64, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kT64n192: return launch_tiled<64, 192, 2, PARTS, 32, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
    case kT64n192d:
      return launch_tiled<64, 192, 2, PARTS, 64, PARTS == 2 ? 3 : 2>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits,
                                                                     st);
    default: return launch_tiled<64, 64, 2, PARTS, 32, 4>(x, w0, w1, w2, out, M, N, K, s1, s2, cfg.splits, st);
  }
}

}  // namespace

extern "C" {

// Reports the configuration the auto path (variant 0, splits 0) or a forced one resolves to:
// cfg_out[0..3] = variant (see enum Variant; decode / decode_n1 / decode_n2 report 1, the generalised decode
// variants their own id), splits (decode: the cluster size), mt, nt. Returns 0, or
// cudaErrorInvalidValue for an unsupported shape / request.
int hp_router_gemm_config(int M, int N, int K, int variant, int splits, int* cfg_out) {
  if (M < 1 || N < 64 || N % 64 || K < 64 || K % 64 || variant < 0 || variant >= kNumVariants || splits < 0 || splits > 8)
    return cudaErrorInvalidValue;
  if (is_decode(variant) && M > 64) return cudaErrorInvalidValue;
  if (splits > 0 && (splits & (splits - 1))) return cudaErrorInvalidValue;  // 1, 2, 4, 8: divides BM
  if (variant != kAuto && tile_of(variant).bn && N % tile_of(variant).bn) return cudaErrorInvalidValue;
  if (hp_router::wgmma_cluster_size(variant, splits) > 8) return cudaErrorInvalidValue;  // portable cluster size
  if ((hp_router::wgmma_pair_splitk(variant) || hp_router::wgmma_reduce_scatter(variant)) && splits == 1)
    return cudaErrorInvalidValue;  // K pairs, reduce-scatter: >= 2 splits
  const Config cfg = choose(M, N, K, variant, splits);
  cfg_out[0] = cfg.variant;
  cfg_out[1] = cfg.splits;
  cfg_out[2] = cfg.mt;
  cfg_out[3] = cfg.nt;
  return 0;
}

// Bytes of device workspace hp_router_gemm_ex needs for this request (0 for every variant but the global
// split-K ones, ws128n192g / ws128n192m2g with K split, ws128n192p / ws128n192m2p with 4 or 8 splits), or -1 for a
// request hp_router_gemm_config refuses.
long long hp_router_gemm_workspace_bytes(int M, int N, int K, int variant, int splits) {
  int cfg[4];
  if (hp_router_gemm_config(M, N, K, variant, splits, cfg)) return -1;
  return static_cast<long long>(hp_router::router_wgmma_workspace_bytes(cfg[0], M, N, cfg[1]));
}

// out[M, N] fp32 = x[M, K] bf16 @ (w0 + s1 * w1 (+ s1 * s2 * w2))^T, w* bf16 [N, K] row-major, all contiguous,
// 16-byte aligned. parts = 2 or 3 (w2 ignored for 2). N % 64 == 0, K % 64 == 0, M >= 1 (the Python wrapper
// validates; this returns cudaErrorInvalidValue for a shape it cannot run instead of touching memory).
// workspace: device memory, 256-byte aligned, hp_router_gemm_workspace_bytes long (may be null when that is 0);
// cudaErrorInvalidValue when it is missing or short.
int hp_router_gemm_ex(const void* x, const void* w0, const void* w1, const void* w2, float* out, int M, int N, int K,
                      int parts, float s1, float s2, int variant, int splits, void* workspace,
                      long long workspace_bytes, void* stream) {
  int cfg_raw[4];
  int e = hp_router_gemm_config(M, N, K, variant, splits, cfg_raw);
  if (e) return e;
  if ((parts != 2 && parts != 3) || !x || !w0 || !w1 || !out || (parts == 3 && !w2)) return cudaErrorInvalidValue;
  const Config cfg{cfg_raw[0], cfg_raw[1], cfg_raw[2], cfg_raw[3]};
  if (hp_router::is_wgmma_variant(cfg.variant)) {  // two parts only (BF16x2)
    if (parts != 2) return cudaErrorInvalidValue;
    return hp_router::launch_router_wgmma(cfg.variant, static_cast<const __nv_bfloat16*>(x),
                                          static_cast<const __nv_bfloat16*>(w0), static_cast<const __nv_bfloat16*>(w1),
                                          out, M, N, K, s1, cfg.splits, workspace,
                                          workspace_bytes > 0 ? static_cast<size_t>(workspace_bytes) : 0,
                                          static_cast<cudaStream_t>(stream));
  }
  auto xb = static_cast<const __nv_bfloat16*>(x);
  auto b0 = static_cast<const __nv_bfloat16*>(w0);
  auto b1 = static_cast<const __nv_bfloat16*>(w1);
  auto b2 = static_cast<const __nv_bfloat16*>(parts == 3 ? w2 : w1);
  auto st = static_cast<cudaStream_t>(stream);
  if (parts == 2) return run<2>(cfg, xb, b0, b1, b2, out, M, N, K, s1, s2, st);
  return run<3>(cfg, xb, b0, b1, b2, out, M, N, K, s1, s2, st);
}

// The entry point without a workspace (every variant but the global split-K ones with K split).
int hp_router_gemm(const void* x, const void* w0, const void* w1, const void* w2, float* out, int M, int N, int K,
                   int parts, float s1, float s2, int variant, int splits, void* stream) {
  return hp_router_gemm_ex(x, w0, w1, w2, out, M, N, K, parts, s1, s2, variant, splits, nullptr, 0, stream);
}

}  // extern "C"
