// assign: builds the dynamic split-KV task map on the device (one CTA).
//
// What: from device-side kv_lens [batch] int32 computes the whole workspace in the format of
//   hotpaths.reference.split_kv_decode.build_task_map (header, bin_start, descriptors, chunk_start, num_chunks;
//   every entry written, padding -1), byte for byte.
// Launch: grid 1. Fast path (batch * H <= 1024 pairs): block 256, each thread owns up to 4 consecutive pairs.
//   Generic path (more pairs): block 1024, the original two-scan kernel. No inter-CTA communication, so no
//   co-residency assumption; CUDA-graph safe (reads lengths from device memory, writes a fixed-size workspace).
//   The kernel triggers programmatic completion at once, so a PDL-launched attention kernel gets its CTAs
//   resident early; it reads the workspace only after cudaGridDependencySynchronize (= after this grid completes).
//   early = 0: a plain stream-ordered launch (kv_lens may come from the previous kernel).
//   early = 1: a PDL launch that overlaps the previous kernel (in a decode step, the attention prologue, which
//   writes Q and the new K/V rows but not kv_lens nor the workspace). Everything up to the first workspace write
//   (the kv_lens loads, both scans and their barriers: nearly all of the kernel's time) runs before
//   cudaGridDependencySynchronize; the writes come after it. So (a) no write can race a reader or writer of the
//   workspace before this kernel (the previous step's combine, plan()'s fill) and (b) this grid completes only
//   after its predecessor has, so the attention kernel's own wait, which covers only its immediate predecessor
//   (this grid), still covers the prologue's writes. Contract: kv_lens must not be written by the kernel launched
//   just before (it is read before the wait); in a decode step it is an input written before the prologue.
// Memory: reads batch*4 B, writes 4 * (9 + 5 C + 6 max_pairs) B (~11 KB at 256 pairs, C = 264).
// Design (fast path), a chain of two __syncthreads and no serial per-pair loop:
//   1. Issue the kv_lens loads first; while they are in flight write what does not depend on them (header
//      fields 4-7, chunk_start/num_chunks past the n = batch*H pairs, descriptor slots >= n + C - 1: the map has
//      at most (nonempty pairs) + (nbins - 1) <= n + C - 1 descriptors).
//   2. Tiles per pair -> warp shuffle scan; warp totals to shared memory; barrier 1; every thread reads the 8
//      warp totals itself (no second barrier, no warp-0 pass): tile prefix ts, total T, budget
//      B = max(ceil(T / C), F), nbins = ceil(T / B).
//   3. Chunks of a pair are closed form: ts / B .. (ts + t - 1) / B (division by B through a multiply-high with
//      a reciprocal computed once per thread). Warp scan of chunk counts; the warp-local chunk prefix and the
//      pair's (ts, te) go to shared memory with the warp index; barrier 2; warp chunk totals give ndesc and each
//      warp's offset.
//   4. Every descriptor starts either at a bin boundary b*B or at a pair start that is not one. The pair owner
//      writes chunk_start, num_chunks and, in the second case, its first descriptor; the thread of bin b
//      (b = tid, tid + 256, ...) binary-searches the pair holding tile b*B in shared memory and writes the
//      descriptor that opens the bin and bin_start[b]. A request of 128 bins is thus written by 128 threads,
//      not one (the old kernel's skewed-batch tail). Each workspace entry is written exactly once.
//   tests/test_split_kv_assign_model.py mirrors this per-thread arithmetic in Python and checks it against
//   build_task_map (and that every entry is written exactly once).
// Limits: total tiles (sum over pairs of ceil(kv_len / 64)) must stay below 2^31, as for the old kernel.
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/launch.cuh"
#include "task_map.cuh"

