// Route kernels of the fused FP8 MoE: topk_ids [T, K] -> the routing plan (plan_layout.cuh), on the device.
//
// Three paths, one plan (byte for byte the host builder's), chosen on the host at plan time from max_pairs (so a
// captured graph replays the same launches whatever the live token count; the kernels read the count they route):
//  - route_small_kernel (decode sizes, max_pairs <= kRouteSmallMaxPairs): one CTA, one pair per thread, 7 barriers
//    (see its comment below);
//  - route_kernel: ONE CTA of 1024 threads, dynamic shared memory ~34 x E ints (E <= 512). With one CTA there
//    is no inter-CTA ordering to buy with global atomics: a few us at decode sizes, but every pair passes through one
//    SM (77 us at 32768 pairs).
//  - route_hist_kernel + route_place_kernel: G CTAs of 1024 threads (G from max_pairs, at most kMaxRouteCtas), CTA
//    c owning the contiguous pair chunk c. The first kernel writes the chunk's expert histogram to a scratch [G][E];
//    the second (PDL-chained) reads the whole scratch in every CTA (G x E ints from L2, spread over the threads) to
//    get, per expert, the total and the count of the chunks before its own, so each CTA knows its (expert, chunk)
//    offset in expert-major order without a grid barrier, atomics or a look-back; it then ranks and places its chunk
//    like the one-CTA kernel and writes its share (grid-strided) of the padding and the tiles. CTA 0 writes the
//    header, counts and offsets. Deterministic; no inter-CTA waiting, so any grid size is safe.
// Shared by both: each warp owns one contiguous segment of its pairs (1/32 of them, in pair order) and walks it 32
// at a time: __match_any_sync + popc give each pair its rank among same-expert lanes below it. Pass 1 counts per
// (warp, expert) in shared memory; a prefix per expert over the warps (in warp order, from the expert's offset) turns
// the counts into cursors; pass 2 walks the segment again and places each pair at cursor + rank. Placement is
// therefore stable (increasing p inside an expert), the property the host builder and the down kernel's write-back
// rely on, with no block-wide barrier inside either pass. Tiles are then cut per expert (ceil(count / block_m)) and
// written in parallel, each thread finding its tile's expert by binary search over the tile prefix sum.
// Traffic: reads T*K ids (twice on the multi-CTA path, the second time from L2), writes the workspace once.
#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "plan_layout.cuh"

namespace hp_moe {

constexpr int kRouteThreads = 1024;
constexpr int kMaxExperts = 512;
constexpr int kRoutePairsPerCta = 512;  // multi-CTA path: the chunk a CTA owns at max_pairs (16 pairs per warp)
constexpr int kMaxRouteCtas = 128;      // one wave of 1024-thread CTAs on an H100/H200

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

// The pairs to route: topk_ids flattened, local expert of pair p or -1 (past the count, or an id outside
// [offset, offset + E): any int is tolerated).
struct RouteIds {
  const int* __restrict__ ids;
  int num_pairs;
  int num_experts;
  int expert_offset;
  __device__ __forceinline__ int expert(int p) const {
    if (p >= num_pairs) return -1;
    const long long e = (long long)ids[p] - expert_offset;
    return (e >= 0 && e < num_experts) ? (int)e : -1;
  }
};

// Piece i of [lo, hi) cut into `parts` contiguous pieces of ceil(n / parts) (the last ones may be short or empty).
__device__ __forceinline__ int2 piece(int lo, int hi, int i, int parts) {
  const long long seg = ((long long)hi - lo + parts - 1) / parts;
  const int a = (int)min((long long)lo + i * seg, (long long)hi);
  return make_int2(a, (int)min((long long)a + seg, (long long)hi));
}

// Pass 1 of one warp over its segment: cnt[e] += pairs of expert e (cnt is the warp's own row: one writer per
// expert, the match leader). Warp-uniform loop: every lane reaches the match.
__device__ __forceinline__ void count_segment(const RouteIds& r, int2 seg, int* cnt) {
  const int lane = threadIdx.x & 31;
  for (int b = seg.x; b < seg.y; b += 32) {
    const int p = b + lane;
    const int e = p < seg.y ? r.expert(p) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (peers & ((1u << lane) - 1u)) == 0) cnt[e] += __popc(peers);
    __syncwarp();  // the next leader of an expert may be another lane
  }
}

