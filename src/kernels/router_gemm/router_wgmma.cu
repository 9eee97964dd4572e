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
// (the deterministic reduction of router_tiled_kernel: no atomics, no workspace, graph-safe).
//
// Pipeline (STAGES slots, prefetch distance STAGES - 2): iteration t waits for its own copies of tile t
// (cp.async.wait_group STAGES - 3), fences them to the async proxy (fence.proxy.async: wgmma reads shared memory
// through the async proxy, cp.async writes through the generic one), and __syncthreads; after that barrier every
// warpgroup has passed wgmma.wait_group 1 of iteration t - 1, so tile t - 2's slot is free and is refilled with
// tile t + STAGES - 2. One barrier per k-tile; no mbarriers, so nothing can wait forever on a lost arrival.
//
// Why cp.async and not TMA: no driver entry point / tensor map per call, rows past M are zero-filled by the
// same instruction, and every thread's address arithmetic stays visible. Cost: ~10 (BN 96) to ~14 (BN 192)
// 16-byte cp.async per thread per k-tile and no cluster multicast of the W tile.
//
// Traffic (L2 -> SM) at M = 4096, N = 192, K = 4096: M * N * K * 2 B * (1 / BN + 2 / BM) = 168 MB for 128 x 96,
// 134 MB for 128 x 192, 235 MB for 64 x 192 (x is 32 MB, each W part 1.5 MB); the mma.sync tiles moved ~170-200
// MB. Grid there: 128 x 96 -> 64 CTAs (128 with 2 K splits), 128 x 192 -> 32 (128 with 4), 64 x 192 -> 64.
// Registers: acc0 + acc1 are 2 * BN / 2 fp32 per thread (96 at BN 96, 128 at BN 128, 192 at BN 192); the BN = 192
// variants run one CTA of <= 256 threads per SM (__launch_bounds__(..., 1): up to 255 registers).
// Configurations (WGS warpgroups, BM = 64 * WGS, BN, STAGES; shared memory = STAGES * (BM + 2 * BN) * 128 B):
//   wg128n96  2 WG, 128 x  96, 4 stages (160 KB)    wg128n192 2 WG, 128 x 192, 3 stages (192 KB)
//   wg64n192  1 WG,  64 x 192, 4 stages (224 KB)    wg128n128 2 WG, 128 x 128, 4 stages (192 KB; N = 256)
#include <cooperative_groups.h>
#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder comes via the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#endif

#include "router_gemm.cuh"
#include "router_wgmma.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kWgBK = 64;           // k-tile: one 128-byte swizzle row of bf16
constexpr int kRowBytes = kWgBK * 2;  // 128

// Shared-memory matrix descriptor of a K-major tile in the 128-byte-swizzle layout whose base is 1024-byte
// aligned: start address >> 4 (bits 0-13), leading byte offset 16 B (bits 16-29; unused for swizzled K-major),
// stride byte offset 1024 B between 8-row groups (bits 32-45), base offset 0 (bits 49-51), layout 1 = 128B
// swizzle (bits 62-63). The k16 step j inside the 64-wide row is start + 32 * j bytes (descriptor + 2 * j).
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes (generic proxy) -> visible to wgmma's shared-memory reads (async proxy).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Pins the accumulators in registers across the asynchronous wgmma (no compiler moves between issue and wait).
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

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

// D[64 x 96] (fp32, 48 regs per thread) += A[64 x 16] * B[96 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n96k16(float (&d)[48], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
      "}, %48, %49, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(desc_a), "l"(desc_b));
}

// D[64 x 128] (fp32, 64 regs per thread) += A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

// D[64 x 192] (fp32, 96 regs per thread) += A[64 x 16] * B[192 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
      "}, %96, %97, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(desc_a), "l"(desc_b));
}
template <int BN>
__device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 96) wgmma_m64n96k16(d, da, db);
  else if constexpr (BN == 128) wgmma_m64n128k16(d, da, db);
  else wgmma_m64n192k16(d, da, db);
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
                        const __nv_bfloat16* __restrict__ w1, float* __restrict__ out, int M, int N, int K,
                        float s1) {
  constexpr int BM = 64 * WGS, THREADS = 128 * WGS, R = BN / 2;
  constexpr int A_BYTES = BM * kRowBytes, B_BYTES = BN * kRowBytes, STAGE_BYTES = A_BYTES + 2 * B_BYTES;
  static_assert(STAGES >= 3, "prefetch distance STAGES - 2 >= 1");
  static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256 && (BN * kRowBytes) % 1024 == 0, "wgmma N, swizzle atoms");
  static_assert(wg_smem_bytes<WGS, BN, STAGES>() <= 227 * 1024, "shared memory per block (sm_90)");
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
      hp_router::cp_async_16(sa + r * kRowBytes + ((c ^ (r & 7)) << 4), src, gm < M ? 16 : 0);
    }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      unsigned char* sb = sa + A_BYTES + p * B_BYTES;
      const __nv_bfloat16* w = p ? w1 : w0;
