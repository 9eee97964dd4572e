// The routing plan's memory layout: ONE int32 workspace, read by every MoE kernel through this view and mirrored
// once in Python (hotpaths.kernels.fused_moe.PlanLayout; the host builder is
// hotpaths.reference.fused_moe.build_routing_plan, compared byte for byte with the route kernel's output).
//
//   header[8]          [0] valid pairs  [1] num_tiles  [2] experts hit  [3] block_m  [4..7] 0
//   expert_counts[E]
//   expert_offsets[E+1]   exclusive prefix sum of counts; offsets[E] = valid pairs
//   sorted_pairs[max_pairs]  pair indices p = t*K + k grouped by local expert, increasing p inside an expert; -1 past
//   tile_expert[max_tiles], tile_start[max_tiles]   tiles of block_m sorted positions, expert order; -1 past
//   max_tiles = ceil(max_pairs / block_m) + E  (each expert can leave one partial tile)
// Why one struct: offsets recomputed at each use drift apart between kernels; here they are written once.
#pragma once
#include <cstdint>

namespace hp_moe {

struct PlanView {
  static constexpr int kHeader = 8;
  int* base;
  int num_experts;
  int max_pairs;
  int block_m;

  __host__ __device__ static int max_tiles_of(int E, int max_pairs, int block_m) {
    return (max_pairs + block_m - 1) / block_m + E;
  }
  __host__ __device__ static long long length(int E, int max_pairs, int block_m) {
    return kHeader + (long long)E + (E + 1) + max_pairs + 2LL * max_tiles_of(E, max_pairs, block_m);
  }
  __host__ __device__ int max_tiles() const { return max_tiles_of(num_experts, max_pairs, block_m); }
  __host__ __device__ int* header() const { return base; }
  __host__ __device__ int* counts() const { return base + kHeader; }
  __host__ __device__ int* offsets() const { return counts() + num_experts; }
  __host__ __device__ int* sorted() const { return offsets() + num_experts + 1; }
  __host__ __device__ int* tile_expert() const { return sorted() + max_pairs; }
  __host__ __device__ int* tile_start() const { return tile_expert() + max_tiles(); }
};
// The layout the Python mirror assumes: header, counts, offsets (E+1), sorted, two tile arrays, nothing else.
static_assert(PlanView::kHeader == 8, "PlanLayout in __init__.py mirrors an 8-int header");

}  // namespace hp_moe