// Pass 2 of one warp over the same segment: stable placement from the warp's cursors cur[e] (advanced).
__device__ __forceinline__ void place_segment(const RouteIds& r, int2 seg, int* cur, int* sorted) {
  const int lane = threadIdx.x & 31;
  for (int b = seg.x; b < seg.y; b += 32) {
    const int p = b + lane;
    const int e = p < seg.y ? r.expert(p) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int c = e >= 0 ? cur[e] : 0;
    if (e >= 0) sorted[c + rank] = p;
    __syncwarp();  // every lane has read its cursor before the leader moves it
    if (e >= 0 && rank == 0) cur[e] = c + __popc(peers);
    __syncwarp();
  }
}

// Sum of expert e's counts over the 32 warp rows of warp_cnt [32][E].
__device__ __forceinline__ int warp_total(const int* warp_cnt, int num_experts, int e) {
  int s = 0;
  for (int w = 0; w < 32; ++w) s += warp_cnt[w * num_experts + e];
  return s;
}

// warp_cnt[w][e] -> cursor: start + the counts of the warps before w (warp order = pair order).
__device__ __forceinline__ void counts_to_cursors(int* warp_cnt, int num_experts, int e, int start) {
  for (int w = 0; w < 32; ++w) {
    const int c = warp_cnt[w * num_experts + e];
    warp_cnt[w * num_experts + e] = start;
    start += c;
  }
}

// Shared memory of the route kernels, all dynamic (a static part would lower the default dynamic limit below 48 KB,
// and the launch helper raises the limit only above 48 KB): warp_cnt [32][E], tile_off [E+1] (exclusive prefix of
// tiles per expert), exp_off [E], warp_sums [32], then, multi-CTA place only, part_total / part_before [1024].
struct RouteSmem {
  int* warp_cnt;
  int* tile_off;
  int* exp_off;
  int* warp_sums;
  int* part_total;
  int* part_before;
  __host__ __device__ static int bytes(int num_experts, bool parts) {
    return (int)sizeof(int) * (34 * num_experts + 1 + 32 + (parts ? 2 * kRouteThreads : 0));
  }
  __device__ explicit RouteSmem(int* s, int num_experts)
      : warp_cnt(s),
        tile_off(s + 32 * num_experts),
        exp_off(tile_off + num_experts + 1),
        warp_sums(exp_off + num_experts),
        part_total(warp_sums + 32),
        part_before(part_total + kRouteThreads) {}
};

// The plan header (plan_layout.cuh): valid pairs, tiles, experts hit, block_m, four reserved zeros. One thread.
__device__ __forceinline__ void write_header(const PlanView& plan, int valid, int num_tiles, int hit) {
  int* h = plan.header();
  h[0] = valid;
  h[1] = num_tiles;
  h[2] = hit;
  h[3] = plan.block_m;
  h[4] = h[5] = h[6] = h[7] = 0;
}

// The padding past the live plan, threads first, first + stride, ...: sorted_pairs -1 from `valid`, the tile arrays
// -1 from `num_tiles` (a replay with fewer tokens must not leave the previous plan's tail behind).
__device__ __forceinline__ void write_padding(const PlanView& plan, int valid, int num_tiles, int first, int stride) {
  int* sorted = plan.sorted();
  for (int i = valid + first; i < plan.max_pairs; i += stride) sorted[i] = -1;
  int* te = plan.tile_expert();
  int* ts = plan.tile_start();
  const int max_tiles = plan.max_tiles();
  for (int i = num_tiles + first; i < max_tiles; i += stride) te[i] = ts[i] = -1;
}

struct PlanTotals {
  int offset;     // this thread's expert's first sorted position (thread e < E)
  int valid;      // routed pairs
  int num_tiles;  // tiles of block_m
};