namespace {

using hp_decode::kDescInts;

constexpr int kFastThreads = 256;
constexpr int kFastWarps = kFastThreads / 32;
constexpr int kFastPer = 4;  // pairs per thread on the fast path
constexpr int kFastMaxPairs = kFastThreads * kFastPer;
constexpr int kAssignThreads = 1024;  // generic path
constexpr int kCache = 4;             // generic path: pairs per thread whose tile counts stay in registers

// x / d for 0 <= x < 2^31, 1 <= d < 2^31: m = ceil(2^32 / d) makes umulhi(x, m) either floor(x / d) or one more.
struct FastDiv {
  unsigned d, m;
};
__device__ __forceinline__ FastDiv make_fastdiv(unsigned d) {
  return {d, d > 1u ? 0xFFFFFFFFu / d + 1u : 0u};
}
__device__ __forceinline__ int fdiv(int x, FastDiv f) {
  unsigned q = __umulhi((unsigned)x, f.m);
  q = (q * f.d > (unsigned)x) ? q - 1u : q;
  return (int)(f.d == 1u ? (unsigned)x : q);
}

// Inclusive sum of v over lanes 0..lane of the warp (all 32 lanes take part).
__device__ __forceinline__ int warp_inclusive_scan(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// The task map's header: what the assignment found (words 0-3) and the request it was built for (words 4-7).
__device__ __forceinline__ void write_header_result(int* header, int T, int B, int nbins, int ndesc) {
  header[0] = T;
  header[1] = B;
  header[2] = nbins;
  header[3] = ndesc;
}
__device__ __forceinline__ void write_header_request(int* header, int batch, int H, int C, int F) {
  header[4] = batch;
  header[5] = H;
  header[6] = C;
  header[7] = F;
}

__global__ void __launch_bounds__(kFastThreads, 1)
    assign_fast_kernel(const int* __restrict__ kv_lens, int* __restrict__ ws, int batch, int H, int C, int F,
                       int max_pairs, int early) {
  __shared__ __align__(16) int s_wtiles[kFastWarps];
  __shared__ __align__(16) int s_wchunks[kFastWarps];
  __shared__ int4 s_pair[kFastMaxPairs];  // (ts, te, warp-local chunk prefix, owner warp)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // dependents still wait for our completion in GridDependencySync
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = batch * H;
  const int per = (n + kFastThreads - 1) / kFastThreads;  // 1..4 (0 when n == 0)
  const int p0 = tid * per;
  const int cnt = max(0, min(per, n - p0));

  const hp_decode::TaskMap<int> tm(ws, C, max_pairs);
  int* bin_start = tm.bin_start();
  int* desc = tm.desc();
  int* chunk_start = tm.chunk_start();
  int* num_chunks = tm.num_chunks();

  // 1. The one long latency: issue the loads first.
  int rr[kFastPer], hh[kFastPer], len[kFastPer];
  {
    int r = 0, h = 0;
    if (cnt > 0) {  // H == 1 (the published config): no division ahead of the load
      h = (H == 1) ? 0 : p0 / batch;
      r = p0 - h * batch;
    }
#pragma unroll
    for (int k = 0; k < kFastPer; ++k) {
      rr[k] = r;
      hh[k] = h;
      len[k] = (k < cnt) ? __ldg(kv_lens + r) : 0;
      if (++r == batch) {
        r = 0;
        ++h;
      }
    }
  }
  // Data-independent entries while the loads fly (early: after the wait below, as every workspace write).
  auto write_fixed = [&]() {
    if (tid == 0) write_header_request(tm.header(), batch, H, C, F);
    for (int p = n + tid; p < max_pairs; p += kFastThreads) {
      chunk_start[p] = -1;
      num_chunks[p] = -1;
    }
    for (int i = kDescInts * (n + C - 1) + tid; i < kDescInts * tm.desc_capacity(); i += kFastThreads) desc[i] = -1;
  };
  if (!early) write_fixed();
  const FastDiv divC = make_fastdiv((unsigned)C);

  // 2. Tiles and their prefix.
  int t[kFastPer], tx[kFastPer];
  int my_t = 0;
#pragma unroll
  for (int k = 0; k < kFastPer; ++k) {
    t[k] = (max(len[k], 0) + 63) >> 6;
    tx[k] = my_t;
    my_t += t[k];
  }
  const int inc = warp_inclusive_scan(my_t, lane);
  if (lane == 31) s_wtiles[warp] = inc;
  __syncthreads();  // barrier 1
  int T = 0, woff = 0;
#pragma unroll
  for (int w = 0; w < kFastWarps; ++w) {
    const int v = s_wtiles[w];
    woff += (w < warp) ? v : 0;
    T += v;
  }
  const int ts0 = woff + inc - my_t;
  int B = F;
  if (T > 0) {
    int q = fdiv(T, divC);
    q += (q * C < T) ? 1 : 0;  // ceil(T / C)
    B = max(q, F);
  }
  const FastDiv divB = make_fastdiv((unsigned)B);
  int nbins = 0;
  if (T > 0) {
    nbins = fdiv(T, divB);
    nbins += (nbins * B < T) ? 1 : 0;
  }

  // 3. Chunks per pair (closed form) and their prefix.
  int b0[kFastPer], nc[kFastPer], cx[kFastPer];
  int my_c = 0;
#pragma unroll
  for (int k = 0; k < kFastPer; ++k) {
    const int ts = ts0 + tx[k];
    b0[k] = fdiv(ts, divB);
    nc[k] = (t[k] > 0) ? fdiv(ts + t[k] - 1, divB) - b0[k] + 1 : 0;
    cx[k] = my_c;
    my_c += nc[k];
  }
  const int cinc = warp_inclusive_scan(my_c, lane);
#pragma unroll
  for (int k = 0; k < kFastPer; ++k)
    if (k < cnt) s_pair[p0 + k] = make_int4(ts0 + tx[k], ts0 + tx[k] + t[k], cinc - my_c + cx[k], warp);
  if (lane == 31) s_wchunks[warp] = cinc;
  __syncthreads();  // barrier 2
  int wc[kFastWarps];
  int ndesc = 0;
#pragma unroll
  for (int w = 0; w < kFastWarps; ++w) {
    wc[w] = ndesc;  // exclusive prefix of warp chunk totals
    ndesc += s_wchunks[w];
  }
  auto warp_chunk_offset = [&](int w) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < kFastWarps; ++k) s = (k == w) ? wc[k] : s;
    return s;
  };