#pragma unroll
      for (int i = tid; i < BN * 8; i += THREADS) {
        const int r = i >> 3, c = i & 7;
        hp_router::cp_async_16(sb + r * kRowBytes + ((c ^ (r & 7)) << 4),
                               w + static_cast<size_t>(n_block + r) * K + k0 + c * 8, 16);
      }
    }
  };

  float acc0[R], acc1[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
    hp_router::cp_async_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int it = kt - kt_begin;
    hp_router::cp_async_wait<STAGES - 3>();  // this thread's copies of tile kt have landed
    fence_proxy_async_smem();
    __syncthreads();  // everyone's copies of tile kt visible; every warpgroup is done with tile kt - 2
    const int nk = kt + STAGES - 2;
    if (nk < kt_end) load_stage((it + STAGES - 2) % STAGES, nk);
    hp_router::cp_async_commit();

    const unsigned char* st = smem + (it % STAGES) * STAGE_BYTES;
    const uint64_t da = smem_desc_sw128(st + wg * 64 * kRowBytes);
    const uint64_t db0 = smem_desc_sw128(st + A_BYTES);
    const uint64_t db1 = smem_desc_sw128(st + A_BYTES + B_BYTES);
    fence_regs(acc0);
    fence_regs(acc1);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgBK / 16; ++ks) {
      wgmma_bn<BN>(acc0, da + 2 * ks, db0 + 2 * ks);
      wgmma_bn<BN>(acc1, da + 2 * ks, db1 + 2 * ks);
    }
    wgmma_commit();
    wgmma_wait<1>();  // tile kt - 1's products are done: its slot may be refilled after the next barrier
    fence_regs(acc0);
    fence_regs(acc1);
  }
  wgmma_wait<0>();
  fence_regs(acc0);
  fence_regs(acc1);
  hp_router::cp_async_wait<0>();

  // Accumulator layout of wgmma m64nN (per warpgroup): register j of thread (warp w, lane l) holds row
  // 16 w + l / 4 + 8 * ((j >> 1) & 1), column 8 * (j >> 2) + 2 * (l % 4) + (j & 1).
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int row0 = wg * 64 + warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m_block + row0 + 8 * h, e = 4 * j + 2 * h;
        if (row < M)
          *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + n_block + 8 * j + col0) =
              make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
      }
    return;
  }

  // Split-K: combined partial tile -> own shared memory (the pipeline buffers are idle now), then rank r sums
  // its slice of rows over the cluster's ranks in rank order (deterministic) and writes it.
  __syncthreads();
  constexpr int LDR = BN + 4;
  float* red = reinterpret_cast<float*>(smem);
  partial_to_smem<BN>(red, acc0, acc1, s1, row0, col0);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rows_per = BM / splits;
  for (int idx = tid; idx < rows_per * (BN / 4); idx += THREADS) {
    const int r = rank * rows_per + idx / (BN / 4), c4 = (idx % (BN / 4)) * 4;
    const int row = m_block + r;
    if (row >= M) continue;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float4 t = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q) + r * LDR + c4);
      v.x += t.x; v.y += t.y; v.z += t.z; v.w += t.w;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + n_block + c4) = v;
  }
  cluster.sync();  // keep this CTA's shared memory alive until every rank has read it
}

// ------------------------------------------------------------------------------------------------------------
// TMA + mbarrier variants (ws128n192, ws128n192m2, with the global split-K ws128n192g, ws128n192m2g, with K
// pairs before it ws128n192p, ws128n192m2p, and as a reduce-scatter ws128n192r, ws128n192t):
// router_wgmma_ws_kernel<CM, STAGES, GRED, KP, RS>.
//
// Same math and the same 128-byte-swizzled stage layout as router_wgmma_kernel (TMA's SWIZZLE_128B writes
// 16-byte chunk c of row r at chunk c ^ (r % 8) inside 1024-byte-aligned tiles: exactly what the cp.async loader
// above writes, so the same descriptors feed wgmma); what changes is how the 128 x 192 tile is fed:
//   - thread 0 issues, per k-tile, three cp.async.bulk.tensor (TMA) loads, x[128, 64], W0[192, 64], W1[192, 64],
//     completing on the slot's "full" mbarrier (armed with the 64 KB it will receive); nobody else touches
//     addresses or copies;
//   - both warpgroups (64 x 192 each: acc0 + acc1 = 192 fp32 registers) wait on "full", issue 4 x 2 wgmma
//     m64n192k16, keep one k-tile of wgmma in flight (wait_group 1) and release the previous slot by arriving on
//     its "empty" mbarrier (one arrival per warp); thread 0 then waits on that "empty" barrier (overlapping its
//     own in-flight wgmma) and refills the slot STAGES tiles ahead.
// So a slot is refilled as soon as both warpgroups are done with it: 2 of the 3 slots (128 KB per SM) are in
// flight while the tensor cores work on the third, with no __syncthreads in the loop. The cp.async 128 x 192
// kernel had one slot in flight (3 stages, prefetch distance 1), and its time per k-tile grew with the grid
// (measured ~1.6 us with 32 CTAs, ~4.2 us with 128): latency, not bandwidth, bound.
// Not a separate producer warpgroup with setmaxnreg: ptxas (13.0) allocates the whole kernel under the
// 384-thread cap of 168 registers, and the 192 accumulators then spill (measured here: ~2.8 KB of spills).
// CM = 2 (ws128n192m2): the cluster pairs two CTAs of neighbouring M tiles (same N tile, same K range); each loads
// half of the W0 / W1 tiles (96 rows) and multicasts it into both CTAs, halving W's L2 -> SM traffic (M = 4096,
// N = 192: 134 MB -> 86 MB). A slot's "empty" barrier then counts the warps of both CTAs (16 arrivals), since
// either issuer overwrites the slot in both; "full" expects 64 KB whoever sent them.
// Launch: grid (ceil(M / 128) rounded up to CM, N / 192, S), cluster (CM, 1, S) with CM * S <= 8, 256 threads,
// 194 KB of shared memory (3 x 64 KB stages + barriers), one CTA per SM. Split-K: the deterministic DSMEM
// reduction of the kernel above over the S ranks that share this CTA's M tile. A padding CTA (odd tile count with
// CM = 2) loads a valid x tile, takes part in the multicast and stores nothing. Rows past M: TMA zero-fills the
// box, stores are masked.
// Every mbarrier wait is bounded (kHangNs of %globaltimer) and then traps (no printf: see mbar_hang_report), so a
// protocol bug fails the launch with an error instead of hanging the device.

constexpr unsigned long long kHangNs = 4000000000ull;  // 4 s: legitimate waits here are microseconds