// Block-wide (1024 threads, every thread calls): thread e < E passes expert e's count. Fills exp_off[0..E) and
// tile_off[0..E] in shared memory; `write` (one CTA) also writes counts, offsets and the header of the plan. The
// caller syncs before reading the shared arrays.
__device__ __forceinline__ PlanTotals expert_offsets(const PlanView& plan, int my_count, int* exp_off, int* tile_off,
                                                     int* warp_sums, bool write) {
  const int tid = threadIdx.x, E = plan.num_experts;
  PlanTotals t;
  int hit = 0;
  t.offset = block_exclusive_scan(my_count, warp_sums, &t.valid);
  const int toff = block_exclusive_scan((my_count + plan.block_m - 1) / plan.block_m, warp_sums, &t.num_tiles);
  (void)block_exclusive_scan(my_count > 0 ? 1 : 0, warp_sums, &hit);
  if (tid < E) {
    exp_off[tid] = t.offset;
    tile_off[tid] = toff;
    if (write) {
      plan.counts()[tid] = my_count;
      plan.offsets()[tid] = t.offset;
    }
  }
  if (tid == 0) {
    tile_off[E] = t.num_tiles;
    if (write) {
      plan.offsets()[E] = t.valid;
      write_header(plan, t.valid, t.num_tiles, hit);
    }
  }
  return t;
}

// The tile arrays and the padding, threads first, first + stride, ...: tile i belongs to the expert x with
// tile_off[x] <= i < tile_off[x+1] (binary search; empty experts have equal bounds and are skipped by taking the
// last x with tile_off[x] <= i).
__device__ __forceinline__ void write_tail_and_tiles(const PlanView& plan, const PlanTotals& t, const int* exp_off,
                                                     const int* tile_off, int first, int stride) {
  int* te = plan.tile_expert();
  int* ts = plan.tile_start();
  for (int i = first; i < t.num_tiles; i += stride) {
    int lo = 0, hi = plan.num_experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (tile_off[mid] <= i)
        lo = mid;
      else
        hi = mid - 1;
    }
    te[i] = lo;
    ts[i] = exp_off[lo] + (i - tile_off[lo]) * plan.block_m;
  }
  write_padding(plan, t.valid, t.num_tiles, first, stride);
}

__global__ void __launch_bounds__(kRouteThreads, 1)
    route_kernel(const int* __restrict__ topk_ids, int* __restrict__ ws, int num_pairs, int num_experts,
                 int expert_offset, int max_pairs, int block_m) {
  extern __shared__ int smem[];
  const RouteSmem sm(smem, num_experts);
  int* warp_cnt = sm.warp_cnt;
  const PlanView plan{ws, num_experts, max_pairs, block_m};
  const RouteIds r{topk_ids, num_pairs, num_experts, expert_offset};
  const int tid = threadIdx.x, warp = tid >> 5;
  const int E = num_experts;

  hp::pdl_wait();  // topk_ids come from the previous kernel; the workspace may still be read by the last down
  // Dependents launch only after the wait: the x pre-pass (quant_rows_kernel, wait_first = 0) relies on it to start
  // with everything before this kernel complete, and overlaps the routing below.
  hp::pdl_launch_dependents();

  for (int i = tid; i < 32 * E; i += kRouteThreads) warp_cnt[i] = 0;
  __syncthreads();
  const int2 seg = piece(0, num_pairs, warp, 32);  // this warp's segment
  int* my_cnt = warp_cnt + warp * E;
  count_segment(r, seg, my_cnt);
  __syncthreads();

  // Offsets and tiles per expert (E <= 512 < 1024: one expert per thread).
  const int my_count = tid < E ? warp_total(warp_cnt, E, tid) : 0;
  const PlanTotals t = expert_offsets(plan, my_count, sm.exp_off, sm.tile_off, sm.warp_sums, true);
  if (tid < E) counts_to_cursors(warp_cnt, E, tid, t.offset);
  __syncthreads();

  place_segment(r, seg, my_cnt, plan.sorted());
  write_tail_and_tiles(plan, t, sm.exp_off, sm.tile_off, tid, kRouteThreads);
}

