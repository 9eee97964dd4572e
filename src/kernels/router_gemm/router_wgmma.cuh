// Router GEMM, SM90 wgmma prefill variants (router_wgmma.cu): ids shared with enum Variant in router_gemm.cu and
// VARIANTS / WGMMA_TILES in __init__.py. Two-part weight only (BF16x2): parts = 3 is refused by the entry point.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace hp_router {

// Variant ids (continue enum Variant of router_gemm.cu; kWgEnd is its kNumVariants).
constexpr int kWg128n96 = 27, kWg128n192 = 28, kWg64n192 = 29, kWg128n128 = 30;
// Warp-specialised TMA variants (router_wgmma_ws_kernel): 128 x 192, CM = 1 or 2 CTAs per cluster along M.
// ws128n192g / ws128n192m2g: ws128n192 / ws128n192m2 with split-K through a global workspace instead of the cluster
// (the cluster is then 1 or the M pair only).
// ws128n192p / ws128n192m2p: the global split-K with the K ranks paired in the cluster (CM, 1, 2): each pair sums
// its two partial tiles through distributed shared memory first, so the workspace carries half the partials and
// the last arrival of each 64-row half sums S / 2 of them (splits 2, 4, 8; with 2 no workspace at all).
// ws128n192r / ws128n192t: the global split-K as a reduce-scatter (each of the S ranks sums 128 / S rows of the
// tile over all ranks, after all have published): r is a cooperative launch (grid within one wave; one grid
// barrier, no counters), t takes its tile and rank from a ticket counter at entry (any grid). Splits 2, 4, 8.
// (r with the W multicast pair was 1.1 us slower at M = 1024-4096: router_trace_session5e_m2r.txt; not kept.)
// (K pairs summed through DSMEM before r's reduce-scatter, a third of its global traffic, were 1.3-2.1 us slower:
// the pair stage took 3.1-3.6 us; router_trace_session5f_pr.txt; not kept.)
constexpr int kWs128n192 = 31, kWs128n192m2 = 32, kWs128n192g = 33, kWs128n192m2g = 34, kWs128n192p = 35,
              kWs128n192m2p = 36, kWs128n192r = 37, kWs128n192t = 38, kWgEnd = 39;

constexpr bool is_wgmma_variant(int v) { return v >= kWg128n96 && v < kWgEnd; }

// Output tile (rows, columns) of a wgmma variant; {0, 0} otherwise. BK is 64 for all of them.
struct WgTile {
  int bm, bn;
};
constexpr WgTile wgmma_tile(int v) {
  return v == kWg128n96 ? WgTile{128, 96}
         : v == kWg128n192 ? WgTile{128, 192}
         : v == kWg64n192 ? WgTile{64, 192}
         : v == kWg128n128 ? WgTile{128, 128}
         : v >= kWs128n192 && v <= kWs128n192t ? WgTile{128, 192}
                           : WgTile{0, 0};
}

// CTAs per cluster along M that share (multicast) the W tiles: 2 for ws128n192m2, else 1. The cluster is
// (CM, 1, splits), so CM * splits <= 8 (portable cluster size).
constexpr int wgmma_cluster_m(int v) {
  return v == kWs128n192m2 || v == kWs128n192m2g || v == kWs128n192m2p ? 2 : 1;
}
// Split-K through a global workspace (the cluster spans the M pair and, for the pair variants, a K pair only).
constexpr bool wgmma_global_splitk(int v) {
  return v == kWs128n192g || v == kWs128n192m2g || v == kWs128n192p || v == kWs128n192m2p || v == kWs128n192r ||
         v == kWs128n192t;
}
// Reduce-scatter split-K (ws128n192r, ws128n192t): splits 2, 4, 8.
constexpr bool wgmma_reduce_scatter(int v) { return v == kWs128n192r || v == kWs128n192t; }
// K ranks paired in the cluster (ws128n192p, ws128n192m2p): splits must be even (2, 4, 8).
constexpr bool wgmma_pair_splitk(int v) { return v == kWs128n192p || v == kWs128n192m2p; }
// CTAs per cluster: (CM, 1, splits), (CM, 1, 2) for the pair variants, (CM, 1, 1) for the other global split-K
// ones. At most 8 (portable).
constexpr int wgmma_cluster_size(int v, int splits) {
  return wgmma_cluster_m(v) * (wgmma_pair_splitk(v) ? 2 : wgmma_global_splitk(v) ? 1 : splits);
}

#if !defined(__CUDACC_RTC__)
// out[M, N] = x @ (w0 + s1 * w1)^T with wgmma variant `variant`, K split over a cluster of `splits` (1, 2, 4, 8)
// CTAs. Returns cudaErrorInvalidValue for a shape the variant cannot run (N % BN, K % 64, M < 1, bad splits,
// wgmma_cluster_size() > 8, a pointer not 16-byte aligned for TMA, a global split-K variant with splits > 1 and
// no workspace of router_wgmma_workspace_bytes() 256-byte aligned).
cudaError_t launch_router_wgmma(int variant, const __nv_bfloat16* x, const __nv_bfloat16* w0,
                                const __nv_bfloat16* w1, float* out, int M, int N, int K, float s1, int splits,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Bytes of device workspace launch_router_wgmma needs (0 unless a global split-K variant with splits > 1).
size_t router_wgmma_workspace_bytes(int variant, int M, int N, int splits);
#endif

}  // namespace hp_router
