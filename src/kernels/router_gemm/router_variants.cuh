// The router GEMM's kernel variants: the one list that names them. It generates the C enum (ids are the list
// order), the dispatch switch of hp_router_gemm_ex, and the C query (hp_router_variant_count / _name / _info) that
// the Python loader reads at load time, so a variant is added or removed here and nowhere else.
//
// Why these variants: each one is picked by the measured dispatch table (data/dispatch/router_gemm_h200.json) at
// some supported shape and M, or is its family's baseline (the simplest kernel of that family, and what the
// built-in "auto" heuristic runs when a shape has no table). The variants measured and dropped, and why, are in
// docs/ops/router_gemm.md.
//
// Columns (one entry per line: tests parse this file):
//   Ident     C identifier suffix (enum kIdent)
//   name      the Python / dispatch-table name
//   family    kAutoFamily (the heuristic), kDecodeFamily (router_decode_kernel, M <= 128), kTiledFamily
//             (router_tiled_kernel, mma.sync), kWgFamily (router_wgmma_kernel: cp.async + wgmma), kWsFamily
//             (router_wgmma_ws_kernel: TMA + mbarrier + wgmma, split-K through a global workspace)
//   bm bn bk  CTA output tile and k-tile (0 for decode, whose tile follows M and the n8 tiles per warp)
//   parts     the most weight parts the variant runs: 3 (BF16x2 and BF16x3) or 2 (BF16x2 only). Three parts
//             (impl="bf16x3_kernel", an accuracy reference, not in the dispatch table) run on the baselines only:
//             the table's choices were measured with two parts, and each three-part build doubles a variant's
//             instantiations.
//   splitk    how K splits are reduced: kSplitCluster (the ranks of a (1, 1, S) cluster through distributed
//             shared memory; decode: its cluster), kSplitGlobal (a global workspace, the last arrival sums),
//             kSplitPair (K pairs summed through DSMEM, then the workspace), kSplitScatter (a reduce-scatter over
//             the workspace after one grid barrier: a cooperative launch)
//   ...       the kernel's template arguments, per family:
//             decode: CS (cluster size), WARPS, WN (n-slabs per CTA), NT (n8 tiles per warp; 0 = by shape, 1 or 2),
//                     U1 (K chunks in flight per warp at MT = 1, 2), U4 (at MT = 3, 4)
//             tiled:  WARPS_M, STAGES (two parts), STAGES (three parts)
//             wg:     WGS (warpgroups; BM = 64 * WGS), STAGES
//             ws:     STAGES, KP (K ranks paired in the cluster), RS (1: reduce-scatter, cooperative)
// ws128n128g / r (the TMA kernel at BN = 128, for N = 128, 256, 512, which BN = 192 does not divide) are picked by
// the first-use tuner on the H200 at M >= 1024 (docs/ops/router_gemm.md); the K-pair form at BN = 128 was never
// picked there (110 tuned points) and was removed, as was the decode kernel's tall form for 65-128 rows (those rows
// now run the decode variants over two row blocks, or a tiled variant with K split over a cluster of 16).
// decode_n1 / decode_n2 are the baseline decode kernel with its n8 tiles per warp forced (the same
// instantiations as "decode"); the query reports them as "decode".
#pragma once