// The 128-byte CUtensorMap, opaque to the device code (cuda.h is host-only; layout checked on the host).
struct alignas(128) TmaMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// CLUSTER_SCOPE: acquire at cluster scope (a barrier that partner CTAs arrive on with a cluster-scope release);
// otherwise the default CTA scope, enough for this CTA's own TMA completions and its own warps' arrivals.
template <bool CLUSTER_SCOPE>
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  if (CLUSTER_SCOPE)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  return ok != 0;
}
// A timed-out wait traps (the launch fails with an error instead of hanging the device). code > 0: the "full"
// wait of local k-tile code - 1 timed out; code < 0: the issuer's "empty" wait for the slot of k-tile -code - 1.
// No printf: any call (printf is one) in a kernel after its first wgmma makes ptxas serialise every wgmma
// (warning C7510), so the code is only kept in a register for cuda-gdb / the SASS dump of a trapped launch.
__device__ __forceinline__ void mbar_hang_report(int code) {
  asm volatile("mov.b32 %0, %0;\n trap;\n" : "+r"(code)::"memory");
}
// Wait until the phase with parity `parity` of the mbarrier at shared address `bar` has completed; false after
// kHangNs without completing.
template <bool CLUSTER_SCOPE = false>
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait<CLUSTER_SCOPE>(bar, parity)) return true;
  const unsigned long long t0 = global_ns();
  while (!mbar_try_wait<CLUSTER_SCOPE>(bar, parity))
    if (global_ns() - t0 > kHangNs) return false;
  return true;
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrive on this CTA's mbarrier (release at CTA scope). The cluster-scope release arrivals these variants used
// first put a cluster-wide fence on the consumers' path every k-tile: Nsight Compute at M = 4096 (128 CTAs) put
// 42% of the warp stall cycles on memory barriers, and this change took ws128n192g/4 from 42.6 to 39.1 us.
__device__ __forceinline__ void mbar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive on the mbarrier at the same shared offset in cluster CTA `rank` (a partner), relaxed: what the arrival
// announces is that this warp's wgmma reads of a slot are over, and wgmma.wait_group has already completed them,
// so no release fence is needed before the partner's TMA overwrites the slot.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {  // every thread of every CTA of the cluster (non-.aligned)
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// 2-D TMA load of the box at (c0 = k, c1 = row) into this CTA's shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same with an L2 cache policy (createpolicy) for the loaded lines.
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
// The same box written at offset `dst` of every CTA in `mask`, each completing on its own `bar` (same offset).
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const TmaMap* map, int c0, int c1, uint32_t bar,
                                               uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

// Diagnostic timeline (studies/gpu_router_trace.py): once hp_router_set_trace() has set a buffer, thread 0 of every
// CTA of router_wgmma_ws_kernel writes kTraceWords words at [CTA linear id * kTraceWords]: %globaltimer at entry,
// when its first k-tile has landed, after its last wgmma, after its partial is published (GRED) and at exit, then
// its SM id, whether it reduced the tile (GRED), its k-tile count, and (reduce-scatter) when its wait for the
// other ranks ended. Null (off) by default: one global load per CTA, after its first loads are issued.
constexpr int kTraceWords = 9;
__device__ unsigned long long* g_ws_trace = nullptr;
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

constexpr int kWsBM = 128, kWsBN = 192, kWsThreads = 256;
constexpr int kWsABytes = kWsBM * kRowBytes, kWsBBytes = kWsBN * kRowBytes;  // 16 KB, 24 KB
// Global split-K workspace: tile counters (padded to 256 B), then S fp32 partial tiles of 128 x 192 per output tile
// of the grid (M tiles padded to the cluster's CM, as the grid is).
// With K pairs (KP = 2): four counters per tile (ticket and stored count per 64-row half) and S / 2 pair sums per
// tile; nothing at S = 2.
constexpr int ws_gred_counters_per_tile(int kp) { return kp == 2 ? 4 : 1; }
constexpr size_t ws_gred_counter_bytes(int counters) { return (static_cast<size_t>(counters) * 4 + 255) / 256 * 256; }
constexpr int ws_grid_tiles(int M, int N, int cm) { return ((M + kWsBM * cm - 1) / (kWsBM * cm)) * cm * (N / kWsBN); }
// Counters of a launch: per tile (none for the reduce-scatter's cooperative grid barrier, RS = 1), plus the ticket
// counter of RS = 2.
constexpr int ws_gred_counters(int M, int N, int cm, int kp, int rs) {
  return rs == 1 ? 0 : ws_grid_tiles(M, N, cm) * ws_gred_counters_per_tile(kp) + (rs == 2 ? 1 : 0);
}
constexpr size_t ws_gred_workspace_bytes(int M, int N, int splits, int cm, int kp, int rs = 0) {
  return splits / kp <= 1 ? 0
                          : ws_gred_counter_bytes(ws_gred_counters(M, N, cm, kp, rs)) +
                                static_cast<size_t>(ws_grid_tiles(M, N, cm)) * (splits / kp) * kWsBM * kWsBN * 4;
}


constexpr int kWsStageBytes = kWsABytes + 2 * kWsBBytes;                      // 64 KB, the "full" tx count

template <int STAGES>
constexpr int ws_smem_bytes() {
  return 1024 /* alignment slack */ + 1024 /* barriers */ + STAGES * kWsStageBytes;
}

