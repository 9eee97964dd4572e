// Router GEMM with a split FP32 weight: out[M, N] (fp32) = x[M, K] (bf16) @ W[N, K]^T, where the FP32 router
// weight is held as two (or three) BF16 parts, W ~ W0 + s1 * W1 (+ s1 * s2 * W2), s1 = s2 = 1/256.
//
// What runs: per CTA, each activation fragment is loaded once and fed to PARTS bf16 tensor-core products
// (mma.sync m16n8k16, fp32 accumulate) into PARTS separate fp32 accumulators; the epilogue forms
// acc0 + s1 * acc1 (or acc0 + s1 * (acc1 + s2 * acc2)) in fp32 and writes the scores once. Two kernels share that
// idea (the variants of each are listed in router_variants.cuh):
//
// 1. router_decode_kernel (M <= 128, memory bound: the weight read is the whole cost). Launch: grid
//    (CS, N / (8 * NT * WN), row blocks), cluster (CS, 1, 1); one row block of up to 64 rows per 64 of M. Every
//    warp owns an n8 * NT slab of W and a strided set of 32-wide K chunks; the CS CTAs of a cluster split K, so the
//    weight streams from every SM. No shared-memory staging: a thread loads 16 contiguous bytes of one weight row
//    and of one activation row, and both MMA operands use the same permutation of k inside the 32-chunk (the dot
//    product does not care about k order), so global loads go straight into MMA fragments. Reduction: warps ->
//    smem (fixed order), then across the cluster through distributed shared memory (each CTA sums a slice of the
//    tile over the ranks in rank order): deterministic, no workspace, no atomics, no second kernel; CUDA-graph safe.
//    Traffic: weight once from HBM; x (M*K*2 B) read by each of the N/(8*NT*WN) column groups, mostly from L2.
//
// 2. router_tiled_kernel (prefill, M > 64): BM x BN output tile per CTA, 256 threads, a cp.async pipeline over
//    BK = 32 or 64 with padded rows (80 / 144 B stride: ldmatrix conflict-free), ldmatrix.x4 fragments; the x tile
//    is staged once per k-step and multiplied by every weight tile. The loop waits on memory round trips rather
//    than on bandwidth, so the BK = 64 variant keeps twice the bytes in flight per stage. When the grid has too
//    few tiles for the SMs (M in the low hundreds), K is split over a cluster of S <= 16 CTAs (grid z = S) reduced
//    through distributed shared memory (hp_router::cluster_splitk_reduce); S = 16 (a non-portable cluster) gives
//    the 65-256-row grids of small N twice the SMs.
//
// 3. router_wgmma.cu: the same two-accumulator prefill tile on wgmma, for the compute-bound M in the thousands
//    where mma.sync tops out (two parts only); see that file's header.
//
// Numerics: the tensor core's FP32 accumulation is not IEEE round-to-nearest, so the error against the
// emulation of the same two products grows with the length of one accumulation chain (one split over all of K);
// splitting K shortens the chains. The dispatch tuner's accuracy gate (ERR_BOUND in __init__.py) rejects a
// configuration whose error exceeds the bound; docs/ops/router_gemm.md has the measurements.
//
// Entry points (C ABI, return cudaError_t): hp_router_gemm / hp_router_gemm_ex (auto config, or a forced
// variant/splits), hp_router_gemm_config (the config a request resolves to), hp_router_gemm_workspace_bytes, and
// the variant query hp_router_variant_count / _name / _info (the Python loader's view of router_variants.cuh).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "router_gemm.cuh"
#include "router_variants.cuh"
#include "router_wgmma.cuh"

namespace cg = cooperative_groups;
using hp_router::cp_async16;
using hp_router::cp_commit;
using hp_router::cp_wait;
using hp_router::grid_dependency_wait;
using hp_router::ldg_stream;
using hp_router::ldmatrix_x4;
using hp_router::mma_bf16_16816;