// Multi-CTA path, step 1: hist[c][e] = pairs of expert e in chunk c = blockIdx.x (every entry written, so the scratch
// needs no clearing between launches).
__global__ void __launch_bounds__(kRouteThreads, 1)
    route_hist_kernel(const int* __restrict__ topk_ids, int* __restrict__ hist, int num_pairs, int num_experts,
                      int expert_offset) {
  extern __shared__ int smem[];
  int* warp_cnt = RouteSmem(smem, num_experts).warp_cnt;
  const RouteIds r{topk_ids, num_pairs, num_experts, expert_offset};
  const int tid = threadIdx.x, warp = tid >> 5;
  const int E = num_experts;
  hp::pdl_wait();  // topk_ids come from the previous kernel; the scratch was last read by the previous place
  hp::pdl_launch_dependents();  // the place kernel waits for this grid to complete before it reads the scratch

  for (int i = tid; i < 32 * E; i += kRouteThreads) warp_cnt[i] = 0;
  __syncthreads();
  const int2 chunk = piece(0, num_pairs, blockIdx.x, gridDim.x);
  count_segment(r, piece(chunk.x, chunk.y, warp, 32), warp_cnt + warp * E);
  __syncthreads();
  for (int e = tid; e < E; e += kRouteThreads) hist[(size_t)blockIdx.x * E + e] = warp_total(warp_cnt, E, e);
}

// Multi-CTA path, step 2 (same grid): per expert, the total over all chunks and the count of the chunks before this
// one (threads in `parts` groups of E, each group summing a contiguous range of chunks; the groups combined in a
// fixed order: integer sums, exact anyway), then the one-CTA kernel's ranking and placement over this chunk from
// cursors offset[e] + before[e] + the warps before, and a grid-strided share of the padding and the tiles.
__global__ void __launch_bounds__(kRouteThreads, 1)
    route_place_kernel(const int* __restrict__ topk_ids, const int* hist, int* __restrict__ ws, int num_pairs,
                       int num_experts, int expert_offset, int max_pairs, int block_m) {
  extern __shared__ int smem[];
  const RouteSmem sm(smem, num_experts);
  int* warp_cnt = sm.warp_cnt;
  int* part_total = sm.part_total;
  int* part_before = sm.part_before;
  const PlanView plan{ws, num_experts, max_pairs, block_m};
  const RouteIds r{topk_ids, num_pairs, num_experts, expert_offset};
  const int tid = threadIdx.x, warp = tid >> 5;
  const int E = num_experts, c = blockIdx.x, G = gridDim.x;
  hp::pdl_wait();  // the histograms are the previous grid's; the workspace may still be read by the last down
  hp::pdl_launch_dependents();  // after the wait, as in route_kernel (the x pre-pass relies on it)

  for (int i = tid; i < 32 * E; i += kRouteThreads) warp_cnt[i] = 0;
  const int parts = kRouteThreads / E;  // >= 2 (E <= 512)
  if (tid < parts * E) {
    const int j = tid / E, e = tid - j * E;
    const int2 cs = piece(0, G, j, parts);
    int total = 0, before = 0;
#pragma unroll 8
    for (int cc = cs.x; cc < cs.y; ++cc) {
      const int v = __ldcg(hist + (size_t)cc * E + e);  // L2: written by the previous grid
      total += v;
      before += cc < c ? v : 0;
    }
    part_total[tid] = total;
    part_before[tid] = before;
  }
  __syncthreads();
  const int2 chunk = piece(0, num_pairs, c, G);
  const int2 seg = piece(chunk.x, chunk.y, warp, 32);
  int* my_cnt = warp_cnt + warp * E;
  count_segment(r, seg, my_cnt);
  int my_count = 0, my_before = 0;
  if (tid < E)
    for (int j = 0; j < parts; ++j) {
      my_count += part_total[j * E + tid];
      my_before += part_before[j * E + tid];
    }
  __syncthreads();  // every warp's counts are in

  const PlanTotals t = expert_offsets(plan, my_count, sm.exp_off, sm.tile_off, sm.warp_sums, c == 0);
  if (tid < E) counts_to_cursors(warp_cnt, E, tid, t.offset + my_before);
  __syncthreads();

  place_segment(r, seg, my_cnt, plan.sorted());
  write_tail_and_tiles(plan, t, sm.exp_off, sm.tile_off, c * kRouteThreads + tid, G * kRouteThreads);
}