// The reduce-scatter split-K epilogue of router_wgmma_ws_kernel<..., RS> (S = splits; see there). Workspace slot of
// rank q: float2 number p (= 2 j + h, 48 per thread) of lane l of warp w (rows 16 w .. 16 w + 15) at
// [(w * 48 + p) * 32 + l], so the rows rank k owns, warps [k * 8 / S, (k + 1) * 8 / S), are one contiguous run
// of 8 / S * 6 KB and every thread of the owner reads it as float4 at [i * 256 + tid] (coalesced). A float4 f of the
// run is lanes 2 m, 2 m + 1 of one (w, p): one row, 4 consecutive columns, so the output store is a float4 too.
template <int S, int RS>
__device__ __forceinline__ void rs_reduce(const float (&acc0)[kWsBN / 2], const float (&acc1)[kWsBN / 2], float s1,
                                          unsigned char* stages, float* __restrict__ partials,
                                          int* __restrict__ counters, float* __restrict__ out, int M, int N, int tile,
                                          int rank_k, int m_block, int n_block, unsigned long long* trace) {
  constexpr int P = kWsBN / 4;                // float2 per thread
  constexpr int WPC = 8 / S;                  // warps (16-row bands) per owned run
  constexpr int RUN4 = WPC * P * 32 / 2;      // float4 per owned run
  constexpr int F4 = RUN4 / kWsThreads;       // float4 per thread per rank (12, 6, 3)
  static_assert(RUN4 % kWsThreads == 0, "the run splits evenly over the threads");
  const int tid = threadIdx.x, lane = tid & 31, gw = tid >> 5;
  float2* slots = reinterpret_cast<float2*>(partials) + static_cast<size_t>(tile) * S * P * kWsThreads;
  float2* own = reinterpret_cast<float2*>(stages);  // this rank's run, same layout, in the idle stage buffers
  __syncthreads();  // both warpgroups are past their last wgmma: the stage buffers may be overwritten
  const int owner = gw / WPC;
  float2* dst = owner == rank_k ? own + static_cast<size_t>(gw - owner * WPC) * P * 32
                                : slots + static_cast<size_t>(rank_k) * P * kWsThreads + static_cast<size_t>(gw) * P * 32;
#pragma unroll
  for (int j = 0; j < kWsBN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * j + 2 * h;
      const float2 v = make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
      if (owner == rank_k)
        dst[(2 * j + h) * 32 + lane] = v;
      else
        __stcg(dst + (2 * j + h) * 32 + lane, v);
    }
  // Publication: the CTA barrier, then one release by thread 0 (cumulative over the stores the barrier ordered
  // before it) and its acquire, then the barrier again; no per-thread fences (0.4 us less than a __threadfence per
  // thread on each side at M = 4096, router_trace_session5c.txt). Publishing through shared memory and TMA bulk
  // copies instead (cp.async.bulk out, and in on an mbarrier) was 0.5-1.5 us slower (router_trace_session5g).
  __syncthreads();  // (and the own run is in shared memory for every thread)
  if constexpr (RS == 1) {
    // Cooperative launch: one grid barrier instead of the per-tile counters. The whole grid ends with its slowest
    // rank anyway, and the barrier needs no zeroed counters, so the launcher's memset node goes too (0.65 us less at
    // M = 4096). cooperative_groups' barrier is the same release / acquire pattern on a word the driver provides.
    // (Per-tile counters zeroed by the kernel itself would need a grid barrier at entry: that one cost 3 us,
    // router_trace_session5h.)
    if (tid == 0 && trace) trace[3] = global_ns();
    cg::this_grid().sync();
    if (tid == 0 && trace) trace[6] = 1;
  } else if (tid == 0) {
    int* ctr = counters + tile;
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(ctr) : "memory");
    if (trace) trace[3] = global_ns();
    const unsigned long long t0 = global_ns();
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(ctr) : "memory");
      if (global_ns() - t0 > kHangNs) mbar_hang_report(1 << 29);  // a peer that never arrives: fail, do not hang
    } while (seen < S);
    if (trace) trace[6] = 1;
  }
  __syncthreads();  // thread 0's acquire (or the grid barrier's) orders every thread's reads below after the stores
  if (tid == 0 && trace) trace[8] = global_ns();
  // Sum the run over the S ranks in rank order (own from shared memory): the bits do not depend on arrival order.
  const float4* own4 = reinterpret_cast<const float4*>(own);
  float4 v[S][F4];
#pragma unroll
  for (int q = 0; q < S; ++q) {
    const float4* src = reinterpret_cast<const float4*>(slots + static_cast<size_t>(q) * P * kWsThreads +
                                                        static_cast<size_t>(rank_k) * WPC * P * 32);
#pragma unroll
    for (int i = 0; i < F4; ++i) v[q][i] = q == rank_k ? own4[i * kWsThreads + tid] : __ldcg(src + i * kWsThreads + tid);
  }
#pragma unroll
  for (int i = 0; i < F4; ++i) {
    float4 a = v[0][i];
#pragma unroll
    for (int q = 1; q < S; ++q) a = make_float4(a.x + v[q][i].x, a.y + v[q][i].y, a.z + v[q][i].z, a.w + v[q][i].w);
    const int f = i * kWsThreads + tid, e2 = 2 * f;   // first float2 of this float4 in the run
    const int w = e2 / (P * 32), p = (e2 / 32) % P, l = e2 % 32;
    const int row = m_block + (rank_k * WPC + w) * 16 + (l >> 2) + 8 * (p & 1);
    const int col = n_block + 8 * (p >> 1) + 2 * (l & 3);
    if (row < M) *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + col) = a;
  }
}