namespace {

constexpr int kTargetCtas = 132;  // H100/H200 SXM SM count: enough CTAs to read from every SM

// The combined score of element e of fragment (i, j): acc[0] + s1 * acc[1] (+ s1 * s2 * acc[2]) in fp32.
template <int PARTS, int MI, int NT>
__device__ __forceinline__ float combine(const float (&acc)[PARTS][MI][NT][4], int i, int j, int e, float s1,
                                         float s2) {
  // Small terms first, as the emulation does: acc0 + s1 * (acc1 + s2 * acc2).
  if constexpr (PARTS == 3) return acc[0][i][j][e] + s1 * (acc[1][i][j][e] + s2 * acc[2][i][j][e]);
  return acc[0][i][j][e] + s1 * acc[1][i][j][e];
}

// ------------------------------------------------------------------------------------------------------------
// Decode kernel (M <= 128): MT = m16 tiles per row block (rows <= 16 * MT), NT = n8 tiles per warp. The cluster size
// CS (8 or 16: 16 is a non-portable size, allowed per kernel by an attribute) comes from the launch, so more,
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

  // Row blocks (grid z, M > 64): block z takes rows [z * TILE_M, z * TILE_M + TILE_M), re-reading the weight slab
  // (the blocks of one slab run at the same time, so the second read is mostly an L2 hit).
  const int m0 = static_cast<int>(blockIdx.z) * TILE_M;
  x += static_cast<size_t>(m0) * K;
  out += static_cast<size_t>(m0) * N;
  M = min(M - m0, TILE_M);

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
  hp_router::zero_fill(acc);

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
          wv[u][p][j] =
              ok ? ldg_stream(wp[p] + static_cast<size_t>(n0 + j * 8 + g) * K + kofs) : make_uint4(0, 0, 0, 0);
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
          xv[u][i][h] = (ok && row < M) ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * K + kofs))
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
            mma_bf16_16816(acc[p][i][j], xv[u][i][0].x, xv[u][i][1].x, xv[u][i][0].y, xv[u][i][1].y, wv[u][p][j].x,
                           wv[u][p][j].y);
            mma_bf16_16816(acc[p][i][j], xv[u][i][0].z, xv[u][i][1].z, xv[u][i][0].w, xv[u][i][1].w, wv[u][p][j].z,
                           wv[u][p][j].w);
          }
  }
  if (!waited) grid_dependency_wait();  // this warp had no chunk: still order the out write after the producer

  // Epilogue 1: per-warp combined partial -> part[k-phase] at its n-slab's columns.
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = i * 16 + g + (e >= 2 ? 8 : 0);
        const int col = wn * WTN + j * 8 + 2 * c + (e & 1);
        part[wk][row * TILE_N + col] = combine(acc, i, j, e, s1, s2);
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
  // every owner loading its elements from the S ranks' shared memory, a second sync before exit) is slower at
  // every decode M: the second barrier waits for the slowest rank's reads.
  asm volatile("barrier.cluster.wait;\n" ::: "memory");  // every CTA of the cluster is running
  const int sl = (rows * TILE_N + cs - 1) / cs;          // slots per rank
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
  static_assert(tiled_smem_bytes<BM, BN, PARTS, BK, STAGES>() <= hp::kSmemPerBlock, "shared memory per block (sm_90)");
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
      cp_async16(sa + r * kLDS + ch * 8, src, gm < M);
    }