// Decode-size path (max_pairs <= kRouteSmallMaxPairs): one CTA, one pair per thread, few barriers. Why a third
// kernel: at decode batches the one-CTA kernel's segment walks, per-warp cursor chains and three block scans made
// it ~485 dependent instructions per warp and 11 barriers (Nsight Compute: 6.3 us at batch 4 with cold caches, ~16
// cycles per issued instruction), 2-4 us of the layer's critical path. Here:
//  - thread p loads pair p's expert right after the wait (the only global read), while the CTA zeroes bits[E][32];
//  - each warp's match_any leader stores its lanes' mask as bits[e][warp] (one writer per word: no atomics);
//  - thread x < E sums its expert's 32 masks (8 x 16-byte loads) = its count; thread p's stable rank is the popc of
//    its expert's masks of the warps below plus its lanes below (pairs in p order, as the host builder places them);
//  - one block scan of count | tiles << 16 (both < 2^16 here) gives the offsets and the tile offsets, a
//    __syncthreads_count the experts hit; each expert's thread writes its own tiles (no binary search).
constexpr int kRouteSmallMaxPairs = kRouteThreads;

__global__ void __launch_bounds__(kRouteThreads, 1)
    route_small_kernel(const int* __restrict__ topk_ids, int* __restrict__ ws, int num_pairs, int num_experts,
                       int expert_offset, int max_pairs, int block_m) {
  extern __shared__ int smem[];
  const int E = num_experts;
  unsigned* bits = reinterpret_cast<unsigned*>(smem);  // [E][32]: bit l of bits[e][w] = pair 32 w + l on e
  int* warp_sums = smem + 32 * E;                      // [32]
  int* exp_off = warp_sums + 32;                       // [E]
  const PlanView plan{ws, num_experts, max_pairs, block_m};
  const RouteIds r{topk_ids, num_pairs, num_experts, expert_offset};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  hp::pdl_wait();  // topk_ids come from the previous kernel; the workspace may still be read by the last down
  hp::pdl_launch_dependents();  // after the wait, as in route_kernel (the x pre-pass relies on it)
  const int e = r.expert(tid);
  for (int i = tid; i < 32 * E; i += kRouteThreads) bits[i] = 0u;
  __syncthreads();
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const unsigned below = (1u << lane) - 1u;
  if (e >= 0 && (peers & below) == 0) bits[e * 32 + warp] = peers;
  __syncthreads();

  int my_count = 0;
  if (tid < E) {
    const uint4* row = reinterpret_cast<const uint4*>(bits + tid * 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint4 v = row[i];
      my_count += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    }
  }
  int rank = 0;
  if (e >= 0) {
    const unsigned* row = bits + e * 32;
    for (int w = 0; w < warp; ++w) rank += __popc(row[w]);
    rank += __popc(peers & below);
  }
  const int my_tiles = (my_count + block_m - 1) / block_m;
  int packed_total = 0;
  const int packed = block_exclusive_scan(my_count | (my_tiles << 16), warp_sums, &packed_total);
  const int offset = packed & 0xffff, toff = packed >> 16;
  const int valid = packed_total & 0xffff, num_tiles = packed_total >> 16;
  const int hit = __syncthreads_count(tid < E && my_count > 0);
  if (tid < E) {
    exp_off[tid] = offset;
    plan.counts()[tid] = my_count;
    plan.offsets()[tid] = offset;
    int* te = plan.tile_expert();
    int* ts = plan.tile_start();
    for (int j = 0; j < my_tiles; ++j) {
      te[toff + j] = tid;
      ts[toff + j] = offset + j * block_m;
    }
  }
  if (tid == 0) {
    plan.offsets()[E] = valid;
    write_header(plan, valid, num_tiles, hit);
  }
  __syncthreads();  // exp_off
  if (e >= 0) plan.sorted()[exp_off[e] + rank] = tid;
  write_padding(plan, valid, num_tiles, tid, kRouteThreads);
}