// GRED (ws128n192g, ws128n192m2g): split-K without a cluster along K (the cluster is the M pair at most), so all
// S * tiles CTAs can be resident at once (a cluster of S = 4 CTAs of 194 KB fits only 30 times on the H200: Nsight Compute's "Max Active
// Clusters", so 32 M tiles x 4 splits ran in two waves). Each rank stores its combined partial tile to a global
// workspace in the fragment layout (coalesced), counts itself in on the tile's counter, and the last rank to
// arrive sums the S partials in rank order (deterministic whatever the arrival order) and writes the tile.
// KP = 2 (ws128n192p, ws128n192m2p; GRED only): the cluster is (CM, 1, 2), pairing K ranks 2g and 2g + 1 of one
// tile. After the main loop both write their combined partial into their own shared memory, and rank k of the pair
// sums rows [64 k, 64 k + 64) of the two (rank 0's first) through DSMEM. Each half then goes through the global
// workspace as above, but with S / 2 pair sums per half and both CTAs of the pair publishing and reducing at once:
// a quarter of the bytes per CTA that one last arrival of KP = 1 reads, and half the partial stores (measured at
// M = 4096, S = 4 with KP = 1: 3.3 us to publish, 5.4 us for the last arrival's sum; studies/gpu_router_trace.py).
// The sum is ((p0 + p1) + (p2 + p3)) + ... in fixed order: deterministic, though not bit-equal to KP = 1's.
// RS (ws128n192r, ws128n192t; GRED, KP = 1, CM = 1): reduce-scatter instead of one last arrival. Rank k of a tile
// owns rows [k * 128 / S, (k + 1) * 128 / S) (the 8 / S warps whose accumulators hold them); every rank publishes
// the rows it does not own, keeps its own in shared memory, waits until all S have published (RS = 1: one grid
// barrier; RS = 2: the tile's counter), and sums its rows over the S ranks in rank order (bit-equal to ws128n192g
// at the same S). The last CTA of
// a tile then reads 3 x 24 KB instead of 4 x 96 KB (S = 4), and all S read at once. Every rank waits for its
// peers, so they must be resident together: RS = 1 (ws128n192r) is a cooperative launch (the grid must fit in one
// wave, checked by the launcher); RS = 2 (ws128n192t) takes its (tile, rank) from a ticket counter at entry, so
// a CTA only ever waits for CTAs of its own ticket group that hold tickets or can still be scheduled (any grid).
template <int CM, int STAGES, bool GRED, int KP = 1, int RS = 0>
__global__ void __launch_bounds__(kWsThreads, 1)
    router_wgmma_ws_kernel(const __grid_constant__ TmaMap map_x, const __grid_constant__ TmaMap map_w0,
                           const __grid_constant__ TmaMap map_w1, float* __restrict__ out, int M, int N, int K,
                           float s1, float* __restrict__ partials, int* __restrict__ counters) {
  constexpr int R = kWsBN / 2;       // 96 fp32 per accumulator per thread
  constexpr int WROWS = kWsBN / CM;  // W rows this CTA loads (and multicasts to its CM - 1 partners)
  static_assert(CM == 1 || CM == 2, "cluster pairs along M");
  static_assert(KP == 1 || (KP == 2 && GRED), "K pairs only with the global split-K");
  static_assert(RS == 0 || (GRED && KP == 1 && CM == 1), "reduce-scatter: global split-K, no pairs");
  static_assert((WROWS * kRowBytes) % 1024 == 0, "a multicast half must start on a swizzle atom");
  static_assert(ws_smem_bytes<STAGES>() <= 227 * 1024, "shared memory per block (sm_90)");
  static_assert(kWsBM * (kWsBN + 4) * 4 <= STAGES * kWsStageBytes, "split-K buffer reuses the stages");
  extern __shared__ unsigned char ws_smem_raw[];
  unsigned char* base = ws_smem_raw + ((1024u - (smem_u32(ws_smem_raw) & 1023u)) & 1023u);
  const uint32_t bar_base = smem_u32(base);  // full[s] at + 8 s, empty[s] at + 8 (STAGES + s)
  unsigned char* stages = base + 1024;
  auto full_bar = [&](int s) { return bar_base + 8u * s; };
  auto empty_bar = [&](int s) { return bar_base + 8u * (STAGES + s); };

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, warp = (tid >> 5) & 3;
  const unsigned long long t_entry = global_ns();
  // The trace pointer is a global load, and right after the timing convention's L2 flush its line is cold: loaded
  // before the first TMA loads, every thread waited a DRAM round trip for it. It is loaded once they are issued
  // (0.2-1.1 us less per launch at M = 1024-4096, router_trace_session5i_trace_load.txt).
  unsigned long long* trace = nullptr;
  // (bx, by, bz): the tile and K rank this CTA computes; the block index, or for RS = 2 the entry ticket
  // (tile-major: the S ranks of a tile hold consecutive tickets).
  int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
  if constexpr (RS == 2) {
    __shared__ int ticket;
    if (tid == 0) ticket = atomicAdd(counters + gridDim.x * gridDim.y, 1);
    __syncthreads();
    const int tile = ticket / static_cast<int>(gridDim.z);
    bz = ticket % static_cast<int>(gridDim.z);
    bx = tile % static_cast<int>(gridDim.x);
    by = tile / static_cast<int>(gridDim.x);
  }
  const int mi = bx % CM;                     // position in the M pair
  const int splits = gridDim.z, rank_k = bz;  // cluster (CM, 1, splits): one cluster spans all splits
  // cluster rank of (mi = 0, this split); GRED: the cluster is the M pair (and the K pair when KP = 2)
  const uint32_t group0 = GRED ? static_cast<uint32_t>((rank_k % KP) * CM) : static_cast<uint32_t>(rank_k * CM);
  const int n_block = by * kWsBN, m_block = bx * kWsBM;
  const int kt_total = K / kWgBK;
  const int kt_begin = static_cast<int>((static_cast<long long>(kt_total) * rank_k) / splits);
  const int kt_end = static_cast<int>((static_cast<long long>(kt_total) * (rank_k + 1)) / splits);
  const int nk = kt_end - kt_begin;
  const int x_row = m_block < M ? m_block : 0;  // padding CTA (CM = 2): any valid tile, never stored
  const int w_row = n_block + mi * WROWS;

  // x tiles are read once: loaded with an L2 evict_first policy, so the lines they allocate are the first victims
  // when later loads need room, rather than lines that must be written back first (after the timing convention's
  // flush, L2 is full of dirty lines) or the W tiles every M tile re-reads. Measured at M = 4096: 1.23 -> 1.12 us per
  // k-tile, ws128n192r/4 32.6 -> 30.7 us, ws128n192g/4 35.8 -> 34.7 (router_trace_session5b.txt); an evict_last
  // policy on the W tiles changed nothing (they stay in L2 either way).
  uint64_t pol_x;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol_x));
  // Thread 0 is the TMA issuer: arm slot s's "full" barrier with the 64 KB it will receive (x from this CTA, the
  // W halves from each CTA of the pair), then load x and this CTA's W rows (multicast to the pair when CM = 2).
  auto issue = [&](int t) {
    const int s = t % STAGES;
    const uint32_t st = smem_u32(stages + s * kWsStageBytes), fb = full_bar(s);
    mbar_arrive_expect_tx(fb, kWsStageBytes);
    // k-tile rotation, once 16 or more M tiles (pairs) share the W tiles: every tile starts with the first k-tile
    // of its K range (one cold W tile shared by all at the start), then M tile i walks the others from k-tile
    // 1 + i % (nk - 1) on, so the CTAs that share the W tiles do not all ask the same L2 lines for the same k-tile
    // at once; the order is fixed per tile (deterministic). Measured: -3 us at M = 4096 (ws128n192p/4 40.4 -> 37.1,
    // ws128n192g/4 40.1 -> 36.9), -2 at M = 2048, within +-0.5 us at M = 1024; keeping the first k-tile common
    // gained 0.1-0.9 us over rotating it too (router_trace_session4b.txt, router_trace_session4e_rotation.txt);
    // keeping the first 2, 3 or 4 common changed nothing beyond the noise (router_trace_session5a.txt).
    const int i = bx / CM;
    const bool rot = gridDim.x / CM >= 16;
    const int kt = rot && t > 0 && nk > 1 ? 1 + (t - 1 + i) % (nk - 1) : t;
    const int k0 = (kt_begin + kt) * kWgBK;
    tma_load_2d_hint(st, &map_x, k0, x_row, fb, pol_x);
    if constexpr (CM == 1) {
      tma_load_2d(st + kWsABytes, &map_w0, k0, w_row, fb);
      tma_load_2d(st + kWsABytes + kWsBBytes, &map_w1, k0, w_row, fb);
    } else {
      const uint32_t off = static_cast<uint32_t>(mi * WROWS * kRowBytes);
      const uint16_t mask = static_cast<uint16_t>(((1u << CM) - 1u) << group0);
      tma_load_2d_mc(st + kWsABytes + off, &map_w0, k0, w_row, fb, mask);
      tma_load_2d_mc(st + kWsABytes + kWsBBytes + off, &map_w1, k0, w_row, fb, mask);
    }
  };

  if (tid == 0) {
    // The rank arithmetic above (x fastest) is what the multicast mask and remote arrivals rely on: check it.
    uint32_t hw_rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(hw_rank));
    if (hw_rank != group0 + mi) __trap();  // (no printf: see mbar_hang_report)
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar(s), 1);        // the local issuer's arrive.expect_tx
      mbar_init(empty_bar(s), 8 * CM);  // every warp of the CM CTAs whose loads write this slot
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync_all();  // barriers initialised before any partner multicasts into or arrives on them
  // (Issuing the first loads before this barrier, which CM = 1 would allow, measured 0-0.2 us faster for
  // ws128n192r and 1-2 us slower for ws128n192g / ws128n192t: router_trace_session5c.txt.)
  // (Requesting only the first k-tile at the start, the others once it had landed, was 0.4-1.4 us slower at
  // M = 2048-4096: router_trace_session5d.txt.)
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w0)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w1)) : "memory");
    for (int t = 0; t < STAGES && t < nk; ++t) issue(t);  // the slots start empty
  }
  trace = g_ws_trace;
  if (trace) {
    trace += (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * kTraceWords;
    if (tid == 0) trace[0] = t_entry;
  }

  float acc0[R], acc1[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = 0.f;
  auto release = [&](int s) {  // this warp is done reading slot s (its wgmma groups completed)
    __syncwarp();
    if (lane == 0) {
      if constexpr (CM == 1) {
        mbar_arrive_local(empty_bar(s));
      } else {
#pragma unroll
        for (int j = 0; j < CM; ++j) {
          if (j == mi)
            mbar_arrive_local(empty_bar(s));
          else
            mbar_arrive_cluster(empty_bar(s), group0 + j);
        }
      }
    }
  };
  int hang = 0;  // see mbar_hang_report
  for (int t = 0; t < nk; ++t) {
    const int s = t % STAGES;
    if (!mbar_wait(full_bar(s), (t / STAGES) & 1)) {
      if (!hang) hang = t + 1;
      break;  // every thread of the CTA times out on the same barrier: no wgmma is issued by part of a warpgroup
    }
    if (trace && t == 0 && tid == 0) trace[1] = global_ns();
    __syncwarp();  // the wgmma instructions below are .sync.aligned: the warp must be converged
    const unsigned char* st = stages + s * kWsStageBytes;
    const uint64_t da = smem_desc_sw128(st + wg * 64 * kRowBytes);
    const uint64_t db0 = smem_desc_sw128(st + kWsABytes);
    const uint64_t db1 = smem_desc_sw128(st + kWsABytes + kWsBBytes);
    fence_regs(acc0);
    fence_regs(acc1);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgBK / 16; ++ks) {
      wgmma_m64n192k16(acc0, da + 2 * ks, db0 + 2 * ks);
      wgmma_m64n192k16(acc1, da + 2 * ks, db1 + 2 * ks);
    }
    wgmma_commit();
    wgmma_wait<1>();  // tile t - 1's products are done: its slot goes back to the issuer(s)
    fence_regs(acc0);
    fence_regs(acc1);
    if (t > 0) {
      const int sp = (t - 1) % STAGES;
      release(sp);
      // Refill the slot of tile t - 1 with tile t - 1 + STAGES once every warp of the pair has released it;
      // the wait overlaps this warpgroup's in-flight wgmma of tile t.
      if (tid == 0 && !hang && t - 1 + STAGES < nk) {
        if (mbar_wait<(CM > 1)>(empty_bar(sp), ((t - 1) / STAGES) & 1))
          issue(t - 1 + STAGES);
        else
          hang = -t;  // stop issuing; keep computing until the "full" waits time out too (warpgroup stays whole)
      }
      __syncwarp();  // lane 0 of warp 0 may have waited / issued: reconverge before the next aligned instructions
    }
  }
  wgmma_wait<0>();
  fence_regs(acc0);
  fence_regs(acc1);
  if (nk > 0 && !hang) release((nk - 1) % STAGES);  // keeps every empty barrier's phase count uniform
  if (trace && tid == 0) {
    trace[2] = global_ns();
    trace[5] = sm_id();
    trace[7] = static_cast<unsigned long long>(nk);
  }

  const int row0 = wg * 64 + warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < kWsBN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m_block + row0 + 8 * h, e = 4 * j + 2 * h;
        if (row < M)
          *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + n_block + 8 * j + col0) =
              make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]);
      }
    if (hang) mbar_hang_report(hang);  // here the accumulators are dead: no call inside the wgmma pipeline
    // Keep this CTA's barriers alive until the partner's last arrivals on them have landed.
    if (CM > 1) cluster_sync_all();
    if (trace && tid == 0) trace[3] = trace[4] = global_ns();
    return;
  }

  if constexpr (GRED && KP == 2) {
    __syncthreads();  // both warpgroups are past their last wgmma: the stage buffers can take the partial tile
    constexpr int LDR = kWsBN + 4, C4 = kWsBN / 4, H4 = 64 * C4 / kWsThreads;  // H4 = 12 float4 per thread
    static_assert(64 * C4 % kWsThreads == 0, "a 64-row half splits evenly over the threads");
    float* red = reinterpret_cast<float*>(stages);
    partial_to_smem<kWsBN>(red, acc0, acc1, s1, row0, col0);
    if (hang) mbar_hang_report(hang);
    cg::cluster_group cluster = cg::this_cluster();
    cluster_sync_all();  // both partials of the K pair are complete (and the M partner's arrivals have landed)
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
    const float* p0 = cluster.map_shared_rank(red, static_cast<unsigned>(mi));       // pair rank 0
    const float* p1 = cluster.map_shared_rank(red, static_cast<unsigned>(CM + mi));  // pair rank 1
    float4 v[H4];
#pragma unroll
    for (int i = 0; i < H4; ++i) {
      const int idx = i * kWsThreads + tid, r = 64 * kp + idx / C4, c4 = (idx % C4) * 4;
      const float4 a = *reinterpret_cast<const float4*>(p0 + r * LDR + c4);
      const float4 b = *reinterpret_cast<const float4*>(p1 + r * LDR + c4);
      v[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    if (trace && tid == 0) {
      trace[3] = global_ns();
      trace[6] = store;
    }
    if (groups > 1) {
      // Workspace: [tile][half][group] slots of 64 x 192 fp32, float4 i of thread tid at [i * kWsThreads + tid].
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
            const float4 t =
                q == grp ? v[i] : __ldcg(slot0 + (static_cast<size_t>(q) * H4 + i) * kWsThreads + tid);
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
    if (trace && tid == 0) trace[4] = global_ns();
    return;
  } else if constexpr (RS != 0) {
    if (hang) mbar_hang_report(hang);
    switch (splits) {  // the loop trip counts below are compile-time per split count: the sums stay in registers
      case 2: rs_reduce<2, RS>(acc0, acc1, s1, stages, partials, counters, out, M, N, by * gridDim.x + bx, rank_k,
                           m_block, n_block, trace); break;
      case 4: rs_reduce<4, RS>(acc0, acc1, s1, stages, partials, counters, out, M, N, by * gridDim.x + bx, rank_k,
                           m_block, n_block, trace); break;
      default: rs_reduce<8, RS>(acc0, acc1, s1, stages, partials, counters, out, M, N, by * gridDim.x + bx, rank_k,
                            m_block, n_block, trace); break;
    }
    if (trace && tid == 0) trace[4] = global_ns();
    return;
  } else if constexpr (GRED) {
    // Fragment layout: float2 number p = 2 j + h of thread tid sits at [p * kWsThreads + tid] of the rank's slot.
    constexpr int P = kWsBN / 4;  // float2 per thread
    const int tile = by * gridDim.x + bx;
    float2* slot0 = reinterpret_cast<float2*>(partials) + static_cast<size_t>(tile) * splits * P * kWsThreads;
    float2* mine = slot0 + static_cast<size_t>(rank_k) * P * kWsThreads;
#pragma unroll
    for (int j = 0; j < kWsBN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h;
        __stcg(mine + (2 * j + h) * kWsThreads + tid,
               make_float2(acc0[e] + s1 * acc1[e], acc0[e + 1] + s1 * acc1[e + 1]));
      }
    if (hang) mbar_hang_report(hang);
    // The pair (CM = 2): the partner's last arrivals on this CTA's barriers land before either CTA may exit.
    if (CM > 1) cluster_sync_all();
    __threadfence();  // this thread's partial is visible GPU-wide before the CTA counts itself in
    __shared__ int last;
    __syncthreads();
    if (tid == 0) last = atomicAdd(counters + tile, 1) == splits - 1;
    __syncthreads();
    if (trace && tid == 0) {
      trace[3] = global_ns();
      trace[6] = last;
      if (!last) trace[4] = trace[3];
    }
    if (!last) return;
    __threadfence();  // acquire side: the other ranks' partials (read through L2 with ld.cg below)
    // Sum the S slots in rank order (this rank's own slot re-read from L2 too, so the order and the bits do not
    // depend on which rank arrived last). A slot's 48 float2 per thread are loaded together into acc1 (dead after
    // the combine above): one L2 round trip per slot. (Looping q inside each element cost a round trip per
    // element: ~0.25 us x 48 x (S - 1), measured 70-100 us in all.)
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
    for (int j = 0; j < kWsBN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * j + 2 * h, row = m_block + row0 + 8 * h;
        if (row < M)
          *reinterpret_cast<float2*>(out + static_cast<size_t>(row) * N + n_block + 8 * j + col0) =
              make_float2(acc0[e], acc0[e + 1]);
      }
    if (trace && tid == 0) trace[4] = global_ns();
    return;
  }

  // Split-K: the combined partial tile -> own shared memory (every slot's loads have landed: all "full" phases
  // were waited on, and both warpgroups are past their last wgmma after the barrier), then rank k sums rows
  // [k * 128 / S, (k + 1) * 128 / S) over the S ranks of this M tile (cluster ranks q * CM + mi) in rank order.
  __syncthreads();
  constexpr int LDR = kWsBN + 4;
  float* red = reinterpret_cast<float*>(stages);
  partial_to_smem<kWsBN>(red, acc0, acc1, s1, row0, col0);
  if (hang) mbar_hang_report(hang);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (trace && tid == 0) {
    trace[3] = global_ns();
    trace[6] = 1;
  }
  const int rows_per = kWsBM / splits;
  for (int idx = tid; idx < rows_per * (kWsBN / 4); idx += kWsThreads) {
    const int r = rank_k * rows_per + idx / (kWsBN / 4), c4 = (idx % (kWsBN / 4)) * 4;
    const int row = m_block + r;
    if (row >= M) continue;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float4 u = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q * CM + mi) + r * LDR + c4);
      v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + n_block + c4) = v;
  }
  cluster.sync();  // keep this CTA's shared memory and barriers alive until every partner is done with them
  if (trace && tid == 0) trace[4] = global_ns();
}

