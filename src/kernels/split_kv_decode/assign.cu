// assign: builds the dynamic split-KV task map on the device (one CTA).
//
// What: from device-side kv_lens [batch] int32 computes the whole workspace in the format of
//   hotpaths.reference.split_kv_decode.build_task_map (header, bin_start, descriptors, chunk_start, num_chunks;
//   every entry written, padding -1), byte for byte.
// Launch: grid 1, block 1024. No inter-CTA communication, so no co-residency assumption; CUDA-graph safe
//   (reads lengths from device memory, writes a fixed-size workspace).
// Memory: reads batch*4 B, writes 4 * (8 + C + 1 + 4 (MAX_PAIRS + C) + 2 MAX_PAIRS) B (~40 KB at 256x8 pairs).
// Design: two block-wide exclusive scans (tiles -> tile_start, then chunks -> chunk_start); each thread owns a
//   contiguous run of pairs so the scans are one shuffle pass; a pair's descriptors are written by its owner.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kAssignThreads = 1024;
constexpr int kCache = 4;  // pairs per thread whose tile counts stay in registers (all of them up to 4096 pairs)

// Exclusive block scan of one int per thread; returns the exclusive prefix, *total = block sum.
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    int s = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
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
assign_kernel(const int* __restrict__ kv_lens, int* __restrict__ ws, int batch, int H, int C, int F,
              int max_pairs) {
  __shared__ int warp_sums[33];
  const int n = batch * H;
  const int per = (n + kAssignThreads - 1) / kAssignThreads;
  const int p0 = min(n, (int)threadIdx.x * per);
  const int p1 = min(n, p0 + per);

  int* header = ws;
  int* bin_start = ws + 8;
  int* desc = bin_start + (C + 1);
  int* chunk_start = desc + 4 * (max_pairs + C);
  int* num_chunks = chunk_start + max_pairs;

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
          desc[4 * d + 0] = r;
          desc[4 * d + 1] = h;
          desc[4 * d + 2] = beg - ts;
          desc[4 * d + 3] = end - ts;
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
  for (int i = 4 * ndesc + (int)threadIdx.x; i < 4 * (max_pairs + C); i += kAssignThreads) desc[i] = -1;
  for (int p = n + (int)threadIdx.x; p < max_pairs; p += kAssignThreads) {
    chunk_start[p] = -1;
    num_chunks[p] = -1;
  }
  if (threadIdx.x == 0) {
    header[0] = T; header[1] = B; header[2] = nbins; header[3] = ndesc;
    header[4] = batch; header[5] = H; header[6] = C; header[7] = F;
  }
}

}  // namespace

extern "C" int hp_decode_assign(const int* kv_lens, int* ws, int batch, int num_kv_heads, int num_ctas,
                                int min_tiles, int max_pairs, void* stream) {
  if (batch < 0 || num_kv_heads <= 0 || num_ctas <= 0 || min_tiles <= 0 || batch * num_kv_heads > max_pairs)
    return (int)cudaErrorInvalidValue;
  assign_kernel<<<1, kAssignThreads, 0, (cudaStream_t)stream>>>(kv_lens, ws, batch, num_kv_heads, num_ctas,
                                                                min_tiles, max_pairs);
  return (int)cudaGetLastError();
}