#pragma unroll
    for (int p = 0; p < PARTS; ++p) {
      __nv_bfloat16* sb = sa + A_ELEMS + p * B_ELEMS;
      for (int i = tid; i < kBN * CPR; i += kTiledThreads) {
        const int r = i / CPR, ch = i % CPR;
        cp_async16(sb + r * kLDS + ch * 8, wp[p] + static_cast<size_t>(n_block + r) * K + k0 + ch * 8, true);
      }
    }
  };

  float acc[PARTS][MI][NT][4];
  hp_router::zero_fill(acc);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
    cp_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; everyone is done with the stage we refill next
    const int nk = kt + kStages - 1;
    if (nk < kt_end) load_stage((nk - kt_begin) % kStages, nk);
    cp_commit();

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
          ldmatrix_x4(
              b, sb + (wn * WN + jj * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLDS + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            mma_bf16_16816(acc[p][i][2 * jj], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
            mma_bf16_16816(acc[p][i][2 * jj + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_wait<0>();

  const int g = lane >> 2, c = lane & 3;
  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = n_block + wn * WN + j * 8 + 2 * c;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m_block + wm * WM + i * 16 + g + h * 8;
          if (row < M)
            *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + col) =
                make_float2(combine(acc, i, j, 2 * h, s1, s2), combine(acc, i, j, 2 * h + 1, s1, s2));
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
      const int col = wn * WN + j * 8 + 2 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * WM + i * 16 + g + h * 8;
        red[row * LDR + col] = combine(acc, i, j, 2 * h, s1, s2);
        red[row * LDR + col + 1] = combine(acc, i, j, 2 * h + 1, s1, s2);
      }
    }
  hp_router::cluster_splitk_reduce<BM, kBN, kTiledThreads>(red, out, M, N, m_block, n_block, rank, splits);
}

// ------------------------------------------------------------------------------------------------------------
// Host side.

struct Config {
  int variant, splits, mt, nt;
};

struct Tile {
  int bm, bn;
};
Tile tile_of(int v) {
  return {hp_router::info(v).bm, hp_router::info(v).bn};
}

// A decode variant's cluster size and n8 tiles per warp; NT = 0 (the baseline): 2 once the grid has >= 4 CTAs
// per SM, else 1.
#define HP_ROUTER_SHAPE_kAutoFamily(...)
#define HP_ROUTER_SHAPE_kDecodeFamily(Ident, CS, WARPS, WN, NT, U1, U4) \
  case hp_router::k##Ident:                                             \
    cfg.nt = NT ? NT : ((N / 8) * CS >= 4 * kTargetCtas ? 2 : 1);       \
    cfg.splits = CS;                                                    \
    break;
#define HP_ROUTER_SHAPE_kTiledFamily(...)
#define HP_ROUTER_SHAPE_kWgFamily(...)
#define HP_ROUTER_SHAPE_kWsFamily(...)
#define HP_ROUTER_DECODE_SHAPE_(Ident, name, family, bm, bn, bk, parts, splitk, ...) \
  HP_ROUTER_SHAPE_##family(Ident, __VA_ARGS__)

Config choose(int M, int N, int K, int variant, int splits) {
  Config cfg{variant, splits, 0, 0};
  if (cfg.variant == hp_router::kAuto) {
    if (M <= 64) {
      cfg.variant = hp_router::kDecode;
    } else {
      const int tiles128 = ((M + 127) / 128) * (N / kBN);
      cfg.variant = tiles128 >= kTargetCtas ? hp_router::kTiled128 : hp_router::kTiled64;
    }
  }
  if (hp_router::is_decode(cfg.variant)) {
    // Rows per block: all of M up to 64, else M split evenly over ceil(M / 64) row blocks (grid z), rounded up to
    // m16 tiles (M = 80: two blocks of 48 rows, MT = 3). 48 rows: 3 m16 tiles, not 4.
    const int blocks = (M + 63) / 64, rows = (M + blocks - 1) / blocks;
    cfg.mt = rows <= 16 ? 1 : rows <= 32 ? 2 : rows <= 48 ? 3 : 4;
    switch (cfg.variant) {
      HP_ROUTER_VARIANTS(HP_ROUTER_DECODE_SHAPE_)
      default:
        break;
    }
    if (cfg.nt == 2 && N % 16) cfg.nt = 1;
    // decode_n1 / decode_n2 run the baseline's kernels with the n8 tiles forced: reported as "decode"
    if (cfg.variant == hp_router::kDecodeN1 || cfg.variant == hp_router::kDecodeN2) cfg.variant = hp_router::kDecode;
  } else if (cfg.splits <= 0 && hp_router::is_wgmma(cfg.variant)) {
    // wgmma tiles run one CTA per SM: split K while the grid fits in one wave and each split keeps >= 4 k-tiles.
    const Tile t = tile_of(cfg.variant);
    const int base = ((M + t.bm - 1) / t.bm) * (N / t.bn);
    int s = 1;
    while (hp_router::wgmma_cluster_size(cfg.variant, 2 * s) <= 8 && 2 * s <= 8 && base * 2 * s <= kTargetCtas &&
           (K / 64) / (2 * s) >= 4)
      s *= 2;
    cfg.splits = s < hp_router::min_splits(cfg.variant) ? hp_router::min_splits(cfg.variant) : s;
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

// Arguments every launcher takes.
struct Args {
  const __nv_bfloat16 *x, *w0, *w1, *w2;
  float* out;
  int M, N, K;
  float s1, s2;
  cudaStream_t stream;
};

template <int MT, int NT, int PARTS, int CS, int WARPS, int WN, int U>
cudaError_t launch_decode(const Args& a) {
  hp::LaunchOptions opt;
  opt.cluster = CS;  // 16 is a non-portable size: hp::launch allows it per kernel and device
  const int row_blocks = (a.M + 16 * MT - 1) / (16 * MT);
  return hp::launch(router_decode_kernel<MT, NT, PARTS, WARPS, WN, U>, dim3(CS, a.N / (8 * NT * WN), row_blocks),
                    dim3(WARPS * 32), 0, a.stream, opt, a.x, a.w0, a.w1, a.w2, a.out, a.M, a.N, a.K, a.s1, a.s2);
}

// A decode variant: the m16 tiles (MT) and, for the baseline, the n8 tiles per warp (NT = 0) come from the config.
// U1: K chunks in flight at MT = 1, 2; U4 at MT = 3, 4 (x fragments for 48 / 64 rows cost 3-4x the registers).
template <int PARTS, int CS, int WARPS, int WN, int NT, int U1, int U4>
cudaError_t run_decode(const Config& cfg, const Args& a) {
  if constexpr (NT == 0) {
    return cfg.nt == 2 ? run_decode<PARTS, CS, WARPS, WN, 2, U1, U4>(cfg, a)
                       : run_decode<PARTS, CS, WARPS, WN, 1, U1, U4>(cfg, a);
  } else {
    switch (cfg.mt) {
      case 1:
        return launch_decode<1, NT, PARTS, CS, WARPS, WN, U1>(a);
      case 2:
        return launch_decode<2, NT, PARTS, CS, WARPS, WN, U1>(a);
      case 3:
        return launch_decode<3, NT, PARTS, CS, WARPS, WN, U4>(a);
      default:
        return launch_decode<4, NT, PARTS, CS, WARPS, WN, U4>(a);
    }
  }
}

template <int PARTS, int BM, int BN, int WARPS_M, int BK, int STAGES2, int STAGES3>
cudaError_t run_tiled(const Config& cfg, const Args& a) {
  constexpr int STAGES = PARTS == 2 ? STAGES2 : STAGES3;
  constexpr int smem = tiled_smem_bytes<BM, BN, PARTS, BK, STAGES>();
  hp::LaunchOptions opt;
  opt.cluster_z = cfg.splits;  // the K ranks of one output tile
  return hp::launch(router_tiled_kernel<BM, BN, WARPS_M, PARTS, BK, STAGES>,
                    dim3(a.N / BN, (a.M + BM - 1) / BM, cfg.splits), dim3(kTiledThreads), smem, a.stream, opt, a.x,
                    a.w0, a.w1, a.w2, a.out, a.M, a.N, a.K, a.s1, a.s2);
}

// The dispatch switch, generated from router_variants.cuh: each mma.sync variant's kernel template arguments.
#define HP_ROUTER_RUN_kAutoFamily(...)
// A variant built for fewer parts than PARTS is not instantiated (hp_router_gemm_ex refuses the request first).
#define HP_ROUTER_RUN_kDecodeFamily(Ident, parts, bm, bn, bk, CS, WARPS, WN, NT, U1, U4)       \
  case hp_router::k##Ident:                                                                    \
    if constexpr (PARTS <= parts) return run_decode<PARTS, CS, WARPS, WN, NT, U1, U4>(cfg, a); \
    return cudaErrorInvalidValue;
#define HP_ROUTER_RUN_kTiledFamily(Ident, parts, bm, bn, bk, WARPS_M, STAGES2, STAGES3)                   \
  case hp_router::k##Ident:                                                                               \
    if constexpr (PARTS <= parts) return run_tiled<PARTS, bm, bn, WARPS_M, bk, STAGES2, STAGES3>(cfg, a); \
    return cudaErrorInvalidValue;
#define HP_ROUTER_RUN_kWgFamily(...)
#define HP_ROUTER_RUN_kWsFamily(...)
#define HP_ROUTER_RUN_(Ident, name, family, bm, bn, bk, parts, splitk, ...) \
  HP_ROUTER_RUN_##family(Ident, parts, bm, bn, bk, __VA_ARGS__)

template <int PARTS>
cudaError_t run(const Config& cfg, const Args& a) {
  switch (cfg.variant) {
    HP_ROUTER_VARIANTS(HP_ROUTER_RUN_)
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

// The variant list of router_variants.cuh, for the Python loader: the number of variants (ids 0 .. count - 1),
// each one's name, and its facts: info_out[0..5] = family (hp_router::Family), bm, bn, bk (0 for decode), the most
// weight parts it runs (2 or 3), how its K splits are reduced (hp_router::SplitK). Returns 0, or
// cudaErrorInvalidValue for an id out of range (name: null).
int hp_router_variant_count() {
  return hp_router::kNumVariants;
}
const char* hp_router_variant_name(int v) {
  return hp_router::valid_variant(v) ? hp_router::info(v).name : nullptr;
}
int hp_router_variant_info(int v, int* info_out) {
  if (!hp_router::valid_variant(v) || !info_out) return cudaErrorInvalidValue;
  const hp_router::VariantInfo& i = hp_router::info(v);
  const int vals[6] = {i.family, i.bm, i.bn, i.bk, i.parts, i.splitk};
  for (int j = 0; j < 6; ++j) info_out[j] = vals[j];
  return 0;
}

// Reports the configuration the auto path (variant 0, splits 0) or a forced one resolves to:
// cfg_out[0..3] = variant (decode_n1 / decode_n2 report "decode"), splits (decode: the cluster size), mt, nt.
// Returns 0, or cudaErrorInvalidValue for an unsupported shape / request.
int hp_router_gemm_config(int M, int N, int K, int variant, int splits, int* cfg_out) {
  // splits 16 only for the tiled kernels (a non-portable cluster of 16 K ranks reduced through DSMEM)
  if (M < 1 || N < 64 || N % 64 || K < 64 || K % 64 || !hp_router::valid_variant(variant) || splits < 0 ||
      splits > (hp_router::is_tiled(variant) ? 16 : 8))
    return cudaErrorInvalidValue;
  if (hp_router::is_decode(variant) && M > hp_router::kDecodeMaxM) return cudaErrorInvalidValue;
  if (splits > 0 && (splits & (splits - 1))) return cudaErrorInvalidValue;  // 1, 2, 4, 8, 16: divides BM
  if (variant != hp_router::kAuto && tile_of(variant).bn && N % tile_of(variant).bn) return cudaErrorInvalidValue;
  // a wgmma launch's cluster stays portable (<= 8 CTAs)
  if (hp_router::is_wgmma(variant) && hp_router::wgmma_cluster_size(variant, splits) > 8) return cudaErrorInvalidValue;
  if (splits > 0 && splits < hp_router::min_splits(variant)) return cudaErrorInvalidValue;  // K pairs, scatter
  const Config cfg = choose(M, N, K, variant, splits);
  cfg_out[0] = cfg.variant;
  cfg_out[1] = cfg.splits;
  cfg_out[2] = cfg.mt;
  cfg_out[3] = cfg.nt;
  return 0;
}

// Bytes of device workspace hp_router_gemm_ex needs for this request (0 for every variant but the global
// split-K ones with K split: ws128n192g, ws128n192r with 2+ splits, ws128n192p with 4 or 8), or -1 for a request
// hp_router_gemm_config refuses.
long long hp_router_gemm_workspace_bytes(int M, int N, int K, int variant, int splits) {
  int cfg[4];
  if (hp_router_gemm_config(M, N, K, variant, splits, cfg)) return -1;
  return static_cast<long long>(hp_router::router_wgmma_workspace_bytes(cfg[0], M, N, cfg[1]));
}

// out[M, N] fp32 = x[M, K] bf16 @ (w0 + s1 * w1 (+ s1 * s2 * w2))^T, w* bf16 [N, K] row-major, all contiguous,
// 16-byte aligned. parts = 2 or 3 (w2 ignored for 2; 3 only for the variants whose parts fact is 3). N % 64 == 0,
// K % 64 == 0, M >= 1 (the Python wrapper validates; this returns cudaErrorInvalidValue for a shape it cannot run
// instead of touching memory). workspace: device memory, 256-byte aligned, hp_router_gemm_workspace_bytes long
// (may be null when that is 0); cudaErrorInvalidValue when it is missing or short.
int hp_router_gemm_ex(const void* x, const void* w0, const void* w1, const void* w2, float* out, int M, int N, int K,
                      int parts, float s1, float s2, int variant, int splits, void* workspace,
                      long long workspace_bytes, void* stream) {
  int cfg_raw[4];
  int e = hp_router_gemm_config(M, N, K, variant, splits, cfg_raw);
  if (e) return e;
  if ((parts != 2 && parts != 3) || !x || !w0 || !w1 || !out || (parts == 3 && !w2)) return cudaErrorInvalidValue;
  const Config cfg{cfg_raw[0], cfg_raw[1], cfg_raw[2], cfg_raw[3]};
  if (parts > hp_router::info(cfg.variant).parts) return cudaErrorInvalidValue;
  if (hp_router::is_wgmma(cfg.variant))
    return hp_router::launch_router_wgmma(
        cfg.variant, static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w0),
        static_cast<const __nv_bfloat16*>(w1), out, M, N, K, s1, cfg.splits, workspace,
        workspace_bytes > 0 ? static_cast<size_t>(workspace_bytes) : 0, static_cast<cudaStream_t>(stream));
  const Args a{static_cast<const __nv_bfloat16*>(x),
               static_cast<const __nv_bfloat16*>(w0),
               static_cast<const __nv_bfloat16*>(w1),
               static_cast<const __nv_bfloat16*>(parts == 3 ? w2 : w1),
               out,
               M,
               N,
               K,
               s1,
               s2,
               static_cast<cudaStream_t>(stream)};
  return parts == 2 ? run<2>(cfg, a) : run<3>(cfg, a);
}

// The entry point without a workspace (every variant but the global split-K ones with K split).
int hp_router_gemm(const void* x, const void* w0, const void* w1, const void* w2, float* out, int M, int N, int K,
                   int parts, float s1, float s2, int variant, int splits, void* stream) {
  return hp_router_gemm_ex(x, w0, w1, w2, out, M, N, K, parts, s1, s2, variant, splits, nullptr, 0, stream);
}

}  // extern "C"