#define HP_ROUTER_VARIANTS(X)                                                              \
  X(Auto, "auto", kAutoFamily, 0, 0, 0, 3, kSplitCluster, 0)                               \
  X(Decode, "decode", kDecodeFamily, 0, 0, 0, 3, kSplitCluster, 8, 4, 1, 0, 4, 2)          \
  X(DecodeN1, "decode_n1", kDecodeFamily, 0, 0, 0, 3, kSplitCluster, 8, 4, 1, 1, 4, 2)     \
  X(DecodeN2, "decode_n2", kDecodeFamily, 0, 0, 0, 3, kSplitCluster, 8, 4, 1, 2, 4, 2)     \
  X(DecW8, "decode_w8", kDecodeFamily, 0, 0, 0, 2, kSplitCluster, 8, 8, 1, 1, 2, 2)        \
  X(DecC16W8, "decode_c16w8", kDecodeFamily, 0, 0, 0, 2, kSplitCluster, 16, 8, 1, 1, 1, 1) \
  X(Tiled64, "tiled64", kTiledFamily, 64, 64, 32, 3, kSplitCluster, 2, 4, 4)               \
  X(Tiled128, "tiled128", kTiledFamily, 128, 64, 32, 3, kSplitCluster, 4, 4, 4)            \
  X(Tiled64Deep, "tiled64d", kTiledFamily, 64, 64, 64, 2, kSplitCluster, 2, 4, 4)          \
  X(Wg128n96, "wg128n96", kWgFamily, 128, 96, 64, 2, kSplitCluster, 2, 4)                  \
  X(Ws128n192g, "ws128n192g", kWsFamily, 128, 192, 64, 2, kSplitGlobal, 3, 1, 0)           \
  X(Ws128n192p, "ws128n192p", kWsFamily, 128, 192, 64, 2, kSplitPair, 3, 2, 0)             \
  X(Ws128n192r, "ws128n192r", kWsFamily, 128, 192, 64, 2, kSplitScatter, 3, 1, 1)          \
  X(Ws128n128g, "ws128n128g", kWsFamily, 128, 128, 64, 2, kSplitGlobal, 4, 1, 0)           \
  X(Ws128n128r, "ws128n128r", kWsFamily, 128, 128, 64, 2, kSplitScatter, 4, 1, 1)

namespace hp_router {

enum Family { kAutoFamily = 0, kDecodeFamily = 1, kTiledFamily = 2, kWgFamily = 3, kWsFamily = 4 };

// The decode kernel runs up to 64 rows per CTA; past that, over row blocks (grid z), up to this M.
constexpr int kDecodeMaxM = 128;
enum SplitK { kSplitCluster = 0, kSplitGlobal = 1, kSplitPair = 2, kSplitScatter = 3 };

#define HP_ROUTER_ENUM_(Ident, ...) k##Ident,
enum Variant { HP_ROUTER_VARIANTS(HP_ROUTER_ENUM_) kNumVariants };
#undef HP_ROUTER_ENUM_

// The facts a host needs to size and check a launch, per variant (indexed by id).
struct VariantInfo {
  const char* name;
  int family, bm, bn, bk, parts, splitk;
};
#define HP_ROUTER_INFO_(Ident, name, family, bm, bn, bk, parts, splitk, ...) {name, family, bm, bn, bk, parts, splitk},
constexpr VariantInfo kVariantInfo[kNumVariants] = {HP_ROUTER_VARIANTS(HP_ROUTER_INFO_)};
#undef HP_ROUTER_INFO_

constexpr const VariantInfo& info(int v) {
  return kVariantInfo[v];
}
constexpr bool valid_variant(int v) {
  return v >= 0 && v < kNumVariants;
}
constexpr bool is_decode(int v) {
  return valid_variant(v) && info(v).family == kDecodeFamily;
}
constexpr bool is_tiled(int v) {
  return valid_variant(v) && info(v).family == kTiledFamily;
}
constexpr bool is_wgmma(int v) {
  return valid_variant(v) && (info(v).family == kWgFamily || info(v).family == kWsFamily);
}
constexpr bool global_splitk(int v) {
  return valid_variant(v) && info(v).splitk != kSplitCluster;
}
constexpr bool pair_splitk(int v) {
  return valid_variant(v) && info(v).splitk == kSplitPair;
}
constexpr bool reduce_scatter(int v) {
  return valid_variant(v) && info(v).splitk == kSplitScatter;
}
// The fewest K splits a variant runs: a K pair and a reduce-scatter need two ranks.
constexpr int min_splits(int v) {
  return pair_splitk(v) || reduce_scatter(v) ? 2 : 1;
}
// CTAs per cluster of a wgmma launch: (1, 1, splits) for the cluster reduction, (1, 1, 2) for the K pairs, one CTA
// for the other global split-K variants. At most 8 (portable).
constexpr int wgmma_cluster_size(int v, int splits) {
  return pair_splitk(v) ? 2 : global_splitk(v) ? 1 : splits;
}

}  // namespace hp_router
