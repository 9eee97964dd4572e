// Split-K across CTAs, shared by the expert GEMMs of both families (mma.sync: expert_gemm.cu; warp-specialized
// wgmma: expert_wgmma.cu): the work units, the two split-factor rules and the arrival protocol.
//
// Every item's K stages are cut into S contiguous ranges, one per work unit (unit u = item * S + ks covers K stages
// [ks * kps, min(kt_count, (ks + 1) * kps))); a unit writes its fp32 partial, the LAST unit of an item to arrive
// (per-item counter) sums the S partials in range order (deterministic, whatever the arrival order) and runs the
// epilogue, then puts the counter back to 0, so the workspace is ready for the next launch with no memset (CUDA-graph
// replays included). Workspace (int32): counters[slots] (zeroed once at allocation), then fp32 partials[slots][...].
// The factor is computed on the device from the plan's tile count (no host sync: one captured launch serves every
// batch), and the same functions answer the host queries the tests compare with.
#pragma once

namespace hp_moe {

constexpr int kMaxSplit = 8;
__host__ __device__ constexpr int splitk_counter_ints(int slots) {
  return (slots + 3) & ~3;
}  // partials 16-B aligned

// mma.sync rule: split only when the items leave CTA slots idle (items * S <= grid), at least 2 stages per range,
// no empty range. slots = the grid's CTA slots.
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

// Warp-specialized wgmma rule (one CTA per SM, items of 32 K stages at Hy3 gate-up): the items also unbalance the grid
// when they outnumber it (282 items on 132 CTAs: 3 rounds of 32 stages for an average of 68), so the factor is the one
// that minimises the busiest CTA's modeled time under the round-robin unit order, rounds * (kps + kSplitUnitCost) with
// rounds = ceil(items * S / grid); kSplitUnitCost (in K stages) charges each unit's end (partial store, arrival,
// epilogue) and keeps S = 1 where a split would only trade stages for unit ends. At least 2 stages per range, no empty
// range, items * S <= max_units (the workspace's partial slots); ties go to the smaller S.
// Mirrored by hotpaths.reference.fused_moe.ws_split_factor (the CPU model of the per-CTA load).
constexpr int kSplitUnitCost = 1;
__host__ __device__ inline int splitk_factor_rounds(int num_items, int grid, int kt_count, int max_units,
                                                    int* kps_out) {
  int best = 1, best_kps = kt_count;
  if (num_items > 0 && grid > 0) {
    long long best_cost = ((long long)num_items + grid - 1) / grid * (kt_count + kSplitUnitCost);
    for (int s = 2; s <= kMaxSplit; ++s) {
      const int kps = (kt_count + s - 1) / s;
      if (kps < 2 || (kt_count + kps - 1) / kps != s) continue;  // too short, or an empty range (a smaller S is it)
      const long long units = (long long)num_items * s;
      if (units > max_units) break;
      const long long cost = (units + grid - 1) / grid * (kps + kSplitUnitCost);
      if (cost < best_cost) best_cost = cost, best = s, best_kps = kps;
    }
  }
  *kps_out = best_kps;
  return best;
}

// The launch's work units (see the block comment above).
struct UnitSchedule {
  int n_tiles, kt_count, split, kps, num_units;
  int* counters;
  float* partials;
};
struct UnitRange {
  int item, kt0, nk, nt, tile;
};
__host__ __device__ inline UnitSchedule unit_schedule_of(int n_tiles, int num_items, int kt_count, int split, int kps,
                                                         int* splitk, int counter_slots) {
  UnitSchedule u;
  u.n_tiles = n_tiles;
  u.kt_count = kt_count;
  u.split = split;
  u.kps = kps;
  u.num_units = num_items * split;
  u.counters = splitk;
  u.partials = split > 1 ? reinterpret_cast<float*>(splitk + splitk_counter_ints(counter_slots)) : nullptr;
  return u;
}
__host__ __device__ inline UnitRange unit_range(const UnitSchedule& u, int unit) {
  UnitRange r;
  r.item = unit / u.split;
  const int ks = unit - r.item * u.split;
  r.kt0 = ks * u.kps;
  r.nk = min(u.kt_count, r.kt0 + u.kps) - r.kt0;
  r.tile = r.item / u.n_tiles;
  r.nt = r.item - r.tile * u.n_tiles;
  return r;
}

// After every thread of the unit has stored its partial: counts the unit's arrival on its item's counter and tells
// (uniformly) whether it arrived last; then the other units' partials are visible to this CTA (read them with
// __ldcg) and the caller puts counters[item] back to 0. sync: the barrier of the unit's threads; flag: a shared int.
template <class Sync>
__device__ __forceinline__ bool splitk_arrive(int* counters, int item, int split, int* flag, Sync sync) {
  __threadfence();  // this unit's partial is visible device-wide before its arrival is counted
  sync();
  if (threadIdx.x == 0) *flag = atomicAdd(&counters[item], 1) == split - 1;
  sync();
  if (!*flag) return false;
  __threadfence();
  return true;
}

}  // namespace hp_moe