  if (early) {  // all that precedes needed only kv_lens: the predecessor's writes matter from here on
    hp::pdl_wait();
    write_fixed();
  }

  // 4a. The pair owner: chunk_start, num_chunks, and a first descriptor that does not open a bin.
  const int cs0 = warp_chunk_offset(warp) + cinc - my_c;
#pragma unroll
  for (int k = 0; k < kFastPer; ++k) {
    if (k < cnt) {
      const int p = p0 + k, cs = cs0 + cx[k], ts = ts0 + tx[k];
      chunk_start[p] = cs;
      num_chunks[p] = nc[k];
      if (t[k] > 0 && b0[k] * B != ts) {
        int* d = tm.desc(cs);
        d[0] = rr[k];
        d[1] = hh[k];
        d[2] = 0;
        d[3] = min(ts + t[k], (b0[k] + 1) * B) - ts;
      }
    }
  }
  // 4b. The bin thread: the descriptor that opens bin b (at tile b*B) and bin_start[b].
  for (int b = tid; b < nbins; b += kFastThreads) {
    const int x = b * B;
    int lo = 0, hi = n - 1;  // first pair whose tile end is > x (it holds tile x: x < T)
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (s_pair[mid].y > x)
        hi = mid;
      else
        lo = mid + 1;
    }
    const int4 e = s_pair[lo];
    const int idx = warp_chunk_offset(e.w) + e.z + b - fdiv(e.x, divB);
    const int h = lo / batch;
    int* d = tm.desc(idx);
    d[0] = lo - h * batch;
    d[1] = h;
    d[2] = x - e.x;
    d[3] = min(e.y, x + B) - e.x;
    bin_start[b] = idx;
  }
  for (int b = nbins + tid; b <= C; b += kFastThreads) bin_start[b] = ndesc;
  for (int i = kDescInts * ndesc + tid; i < kDescInts * (n + C - 1); i += kFastThreads) desc[i] = -1;
  if (tid == 0) write_header_result(tm.header(), T, B, nbins, ndesc);
}

// ---- Generic path (batch * H > kFastMaxPairs): two block-wide exclusive scans, pair-major writes. ----
// Exclusive block scan of one int per thread; returns the exclusive prefix, *total = block sum.
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int x = warp_inclusive_scan(v, lane);
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    const int s = warp_inclusive_scan(w, lane);
    warp_sums[lane] = s - w;  // exclusive prefix of warp totals
    if (lane == 31) warp_sums[32] = s;
  }
  __syncthreads();
  int res = warp_sums[warp] + x - v;
  *total = warp_sums[32];
  __syncthreads();  // warp_sums reused by the next scan
  return res;
}