inline int route_small_smem(int num_experts) {
  return (int)sizeof(int) * (33 * num_experts + 32);
}

// The host entry points' argument check (each kernel has a shared-memory array per expert up to kMaxExperts).
inline bool route_args_ok(int num_pairs, int num_experts, int max_pairs, int block_m) {
  return num_experts >= 1 && num_experts <= kMaxExperts && block_m >= 1 && num_pairs >= 0 && num_pairs <= max_pairs;
}

// CTAs of the multi-CTA path for a plan of max_pairs (fixed per plan: the scratch holds that many x E ints).
inline int route_ctas(int max_pairs) {
  const int g = (max_pairs + kRoutePairsPerCta - 1) / kRoutePairsPerCta;
  return g < 1 ? 1 : (g > kMaxRouteCtas ? kMaxRouteCtas : g);
}

}  // namespace hp_moe

extern "C" {

long long hp_moe_workspace_len(int num_experts, int max_pairs, int block_m) {
  return hp_moe::PlanView::length(num_experts, max_pairs, block_m);
}

// CTAs of the multi-CTA route for plans of max_pairs; its scratch is that many x num_experts int32.
int hp_moe_route_ctas(int max_pairs) {
  return hp_moe::route_ctas(max_pairs);
}

// The route: hist == null takes the one-CTA kernel; otherwise the two-kernel multi-CTA path with hist the scratch of
// hp_moe_route_ctas(max_pairs) x num_experts int32. hp_moe_route_small: the decode-size kernel (max_pairs <=
// hp_moe_route_small_max_pairs()).
int hp_moe_route_small_max_pairs() {
  return hp_moe::kRouteSmallMaxPairs;
}

int hp_moe_route_small(const int* topk_ids, int* ws, int num_pairs, int num_experts, int expert_offset, int max_pairs,
                       int block_m, int pdl, cudaStream_t stream) {
  if (!hp_moe::route_args_ok(num_pairs, num_experts, max_pairs, block_m) || max_pairs > hp_moe::kRouteSmallMaxPairs)
    return (int)cudaErrorInvalidValue;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  return (int)hp::launch(hp_moe::route_small_kernel, dim3(1), dim3(hp_moe::kRouteThreads),
                         hp_moe::route_small_smem(num_experts), stream, opt, topk_ids, ws, num_pairs, num_experts,
                         expert_offset, max_pairs, block_m);
}

int hp_moe_route(const int* topk_ids, int* ws, int* hist, int num_pairs, int num_experts, int expert_offset,
                 int max_pairs, int block_m, int pdl, cudaStream_t stream) {
  if (!hp_moe::route_args_ok(num_pairs, num_experts, max_pairs, block_m)) return (int)cudaErrorInvalidValue;
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  const int smem = hp_moe::RouteSmem::bytes(num_experts, false);
  const dim3 block(hp_moe::kRouteThreads);
  if (hist == nullptr)
    return (int)hp::launch(hp_moe::route_kernel, dim3(1), block, smem, stream, opt, topk_ids, ws, num_pairs,
                           num_experts, expert_offset, max_pairs, block_m);
  const dim3 grid(hp_moe::route_ctas(max_pairs));
  const cudaError_t err = hp::launch(hp_moe::route_hist_kernel, grid, block, smem, stream, opt, topk_ids, hist,
                                     num_pairs, num_experts, expert_offset);
  if (err != cudaSuccess) return (int)err;
  return (int)hp::launch(hp_moe::route_place_kernel, grid, block, hp_moe::RouteSmem::bytes(num_experts, true), stream,
                         opt, topk_ids, static_cast<const int*>(hist), ws, num_pairs, num_experts, expert_offset,
                         max_pairs, block_m);
}

}  // extern "C"
