// The dynamic task map's workspace (int32), as one typed view: written by assign.cu, read by the attention and
// combine kernels. Layout, in order (hotpaths.reference.split_kv_decode owns the host side of the same layout and
// tests/test_split_kv_decode_ref.py parses the constants below to check it matches):
//   header      [kHeaderInts]            total_tiles, budget, nbins, ndesc, batch, H, C, min_tiles
//   bin_start   [C + 1]                  descriptors of bin b are [bin_start[b], bin_start[b + 1])
//   desc        [max_pairs + C][kDescInts] (request, kv head, first tile, end tile), padding -1
//   chunk_start [max_pairs]              partial slot of the pair's first chunk (pair p = h * batch + r)
//   num_chunks  [max_pairs]              chunks of the pair (0: empty request, 1: written directly)
// Why max_pairs + C descriptors: each of the C - 1 bin boundaries splits at most one pair, so a map over at most
// max_pairs non-empty pairs never holds more.
#pragma once

namespace hp_decode {

constexpr int kHeaderInts = 8;
constexpr int kDescInts = 4;  // ints per descriptor: the one stride every reader and writer of `desc` uses
static_assert(kHeaderInts == 8 && kDescInts == 4,
              "task-map layout changed: update hotpaths.reference.split_kv_decode (TASK_MAP_HEADER_INTS, "
              "TASK_MAP_DESC_INTS, workspace_len) in the same commit");

// Int32 entries of the workspace for C CTAs and max_pairs (head, request) pairs.
__host__ __device__ constexpr long long task_map_len(int C, int max_pairs) {
  return kHeaderInts + (C + 1LL) + (long long)kDescInts * (max_pairs + C) + 2LL * max_pairs;
}

// T = int (assign writes) or const int (the kernels read). Accessors return pointers to the start of each part.
template <typename T>
struct TaskMap {
  T* ws;
  int C, max_pairs;
  __host__ __device__ __forceinline__ TaskMap(T* ws_, int C_, int max_pairs_) : ws(ws_), C(C_), max_pairs(max_pairs_) {}
  __host__ __device__ __forceinline__ T* header() const { return ws; }
  __host__ __device__ __forceinline__ T* bin_start() const { return ws + kHeaderInts; }
  __host__ __device__ __forceinline__ T* desc() const { return bin_start() + (C + 1); }
  __host__ __device__ __forceinline__ T* desc(int d) const { return desc() + kDescInts * d; }
  __host__ __device__ __forceinline__ int desc_capacity() const { return max_pairs + C; }
  __host__ __device__ __forceinline__ T* chunk_start() const { return desc() + kDescInts * desc_capacity(); }
  __host__ __device__ __forceinline__ T* num_chunks() const { return chunk_start() + max_pairs; }
};

}  // namespace hp_decode