#if !defined(__CUDACC_RTC__)
template <int WGS, int BN, int STAGES>
cudaError_t launch_wg(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1, float* out, int M,
                      int N, int K, float s1, int splits, cudaStream_t stream) {
  constexpr int smem = wg_smem_bytes<WGS, BN, STAGES>();
  auto kernel = router_wgmma_kernel<WGS, BN, STAGES>;
  static bool configured = false;  // attribute set once per instantiation (host-side, not a stream op)
  if (!configured) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    configured = true;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(N / BN, (M + 64 * WGS - 1) / (64 * WGS), splits);
  lc.blockDim = dim3(128 * WGS);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = splits;
  lc.attrs = attr;
  lc.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, x, w0, w1, out, M, N, K, s1);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

// Host: a 2-D bf16 tensor map over a row-major [rows, K] matrix with a box of 64 (K) x box_rows and the
// 128-byte swizzle; rows past `rows` read as zeros. cuTensorMapEncodeTiled comes from the driver through the
// runtime's entry-point query (no -lcuda link); resolved once per process.
cudaError_t encode_bf16_map(TmaMap* map, const void* ptr, int rows, int K, int box_rows) {
  static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) == alignof(CUtensorMap), "CUtensorMap");
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return cudaErrorNotSupported;
  if (reinterpret_cast<uintptr_t>(ptr) % 16) return cudaErrorInvalidValue;  // TMA global address alignment
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * 2};  // bytes, row to row (K % 64 == 0: 16 B multiple)
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kWgBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                            const_cast<void*>(ptr), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int CM, int STAGES, bool GRED, int KP = 1, int RS = 0>
cudaError_t launch_ws(const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1, float* out, int M,
                      int N, int K, float s1, int splits, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  if ((GRED ? splits : CM * splits) > 8 || CM * KP > 8) return cudaErrorInvalidValue;  // portable cluster / splits
  if (splits % KP) return cudaErrorInvalidValue;                                       // K pairs
  if (RS && splits < 2) return cudaErrorInvalidValue;                                  // reduce-scatter: >= 2 ranks
  const int m_tiles = (M + kWsBM - 1) / kWsBM;
  float* partials = nullptr;
  int* counters = nullptr;
  if (GRED && splits / KP > 1) {
    if (!workspace || workspace_bytes < ws_gred_workspace_bytes(M, N, splits, CM, KP, RS) ||
        reinterpret_cast<uintptr_t>(workspace) % 256)
      return cudaErrorInvalidValue;
    const int ncounters = ws_gred_counters(M, N, CM, KP, RS);
    counters = static_cast<int*>(workspace);
    partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + ws_gred_counter_bytes(ncounters));
    // Zeroed before every launch (a memset node in a graph). Measured on the H200 at M = 2048 / 4096: a one-CTA
    // zeroing kernel overlapped with the GEMM through PDL was no faster (37.4 vs 37.0 us, ws128n192p/4); only no
    // zeroing at all, on a persistent workspace, gained (~1 us): router_trace_session4c.txt.
    if (RS != 1) {  // (ws128n192r: a grid barrier, no counters to zero)
      cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(int) * ncounters, stream);
      if (e != cudaSuccess) return e;
    }
  }
  // Tensor maps are encoded per call on the host (a few us of CPU, no stream work): the kernel parameters carry
  // them, so a captured graph keeps the ones of its capture, like the raw pointers of the other variants.
  TmaMap mx, mw0, mw1;
  cudaError_t e = encode_bf16_map(&mx, x, M, K, kWsBM);
  if (e == cudaSuccess) e = encode_bf16_map(&mw0, w0, N, K, kWsBN / CM);
  if (e == cudaSuccess) e = encode_bf16_map(&mw1, w1, N, K, kWsBN / CM);
  if (e != cudaSuccess) return e;
  constexpr int smem = ws_smem_bytes<STAGES>();
  auto kernel = router_wgmma_ws_kernel<CM, STAGES, GRED, KP, RS>;
  static bool configured = false;  // attribute set once per instantiation (host-side, not a stream op)
  if (!configured) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    configured = true;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3((m_tiles + CM - 1) / CM * CM, N / kWsBN, splits);
  lc.blockDim = dim3(kWsThreads);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  if (RS == 1) {
    // Every CTA waits for the other ranks of its tile: the whole grid must be resident at once. A cooperative
    // launch guarantees it (or fails); refuse up front a grid larger than one wave on this device.
    // CTAs that fit at once, per device (queried once per device and instantiation: host calls, not stream ops).
    static int fit[64] = {};
    int dev = 0;
    e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
    if (!fit[dev]) {
      int sms = 0, per_sm = 0;
      e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWsThreads, smem);
      if (e != cudaSuccess) return e;
      fit[dev] = sms * per_sm;
    }
    if (static_cast<long long>(lc.gridDim.x) * lc.gridDim.y * lc.gridDim.z > fit[dev]) return cudaErrorInvalidValue;
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
  } else {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CM;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = GRED ? KP : splits;
  }
  lc.attrs = attr;
  lc.numAttrs = 1;
  e = cudaLaunchKernelEx(&lc, kernel, mx, mw0, mw1, out, M, N, K, s1, partials, counters);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}
