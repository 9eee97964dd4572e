// Route kernel of the fused FP8 MoE: topk_ids [T, K] -> the routing plan (plan_layout.cuh), on the device.
//
// Launch: ONE CTA of 1024 threads, dynamic shared memory 32 warps x E ints (E <= 512). Traffic: reads T*K ids,
// writes the workspace once (a few KB at decode sizes).
// Design: with one CTA there is no inter-CTA ordering to buy with global atomics. Each warp owns one contiguous
// segment of the pairs (1/32 of them, in pair order) and walks it 32 at a time: __match_any_sync + popc give each
// pair its rank among same-expert lanes below it. Pass 1 counts per (warp, expert) in shared memory; one prefix per
// expert over the warps (in warp order, from the expert's offset) turns the counts into cursors; pass 2 walks the
// segment again and places each pair at cursor + rank. Placement is therefore stable (increasing p inside an
// expert), the property the host builder and the down kernel's write-back rely on, with no block-wide barrier
// inside either pass (a chunk-by-chunk placement needed four per 1024 pairs plus a 32-step serial prefix each: 28 us
// at 8192 pairs). Tiles are then cut per expert (ceil(count / block_m)) and written in parallel, each thread
// finding its tile's expert by binary search over the tile prefix sum.
#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "plan_layout.cuh"

namespace hp_moe {

constexpr int kRouteThreads = 1024;
constexpr int kMaxExperts = 512;

// Exclusive block scan of one int per thread (1024 threads); returns the prefix, *total gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int s = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const int base = warp ? warp_sums[warp - 1] : 0;
  *total = warp_sums[31];
  __syncthreads();  // warp_sums may be reused by the caller's next scan
  return base + x - v;
}

__global__ void __launch_bounds__(kRouteThreads, 1)
    route_kernel(const int* __restrict__ topk_ids, int* __restrict__ ws, int num_pairs, int num_experts,
                 int expert_offset, int max_pairs, int block_m) {
  extern __shared__ int smem[];
  int* warp_cnt = smem;                      // [32][E]
  __shared__ int tile_off[kMaxExperts + 1];  // exclusive prefix of tiles per expert
  __shared__ int warp_sums[32];
  const PlanView plan{ws, num_experts, max_pairs, block_m};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int E = num_experts;

  hp::pdl_wait();  // topk_ids come from the previous kernel; the workspace may still be read by the last down
  // Dependents launch only after the wait: the x pre-pass (quant_rows_kernel, wait_first = 0) relies on it to start
  // with everything before this kernel complete, and overlaps the routing below.
  hp::pdl_launch_dependents();

  for (int i = tid; i < 32 * E; i += kRouteThreads) warp_cnt[i] = 0;
  __syncthreads();
  auto local_expert = [&](int p) {
    if (p >= num_pairs) return -1;
    const long long e = (long long)topk_ids[p] - expert_offset;  // any int is tolerated: outside [0, E) skips
    return (e >= 0 && e < E) ? (int)e : -1;
  };
  // This warp's segment [p0, p1) (the loops below are warp-uniform: every lane reaches the match).
  const int seg = (num_pairs + 31) / 32;
  const int p0 = (int)min((long long)warp * seg, (long long)num_pairs);
  const int p1 = (int)min((long long)p0 + seg, (long long)num_pairs);
  int* my_cnt = warp_cnt + warp * E;
  for (int b = p0; b < p1; b += 32) {  // pass 1: per-(warp, expert) counts
    const int p = b + lane;
    const int e = p < p1 ? local_expert(p) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (peers & ((1u << lane) - 1u)) == 0) my_cnt[e] += __popc(peers);  // one writer per expert
    __syncwarp();  // the next leader of an expert may be another lane
  }
  __syncthreads();

  // Offsets and tiles per expert (E <= 512 < 1024: one expert per thread).
  int my_count = 0;
  if (tid < E)
    for (int w = 0; w < 32; ++w) my_count += warp_cnt[w * E + tid];
  int valid = 0, num_tiles = 0, hit = 0;
  const int off = block_exclusive_scan(my_count, warp_sums, &valid);
  const int my_tiles = (my_count + block_m - 1) / block_m;
  const int toff = block_exclusive_scan(my_tiles, warp_sums, &num_tiles);
  const int is_hit = block_exclusive_scan(my_count > 0 ? 1 : 0, warp_sums, &hit);
  (void)is_hit;
  if (tid < E) {
    plan.counts()[tid] = my_count;
    plan.offsets()[tid] = off;
    tile_off[tid] = toff;
    int run = off;  // per-warp counts -> cursors, in warp order (= pair order)
    for (int w = 0; w < 32; ++w) {
      const int c = warp_cnt[w * E + tid];
      warp_cnt[w * E + tid] = run;
      run += c;
    }
  }
  if (tid == 0) {
    plan.offsets()[E] = valid;
    tile_off[E] = num_tiles;
    int* h = plan.header();
    h[0] = valid;
    h[1] = num_tiles;
    h[2] = hit;
    h[3] = block_m;
    h[4] = h[5] = h[6] = h[7] = 0;
  }
  __syncthreads();

  // Pass 2: stable placement from this warp's cursors.
  int* sorted = plan.sorted();
  for (int b = p0; b < p1; b += 32) {
    const int p = b + lane;
    const int e = p < p1 ? local_expert(p) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int cur = e >= 0 ? my_cnt[e] : 0;
    if (e >= 0) sorted[cur + rank] = p;
    __syncwarp();  // every lane has read its cursor before the leader moves it
    if (e >= 0 && rank == 0) my_cnt[e] = cur + __popc(peers);
    __syncwarp();
  }
  for (int i = valid + tid; i < max_pairs; i += kRouteThreads) sorted[i] = -1;

  // Tiles: tile i belongs to the expert x with tile_off[x] <= i < tile_off[x+1] (binary search; empty experts
  // have equal bounds and are skipped by taking the last x with tile_off[x] <= i).
  int* te = plan.tile_expert();
  int* ts = plan.tile_start();
  const int max_tiles = plan.max_tiles();
  for (int i = tid; i < max_tiles; i += kRouteThreads) {
    if (i < num_tiles) {
      int lo = 0, hi = E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile_off[mid] <= i)
          lo = mid;
        else
          hi = mid - 1;
      }
      te[i] = lo;
      ts[i] = plan.offsets()[lo] + (i - tile_off[lo]) * block_m;
    } else {
      te[i] = -1;
      ts[i] = -1;
    }
  }
}

}  // namespace hp_moe

extern "C" {

long long hp_moe_workspace_len(int num_experts, int max_pairs, int block_m) {
  return hp_moe::PlanView::length(num_experts, max_pairs, block_m);
}

int hp_moe_route(const int* topk_ids, int* ws, int num_pairs, int num_experts, int expert_offset, int max_pairs,
                 int block_m, int pdl, cudaStream_t stream) {
  if (num_experts < 1 || num_experts > hp_moe::kMaxExperts || block_m < 1 || num_pairs > max_pairs)
    return (int)cudaErrorInvalidValue;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  const int smem = 32 * num_experts * (int)sizeof(int);
  return (int)hp::launch(hp_moe::route_kernel, dim3(1), dim3(hp_moe::kRouteThreads), smem, stream, opt, topk_ids, ws,
                         num_pairs, num_experts, expert_offset, max_pairs, block_m);
}

}  // extern "C"