__global__ void __launch_bounds__(kAssignThreads, 1)
    assign_generic_kernel(const int* __restrict__ kv_lens, int* __restrict__ ws, int batch, int H, int C, int F,
                          int max_pairs, int early) {
  __shared__ int warp_sums[33];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  const int n = batch * H;
  const int per = (n + kAssignThreads - 1) / kAssignThreads;
  const int p0 = min(n, (int)threadIdx.x * per);
  const int p1 = min(n, p0 + per);

  const hp_decode::TaskMap<int> tm(ws, C, max_pairs);
  int* bin_start = tm.bin_start();
  int* desc = tm.desc();
  int* chunk_start = tm.chunk_start();
  int* num_chunks = tm.num_chunks();

  // Pass 1: tiles per pair (p = h * batch + r) and their exclusive prefix. kv_lens is read from memory once
  // (cold after an L2 flush: the one long latency here); up to kCache pairs per thread stay in registers.
  int tcache[kCache];
  int my_tiles = 0;
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int p = p0 + k;
    tcache[k] = (p < p1) ? (max(__ldg(kv_lens + p % batch), 0) + 63) >> 6 : 0;
    my_tiles += tcache[k];
  }
  for (int p = p0 + kCache; p < p1; ++p) my_tiles += (max(kv_lens[p % batch], 0) + 63) >> 6;
  auto tiles_of = [&](int p) -> int {  // p in [p0, p1)
    int t = 0;
#pragma unroll
    for (int k = 0; k < kCache; ++k) t = (p == p0 + k) ? tcache[k] : t;
    return (p < p0 + kCache) ? t : (max(kv_lens[p % batch], 0) + 63) >> 6;
  };
  int T;
  int ts0 = block_exclusive_scan(my_tiles, warp_sums, &T);
  const int B = (T == 0) ? F : max((T + C - 1) / C, F);
  const int nbins = (T == 0) ? 0 : (T + B - 1) / B;

  // Pass 2: chunks per pair.
  int my_chunks = 0;
  {
    int ts = ts0;
    for (int p = p0; p < p1; ++p) {
      int t = tiles_of(p);
      if (t > 0) my_chunks += (ts + t - 1) / B - ts / B + 1;
      ts += t;
    }
  }
  int ndesc;
  int cs0 = block_exclusive_scan(my_chunks, warp_sums, &ndesc);

  if (early) hp::pdl_wait();  // passes 1-2 read only kv_lens; the workspace writes wait for the predecessor

  // Pass 3: write chunk_start, num_chunks, descriptors and the bin starts they open.
  {
    int ts = ts0, cs = cs0;
    for (int p = p0; p < p1; ++p) {
      int r = p % batch, h = p / batch;
      int t = tiles_of(p);
      int nc = 0;
      if (t > 0) {
        int b0 = ts / B, b1 = (ts + t - 1) / B;
        nc = b1 - b0 + 1;
        for (int c = 0; c < nc; ++c) {
          int b = b0 + c;
          int beg = max(ts, b * B), end = min(ts + t, (b + 1) * B);
          int d = cs + c;
          desc[kDescInts * d + 0] = r;
          desc[kDescInts * d + 1] = h;
          desc[kDescInts * d + 2] = beg - ts;
          desc[kDescInts * d + 3] = end - ts;
          if (beg == b * B) bin_start[b] = d;
        }
      }
      chunk_start[p] = cs;
      num_chunks[p] = nc;
      ts += t;
      cs += nc;
    }
  }
  // Padding and the tail of bin_start.
  for (int b = nbins + (int)threadIdx.x; b <= C; b += kAssignThreads) bin_start[b] = ndesc;
  for (int i = kDescInts * ndesc + (int)threadIdx.x; i < kDescInts * tm.desc_capacity(); i += kAssignThreads)
    desc[i] = -1;
  for (int p = n + (int)threadIdx.x; p < max_pairs; p += kAssignThreads) {
    chunk_start[p] = -1;
    num_chunks[p] = -1;
  }
  if (threadIdx.x == 0) {
    write_header_result(tm.header(), T, B, nbins, ndesc);
    write_header_request(tm.header(), batch, H, C, F);
  }
}

}  // namespace

// Host launcher: NVRTC (hotpaths.harness.nvrtc) compiles device code only, so it is guarded out there.
#if !defined(__CUDACC_RTC__)
// early: 0 a plain launch; 1 a PDL launch doing its kv_lens reads and scans before the wait (see the top).
extern "C" int hp_decode_assign(const int* kv_lens, int* ws, int batch, int num_kv_heads, int num_ctas, int min_tiles,
                                int max_pairs, int early, void* stream) {
  if (batch < 0 || num_kv_heads <= 0 || num_ctas <= 0 || min_tiles <= 0 ||
      (long long)batch * num_kv_heads > (long long)max_pairs)
    return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  hp::LaunchOptions opt;
  opt.pdl = early != 0;
  const int e = early != 0;
  if (batch * num_kv_heads <= kFastMaxPairs)
    return (int)hp::launch(assign_fast_kernel, dim3(1), dim3(kFastThreads), 0, s, opt, kv_lens, ws, batch, num_kv_heads,
                           num_ctas, min_tiles, max_pairs, e);
  return (int)hp::launch(assign_generic_kernel, dim3(1), dim3(kAssignThreads), 0, s, opt, kv_lens, ws, batch,
                         num_kv_heads, num_ctas, min_tiles, max_pairs, e);
}
#endif