#endif

}  // namespace

#if !defined(__CUDACC_RTC__)
// Sets (or with null clears) the diagnostic timeline buffer of router_wgmma_ws_kernel: kTraceWords (9) uint64 per
// CTA of the next launches (grid x * y * z). Not stream-ordered: call it with the device idle.
extern "C" int hp_router_set_trace(void* buffer) {
  return static_cast<int>(cudaMemcpyToSymbol(g_ws_trace, &buffer, sizeof(buffer)));
}

namespace hp_router {

size_t router_wgmma_workspace_bytes(int variant, int M, int N, int splits) {
  return wgmma_global_splitk(variant) && splits > 1 && M > 0 && N > 0
             ? ws_gred_workspace_bytes(M, N, splits, wgmma_cluster_m(variant), wgmma_pair_splitk(variant) ? 2 : 1,
                                       wgmma_reduce_scatter(variant) ? (variant == kWs128n192t ? 2 : 1) : 0)
             : 0;
}

cudaError_t launch_router_wgmma(int variant, const __nv_bfloat16* x, const __nv_bfloat16* w0,
                                const __nv_bfloat16* w1, float* out, int M, int N, int K, float s1, int splits,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const WgTile t = wgmma_tile(variant);
  if (!t.bn || M < 1 || N < t.bn || N % t.bn || K < kWgBK || K % kWgBK || !x || !w0 || !w1 || !out)
    return cudaErrorInvalidValue;
  if (splits != 1 && splits != 2 && splits != 4 && splits != 8) return cudaErrorInvalidValue;  // divides BM
  switch (variant) {
    case kWg128n96: return launch_wg<2, 96, 4>(x, w0, w1, out, M, N, K, s1, splits, stream);
    case kWg128n192: return launch_wg<2, 192, 3>(x, w0, w1, out, M, N, K, s1, splits, stream);
    case kWg64n192: return launch_wg<1, 192, 4>(x, w0, w1, out, M, N, K, s1, splits, stream);
    case kWg128n128: return launch_wg<2, 128, 4>(x, w0, w1, out, M, N, K, s1, splits, stream);
    case kWs128n192: return launch_ws<1, 3, false>(x, w0, w1, out, M, N, K, s1, splits, nullptr, 0, stream);
    case kWs128n192m2: return launch_ws<2, 3, false>(x, w0, w1, out, M, N, K, s1, splits, nullptr, 0, stream);
    case kWs128n192g:
      return launch_ws<1, 3, true>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    case kWs128n192m2g:
      return launch_ws<2, 3, true>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    case kWs128n192p:
      return launch_ws<1, 3, true, 2>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    case kWs128n192m2p:
      return launch_ws<2, 3, true, 2>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    case kWs128n192r:
      return launch_ws<1, 3, true, 1, 1>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    case kWs128n192t:
      return launch_ws<1, 3, true, 1, 2>(x, w0, w1, out, M, N, K, s1, splits, workspace, workspace_bytes, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hp_router
#endif
