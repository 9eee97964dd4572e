// Split-KV decode attention over a paged KV cache (FP8 e4m3 or BF16 KV), persistent or static grid, + combine.
//
// What: for each task descriptor (request r, kv head h, tiles [tb, te) of 64 tokens) computes softmax(Q K^T) V
//   for all query rows of the GQA group (ratio heads x q_len tokens, causal among the q_len draft tokens).
//   A pair (h, r) with one chunk writes bf16 output directly; otherwise an fp32 partial (normalized by its own
//   sum) + natural-log LSE to its slot, merged by combine_kernel (or, v3 fused merge, by the pair's last CTA).
// One kernel template, attention_kernel<Traits>, with three bodies (docs/ops/split_kv_decode.md has the
// measurements that chose each):
//   - row layout (Traits::TRANSPOSED = false; variant "v2", FP8 and BF16): S = Q K^T and O += P V on m16n8k16
//     f16/bf16 MMAs with the 16 query rows of a row group as m. FP8 K/Q are converted to f16 (exact); V
//     B-fragments are built in registers from 16 B loads of 4 tokens + prmt; FP8 K/V/Q rows are XOR-swizzled
//     (unit u of row t at u ^ (t & 7)), BF16 rows padded by 16 B; the end-of-descriptor merge buffer is
//     XOR-swizzled so writes and the 16 B read-out are conflict-free and the stores full-sector.
//   - transposed layout (TRANSPOSED = true; "v3" and its stage / CTAs-per-SM configurations, FP8 only): at GQA
//     8:1 a row group has 8 rows, so the m16 side of the row layout is half padding; v3 computes S^T = K Q^T on the
//     FP8 MMA (m16n8k32 e4m3, no conversion of K or Q) and O^T += V^T P^T, turning P^T into PV's B operand with two
//     movmatrix.trans. Optional fused merge (fuse_max) and fuse-all (no combine launch).
//   - warpgroup-MMA body (TraitsWg; "v3w", "v3wc3", what auto runs above 16 rows (FP8) and above 8 (BF16): MTP):
//     the group's up to 64 rows as wgmma's M side, S = Q K^T on the e4m3 (bf16) wgmma from shared memory, O += P V
//     on the f16 (bf16) wgmma with P from registers and V read as an MN-major operand (FP8: converted once per tile
//     to f16 in its token-major order; BF16: read where the loader wrote it); one state per row (no merge of warps).
//     The transposed layout's task map, loader, fused merge and partials (attention_wg below).
// Launch: grid (C, G) with C persistent CTAs (bin b = blockIdx.x, from the assign workspace, task_map.cuh) or, in
//   the static modes, (H * batch * splits, G) with one descriptor per CTA computed from blockIdx; G row groups
//   (rows beyond one group re-read the KV once per extra group, mostly from L2 as the groups run together).
//   128 threads = 4 warps; in each 64-token tile warp w owns tokens [16w, 16w + 16); each warp keeps its own
//   online-softmax state and the 4 states are merged through smem per descriptor.
// Memory: KV read once per row group via a Traits::kStages-deep cp.async pipeline (16 B, zero-fill past kv_len: a
//   NaN-poisoned slot is never read); Q of a descriptor travels in the stage of its first tile.
// Math: fp32 accumulation; FP8 scales stay in fp32 (q_scale * k_scale * sm_scale on the scores, v_scale on the
//   output); P is rounded to f16 (FP8 KV) or bf16 (BF16 KV), as the emulation in hotpaths.reference does.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/launch.cuh"
#include "common/wgmma.cuh"
#include "ptx.cuh"
#include "task_map.cuh"

namespace {

using namespace hp_decode;

constexpr int kD = 128;         // head_dim
constexpr int kTile = 64;       // tokens per tile
constexpr int kThreads = 128;   // 4 warps
constexpr int kDescCache = 32;  // descriptors of a bin cached in smem (more: read from global)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

enum Mode { kDynamic = 0, kStaticCount = 1, kStaticChunk = 2 };

struct Params {
  const void* q;
  const float* q_scale;
  const void* k;
  const void* v;
  const int* block_table;
  const int* kv_lens;
  const float* k_scale;
  const float* v_scale;
  __nv_bfloat16* out;
  float* part_o;
  float* part_lse;
  const int* ws;
  float sm_scale;
  int batch, H, q_heads, ratio, q_len, R, page_size, page_shift, max_pages, num_pages, C, max_pairs;
  int mode, splits, chunk_tiles;
  int* counters;  // v3: per (pair, row group) arrival counters of the fused merge (self-resetting), or null
  int fuse_max;   // v3: pairs with 2..fuse_max chunks are merged by their last-arriving CTA (0: all by combine)
  int early;      // 1: before the PDL wait, prefetch the start-up chain's arrays into L2 (prefetch_start_up)

  // The dynamic task map in the workspace (task_map.cuh).
  __device__ __forceinline__ TaskMap<const int> task_map() const { return TaskMap<const int>(ws, C, max_pairs); }
  // Row of q / q_scale / out ([batch, q_len, q_heads]) for request r, kv head h, draft token qi, head hl of the group.
  __device__ __forceinline__ size_t head_row(int r, int h, int qi, int hl) const {
    return ((size_t)r * q_len + qi) * q_heads + h * ratio + hl;
  }
  // Row of part_o / part_lse ([slots, R]) for partial slot `slot`, query row rr of the group.
  __device__ __forceinline__ size_t part_row(int slot, int rr) const { return (size_t)slot * R + rr; }
  // Token row of the KV cache ([num_pages * page_size, H]) for cache slot `slot`, kv head h.
  __device__ __forceinline__ size_t kv_row(size_t slot, int h) const { return slot * H + h; }
};

// Shared memory of one SM (H200 / H100: 228 KB) and what each resident CTA costs beside its dynamic shared memory:
// the 1 KB the runtime reserves per CTA, and the transposed layout's static arrays (kv_lens cache, scales).
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kCtaSmemOverhead = 1024 + 1536;

// Traits of one attention kernel: everything a variant changes. Product layout (see the file comment), KV dtype,
// pipeline depth, CTAs per SM (the __launch_bounds__ occupancy and the persistent grid size) and, in the transposed
// layout, NT n-tiles of 8 query rows per row group (NT = 2: 9..16 rows; NT = 4: 17..32 rows, the MTP row group
// that holds every draft token of a GQA 8:1 pair so each K/V tile is read and converted once for all of them).
// Shared memory per CTA: STAGES x (K tile + V tile + Q rows + Q row scales) + the per-warp merge buffer + the
// descriptor cache. Where that does not fit CPS CTAs per SM (transposed layout only), the merge buffer lives in
// the stage just computed instead (MERGE_IN_STAGE, derived, not chosen): one more stage, or one more
// CTA per SM, for one more barrier per descriptor (the warps must have finished that stage's PV first).
template <bool FP8_, bool TRANSPOSED_, int STAGES_, int CPS_, int NT_ = 1>
struct Traits {
  static constexpr bool FP8 = FP8_;
  static constexpr bool TRANSPOSED = TRANSPOSED_;
  static constexpr bool WG = false;  // the warpgroup-MMA body (TraitsWg) instead
  static constexpr int STAGES = STAGES_;
  static constexpr int CPS = CPS_;
  static constexpr int NT = NT_;
  static constexpr int TS = 4;  // token-slice warps (one per 16 tokens of a tile) = states merged per row
  static constexpr int THREADS = kThreads;
  static_assert(TRANSPOSED || NT == 1, "the row layout has one m16 tile of query rows");
  static_assert(FP8 || NT == 1, "BF16 transposed: one n-tile of 8 rows (9+ rows run the row layout, m16 then full)");
  static_assert(NT == 1 || NT == 2 || NT == 4, "tr_store splits 128 threads evenly over 8 NT rows");
  // NT = 4: the O^T accumulators alone are 128 fp32 per thread, so Q's B fragments are not held in registers
  // across tiles but re-read from shared memory per n-tile (2 x 16 B per tile and n-tile). Q then has to outlive
  // the stage of the descriptor's first tile: it lives in the Q area of stage (descriptor index % STAGES), which
  // the loader (at most STAGES - 1 tiles, so descriptors, ahead) never rewrites while that descriptor computes.
  static constexpr bool QSMEM = TRANSPOSED && NT > 2;
  static_assert(STAGES >= 2, "the pipeline waits for STAGES - 2 groups");
  static constexpr int MROWS = TRANSPOSED ? 8 * NT : 16;  // query rows per row group
  static constexpr int ES = FP8 ? 1 : 2;                  // bytes per element
  // FP8 rows and the transposed layout's BF16 rows are XOR-swizzled (16 B unit u of row t at u ^ (t & 7)); the row
  // layout's BF16 rows are padded by 16 B (its kq_unit map is conflict-free on 17-unit rows).
  static constexpr bool SWZ = FP8 || TRANSPOSED;
  static constexpr int ROWB = SWZ ? kD * ES : kD * ES + 16;  // smem bytes per K / V row
  static_assert(!FP8 || ROWB == kD, "load_v_tokens reads unpadded FP8 rows of kD bytes");
  static constexpr int KV_BYTES = kTile * ROWB;  // one of K or V
  static constexpr int QROWB = kD * ES;
  static constexpr int STAGE_BYTES = 2 * KV_BYTES + MROWS * QROWB + MROWS * 4;
  static constexpr int MERGE_BYTES = TS * MROWS * kD * 4 + 2 * TS * MROWS * 4;
  static constexpr int DESC_BYTES = kDescCache * 8 * 4;
  static constexpr bool MERGE_IN_STAGE =
      TRANSPOSED && CPS * (STAGES * STAGE_BYTES + MERGE_BYTES + DESC_BYTES + kCtaSmemOverhead) > kSmemPerSm;
  // The whole stage is free at the descriptor's end: its K/V tile is consumed and, without QSMEM, the Q rows and
  // scales it carried (only for a descriptor starting at that tile) are already in registers.
  static_assert(!MERGE_IN_STAGE || (MERGE_BYTES <= STAGE_BYTES && !QSMEM), "the merge buffer must fit a stage");
  static constexpr int SMEM = STAGES * STAGE_BYTES + (MERGE_IN_STAGE ? 0 : MERGE_BYTES) + DESC_BYTES;
  static_assert(CPS * (SMEM + kCtaSmemOverhead) <= kSmemPerSm, "CPS CTAs of this configuration do not fit an SM");
};

// "v3w": the warpgroup-MMA body (attention_wg): one warpgroup of 4 warps, one group of up to 64 query rows as wgmma's M
// side (rows past R are padding). FP8 KV: S = Q K^T on the e4m3 wgmma from shared memory and O += P V on the f16
// wgmma with P from registers and V converted once per tile to f16 in the BF16 tile layout below (16-bit wgmma reads
// an MN-major B; e4m3 wgmma does not, so the FP8 V must become 16-bit anyway). Stage: K, V (8 KB each), the Q rows
// of a descriptor starting in it (64 x 128 B) and their scales, every part 1024-byte aligned (the swizzle atoms);
// then the converted f16 V tile (16 KB) and the descriptor cache. BF16 KV: S on the bf16 wgmma (8 k16 steps) and
// O += P V on the bf16 wgmma with B = V read in place, MN-major (wgmma transposes 16-bit B operands itself), so
// there is no conversion; every 256-byte row (K, V, Q) is stored as two 128-byte halves (dims 0-63, 64-127), each
// half a [64 rows][128 B] swizzled tile of its own (HALF bytes apart), the layout both the K-major and the MN-major
// descriptors read. Stage: K, V (16 KB each), Q (64 x 256 B): 48 KB, so two stages at two CTAs per SM.
template <int STAGES_, int CPS_, bool FP8_ = true>
struct TraitsWg {
  static constexpr bool WG = true;  // (the transposed layout's task map, partials, fused merge and combine)
  static constexpr bool FP8 = FP8_;
  static constexpr int STAGES = STAGES_;
  static constexpr int CPS = CPS_;
  static constexpr int THREADS = 128;
  static constexpr int MROWS = 64;                    // wgmma's M
  static constexpr int ES = FP8 ? 1 : 2;              // bytes per element
  static constexpr int HALF = FP8 ? 0 : kTile * 128;  // BF16: byte offset of the dims-64-127 half of a tile
  static constexpr int KV_BYTES = kTile * kD * ES;
  static constexpr int Q_OFF = 2 * KV_BYTES, QS_OFF = Q_OFF + MROWS * kD * ES;
  static constexpr int STAGE_BYTES = (QS_OFF + (FP8 ? MROWS * 4 : 0) + 1023) / 1024 * 1024;
  static constexpr int VN_BYTES = FP8 ? kD * kTile * 2 : 0;  // FP8: the V tile converted to f16 (two 8 KB halves)
  static constexpr int DESC_BYTES = kDescCache * 8 * 4;
  static constexpr int SMEM = STAGES * STAGE_BYTES + VN_BYTES + DESC_BYTES + 1024;  // + 1024: base rounded up
  static_assert(STAGES >= 2, "the pipeline waits for STAGES - 2 groups");
  static_assert(FP8 || MROWS * 128 == HALF, "BF16: Q halves as far apart as K / V halves");
  static_assert(CPS * (SMEM + kCtaSmemOverhead) <= kSmemPerSm, "CPS CTAs of this configuration do not fit an SM");
};

// The configurations that run. Row layout: FP8 4 stages (XOR-swizzled rows leave room for a 4th), BF16 2 (3 do not
// fit two CTAs per SM). Transposed: FP8 {stages, CTAs per SM} 4/2 ("v3"), 3/3, 5/2, 2/4; 9..16 rows always
// 4/2; BF16 2/2, 3/2, 2/3 (8 rows per group).
using RowFp8 = Traits<true, false, 4, 2>;
using RowBf16 = Traits<false, false, 2, 2>;
template <int STAGES, int CPS, int NT = 1>
using Transposed = Traits<true, true, STAGES, CPS, NT>;
template <int STAGES, int CPS>
using TransposedBf16 = Traits<false, true, STAGES, CPS, 1>;

struct Desc {
  int r, h, tb, te, slot, nch, kvlen;
};
constexpr int kLenCache = 256;  // kv_lens of batches up to this size are staged in smem at start-up (v3)

// The four 32-bit words of a 16-byte load, in memory order, into w[0..3].
__device__ __forceinline__ void put_words(uint32_t* w, const uint4& u) {
  w[0] = u.x;
  w[1] = u.y;
  w[2] = u.z;
  w[3] = u.w;
}

// FP8 V, both layouts: 16 B (dims 16g..16g+15) of each of the thread's tokens 2tig, 2tig + 1, 2tig + 8, 2tig + 9
// of the warp's 16 (the k slots of P's fragment), from the XOR-swizzled rows; the caller pairs their bytes with prmt.
__device__ __forceinline__ void load_v_tokens(const uint8_t* sV, int warp, int g, int tig, uint32_t (&a4)[4],
                                              uint32_t (&b4)[4], uint32_t (&c4)[4], uint32_t (&d4)[4]) {
  constexpr int ROWB = kD;  // FP8 rows are unpadded
  const int t0 = warp * 16 + 2 * tig;
  auto ldv = [&](int t) { return *reinterpret_cast<const uint4*>(sV + t * ROWB + ((g ^ (t & 7)) * 16)); };
  const uint4 va = ldv(t0), vb = ldv(t0 + 1), vc = ldv(t0 + 8), vd = ldv(t0 + 9);
  put_words(a4, va);
  put_words(b4, vb);
  put_words(c4, vc);
  put_words(d4, vd);
}

// 16 B unit of a Q/K row that thread tig reads as its i-th load (the head_dim permutation inside the dot product;
// Q and K use the same map, so any bijection is exact). FP8: units 2tig + i, stored XOR-swizzled by row & 7 (the two
// rows of a quarter warp land on disjoint banks). BF16: units 2tig, 2tig+1, 2tig+8, 2tig+9: on the row layout's
// 17-unit padded rows conflict-free, where units 4tig..4tig+3 would put tig 0/2 and 1/3 on the same banks; on the
// transposed layout's XOR-swizzled 16-unit rows (SWZ) the swizzle separates the two rows of a quarter warp instead.
template <bool FP8, bool SWZ>
__device__ __forceinline__ int kq_unit(int i, int tig, int row) {
  if constexpr (FP8)
    return (2 * tig + i) ^ (row & 7);
  else if constexpr (SWZ)
    return (2 * tig + (i & 1) + 8 * (i >> 1)) ^ (row & 7);
  else
    return 2 * tig + (i & 1) + 8 * (i >> 1);
}

// The thread's 8 * ES words of one Q or K row (p: the row's start; row: its index for the swizzle), in
// k-step order: kq_pair(w, ks) is then the (low, high) register pair of k16 step ks.
template <class CF>
__device__ __forceinline__ void load_kq_words(const uint8_t* p, int tig, int row, uint32_t (&w)[8 * CF::ES]) {
#pragma unroll
  for (int i = 0; i < 2 * CF::ES; ++i) {
    put_words(w + 4 * i, *reinterpret_cast<const uint4*>(p + kq_unit<CF::FP8, CF::SWZ>(i, tig, row) * 16));
  }
}
// k16 step ks of the words load_kq_words read, as two f16x2 (FP8: exact e4m3 -> f16) or bf16x2 registers.
template <bool FP8, int W>
__device__ __forceinline__ uint2 kq_pair(const uint32_t (&w)[W], int ks) {
  if constexpr (FP8)
    return make_uint2(e4m3x2_to_f16x2(w[ks]), e4m3x2_hi_to_f16x2(w[ks]));
  else
    return make_uint2(w[2 * ks], w[2 * ks + 1]);
}

// Row-layout merge buffer: 16 B unit u (0..31) of merge row r is stored at u ^ ((u >> 3) & 3) ^ ((r & 1) << 2), so the FP8
// writes (8 lanes: 2 rows x 4 tig, same low unit bits) and the read-out (8 lanes: 1 row, 8 segments) never share
// a bank group.
__device__ __forceinline__ int merge_swz(int r, int u) {
  return u ^ (((u >> 3) & 3) ^ ((r & 1) << 2));
}

// Descriptor from blockIdx in the static modes (p = h * batch + r, split s); returns false if empty.
__device__ bool static_desc(const Params& P, Desc& d) {
  const int p = blockIdx.x / P.splits, s = blockIdx.x % P.splits;
  if (p >= P.batch * P.H) return false;
  d.r = p % P.batch;
  d.h = p / P.batch;
  d.kvlen = max(P.kv_lens[d.r], 0);
  const int tiles = (d.kvlen + kTile - 1) / kTile;
  const int ct = (P.mode == kStaticCount) ? (tiles + P.splits - 1) / P.splits : P.chunk_tiles;
  if (tiles == 0 || ct <= 0) return false;
  d.nch = (tiles + ct - 1) / ct;
  if (d.nch > P.splits) return false;  // host guarantees splits >= chunks; never run past the slots
  d.tb = s * ct;
  d.te = min(tiles, d.tb + ct);
  d.slot = blockIdx.x;
  return d.tb < d.te;
}

// Static modes: the CTA's one descriptor (from blockIdx) into descriptor-cache slot 0; returns the CTA's descriptor
// count (0 or 1).
__device__ __forceinline__ int cache_static_desc(const Params& P, int* dcache, int tid) {
  Desc sd;
  if (!static_desc(P, sd)) return 0;
  if (tid == 0) {
    int* e = dcache;
    e[0] = sd.r;
    e[1] = sd.h;
    e[2] = sd.tb;
    e[3] = sd.te;
    e[4] = sd.slot;
    e[5] = sd.nch;
    e[6] = sd.kvlen;
  }
  return 1;
}

// Descriptor d straight from the task map in global memory (bins with more descriptors than the smem cache holds,
// only with very large budgets).
__device__ __forceinline__ Desc global_desc(const Params& P, int d) {
  const TaskMap<const int> tm = P.task_map();
  const int* desc = tm.desc();
  const int* nchunks = tm.num_chunks();
  Desc o;
  o.r = desc[kDescInts * d];
  o.h = desc[kDescInts * d + 1];
  o.tb = desc[kDescInts * d + 2];
  o.te = desc[kDescInts * d + 3];
  o.slot = d;
  o.nch = nchunks[o.h * P.batch + o.r];
  o.kvlen = max(P.kv_lens[o.r], 0);
  return o;
}

// Descriptor-cache entry e as a Desc, with the caller's nch (see fetch_desc).
__device__ __forceinline__ Desc cached_desc(const int* e, int nch) {
  Desc o;
  o.r = e[0];
  o.h = e[1];
  o.tb = e[2];
  o.te = e[3];
  o.slot = e[4];
  o.nch = nch;
  o.kvlen = e[6];
  return o;
}

// Descriptor d of the CTA's bin (whose first is d_begin): from the shared-memory descriptor cache (8 ints per entry:
// r, h, tb, te, slot, nch, kvlen, chunk_start) or, past its kDescCache entries (bins with more descriptors, only
// with very large budgets), from global memory. LATE_NCH (the transposed layout): in the dynamic mode e[5] arrives
// by cp.async and may still be in flight, so nch is left -1 (read at the descriptor's end instead).
template <bool LATE_NCH>
__device__ __forceinline__ Desc fetch_desc(const Params& P, const int* dcache, int d_begin, int d) {
  Desc o;
  const int i = d - d_begin;
  if (i < kDescCache) {
    const int* e = dcache + 8 * i;
    o = cached_desc(e, (LATE_NCH && P.mode == kDynamic) ? -1 : e[5]);
  } else {
    o = global_desc(P, d);
  }
  return o;
}

// Row layout's loaders: the i-th 16 B chunk thread tid copies of a tile of RC chunks per row, as (row, chunk).
struct TileChunk {
  int row, ch;
};
template <int RC>
__device__ __forceinline__ TileChunk tile_chunk(int tid, int i) {
  const int c = tid + kThreads * i;
  return {c / RC, c % RC};
}

// FP8 Q: the score scale of query row rr of descriptor d into *dst (0 for rows past P.R), by cp.async.
__device__ __forceinline__ void load_q_scale(const Params& P, const Desc& d, int rr, float* dst) {
  const bool ok = rr < P.R;
  const int qi = ok ? rr / P.ratio : 0, hl = ok ? rr % P.ratio : 0;
  const size_t idx = ok ? P.head_row(d.r, d.h, qi, hl) : 0;
  cp_async4(dst, P.q_scale + idx, ok);
}

// The load side of the KV pipeline, shared by both layouts: a cursor over the CTA's descriptors [d, d_end) and their
// tiles (fetch(d) -> Desc), and load(stage, desc, tile, first tile of the descriptor, descriptor index) issuing one
// tile's copies. issue() loads the next tile, if any is left, and always commits a group, so the group count per
// stage stays uniform for cp_wait.
template <class Fetch, class Load>
struct TileLoader {
  Fetch& fetch;
  Load& load;
  const int d_end;
  int d;
  Desc dd;
  int t;
  bool ok = true;
  __device__ __forceinline__ TileLoader(Fetch& fetch_, Load& load_, int d_begin, int d_end_)
      : fetch(fetch_), load(load_), d_end(d_end_), d(d_begin), dd(fetch_(d_begin)), t(dd.tb) {}
  __device__ __forceinline__ void issue(int stage) {
    if (ok) {
      load(stage, dd, t, t == dd.tb, d);
      if (++t >= dd.te) {
        if (++d < d_end) {
          dd = fetch(d);
          t = dd.tb;
        } else
          ok = false;
      }
    }
    cp_commit();
  }
};

// Descriptor start: Q fragments of rows g and g + 8 (index half), their score scales and causal limits, fresh state.
template <class CF>
__device__ __forceinline__ void rows_begin_descriptor(const Params& P, const uint8_t* sV, const Desc& cdd, int rg,
                                                      int g, int tig, float kscale, int kv_cap, uint32_t (&qa)[8][4],
                                                      float (&o)[16][4], float (&m_)[2], float (&l_)[2], float (&sc)[2],
                                                      int (&lim_)[2]) {
  constexpr bool FP8 = CF::FP8;
  constexpr int kRowsPerGroup = CF::MROWS;
  const uint8_t* sQ = sV + CF::KV_BYTES;
  const float* sQs = reinterpret_cast<const float*>(sQ + kRowsPerGroup * CF::QROWB);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = g + 8 * half;
    uint32_t w[8 * CF::ES];
    load_kq_words<CF>(sQ + row * CF::QROWB, tig, row, w);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint2 q = kq_pair<FP8>(w, ks);
      qa[ks][half] = q.x;
      qa[ks][half + 2] = q.y;
    }
    const int rr = rg * kRowsPerGroup + row;
    const int qi = rr < P.R ? rr / P.ratio : 0;
    float s = P.sm_scale * kLog2e;
    if (FP8) s *= sQs[row] * kscale;
    sc[half] = s;
    lim_[half] = rr < P.R ? min(cdd.kvlen - (P.q_len - 1 - qi), min(cdd.kvlen, kv_cap)) : 0;
    m_[half] = -INFINITY;
    l_[half] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
}

// S = Q K^T for the warp's 16 tokens: s[nt][e] is row g + 8 (e >> 1), token 8nt + 2tig + (e & 1) of the warp's.
template <class CF>
__device__ __forceinline__ void rows_qk(const uint8_t* sK, const uint32_t (&qa)[8][4], int warp, int g, int tig,
                                        float (&s)[2][4]) {
  constexpr bool FP8 = CF::FP8;
  float s2[2][4];  // two accumulation chains per n-tile (even / odd k-steps) halve the mma latency chain
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    s2[nt][0] = s2[nt][1] = s2[nt][2] = s2[nt][3] = 0.f;
    uint32_t w[8 * CF::ES];
    load_kq_words<CF>(sK + (warp * 16 + nt * 8 + g) * CF::ROWB, tig, g, w);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint2 b = kq_pair<FP8>(w, ks);
      mma16816<FP8>((ks & 1) ? s2[nt] : s[nt], qa[ks], b.x, b.y);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] += s2[nt][e];
  }
}

// Online softmax update (log2 domain) of rows g, g + 8 over the tile's scores: masks tokens past each row's causal
// limit, rescales O when the running max moves, and packs P as the A fragment of the PV product.
template <class CF>
__device__ __forceinline__ void rows_softmax_update(float (&s)[2][4], const float (&sc)[2], const int (&lim_)[2],
                                                    int tok0, int tig, float (&m_)[2], float (&l_)[2],
                                                    float (&o)[16][4], uint32_t (&pa)[4]) {
  constexpr bool FP8 = CF::FP8;
  float mloc[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const int tok = tok0 + nt * 8 + tig * 2 + (e & 1);
      float v = s[nt][e] * sc[half];
      v = tok < lim_[half] ? v : -INFINITY;
      s[nt][e] = v;
      mloc[half] = fmaxf(mloc[half], v);
    }
  float alpha[2], muse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = mloc[half];
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m_[half], mx);
    muse[half] = (mnew == -INFINITY) ? 0.f : mnew;
    alpha[half] = exp2f(m_[half] - muse[half]);
    m_[half] = mnew;
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[nt][e] - muse[e >> 1]);
      s[nt][e] = p;
      rs[e >> 1] += p;
    }
  l_[0] = l_[0] * alpha[0] + rs[0];
  l_[1] = l_[1] * alpha[1] + rs[1];
  if (alpha[0] != 1.f || alpha[1] != 1.f) {  // the running max rarely moves after the first tiles
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
  }
  pa[0] = pack_p<FP8>(s[0][0], s[0][1]);
  pa[1] = pack_p<FP8>(s[0][2], s[0][3]);
  pa[2] = pack_p<FP8>(s[1][0], s[1][1]);
  pa[3] = pack_p<FP8>(s[1][2], s[1][3]);
}

// O += P V for the warp's 16 tokens.
template <class CF>
__device__ __forceinline__ void rows_pv(const uint8_t* sV, const uint32_t (&pa)[4], int warp, int lane, int g, int tig,
                                        float (&o)[16][4]) {
  constexpr bool FP8 = CF::FP8;
  if constexpr (FP8) {
    // B fragments straight from the fp8 tile (no f16 staging buffer, no ldmatrix). n-tile j, column n holds
    // dim 16n + j, so this thread (n = g) reads 16 B (dims 16g..16g+15) of its 4 tokens 2tig, 2tig+1, 2tig+8,
    // 2tig+9 (the k slots of P's A fragment) and pairs the bytes of two tokens with prmt: exact e4m3 -> f16.
    // Its accumulators then hold dims 32tig + j (c0/c2) and 32tig + 16 + j (c1/c3): see the merge.
    uint32_t a4[4], b4[4], c4[4], d4[4];
    load_v_tokens(sV, warp, g, tig, a4, b4, c4, d4);
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      const uint32_t ab01 = __byte_perm(a4[wi], b4[wi], 0x5140), ab23 = __byte_perm(a4[wi], b4[wi], 0x7362);
      const uint32_t cd01 = __byte_perm(c4[wi], d4[wi], 0x5140), cd23 = __byte_perm(c4[wi], d4[wi], 0x7362);
      mma16816<FP8>(o[4 * wi], pa, e4m3x2_to_f16x2(ab01), e4m3x2_to_f16x2(cd01));
      mma16816<FP8>(o[4 * wi + 1], pa, e4m3x2_hi_to_f16x2(ab01), e4m3x2_hi_to_f16x2(cd01));
      mma16816<FP8>(o[4 * wi + 2], pa, e4m3x2_to_f16x2(ab23), e4m3x2_to_f16x2(cd23));
      mma16816<FP8>(o[4 * wi + 3], pa, e4m3x2_hi_to_f16x2(ab23), e4m3x2_hi_to_f16x2(cd23));
    }
  } else {  // BF16: ldmatrix.trans straight from the tile
    const uint8_t* vsrc = sV + warp * 16 * CF::ROWB;
    const int trow = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int dsel = (lane >> 4) * 8;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vsrc + trow * CF::ROWB + (jj * 16 + dsel) * 2);
      mma16816<FP8>(o[2 * jj], pa, b[0], b[1]);
      mma16816<FP8>(o[2 * jj + 1], pa, b[2], b[3]);
    }
  }
}

// End of a descriptor, step 1: the warp's running max, row sums and O rows into the merge buffer.
template <class CF>
__device__ __forceinline__ void rows_stage_merge(const float (&m_)[2], const float (&l_)[2], const float (&o)[16][4],
                                                 float* merge_o, float* merge_m, float* merge_l, int warp, int g,
                                                 int tig) {
  constexpr bool FP8 = CF::FP8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = l_[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (tig == 0) {
      merge_m[warp * 16 + g + 8 * half] = m_[half];
      merge_l[warp * 16 + g + 8 * half] = l;
    }
  }
  {
    // XOR-swizzled merge rows (merge_swz): conflict-free float4 writes (FP8) and float4 reads.
    const int r0 = warp * 16 + g;
    if constexpr (FP8) {  // accumulator e holds row g + 8 (e >> 1), dims 32tig + 16 (e & 1) + j
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int jq = 0; jq < 4; ++jq) {
          const int r = r0 + 8 * (e >> 1), u = 8 * tig + 4 * (e & 1) + jq;
          *reinterpret_cast<float4*>(merge_o + r * kD + (merge_swz(r, u) << 2)) =
              make_float4(o[4 * jq][e], o[4 * jq + 1][e], o[4 * jq + 2][e], o[4 * jq + 3][e]);
        }
    } else {  // ldmatrix layout: n-tile j holds dims 8j + 2tig + {0, 1}
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = r0 + 8 * hr, u = 2 * j + (tig >> 1);
          *reinterpret_cast<float2*>(merge_o + r * kD + (merge_swz(r, u) << 2) + 2 * (tig & 1)) =
              make_float2(o[j][2 * hr], o[j][2 * hr + 1]);
        }
    }
  }
}

// End of a descriptor, step 2 (after a barrier): merge the 4 warps' states per row and store the bf16 output (a
// pair with one chunk) or the normalized fp32 partial and its natural-log LSE.
template <class CF>
__device__ __forceinline__ void rows_store(const Params& P, const float* merge_o, const float* merge_m,
                                           const float* merge_l, const Desc& cdd, int rg, int tid, float vscale) {
  constexpr int kRowsPerGroup = CF::MROWS;
  // 16 rows x 8 segments: segment seg = dims 32i + 4seg + {0..3}, i = 0..3, so
  // 8 lanes of a row cover 128 contiguous bytes of fp32 partial / 64 of bf16 output per store (coalesced).
  const int row = tid >> 3, seg = tid & 7;
  const int rr = rg * kRowsPerGroup + row;
  if (rr < P.R) {
    float mw[4], M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mw[w] = merge_m[w * 16 + row];
      M = fmaxf(M, mw[w]);
    }
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    float L = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float f = exp2f(mw[w] - M);
        L += merge_l[w * 16 + row] * f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 x = *reinterpret_cast<const float4*>(merge_o + (w * 16 + row) * kD +
                                                            (merge_swz(w * 16 + row, 8 * i + seg) << 2));
          acc[4 * i] += f * x.x;
          acc[4 * i + 1] += f * x.y;
          acc[4 * i + 2] += f * x.z;
          acc[4 * i + 3] += f * x.w;
        }
      }
    }
    const float inv = (L > 0.f) ? vscale / L : 0.f;
    const int qi = rr / P.ratio, hl = rr % P.ratio;
    if (cdd.nch == 1) {
      const size_t orow = P.head_row(cdd.r, cdd.h, qi, hl);
      __nv_bfloat162 pk[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) pk[i] = __floats2bfloat162_rn(acc[2 * i] * inv, acc[2 * i + 1] * inv);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint2*>(P.out + orow * kD + 32 * i + 4 * seg) =
            make_uint2(*reinterpret_cast<uint32_t*>(&pk[2 * i]), *reinterpret_cast<uint32_t*>(&pk[2 * i + 1]));
    } else {
      const size_t prow = P.part_row(cdd.slot, rr);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(P.part_o + prow * kD + 32 * i + 4 * seg) =
            make_float4(acc[4 * i] * inv, acc[4 * i + 1] * inv, acc[4 * i + 2] * inv, acc[4 * i + 3] * inv);
      if (seg == 0) P.part_lse[prow] = (L > 0.f) ? (M + log2f(L)) * kLn2 : -INFINITY;
    }
  }
}

// Row layout (Traits::TRANSPOSED = false): one m16 tile of query rows, FP8 or BF16 KV.
template <class CF>
__device__ __forceinline__ void attention_rows(const Params& P) {
  constexpr bool FP8 = CF::FP8;
  constexpr int kRowsPerGroup = CF::MROWS;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* stages = smem;
  float* merge_o = reinterpret_cast<float*>(smem + CF::STAGES * CF::STAGE_BYTES);
  float* merge_m = merge_o + 4 * 16 * kD;
  float* merge_l = merge_m + 4 * 16;
  int* dcache = reinterpret_cast<int*>(smem + CF::STAGES * CF::STAGE_BYTES + CF::MERGE_BYTES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int rg = blockIdx.y;  // row group

  // Wait for the producer of the workspace / the previous consumer of the partial buffers (PDL).
  cudaGridDependencySynchronize();

  const int kv_cap = P.max_pages * P.page_size;  // never index the block table past its width
  int d_begin = 0, d_end = 0;
  if (P.mode == kDynamic) {
    const TaskMap<const int> tm = P.task_map();
    const int* bin_start = tm.bin_start();
    d_begin = bin_start[blockIdx.x];
    d_end = bin_start[blockIdx.x + 1];
    const int* desc = tm.desc();
    const int* nchunks = tm.num_chunks();
    for (int i = tid; i < min(d_end - d_begin, kDescCache); i += kThreads) {
      int d = d_begin + i;
      int r = desc[kDescInts * d], h = desc[kDescInts * d + 1];
      int* e = dcache + 8 * i;
      e[0] = r;
      e[1] = h;
      e[2] = desc[kDescInts * d + 2];
      e[3] = desc[kDescInts * d + 3];
      e[4] = d;
      e[5] = nchunks[h * P.batch + r];
      e[6] = max(P.kv_lens[r], 0);
    }
  } else {
    d_end = cache_static_desc(P, dcache, tid);
  }
  __syncthreads();
  if (d_begin >= d_end) return;

  auto fetch = [&](int d) { return fetch_desc<false>(P, dcache, d_begin, d); };

  // ---- loader ----
  const uint8_t* kbase = reinterpret_cast<const uint8_t*>(P.k);
  const uint8_t* vbase = reinterpret_cast<const uint8_t*>(P.v);
  const uint8_t* qbase = reinterpret_cast<const uint8_t*>(P.q);
  auto load_tile = [&](int stage, const Desc& d, int tile, bool first, int /*descriptor index*/) {
    uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    uint8_t* sV = sK + CF::KV_BYTES;
    const int lim = min(d.kvlen, kv_cap);
    constexpr int RC = kD * CF::ES / 16;  // 16 B chunks per row
    constexpr int PER = kTile * RC / kThreads;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const auto [tl, ch] = tile_chunk<RC>(tid, i);
      const int tok = tile * kTile + tl;
      bool ok = tok < lim;
      int page = 0;
      if (ok) page = __ldg(P.block_table + (size_t)d.r * P.max_pages + (tok >> P.page_shift));
      ok = ok && page >= 0 && page < P.num_pages;
      const size_t slot = (size_t)page * P.page_size + (tok & (P.page_size - 1));
      const size_t off = ok ? (P.kv_row(slot, d.h) * kD) * CF::ES + ch * 16 : 0;
      const int dcol = CF::SWZ ? ((ch ^ (tl & 7)) * 16) : ch * 16;
      cp_async16(sK + tl * CF::ROWB + dcol, kbase + off, ok);
      cp_async16(sV + tl * CF::ROWB + dcol, vbase + off, ok);
    }
    if (first) {
      uint8_t* sQ = sV + CF::KV_BYTES;
      float* sQs = reinterpret_cast<float*>(sQ + kRowsPerGroup * CF::QROWB);
      constexpr int QPER = kRowsPerGroup * RC / kThreads;
#pragma unroll
      for (int i = 0; i < QPER; ++i) {
        const auto [row, ch] = tile_chunk<RC>(tid, i);
        const int rr = rg * kRowsPerGroup + row;
        const bool ok = rr < P.R;
        const int qi = ok ? rr / P.ratio : 0, hl = ok ? rr % P.ratio : 0;
        // written out rather than P.head_row(): the accessor changes how nvcc folds the `ok` selects here
        const size_t qrow = (size_t)d.r * P.q_len + qi;
        const size_t off = ok ? ((qrow * P.q_heads + d.h * P.ratio + hl) * kD) * CF::ES + ch * 16 : 0;
        cp_async16(sQ + row * CF::QROWB + (CF::SWZ ? (ch ^ (row & 7)) : ch) * 16, qbase + off, ok);
      }
      if (FP8 && tid < kRowsPerGroup) load_q_scale(P, d, rg * kRowsPerGroup + tid, sQs + tid);
    }
  };

  TileLoader ld(fetch, load_tile, d_begin, d_end);
#pragma unroll 1
  for (int s = 0; s < CF::STAGES - 1; ++s) ld.issue(s);

  const float kscale = FP8 ? __ldg(P.k_scale) : 1.f;
  const float vscale = FP8 ? __ldg(P.v_scale) : 1.f;

  // Compute state.
  int cd = d_begin;
  Desc cdd = fetch(cd);
  int ct = cdd.tb;
  uint32_t qa[8][4];
  float o[16][4];
  float m_[2], l_[2], sc[2];
  int lim_[2];

#pragma unroll 1
  for (int it = 0;; ++it) {
    cp_wait<CF::STAGES - 2>();
    __syncthreads();
    ld.issue((it + CF::STAGES - 1) % CF::STAGES);

    const int stage = it % CF::STAGES;
    const uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    const uint8_t* sV = sK + CF::KV_BYTES;

    if (ct == cdd.tb) rows_begin_descriptor<CF>(P, sV, cdd, rg, g, tig, kscale, kv_cap, qa, o, m_, l_, sc, lim_);

    // ---- S = Q K^T for this warp's 16 tokens ----
    float s[2][4];
    rows_qk<CF>(sK, qa, warp, g, tig, s);

    // ---- online softmax (log2 domain) ----
    uint32_t pa[4];
    rows_softmax_update<CF>(s, sc, lim_, ct * kTile + warp * 16, tig, m_, l_, o, pa);

    // ---- O += P V ----
    rows_pv<CF>(sV, pa, warp, lane, g, tig, o);

    // ---- advance; epilogue at the end of a descriptor ----
    if (++ct >= cdd.te) {
      rows_stage_merge<CF>(m_, l_, o, merge_o, merge_m, merge_l, warp, g, tig);
      __syncthreads();
      rows_store<CF>(P, merge_o, merge_m, merge_l, cdd, rg, tid, vscale);
      if (++cd >= d_end) break;
      cdd = fetch(cd);
      ct = cdd.tb;
    }
  }
  cp_wait<0>();
}

// ================================================================================================================
// Transposed layout (Traits::TRANSPOSED, variant "v3" and its configurations; FP8 KV only, BF16 runs the row
// layout): the same task map, partial layout and API, with the products transposed so that the 64-token tile, not
// the query rows, fills the MMA's 16-row side.
//
// Why: at the published GQA 8:1 and q_len 1 a row group has R = 8 query rows, so the row layout's m16 tiles of query rows
// are half padding: half of every QK and PV product is wasted, and the fragments, accumulators (64 fp32 O values per
// thread) and conversions are sized for 16 rows. It computes S^T = K Q^T (m = 16 tokens of the warp, n = 8 query
// rows, k = head_dim) and O^T += V^T P^T (m = 16 head dims, n = 8 rows, k = 16 tokens):
//  - QK uses the FP8 tensor-core instruction directly (mma.m16n8k32 e4m3 x e4m3 -> fp32): K and Q are fed as the
//    bytes in shared memory, no e4m3 -> f16 conversion; 4 MMAs per warp-tile (row layout: 16 f16 MMAs + 16
//    conversions).
//  - S^T's accumulator holds (token, row); P^T must be PV's B operand (row = column n, token = k): two
//    movmatrix.trans (8 x 8 b16 register transposes) turn the f16-packed P into exactly that fragment.
//  - PV: A = V^T built in registers from 16 B smem loads of the thread's 4 tokens + prmt + exact e4m3 -> f16 (as
//    the row layout), 8 MMAs per warp-tile (row layout: 16); O^T is 32 fp32 per thread (row layout: 64).
//  P stays f16 (same numerics as the row layout and the emulation). NT = 2 (R = 9..16 rows per group) doubles n.
// Head-dim maps: QK: thread (g, t) feeds dims 32t..32t+31 (k slots 4t.. / 16+4t.. of each k32 step, the same map on
// the A (K) and B (Q) side). PV: m-tile j, row g <-> dim 16g + j, row g + 8 <-> dim 16g + 8 + j (thread g loads dims
// 16g..16g+15 of each of its tokens); the merge stores by real dim.
// Loads: as the FP8 row layout (cp.async 16 B, K/V/Q rows XOR-swizzled by row & 7), with the block-table lookup done once per
// thread and tile when a page holds whole tiles (page_size >= 64), instead of once per 16 B copy.
// Configurations (STAGES, CTAs per SM): see kConfigCps; the plan sizes the persistent grid from
// hp_decode_ctas_per_sm.

// merge buffer of v3: 16 B unit u of row r stored at u ^ ((r >> 1) & 3): the float4 writes (8 lanes: rows 2t + c,
// units 4g + q) and the read-out (8 lanes of one row, consecutive units) are conflict-free.
__device__ __forceinline__ int merge3_swz(int r, int u) {
  return u ^ ((r >> 1) & 3);
}
constexpr int kMaxRowGroups = 8;  // v3 fused merge: counters per pair (R <= 64 rows: at most 8 groups of >= 8)
// fuse_max >= kFuseAll (dynamic mode): every split pair is merged by the attention kernel and no combine runs, so
// the attention kernel also writes the zero rows of empty pairs (kv_len 0), which the combine writes otherwise.
constexpr int kFuseAll = 1 << 20;

// Score scale (log2 domain) and causal limit of row rowc of row group rg: draft token qi sees the first
// kv_len - (q_len - 1 - qi) tokens; rows past R see none.
template <class CF>
__device__ __forceinline__ void tr_row_scale_lim(const Params& P, const float* sQs, const Desc& cdd, int rg, int rowc,
                                                 float kscale, int kv_cap, float& sc, int& lim) {
  const int rr = rg * CF::MROWS + rowc;
  const int qi = rr < P.R ? rr / P.ratio : 0;
  if constexpr (CF::FP8)
    sc = P.sm_scale * kLog2e * sQs[rowc] * kscale;
  else
    sc = P.sm_scale * kLog2e;
  lim = rr < P.R ? min(cdd.kvlen - (P.q_len - 1 - qi), min(cdd.kvlen, kv_cap)) : 0;
}

// Descriptor start: B fragments of Q (rows 8nt + g), the score scale and causal limit of rows 8nt + 2tig + c, fresh
// online-softmax state and O^T. QSMEM: no Q fragments, and the scales / limits go to shared memory (the caller).
// BF16: Q's B fragments are the row's 4 units of load_kq_words (16 words, k16 step ks = words 2ks, 2ks + 1).
template <class CF>
__device__ __forceinline__ void tr_begin_descriptor(const Params& P, const uint8_t* sV, const Desc& cdd, int rg, int g,
                                                    int tig, float kscale, int kv_cap,
                                                    uint32_t (&qb)[CF::QSMEM ? 1 : CF::NT][8 * CF::ES],
                                                    float (&o)[CF::NT][8][4], float (&m_)[CF::NT][2],
                                                    float (&l_)[CF::NT][2], float (&sc)[CF::QSMEM ? 1 : CF::NT][2],
                                                    int (&lim_)[CF::QSMEM ? 1 : CF::NT][2]) {
  constexpr int NT = CF::NT, MROWS = CF::MROWS;
  const uint8_t* sQ = sV + CF::KV_BYTES;  // sV: the V tile whose stage holds this descriptor's Q
  const float* sQs = reinterpret_cast<const float*>(sQ + MROWS * CF::QROWB);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = 8 * nt + g;
    if constexpr (!CF::FP8) {
      load_kq_words<CF>(sQ + row * CF::QROWB, tig, row, qb[nt]);
    } else if constexpr (!CF::QSMEM) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 u = *reinterpret_cast<const uint4*>(sQ + row * kD + (((2 * tig + i) ^ (row & 7)) * 16));
        qb[nt][4 * i] = u.x;
        qb[nt][4 * i + 1] = u.y;
        qb[nt][4 * i + 2] = u.z;
        qb[nt][4 * i + 3] = u.w;
      }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if constexpr (!CF::QSMEM)
        tr_row_scale_lim<CF>(P, sQs, cdd, rg, 8 * nt + 2 * tig + c, kscale, kv_cap, sc[nt][c], lim_[nt][c]);
      m_[nt][c] = -INFINITY;
      l_[nt][c] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) o[nt][j][0] = o[nt][j][1] = o[nt][j][2] = o[nt][j][3] = 0.f;
  }
}

// S^T = K Q^T on the e4m3 MMA: A = K rows (tokens 16w + g, 16w + g + 8), 32 B each (units 2tig, 2tig + 1); s[nt]
// holds (token g | g + 8, rows 8nt + 2tig + {0, 1}). QSMEM: Q's B fragments of n-tile nt are read here from sQ
// (the descriptor's Q rows) instead of qb.
// BF16: m16n8k16 bf16 MMAs, A = K rows t, t + 8 (16 words each by load_kq_words, the same dim map as Q's).
template <class CF>
__device__ __forceinline__ void tr_qk(const uint8_t* sK, const uint32_t (&qb)[CF::QSMEM ? 1 : CF::NT][8 * CF::ES],
                                      const uint8_t* sQ, int warp, int g, int tig, float (&s)[CF::NT][4]) {
  constexpr int NT = CF::NT;
  if constexpr (!CF::FP8) {
    const int t = warp * 16 + g;
    uint32_t k0[16], k1[16];
    load_kq_words<CF>(sK + t * CF::ROWB, tig, t, k0);
    load_kq_words<CF>(sK + (t + 8) * CF::ROWB, tig, t + 8, k1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s2[4] = {0.f, 0.f, 0.f, 0.f};  // two accumulation chains (even / odd k16 steps)
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const uint32_t a[4] = {k0[2 * ks], k1[2 * ks], k0[2 * ks + 1], k1[2 * ks + 1]};
        mma16816<false>((ks & 1) ? s2 : s[nt], a, qb[nt][2 * ks], qb[nt][2 * ks + 1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += s2[e];
    }
  } else {
    uint32_t ka[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = warp * 16 + g + 8 * h;  // t & 7 == g
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 u = *reinterpret_cast<const uint4*>(sK + t * CF::ROWB + (((2 * tig + i) ^ g) * 16));
        ka[h][4 * i] = u.x;
        ka[h][4 * i + 1] = u.y;
        ka[h][4 * i + 2] = u.z;
        ka[h][4 * i + 3] = u.w;
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s2[4] = {0.f, 0.f, 0.f, 0.f};  // two accumulation chains (even / odd k32 steps)
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      uint32_t qs[8];
      if constexpr (CF::QSMEM) {
        const int row = 8 * nt + g;  // row & 7 == g
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 u = *reinterpret_cast<const uint4*>(sQ + row * kD + (((2 * tig + i) ^ g) * 16));
          qs[4 * i] = u.x;
          qs[4 * i + 1] = u.y;
          qs[4 * i + 2] = u.z;
          qs[4 * i + 3] = u.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) qs[i] = qb[nt][i];
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint32_t a[4] = {ka[0][2 * ks], ka[1][2 * ks], ka[0][2 * ks + 1], ka[1][2 * ks + 1]};
        mma_e4m3_16832((ks & 1) ? s2 : s[nt], a, qs[2 * ks], qs[2 * ks + 1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += s2[e];
    }
  }
}

// Online softmax update per row (a column of S^T; max over the warp's 16 tokens = lanes of equal tig), O^T
// rescaled when the running max moves, and P^T as PV's B operand (two movmatrix.trans).
// QSMEM: scales and limits from s_sc / s_lim (rows of the group) instead of sc / lim_.
template <class CF>
__device__ __forceinline__ void tr_softmax_update(float (&s)[CF::NT][4], const float (&sc)[CF::QSMEM ? 1 : CF::NT][2],
                                                  const int (&lim_)[CF::QSMEM ? 1 : CF::NT][2], const float* s_sc,
                                                  const int* s_lim, int tig, int tok0, float (&m_)[CF::NT][2],
                                                  float (&l_)[CF::NT][2], float (&o)[CF::NT][8][4],
                                                  uint32_t (&pb)[CF::NT][2]) {
  constexpr int NT = CF::NT;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float alpha[2], muse[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float scv;
      int lim;
      if constexpr (CF::QSMEM) {
        scv = s_sc[8 * nt + 2 * tig + c];
        lim = s_lim[8 * nt + 2 * tig + c];
      } else {
        scv = sc[nt][c];
        lim = lim_[nt][c];
      }
      float v0 = s[nt][c] * scv, v1 = s[nt][c + 2] * scv;
      v0 = tok0 < lim ? v0 : -INFINITY;
      v1 = tok0 + 8 < lim ? v1 : -INFINITY;
      float mx = fmaxf(v0, v1);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float mnew = fmaxf(m_[nt][c], mx);
      muse[c] = (mnew == -INFINITY) ? 0.f : mnew;
      alpha[c] = exp2f(m_[nt][c] - muse[c]);
      m_[nt][c] = mnew;
      v0 = exp2f(v0 - muse[c]);
      v1 = exp2f(v1 - muse[c]);
      l_[nt][c] = l_[nt][c] * alpha[c] + (v0 + v1);  // per-thread partial sum (its 2 tokens), reduced at the end
      s[nt][c] = v0;
      s[nt][c + 2] = v1;
    }
    if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[nt][j][0] *= alpha[0];
        o[nt][j][1] *= alpha[1];
        o[nt][j][2] *= alpha[0];
        o[nt][j][3] *= alpha[1];
      }
    }
    // (token g | g + 8, rows 2tig, 2tig + 1) as f16x2 -> transpose -> (row g, tokens 2tig, 2tig + 1 | + 8)
    pb[nt][0] = movmatrix_trans(pack_p<CF::FP8>(s[nt][0], s[nt][1]));
    pb[nt][1] = movmatrix_trans(pack_p<CF::FP8>(s[nt][2], s[nt][3]));
  }
}

// O^T += V^T P^T: A = V^T built in registers from the thread's tokens 2tig, 2tig + 1, 2tig + 8, 2tig + 9 (dims
// 16g..16g+15; prmt + exact e4m3 -> f16). BF16: A = V^T of m-tile j (dims 16j..16j+15) by one ldmatrix.x4.trans of
// the warp's 16 V rows (lane l addresses token (l & 7) + 8 (l >> 4), unit 2j + ((l >> 3) & 1)), so m-tile j holds
// dim 16j + g (c0, c1) and 16j + 8 + g (c2, c3): tr_stage_merge stores by that map.
template <class CF>
__device__ __forceinline__ void tr_pv(const uint8_t* sV, const uint32_t (&pb)[CF::NT][2], int warp, int lane, int g,
                                      int tig, float (&o)[CF::NT][8][4]) {
  constexpr int NT = CF::NT;
  if constexpr (!CF::FP8) {
    const int tok = warp * 16 + (lane & 7) + ((lane >> 4) << 3);  // tok & 7 == lane & 7
    const uint8_t* vrow = sV + tok * CF::ROWB;
    const int hi = (lane >> 3) & 1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vrow + (((2 * j + hi) ^ (lane & 7)) * 16));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816<false>(o[nt][j], a, pb[nt][0], pb[nt][1]);
    }
  } else {
    uint32_t a4[4], b4[4], c4[4], d4[4];
    load_v_tokens(sV, warp, g, tig, a4, b4, c4, d4);
#pragma unroll
    for (int wq = 0; wq < 2; ++wq) {  // word wq: dims 16g + 4wq.. (rows g), word 2 + wq: dims 16g + 8 + 4wq..
      const uint32_t ab_lo = __byte_perm(a4[wq], b4[wq], 0x5140), ab_hi = __byte_perm(a4[wq], b4[wq], 0x7362);
      const uint32_t cd_lo = __byte_perm(c4[wq], d4[wq], 0x5140), cd_hi = __byte_perm(c4[wq], d4[wq], 0x7362);
      const uint32_t AB_lo = __byte_perm(a4[wq + 2], b4[wq + 2], 0x5140);
      const uint32_t AB_hi = __byte_perm(a4[wq + 2], b4[wq + 2], 0x7362);
      const uint32_t CD_lo = __byte_perm(c4[wq + 2], d4[wq + 2], 0x5140);
      const uint32_t CD_hi = __byte_perm(c4[wq + 2], d4[wq + 2], 0x7362);
      const uint32_t lo[4] = {ab_lo, AB_lo, cd_lo, CD_lo}, hi[4] = {ab_hi, AB_hi, cd_hi, CD_hi};
      uint32_t a[4][4];  // m-tile 4wq + b: the low (b even) or high (b odd) e4m3 pair of lo (b < 2) or hi (b >= 2)
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t x = b < 2 ? lo[k] : hi[k];
          a[b][k] = (b & 1) ? e4m3x2_hi_to_f16x2(x) : e4m3x2_to_f16x2(x);
        }
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816<true>(o[nt][4 * wq + b], a[b], pb[nt][0], pb[nt][1]);
    }
  }
}

// End of a descriptor, step 1: the warp's running max, row sums (reduced over the lanes of equal tig) and O^T rows,
// stored by real dim, into the merge buffer (slot `warp`: the warp's token slice, 0..TS-1).
template <class CF>
__device__ __forceinline__ void tr_stage_merge(const float (&m_)[CF::NT][2], const float (&l_)[CF::NT][2],
                                               const float (&o)[CF::NT][8][4], float* merge_o, float* merge_m,
                                               float* merge_l, int warp, int g, int tig) {
  constexpr int NT = CF::NT, MROWS = CF::MROWS;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float l = l_[nt][c];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      const int r = 8 * nt + 2 * tig + c;
      if (g == 0) {
        merge_m[warp * MROWS + r] = m_[nt][c];
        merge_l[warp * MROWS + r] = l;
      }
      float* mrow = merge_o + (warp * MROWS + r) * kD;
      if constexpr (CF::FP8) {
      // units 4g + q of row r: q = 0, 1: dims 16g + 4q + i (c-slot c); q = 2, 3: dims 16g + 8 + 4(q-2) + i (c + 2)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int jb = 4 * (q & 1), e = c + 2 * (q >> 1);
          *reinterpret_cast<float4*>(mrow + (merge3_swz(r, 4 * g + q) << 2)) =
              make_float4(o[nt][jb][e], o[nt][jb + 1][e], o[nt][jb + 2][e], o[nt][jb + 3][e]);
        }
      } else {  // BF16 (tr_pv's ldmatrix map): m-tile j holds dims 16j + g (c-slot c) and 16j + 8 + g (c + 2)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int dim = 16 * j + 8 * hh + g;
            mrow[(merge3_swz(r, dim >> 2) << 2) + (dim & 3)] = o[nt][j][c + 2 * hh];
          }
      }
    }
}

// End of a descriptor, step 2 (after a barrier): merge the TS warps' states per row and store the bf16 output (a
// pair with one chunk: nch() == 1) or the normalized fp32 partial and its natural-log LSE.
template <class CF, class Nch>
__device__ __forceinline__ void tr_store(const Params& P, const float* merge_o, const float* merge_m,
                                         const float* merge_l, const Desc& cdd, int rg, int tid, float vscale,
                                         Nch nch_of_cd) {
  constexpr int MROWS = CF::MROWS, TS = CF::TS;
  constexpr int PROWS = MROWS < 16 ? MROWS : 16;  // rows per pass (register budget: see tr_fused_merge)
  constexpr int TPR = CF::THREADS / PROWS;        // threads per row
  constexpr int UPT = 32 / TPR;                   // 16 B units per thread: seg + TPR * i
  const int seg = tid % TPR;
  auto one_row = [&](const int row) {
    const int rr = rg * MROWS + row;
    if (rr < P.R) {
      float mw[TS], M = -INFINITY;
#pragma unroll
      for (int w = 0; w < TS; ++w) {
        mw[w] = merge_m[w * MROWS + row];
        M = fmaxf(M, mw[w]);
      }
      float acc[UPT][4];
#pragma unroll
      for (int i = 0; i < UPT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      float L = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < TS; ++w) {
          const float f = exp2f(mw[w] - M);
          L += merge_l[w * MROWS + row] * f;
          const float* mrow = merge_o + (w * MROWS + row) * kD;
#pragma unroll
          for (int i = 0; i < UPT; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(mrow + (merge3_swz(row, seg + TPR * i) << 2));
            acc[i][0] += f * x.x;
            acc[i][1] += f * x.y;
            acc[i][2] += f * x.z;
            acc[i][3] += f * x.w;
          }
        }
      }
      const float inv = (L > 0.f) ? vscale / L : 0.f;
      const int qi = rr / P.ratio, hl = rr % P.ratio;
      if (nch_of_cd() == 1) {
        const size_t orow = P.head_row(cdd.r, cdd.h, qi, hl);
#pragma unroll
        for (int i = 0; i < UPT; ++i)
          *reinterpret_cast<uint2*>(P.out + orow * kD + 4 * (seg + TPR * i)) =
              make_uint2(pack_bf16(acc[i][0] * inv, acc[i][1] * inv), pack_bf16(acc[i][2] * inv, acc[i][3] * inv));
      } else {
        const size_t prow = P.part_row(cdd.slot, rr);
#pragma unroll
        for (int i = 0; i < UPT; ++i)
          *reinterpret_cast<float4*>(P.part_o + prow * kD + 4 * (seg + TPR * i)) =
              make_float4(acc[i][0] * inv, acc[i][1] * inv, acc[i][2] * inv, acc[i][3] * inv);
        if (seg == 0) P.part_lse[prow] = (L > 0.f) ? (M + log2f(L)) * kLn2 : -INFINITY;
      }
    }
  };
  if constexpr (PROWS == MROWS) {
    one_row(tid / TPR);
  } else {
#pragma unroll 1
    for (int row = tid / TPR; row < MROWS; row += PROWS) one_row(row);
  }
}

// End of a descriptor, step 3 (fused merge, fuse_max > 0): the CTA that writes the last chunk of a pair with
// 2..fuse_max chunks merges the pair's partials into the bf16 output.
template <class CF, class Nch, class FirstSlot>
__device__ __forceinline__ void tr_fused_merge(const Params& P, const Desc& cdd, int rg, int tid, int& s_last,
                                               Nch nch_of_cd, FirstSlot first_slot) {
  constexpr int MROWS = CF::MROWS;
  // At most 16 rows per pass: 4 chunks x 16 B units per thread in flight stay at 64 registers beside the O^T
  // accumulators, which stay live across descriptors (NT = 4 holds 128 of them).
  constexpr int PROWS = MROWS < 16 ? MROWS : 16;
  constexpr int TPR = CF::THREADS / PROWS;  // threads per row
  constexpr int UPT = 32 / TPR;             // 16 B units per thread: seg + TPR * i
  const int seg = tid % TPR;
  // Fused merge: the CTA that writes the last of a pair's 2..fuse_max chunks (for this row group) merges
  // them, so no combine work is left for the pair. Arrival: every writer fences its stores, one atomic per
  // CTA; the last arriver resets the counter for the next launch and reads the partials from L2.
  const int nch = nch_of_cd();
  if (nch > 1 && nch <= P.fuse_max) {
    __threadfence();
    __syncthreads();
    int* ctr = P.counters + (size_t)(cdd.h * P.batch + cdd.r) * kMaxRowGroups + rg;
    if (tid == 0) {
      const int last = atomicAdd(ctr, 1) == nch - 1;
      if (last) *ctr = 0;
      s_last = last;
    }
    __syncthreads();
    if (s_last) {
      __threadfence();
      auto one_row = [&](const int row) {
        const int rr = rg * MROWS + row;
        if (rr < P.R) {
          const int first = first_slot();
          float m = -INFINITY, L = 0.f, acc[UPT][4];
#pragma unroll
          for (int i = 0; i < UPT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
          for (int c0 = 0; c0 < nch; c0 += 4) {  // 4 chunks' LSE + rows in flight, online max (as combine_kernel<true>)
            float lv[4];
            float4 x[4][UPT];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              const bool ok = c0 + u < nch;
              const size_t prow = P.part_row(first + c0 + u, rr);
              lv[u] = ok ? __ldcg(P.part_lse + prow) : -INFINITY;
#pragma unroll
              for (int i = 0; i < UPT; ++i)
                x[u][i] = ok ? __ldcg(reinterpret_cast<const float4*>(P.part_o + prow * kD + 4 * (seg + TPR * i)))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            const float mnew = fmaxf(m, fmaxf(fmaxf(lv[0], lv[1]), fmaxf(lv[2], lv[3])));
            if (mnew == -INFINITY) continue;
            const float f = expf(m - mnew);
            L *= f;
#pragma unroll
            for (int i = 0; i < UPT; ++i) {
              acc[i][0] *= f;
              acc[i][1] *= f;
              acc[i][2] *= f;
              acc[i][3] *= f;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              const float w = expf(lv[u] - mnew);
              L += w;
#pragma unroll
              for (int i = 0; i < UPT; ++i) {
                acc[i][0] += w * x[u][i].x;
                acc[i][1] += w * x[u][i].y;
                acc[i][2] += w * x[u][i].z;
                acc[i][3] += w * x[u][i].w;
              }
            }
            m = mnew;
          }
          const float inv = (L > 0.f) ? 1.f / L : 0.f;
          const int qi = rr / P.ratio, hl = rr % P.ratio;
          const size_t orow = P.head_row(cdd.r, cdd.h, qi, hl);
#pragma unroll
          for (int i = 0; i < UPT; ++i)
            *reinterpret_cast<uint2*>(P.out + orow * kD + 4 * (seg + TPR * i)) =
                make_uint2(pack_bf16(acc[i][0] * inv, acc[i][1] * inv), pack_bf16(acc[i][2] * inv, acc[i][3] * inv));
        }
      };
      if constexpr (PROWS == MROWS) {
        one_row(tid / TPR);
      } else {
#pragma unroll 1
        for (int row = tid / TPR; row < MROWS; row += PROWS) one_row(row);
      }
    }
  }
}

// Shared-memory byte offset of 16 B unit ch of K / V row tl: rows of ROWB bytes with unit ch at ch ^ (tl & 7) (the
// 128-byte swizzle; BF16 rows of 256 B keep bit 3 of ch), or, with HALF > 0 (the warpgroup body's BF16 tiles), the
// row's two 128-byte halves in two [rows][128 B] swizzled tiles HALF bytes apart.
template <int ROWB, int HALF>
__device__ __forceinline__ int kv_unit_offset(int tl, int ch) {
  if constexpr (HALF > 0)
    return (ch >> 3) * HALF + tl * 128 + (((ch & 7) ^ (tl & 7)) * 16);
  else
    return tl * ROWB + ((ch ^ (tl & 7)) * 16);
}

// The K and V rows of tokens t0 + TPP i (i < kTile / TPP) of `tile`, 16 B unit ch of each, into sK / sV at
// kv_unit_offset; ES = bytes per element. Whole pages: every row is in page `page` (read by the caller once per
// tile); shorter pages: one block-table read per token. Rows past `lim` or on a page outside the cache are
// zero-filled. The transposed layout's loader and the warpgroup body's general path (partial tiles, short pages)
// share it.
template <int TPP, int ROWB, int ES, int HALF = 0>
__device__ __forceinline__ void copy_tile_rows(const Params& P, int h, int tile, int lim, int page, bool whole_pages,
                                               const int* bt, int ch, int t0, const uint8_t* kbase,
                                               const uint8_t* vbase, uint8_t* sK, uint8_t* sV) {
#pragma unroll
  for (int i = 0; i < kTile / TPP; ++i) {
    const int tl = t0 + TPP * i;
    const int tok = tile * kTile + tl;
    bool ok = tok < lim;
    int pg = page;
    if (!whole_pages && ok) pg = __ldg(bt + (tok >> P.page_shift));
    ok = ok && pg >= 0 && pg < P.num_pages;
    const size_t slot = (size_t)pg * P.page_size + (tok & (P.page_size - 1));
    const size_t off = ok ? P.kv_row(slot, h) * kD * ES + ch * 16 : 0;
    const int dst = kv_unit_offset<ROWB, HALF>(tl, ch);
    cp_async16(sK + dst, kbase + off, ok);
    cp_async16(sV + dst, vbase + off, ok);
  }
}

template <class CF>
__device__ __forceinline__ void attention_transposed(const Params& P) {
  constexpr int NT = CF::NT, STAGES = CF::STAGES, MROWS = CF::MROWS;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* stages = smem;
  // the merge buffer: its own area, or (MERGE_IN_STAGE) the stage whose tile ended the descriptor
  float* merge_own = reinterpret_cast<float*>(smem + STAGES * CF::STAGE_BYTES);
  float* merge_own_m = merge_own + CF::TS * MROWS * kD;
  float* merge_own_l = merge_own_m + CF::TS * MROWS;
  int* dcache = reinterpret_cast<int*>(smem + STAGES * CF::STAGE_BYTES + (CF::MERGE_IN_STAGE ? 0 : CF::MERGE_BYTES));

  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = tid >> 5;  // the warp's 16-token slice of each tile
  const int g = lane >> 2, tig = lane & 3;
  const int rg = blockIdx.y;  // row group of MROWS rows

  cudaGridDependencySynchronize();
  // Let the combine grid launch now: its CTAs wait in their own cudaGridDependencySynchronize (which still waits
  // for this whole grid to finish and flush), so its launch latency hides behind this kernel instead of adding to it.
  cudaTriggerProgrammaticLaunchCompletion();

  const int kv_cap = P.max_pages * P.page_size;
  int d_begin = 0, d_end = 0;
  if (P.mode == kDynamic) {
    // Start-up chain of dependent memory round trips (cold L2 in the benchmark, ~0.6-1 us each): bin bounds and
    // kv_lens together -> descriptors -> block table -> first KV tile. kv_lens is an input (not produced by the
    // descriptor reads), so it is fetched beside the bin bounds; num_chunks (needed only at a descriptor's end)
    // arrives by cp.async with the first stage's group instead of blocking.
    __shared__ int s_len[kLenCache];
    const TaskMap<const int> tm = P.task_map();
    const int* bin_start = tm.bin_start();
    d_begin = bin_start[blockIdx.x];
    d_end = bin_start[blockIdx.x + 1];
    const bool lens_cached = P.batch <= kLenCache;
    if (lens_cached)
      for (int i = tid; i < P.batch; i += CF::THREADS) s_len[i] = max(P.kv_lens[i], 0);
    __syncthreads();
    const int* desc = tm.desc();
    const int* nchunks = tm.num_chunks();
    for (int i = tid; i < min(d_end - d_begin, kDescCache); i += CF::THREADS) {
      int d = d_begin + i;
      const int* dp = desc + kDescInts * d;
      const int4 dd = make_int4(dp[0], dp[1], dp[2], dp[3]);  // 4 B aligned only: four loads
      int* e = dcache + 8 * i;
      e[0] = dd.x;
      e[1] = dd.y;
      e[2] = dd.z;
      e[3] = dd.w;
      e[4] = d;
      e[6] = lens_cached ? s_len[dd.x] : max(P.kv_lens[dd.x], 0);
      cp_async4(e + 5, nchunks + dd.y * P.batch + dd.x, true);           // completes with the first stage's group
      cp_async4(e + 7, tm.chunk_start() + dd.y * P.batch + dd.x, true);  // chunk_start (fused merge)
    }
  } else {
    d_end = cache_static_desc(P, dcache, tid);
  }
  __syncthreads();
  if (P.mode == kDynamic && P.fuse_max >= kFuseAll) {  // fuse-all: zero rows of empty pairs (see kFuseAll)
    const int* nchunks = P.task_map().num_chunks();    // [h * batch + r]
    const int r0 = rg * MROWS, r1 = min(r0 + MROWS, P.R);
    for (int p = blockIdx.x; p < P.batch * P.H; p += gridDim.x) {
      if (nchunks[p] != 0) continue;  // the same for every thread of the CTA
      const int r = p % P.batch, h = p / P.batch;
      for (int i = tid; i < (r1 - r0) * (kD / 8); i += CF::THREADS) {
        const int rr = r0 + i / (kD / 8), qi = rr / P.ratio, hl = rr % P.ratio;
        const size_t orow = P.head_row(r, h, qi, hl);
        reinterpret_cast<uint4*>(P.out + orow * kD)[i % (kD / 8)] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  if (d_begin >= d_end) return;

  auto fetch = [&](int d) { return fetch_desc<true>(P, dcache, d_begin, d); };
  // chunk count of descriptor d's pair, read at its end (the dcache slot is filled by cp.async, see above)
  auto nch_of = [&](int d) -> int {
    const int i = d - d_begin;
    if (P.mode != kDynamic || i >= kDescCache) return fetch(d).nch;
    return dcache[8 * i + 5];
  };
  // slot of chunk 0 of descriptor d's pair (its chunks occupy consecutive slots)
  auto first_slot_of = [&](int d, const Desc& dd) -> int {
    if (P.mode != kDynamic) return (dd.h * P.batch + dd.r) * P.splits;
    const int i = d - d_begin;
    if (i < kDescCache) return dcache[8 * i + 7];
    return P.task_map().chunk_start()[dd.h * P.batch + dd.r];
  };
  __shared__ int s_last;

  // ---- loader: thread copies 16 B unit ch = tid % RC of tokens tid / RC + TPP i of K and of V ----
  const uint8_t* kbase = reinterpret_cast<const uint8_t*>(P.k);
  const uint8_t* vbase = reinterpret_cast<const uint8_t*>(P.v);
  const uint8_t* qbase = reinterpret_cast<const uint8_t*>(P.q);
  const bool whole_pages = P.page_size >= kTile;  // a 64-token tile never straddles a page
  // QSMEM: the Q rows (+ scales) of descriptor d, in the Q area of stage (d - d_begin) % STAGES
  auto q_area = [&](int d) -> uint8_t* {
    return stages + ((d - d_begin) % STAGES) * CF::STAGE_BYTES + 2 * CF::KV_BYTES;
  };
  constexpr int RC = kD * CF::ES / 16;  // 16 B units per K / V / Q row (FP8 8, BF16 16)
  constexpr int RC_SHIFT = RC == 8 ? 3 : 4;
  static_assert(RC == 1 << RC_SHIFT, "shift / mask addressing of a row's units");
  constexpr int TPP = CF::THREADS / RC;  // token rows per pass of the CTA
  auto load_tile = [&](int stage, const Desc& d, int tile, bool first, int qd) {
    uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    uint8_t* sV = sK + CF::KV_BYTES;
    const int lim = min(d.kvlen, kv_cap);
    const int ch = tid & (RC - 1), t0 = tid >> RC_SHIFT;
    const int* bt = P.block_table + (size_t)d.r * P.max_pages;
    int page_once = -1;
    if (whole_pages && tile * kTile < lim) page_once = __ldg(bt + ((tile * kTile) >> P.page_shift));
    copy_tile_rows<TPP, CF::ROWB, CF::ES>(P, d.h, tile, lim, page_once, whole_pages, bt, ch, t0, kbase, vbase, sK, sV);
    if (first) {
      // Q rides with the descriptor's first tile; QSMEM: in the Q area of stage (descriptor index % STAGES)
      uint8_t* sQ = CF::QSMEM ? q_area(qd) : sV + CF::KV_BYTES;
      float* sQs = reinterpret_cast<float*>(sQ + MROWS * CF::QROWB);
      constexpr int QPER = MROWS * RC;  // 16 B units
      for (int c = tid; c < QPER; c += CF::THREADS) {
        const int row = c >> RC_SHIFT, u = c & (RC - 1);
        const int rr = rg * MROWS + row;
        const bool ok = rr < P.R;
        const int qi = ok ? rr / P.ratio : 0, hl = ok ? rr % P.ratio : 0;
        const size_t qrow = (size_t)d.r * P.q_len + qi;  // not P.head_row(): see the row layout's Q load
        const size_t off = ok ? (qrow * P.q_heads + d.h * P.ratio + hl) * kD * CF::ES + u * 16 : 0;
        cp_async16(sQ + row * CF::QROWB + ((u ^ (row & 7)) * 16), qbase + off, ok);
      }
      if (CF::FP8 && tid < MROWS) load_q_scale(P, d, rg * MROWS + tid, sQs + tid);
    }
  };

  TileLoader ld(fetch, load_tile, d_begin, d_end);
#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) ld.issue(s);

  const float kscale = CF::FP8 ? __ldg(P.k_scale) : 1.f;
  const float vscale = CF::FP8 ? __ldg(P.v_scale) : 1.f;

  int cd = d_begin;
  Desc cdd = fetch(cd);
  int ct = cdd.tb;
  uint32_t qb[CF::QSMEM ? 1 : NT]
             [8 * CF::ES];  // B fragments of Q (row 8nt + g; FP8: dims 32tig..32tig+31); QSMEM: unused
  float o[NT][8][4];        // O^T: m-tile j (dims 16g + j / 16g + 8 + j) x rows 8nt + 2tig + {0, 1}
  float m_[NT][2], l_[NT][2], sc[CF::QSMEM ? 1 : NT][2];
  int lim_[CF::QSMEM ? 1 : NT][2];
  // QSMEM: the rows' score scales and causal limits, written at each descriptor start (fewer live registers)
  __shared__ float s_sc[CF::QSMEM ? MROWS : 1];
  __shared__ int s_lim[CF::QSMEM ? MROWS : 1];

#pragma unroll 1
  for (int it = 0;; ++it) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    ld.issue((it + STAGES - 1) % STAGES);

    const int stage = it % STAGES;
    const uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    const uint8_t* sV = sK + CF::KV_BYTES;
    const uint8_t* sQd = CF::QSMEM ? q_area(cd) : sV + CF::KV_BYTES;  // this descriptor's Q rows

    if (ct == cdd.tb) {
      tr_begin_descriptor<CF>(P, sQd - CF::KV_BYTES, cdd, rg, g, tig, kscale, kv_cap, qb, o, m_, l_, sc, lim_);
      if constexpr (CF::QSMEM) {  // the previous descriptor's last reads of s_sc / s_lim precede the loop's barrier
        if (tid < MROWS)
          tr_row_scale_lim<CF>(P, reinterpret_cast<const float*>(sQd + MROWS * CF::QROWB), cdd, rg, tid, kscale, kv_cap,
                               s_sc[tid], s_lim[tid]);
        __syncthreads();
      }
    }

    // ---- S^T = K Q^T ----
    float s[NT][4];
    tr_qk<CF>(sK, qb, sQd, warp, g, tig, s);

    // ---- online softmax per row ----
    uint32_t pb[NT][2];
    tr_softmax_update<CF>(s, sc, lim_, s_sc, s_lim, tig, ct * kTile + warp * 16 + g, m_, l_, o, pb);

    // ---- O^T += V^T P^T ----
    tr_pv<CF>(sV, pb, warp, lane, g, tig, o);

    // ---- advance; epilogue at the end of a descriptor ----
    if (++ct >= cdd.te) {
      float *merge_o = merge_own, *merge_m = merge_own_m, *merge_l = merge_own_l;
      if constexpr (CF::MERGE_IN_STAGE) {
        merge_o = reinterpret_cast<float*>(stages + stage * CF::STAGE_BYTES);
        merge_m = merge_o + CF::TS * MROWS * kD;
        merge_l = merge_m + CF::TS * MROWS;
      }
      // MERGE_IN_STAGE: every warp's PV must be done with this stage's V first; the loader rewrites the stage only
      // after the next iteration's barrier, which follows the merge's last read.
      if constexpr (CF::MERGE_IN_STAGE) __syncthreads();
      tr_stage_merge<CF>(m_, l_, o, merge_o, merge_m, merge_l, warp, g, tig);
      __syncthreads();
      auto nch_of_cd = [&]() { return nch_of(cd); };
      tr_store<CF>(P, merge_o, merge_m, merge_l, cdd, rg, tid, vscale, nch_of_cd);
      tr_fused_merge<CF>(P, cdd, rg, tid, s_last, nch_of_cd, [&]() { return first_slot_of(cd, cdd); });
      if (++cd >= d_end) break;
      cdd = fetch(cd);
      ct = cdd.tb;
    }
  }
  cp_wait<0>();
}

// ================================================================================================================
// Warpgroup-MMA body (TraitsWg, variants "v3w" / "v3wc3"; FP8 KV, and BF16 under v3w): the same task map, loader,
// partial layout, fused merge and combine as the transposed layout, with the products on wgmma.
//
// Why: at 17-64 query rows per (request, KV head) (GQA 8:1 at q_len 3-4, 16:1 at q_len 2-4) the mma.sync layouts put
// every row's online-softmax chain into one warp per 16-token slice (v3m: 658 instructions per warp and tile, 4x the
// MMAs of 8 rows, spilled state), so they stop being bound by the KV stream (50-61% of the read probe at q_len 3-4).
// Here the 64 rows are wgmma's M side: warp w owns rows 16w..16w+15 for the whole tile, so a row's max and sum need
// two shuffles among 4 lanes, and the MMAs (4 QK + 4 PV instructions per tile for the warpgroup) run asynchronously
// beside the V conversion. Rows past R are padding; a warp with no live row skips the softmax and feeds P = 0.
//  - S[64 x 64 tokens] = Q K^T: wgmma m64n64k32 e4m3, A = the descriptor's Q rows and B = the K tile, both K-major
//    128-byte-swizzled in shared memory exactly as the loader writes them (16 B unit u of row t at u ^ (t & 7)).
//  - O[64 x 128] += P V: wgmma m64n128k16 f16, A = P from registers (the S accumulator rounded to f16 is already
//    the A fragment), B = V MN-major: FP8 wgmma reads only K-major operands and V is stored token-major, so each V
//    tile is converted once per CTA to f16 (exact e4m3 -> f16) in the same token-major order, overlapping the QK
//    wgmma, and the 16-bit wgmma reads it through an MN-major descriptor (as BF16 reads V in place). Converting into
//    a K-major V^T tile instead (a transpose in registers before the stores) cost 2-5% more per layer
//    (docs/ops/split_kv_decode.md, "v3w: FP8 V converted in token order").
//  Numerics are the transposed layout's: fp32 scores scaled after the product, P rounded to f16, V exact in f16,
//  fp32 accumulation (the same emulation).
//  BF16 KV (TraitsWg<2, 2, false>): S on the bf16 wgmma m64n64k16 (8 k16 steps, 4 per 64-dim half of the rows) and
//  O += P V on the bf16 m64n128k16 with P rounded to bf16 from registers and B = V read where the loader wrote it,
//  as an MN-major operand (the transpose-B immediate that 16-bit wgmma takes; desc_sw128_mn: the two 64-dim halves
//  of V are the N blocks, 16 tokens = two 1024-byte atoms per k16 step): no conversion, no f16 V tile, and no barrier
//  between the QK and the PV. The emulation is the row layout's BF16 one (P in bf16).

// V tile (FP8, token rows of 128 B, unit u of token t at u ^ (t & 7)) -> f16 in the same token-major order, the BF16
// tile layout: each token's 256 B as two 128-byte halves (dims 0-63, 64-127) kTile * 128 bytes apart, 16 B unit c of
// a half at c ^ (t & 7) (kv_unit_offset, as the BF16 loader writes it), which the PV reads as an MN-major operand
// (desc_sw128_mn), so nothing is transposed. Thread: token t = (tid & 7) + 8 ((tid >> 3) & 7), FP8 units u =
// 4 (tid >> 6) .. + 3; a quarter warp reads unit u of 8 consecutive tokens and writes f16 units 2u, 2u + 1 of them:
// 8 distinct 16 B bank groups either way.
__device__ __forceinline__ void wg_convert_vn(const uint8_t* sV, uint8_t* sVn, int tid) {
  const int t = (tid & 7) + 8 * ((tid >> 3) & 7), u0 = 4 * (tid >> 6);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int u = u0 + j;
    const uint4 x = *reinterpret_cast<const uint4*>(sV + kv_unit_offset<kD, 0>(t, u));
    const uint4 lo =
        make_uint4(e4m3x2_to_f16x2(x.x), e4m3x2_hi_to_f16x2(x.x), e4m3x2_to_f16x2(x.y), e4m3x2_hi_to_f16x2(x.y));
    const uint4 hi =
        make_uint4(e4m3x2_to_f16x2(x.z), e4m3x2_hi_to_f16x2(x.z), e4m3x2_to_f16x2(x.w), e4m3x2_hi_to_f16x2(x.w));
    *reinterpret_cast<uint4*>(sVn + kv_unit_offset<kD, kTile * 128>(t, 2 * u)) = lo;  // dims 16u..16u + 7
    *reinterpret_cast<uint4*>(sVn + kv_unit_offset<kD, kTile * 128>(t, 2 * u + 1)) = hi;
  }
}

// 2^x for the softmax: the bare ex2.approx.ftz (one MUFU op; exp2f adds the denormal range handling around it).
// Results below 2^-126 flush to 0, which changes nothing downstream: P is rounded to f16 (smallest subnormal 2^-24)
// and such terms are far below the fp32 resolution of the row sum, which always holds a 1 (the max).
__device__ __forceinline__ float wg_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The warpgroup body's lazy softmax rescaling threshold (log2 units; see attention_wg): P <= 2^8 in f16.
constexpr float kRescaleLog2 = 8.f;

// Max / sum of 16 values as a balanced tree (4 dependent steps instead of a 16-step chain).
__device__ __forceinline__ float wg_max16(const float (&v)[16]) {
  float a[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = fmaxf(v[2 * k], v[2 * k + 1]);
#pragma unroll
  for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
    for (int k = 0; k < w; ++k) a[k] = fmaxf(a[k], a[k + w]);
  return a[0];
}
__device__ __forceinline__ float wg_sum16(const float (&v)[16]) {
  float a[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = v[2 * k] + v[2 * k + 1];
#pragma unroll
  for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
    for (int k = 0; k < w; ++k) a[k] += a[k + w];
  return a[0];
}
template <class CF>
__device__ __forceinline__ void attention_wg(const Params& P) {
  constexpr int STAGES = CF::STAGES, MROWS = CF::MROWS;
  extern __shared__ uint8_t wg_smem[];
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wg_smem);
  uint8_t* stages = wg_smem + ((1024u - (raw & 1023u)) & 1023u);  // swizzle atoms: 1024-byte aligned
  uint8_t* sVn = stages + STAGES * CF::STAGE_BYTES;               // FP8: the converted V tile
  int* dcache = reinterpret_cast<int*>(sVn + CF::VN_BYTES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int rg = blockIdx.y;  // row group of MROWS rows
  // M row m of the wgmma <-> row of the group. At most 32 rows (8:1 at q_len <= 4): row 8w + i sits at M row
  // 16w + i (i < 8), so every warp owns up to 8 live rows in its first half (lanes' row g) and its second half is
  // padding: 4 warps share the softmax of 32 rows, one row per thread, instead of 2 warps with two rows each.
  // Otherwise M row m = group row m. Returns -1 for padding.
  const bool half = P.R <= 32;
  auto group_row = [&](int m) -> int {
    if (!half) return m;
    return (m & 15) < 8 ? 8 * (m >> 4) + (m & 7) : -1;
  };

  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();  // as the transposed layout: the combine's launch hides behind this grid

  const int kv_cap = P.max_pages * P.page_size;
  int d_begin = 0, d_end = 0;
  // The start-up, fuse-all zero rows and the loader's tile / Q set-up below repeat attention_transposed's on purpose:
  // shared helpers changed that body's code generation and cost it 0.6% (docs/ops/split_kv_decode.md); change both
  // together. The per-token copy loop alone is shared (copy_tile_rows: measured level).
  if (P.mode == kDynamic) {  // the transposed layout's start-up chain (attention_transposed)
    __shared__ int s_len[kLenCache];
    const TaskMap<const int> tm = P.task_map();
    const int* bin_start = tm.bin_start();
    d_begin = bin_start[blockIdx.x];
    d_end = bin_start[blockIdx.x + 1];
    const bool lens_cached = P.batch <= kLenCache;
    if (lens_cached)
      for (int i = tid; i < P.batch; i += CF::THREADS) s_len[i] = max(P.kv_lens[i], 0);
    __syncthreads();
    const int* desc = tm.desc();
    const int* nchunks = tm.num_chunks();
    for (int i = tid; i < min(d_end - d_begin, kDescCache); i += CF::THREADS) {
      int d = d_begin + i;
      const int* dp = desc + kDescInts * d;
      const int4 dd = make_int4(dp[0], dp[1], dp[2], dp[3]);
      int* e = dcache + 8 * i;
      e[0] = dd.x;
      e[1] = dd.y;
      e[2] = dd.z;
      e[3] = dd.w;
      e[4] = d;
      e[6] = lens_cached ? s_len[dd.x] : max(P.kv_lens[dd.x], 0);
      cp_async4(e + 5, nchunks + dd.y * P.batch + dd.x, true);
      cp_async4(e + 7, tm.chunk_start() + dd.y * P.batch + dd.x, true);
    }
  } else {
    d_end = cache_static_desc(P, dcache, tid);
  }
  __syncthreads();
  if (P.mode == kDynamic && P.fuse_max >= kFuseAll) {  // fuse-all: zero rows of empty pairs (see kFuseAll)
    const int* nchunks = P.task_map().num_chunks();
    const int r0 = rg * MROWS, r1 = min(r0 + MROWS, P.R);
    for (int p = blockIdx.x; p < P.batch * P.H; p += gridDim.x) {
      if (nchunks[p] != 0) continue;
      const int r = p % P.batch, h = p / P.batch;
      for (int i = tid; i < (r1 - r0) * (kD / 8); i += CF::THREADS) {
        const int rr = r0 + i / (kD / 8), qi = rr / P.ratio, hl = rr % P.ratio;
        const size_t orow = P.head_row(r, h, qi, hl);
        reinterpret_cast<uint4*>(P.out + orow * kD)[i % (kD / 8)] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  if (d_begin >= d_end) return;

  auto fetch = [&](int d) { return fetch_desc<true>(P, dcache, d_begin, d); };
  auto nch_of = [&](int d) -> int {
    const int i = d - d_begin;
    if (P.mode != kDynamic || i >= kDescCache) return fetch(d).nch;
    return dcache[8 * i + 5];
  };
  auto first_slot_of = [&](int d, const Desc& dd) -> int {
    if (P.mode != kDynamic) return (dd.h * P.batch + dd.r) * P.splits;
    const int i = d - d_begin;
    if (i < kDescCache) return dcache[8 * i + 7];
    return P.task_map().chunk_start()[dd.h * P.batch + dd.r];
  };
  __shared__ int s_last;

  // ---- loader (the transposed layout's): 16 B unit tid % 8 of tokens tid / 8 + 16 i of K and V; the Q rows of
  // descriptor d (64, zero past R) and their scales in the Q area of stage (d - d_begin) % STAGES, which the loader
  // (at most STAGES - 1 tiles, so descriptors, ahead) never rewrites while d computes ----
  const uint8_t* kbase = reinterpret_cast<const uint8_t*>(P.k);
  const uint8_t* vbase = reinterpret_cast<const uint8_t*>(P.v);
  const uint8_t* qbase = reinterpret_cast<const uint8_t*>(P.q);
  const bool whole_pages = P.page_size >= kTile;
  auto q_area = [&](int d) -> uint8_t* { return stages + ((d - d_begin) % STAGES) * CF::STAGE_BYTES + CF::Q_OFF; };
  constexpr int ES = CF::ES, HALF = CF::HALF;
  constexpr int RC = kD * ES / 16, RC_SHIFT = RC == 8 ? 3 : 4, TPP = CF::THREADS / RC;
  static_assert(RC == 1 << RC_SHIFT, "shift / mask addressing of a row's units");
  // The page of tile `tile` of d (whole pages: one page per tile; -1 past the length). Read one issue ahead of the
  // copies that use it (WgLoader), so no copy waits for a block-table round trip.
  auto tile_page = [&](const Desc& d, int tile) -> int {
    if (!whole_pages || tile * kTile >= min(d.kvlen, kv_cap)) return -1;
    return __ldg(P.block_table + (size_t)d.r * P.max_pages + ((tile * kTile) >> P.page_shift));
  };
  auto load_tile = [&](int stage, const Desc& d, int tile, bool first, int qd, int page_once) {
    uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    uint8_t* sV = sK + CF::KV_BYTES;
    const int lim = min(d.kvlen, kv_cap);
    const int ch = tid & (RC - 1), t0 = tid >> RC_SHIFT;
    const int* bt = P.block_table + (size_t)d.r * P.max_pages;
    if (whole_pages && (tile + 1) * kTile <= lim && page_once >= 0 && page_once < P.num_pages) {
      // a full tile inside one page: one base address, this thread's token rows t0 + TPP i at a fixed stride
      const size_t slot0 = (size_t)page_once * P.page_size + ((tile * kTile) & (P.page_size - 1)) + t0;
      const size_t off0 = P.kv_row(slot0, d.h) * kD * ES + ch * 16, step = (size_t)TPP * P.H * kD * ES;
      const int dst0 = kv_unit_offset<kD, HALF>(t0, ch);  // (t0 + TPP i) & 7 == t0 & 7 (TPP = 16 or 8)
      constexpr int RSTEP = TPP * (HALF > 0 ? 128 : kD);  // bytes between the thread's rows
#pragma unroll
      for (int i = 0; i < kTile / TPP; ++i) {
        cp_async16(sK + dst0 + i * RSTEP, kbase + off0 + i * step, true);
        cp_async16(sV + dst0 + i * RSTEP, vbase + off0 + i * step, true);
      }
    } else
      copy_tile_rows<TPP, kD, ES, HALF>(P, d.h, tile, lim, page_once, whole_pages, bt, ch, t0, kbase, vbase, sK, sV);
    if (first) {
      uint8_t* sQ = q_area(qd);
      float* sQs = reinterpret_cast<float*>(sQ + (CF::QS_OFF - CF::Q_OFF));
      for (int c = tid; c < MROWS * RC; c += CF::THREADS) {
        const int row = c >> RC_SHIFT, u = c & (RC - 1);
        const int gr = group_row(row), rr = rg * MROWS + gr;
        const bool ok = gr >= 0 && rr < P.R;
        const int qi = ok ? rr / P.ratio : 0, hl = ok ? rr % P.ratio : 0;
        const size_t qrow = (size_t)d.r * P.q_len + qi;
        const size_t off = ok ? (qrow * P.q_heads + d.h * P.ratio + hl) * kD * ES + u * 16 : 0;
        cp_async16(sQ + kv_unit_offset<kD, HALF>(row, u), qbase + off, ok);  // Q: 64 rows, the K tile's layout
      }
      if (CF::FP8 && tid < MROWS) {
        const int gr = group_row(tid);
        load_q_scale(P, d, gr >= 0 ? rg * MROWS + gr : P.R, sQs + tid);  // P.R: a padding row's scale is 0
      }
    }
  };

  // The transposed layout's TileLoader, plus the next tile's page read at each issue (used at the next one).
  struct WgLoader {
    decltype(fetch)& fetch;
    decltype(load_tile)& load;
    decltype(tile_page)& page_of;
    const int d_end;
    int d;
    Desc dd;
    int t, page;
    bool ok = true;
    __device__ __forceinline__ void issue(int stage) {
      if (ok) {
        load(stage, dd, t, t == dd.tb, d, page);
        if (++t >= dd.te) {
          if (++d < d_end) {
            dd = fetch(d);
            t = dd.tb;
          } else
            ok = false;
        }
        if (ok) page = page_of(dd, t);
      }
      cp_commit();
    }
  };
  const Desc d0 = fetch(d_begin);
  WgLoader ld{fetch, load_tile, tile_page, d_end, d_begin, d0, d0.tb, tile_page(d0, d0.tb)};
#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) ld.issue(s);

  const float kscale = CF::FP8 ? __ldg(P.k_scale) : 1.f;
  const float vscale = CF::FP8 ? __ldg(P.v_scale) : 1.f;
  // the thread's M rows 16w + g (index 0) and 16w + g + 8 (index 1), as rows of the group (-1: padding); a warp
  // with no row below R is idle in the softmax and the epilogue (warp-uniform)
  const int grow[2] = {group_row(16 * warp + g), group_row(16 * warp + g + 8)};
  const bool live = rg * MROWS + (half ? 8 : 16) * warp < P.R;

  int cd = d_begin;
  Desc cdd = fetch(cd);
  int ct = cdd.tb;
  float sacc[32];  // S: register j = row 16w + g + 8 ((j >> 1) & 1), token 8 (j >> 2) + 2 tig + (j & 1)
  // O: register j = the same rows, dim 8 (j >> 2) + 2 tig + (j & 1); zeroed here and after each descriptor's epilogue.
  float o[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] = 0.f;
  float m_[2], l_[2], sc[2];
  int lim_[2];
  // P as PV's A fragments. The asynchronous PV reads them until its wait (at the next loop top): keep_pa after
  // each wait holds them live to that point, so their registers are not reused while the tensor cores read them.
  // (Leaving the PV in flight past the loop-top barrier, beside the loads' issue and the QK, made ptxas serialize
  // every wgmma of the kernel: C7513, an ordinary instruction defining a wgmma input inside a pending group.)
  uint32_t pa[4][4] = {};
  auto keep_pa = [&]() {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pa[kk][i])::"memory");
  };

#pragma unroll 1
  for (int it = 0;; ++it) {
    cp_wait<STAGES - 2>();
    hp::wg::fence_proxy_async();  // this thread's cp.async writes -> the wgmma (async proxy) reads after the barrier
    __syncthreads();
    hp::wg::wait<0>();  // the previous tile's PV ran across the barrier, where the warps wait for each other
    hp::wg::pin(o);
    keep_pa();

    const int stage = it % STAGES;
    const uint8_t* sK = stages + stage * CF::STAGE_BYTES;
    const uint8_t* sV = sK + CF::KV_BYTES;
    const uint8_t* sQd = q_area(cd);

    if (ct == cdd.tb) {  // descriptor start (no PV is in flight: the last descriptor's end waited for it)
      const float* sQs = reinterpret_cast<const float*>(sQd + (CF::QS_OFF - CF::Q_OFF));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = rg * MROWS + grow[h];
        const bool ok = grow[h] >= 0 && rr < P.R;
        const int qi = ok ? rr / P.ratio : 0;
        sc[h] = P.sm_scale * kLog2e * (CF::FP8 ? sQs[16 * warp + g + 8 * h] * kscale : 1.f);
        lim_[h] = ok ? min(cdd.kvlen - (P.q_len - 1 - qi), min(cdd.kvlen, kv_cap)) : 0;
        m_[h] = -INFINITY;
        l_[h] = 0.f;
      }
    }

    // ---- S = Q K^T (async), the V conversion beside it ----
    if constexpr (CF::FP8) {  // k32 step ks: + 32 ks bytes inside the swizzled rows (descriptor + 2 ks)
      const uint64_t dq = hp::wg::desc_sw128(sQd), dk = hp::wg::desc_sw128(sK);
      hp::wg::fence();
      hp::wg::mma_e4m3<64, 0>(sacc, dq, dk);
#pragma unroll
      for (int ks = 1; ks < kD / 32; ++ks) hp::wg::mma_e4m3<64, 1>(sacc, dq + 2 * ks, dk + 2 * ks);
      hp::wg::commit();
    } else {  // k16 step ks: half ks / 4 of the rows, + 32 (ks % 4) bytes inside it
      const uint64_t dq0 = hp::wg::desc_sw128(sQd), dk0 = hp::wg::desc_sw128(sK);
      const uint64_t dq1 = hp::wg::desc_sw128(sQd + HALF), dk1 = hp::wg::desc_sw128(sK + HALF);
      hp::wg::fence();
      hp::wg::mma_bf16<64, 0>(sacc, dq0, dk0);
#pragma unroll
      for (int ks = 1; ks < 4; ++ks) hp::wg::mma_bf16<64, 1>(sacc, dq0 + 2 * ks, dk0 + 2 * ks);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) hp::wg::mma_bf16<64, 1>(sacc, dq1 + 2 * ks, dk1 + 2 * ks);
      hp::wg::commit();
    }
    // the copies of tile it + STAGES - 1 into the stage tile it - 1 used (its QK, V conversion and PV are done),
    // issued after the QK so that their address arithmetic runs beside it
    ld.issue((it + STAGES - 1) % STAGES);
    if constexpr (CF::FP8) {
      wg_convert_vn(sV, sVn, tid);
      hp::wg::fence_proxy_async();
    }
    hp::wg::wait<0>();
    hp::wg::pin(sacc);
    if constexpr (CF::FP8) __syncthreads();  // the f16 V tile complete (BF16: the PV reads V where the loader wrote it)

    // ---- online softmax per row (log2 domain), P as PV's A fragments ----
    if (live) {
      float alpha[2];
      const int tok0 = ct * kTile + 2 * tig;
      alpha[1] = 1.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && half) {  // the padding half: P = 0, O untouched
#pragma unroll
          for (int n = 0; n < 8; ++n) sacc[4 * n + 2] = sacc[4 * n + 3] = 0.f;
          continue;
        }
        // full tile: max and exponent on the raw scores (sc >= 0: max(s sc) = sc max(s); p = 2^(s sc - m) is one
        // FFMA and the MUFU); a partial tile is scaled and masked first. Trees, not chains: 4 dependent steps, not 16.
        const bool full = (ct + 1) * kTile <= lim_[h];
        float v[16];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = sacc[4 * n + 2 * h + e];
            v[2 * n + e] = full ? x : (tok0 + 8 * n + e < lim_[h] ? x * sc[h] : -INFINITY);
          }
        float mx = wg_max16(v);
        if (full) mx *= sc[h];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // Lazy rescaling: the row's reference max moves only when its running max grows past it by more than
        // kRescaleLog2 (log2 units), so most tiles keep alpha = 1 and skip the 64-register O rescale. Exact: P =
        // 2^(s - ref) <= 2^8 is as precise in f16 as at the true max, and the row sum and the LSE use the same
        // reference.
        const float mx_all = fmaxf(m_[h], mx);
        const float mref = (mx_all > m_[h] + kRescaleLog2) ? mx_all : m_[h];
        const float muse = (mref == -INFINITY) ? 0.f : mref;
        alpha[h] = wg_exp2(m_[h] - muse);
        m_[h] = mref;
#pragma unroll
        for (int k = 0; k < 16; ++k) v[k] = wg_exp2(full ? fmaf(v[k], sc[h], -muse) : v[k] - muse);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) sacc[4 * n + 2 * h + e] = v[2 * n + e];
        const float sum = wg_sum16(v);
        l_[h] = l_[h] * alpha[h] + sum;  // per-thread partial sum (its 16 tokens), reduced at the end
      }
      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int j = 0; j < 64; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)  // k16 step kk = tokens 16kk.. = the accumulator's n8 tiles 2kk, 2kk + 1
#pragma unroll
        for (int i = 0; i < 4; ++i) pa[kk][i] = pack_p<CF::FP8>(sacc[8 * kk + 2 * i], sacc[8 * kk + 2 * i + 1]);
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) pa[kk][i] = 0u;
    }

    // ---- O += P V (waited for after the next loop-top barrier, or at the descriptor's end) ----
    hp::wg::pin(o);
    hp::wg::fence();
    if constexpr (CF::FP8) {
      const uint64_t dv = hp::wg::desc_sw128_mn(sVn, kTile * 128);  // as BF16's PV below, on the converted tile
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) hp::wg::mma_f16_rs_tb<128>(o, pa[kk], dv + (2048 >> 4) * kk);
    } else {  // V MN-major: the two 64-dim halves HALF bytes apart, k16 step kk = 16 token rows = 2 KB further
      const uint64_t dv = hp::wg::desc_sw128_mn(sV, HALF);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) hp::wg::mma_bf16_rs_tb<128>(o, pa[kk], dv + (2048 >> 4) * kk);
    }
    hp::wg::commit();

    // ---- advance; epilogue at the end of a descriptor ----
    if (++ct >= cdd.te) {
      hp::wg::wait<0>();
      hp::wg::pin(o);
      keep_pa();
      const int nch = nch_of(cd);
      if (live) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float L = l_[h];
          L += __shfl_xor_sync(0xffffffffu, L, 1);
          L += __shfl_xor_sync(0xffffffffu, L, 2);
          const int rr = rg * MROWS + grow[h];
          if (grow[h] >= 0 && rr < P.R) {
            const float inv = (L > 0.f) ? vscale / L : 0.f;
            const int qi = rr / P.ratio, hl = rr % P.ratio;
            if (nch == 1) {
              __nv_bfloat16* orow = P.out + P.head_row(cdd.r, cdd.h, qi, hl) * kD + 2 * tig;
#pragma unroll
              for (int n = 0; n < 16; ++n)
                *reinterpret_cast<uint32_t*>(orow + 8 * n) =
                    pack_bf16(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
            } else {
              const size_t prow = P.part_row(cdd.slot, rr);
              float* orow = P.part_o + prow * kD + 2 * tig;
#pragma unroll
              for (int n = 0; n < 16; ++n)
                *reinterpret_cast<float2*>(orow + 8 * n) =
                    make_float2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
              if (tig == 0) P.part_lse[prow] = (L > 0.f) ? (m_[h] + log2f(L)) * kLn2 : -INFINITY;
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 64; ++j) o[j] = 0.f;  // the next descriptor's fresh O
      tr_fused_merge<CF>(P, cdd, rg, tid, s_last, [&]() { return nch; }, [&]() { return first_slot_of(cd, cdd); });
      if (++cd >= d_end) break;
      cdd = fetch(cd);
      ct = cdd.tb;
    }
  }
  cp_wait<0>();
}

// The attention kernel: one template over Traits; the layout picks the body (both read the same task map and write
// the same partial layout).
// Work done before the PDL wait (Params::early). Every read of this kernel's start-up chain (bin bounds -> descriptors
// and kv_lens -> block table -> first KV tile) is a dependent round trip to DRAM after a cold L2; the predecessor
// (the prologue, or the assign kernel) runs for microseconds during which this grid is already resident. Here the
// grid pulls the task map, kv_lens, the block table and the two FP8 scales into L2, one 128-byte line per thread,
// lines dealt round-robin over the CTAs. Safe whatever the predecessor writes: a prefetch returns no value and
// changes none that a later load returns (PTX memory model), and it targets L2 only, the GPU's point of coherence
// (never L1, which is not coherent across SMs). Every real load stays after the wait, so the task map (written
// by assign), Q and the new K/V rows (written by the prologue) are read exactly as before. Not prefetched: Q and
// the cache (the predecessor's own writes land in L2; which KV tiles a CTA reads is known only from the task map).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
__device__ __forceinline__ void prefetch_lines(const void* base, long long bytes, long long first, long long step) {
  const char* b = reinterpret_cast<const char*>(base);
  if (b == nullptr || bytes <= 0) return;
  const long long lines = (bytes + 127) >> 7;  // line i starts inside [base, base + bytes)
  for (long long i = first; i < lines; i += step) prefetch_l2(b + (i << 7));
}
__device__ void prefetch_start_up(const Params& P) {
  const long long ctas = (long long)gridDim.x * gridDim.y;
  const long long first = (long long)threadIdx.x * ctas + (long long)blockIdx.y * gridDim.x + blockIdx.x;
  const long long step = ctas * blockDim.x;
  if (P.mode == kDynamic) prefetch_lines(P.ws, 4 * task_map_len(P.C, P.max_pairs), first, step);
  prefetch_lines(P.kv_lens, 4LL * P.batch, first, step);
  prefetch_lines(P.block_table, 4LL * P.batch * P.max_pages, first, step);
  prefetch_lines(P.k_scale, 4, first, step);
  prefetch_lines(P.v_scale, 4, first, step);
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, T::CPS) attention_kernel(const Params P) {
  if (P.early) prefetch_start_up(P);  // before the PDL wait that opens either body
  if constexpr (T::WG)
    attention_wg<T>(P);
  else if constexpr (T::TRANSPOSED)
    attention_transposed<T>(P);
  else
    attention_rows<T>(P);
}

// combine: one CTA per (row, pair) (grid (R, pairs): a long pair's rows land on R different SMs), 8 warps split
// the pair's chunks (warp w merges chunks w, w+8, ...; lanes own 4 dims, 16 B loads, 4 chunks in flight per warp)
// and are merged through smem. A pair with one chunk returns at once (the attention kernel wrote it); 0 chunks
// or a row that saw no key -> zeros. The merge order depends only on the pair's chunk count, so batch-invariant
// mode stays bit-identical. Two forms (ONLINE), one kernel template:
//  - ONLINE = false (run after the row layout): block max of the chunks' LSE first, then the weighted partials.
//  - ONLINE = true (run after the transposed layout): a warp loads its chunks' LSE and partial rows together and
//    keeps an online max, so one dependent L2 round trip per 32 chunks instead of two or more; warps are merged
//    through smem with their own maxima. Pairs with 2..fuse_max chunks were merged by the attention kernel.
constexpr int kCombineWarps = 8;

// Chunk count and first partial slot of pair p = h * batch + r: the task map's (dynamic) or static_desc's.
__device__ __forceinline__ void pair_chunks(const Params& P, int p, int r, int& n, int& first) {
  if (P.mode == kDynamic) {
    const TaskMap<const int> tm = P.task_map();
    n = tm.num_chunks()[p];
    first = tm.chunk_start()[p];
  } else {
    const int kvlen = max(P.kv_lens[r], 0);
    const int tiles = (kvlen + kTile - 1) / kTile;
    const int ct = (P.mode == kStaticCount) ? (tiles + P.splits - 1) / P.splits : P.chunk_tiles;
    n = (tiles == 0 || ct <= 0) ? 0 : min((tiles + ct - 1) / ct, P.splits);
    first = p * P.splits;
  }
}

// Two-pass merge: returns the warp's weighted sum of its chunks (weights relative to the block max M, which every
// warp computes first); L gets the warp's sum of weights.
__device__ __forceinline__ float4 combine_two_pass(const Params& P, const float* lse, int first, int rr, int n,
                                                   int warp, int lane, float* s_m, float& L) {
  // block max of the chunks' LSE
  float M = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kCombineWarps * 32) M = fmaxf(M, lse[(size_t)i * P.R]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (lane == 0) s_m[warp] = M;
  __syncthreads();
  M = s_m[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) M = fmaxf(M, s_m[w]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  L = 0.f;
  if (M != -INFINITY) {  // n == 0 or every chunk empty for this row: zeros
    const float4* po = reinterpret_cast<const float4*>(P.part_o + P.part_row(first, rr) * kD) + lane;
    const size_t cstride = (size_t)P.R * kD / 4;  // float4s between chunks
    int i = warp;
    for (; i + 3 * kCombineWarps < n; i += 4 * kCombineWarps) {  // 4 independent loads in flight
      float wgt[4];
      float4 x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = i + u * kCombineWarps;
        wgt[u] = lse[(size_t)c * P.R];
        x[u] = po[c * cstride];
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float w = expf(wgt[u] - M);
        L += w;
        acc.x += w * x[u].x;
        acc.y += w * x[u].y;
        acc.z += w * x[u].z;
        acc.w += w * x[u].w;
      }
    }
    for (; i < n; i += kCombineWarps) {
      const float w = expf(lse[(size_t)i * P.R] - M);
      const float4 x = po[i * cstride];
      L += w;
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
    }
  }
  return acc;
}

// Online merge: returns the warp's sum of its chunks weighted relative to the warp's own max m (WARPS warps).
template <int WARPS>
__device__ __forceinline__ float4 combine_online(const Params& P, const float* lse, const float4* po, int n, int warp,
                                                 float& m, float& L) {
  const size_t cstride = (size_t)P.R * kD / 4;
  m = -INFINITY;
  L = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  // 4 chunks per warp in flight (n <= 32 in one round trip); 8 measured slower (78 registers: fewer combine CTAs
  // resident early beside the attention kernel).
  for (int i = warp; i < n; i += 4 * WARPS) {
    float lv[4];
    float4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = i + u * WARPS;
      lv[u] = c < n ? lse[(size_t)c * P.R] : -INFINITY;
      x[u] = c < n ? po[c * cstride] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float mb = fmaxf(fmaxf(lv[0], lv[1]), fmaxf(lv[2], lv[3]));
    const float mnew = fmaxf(m, mb);
    if (mnew == -INFINITY) continue;  // nothing seen yet (empty chunks)
    const float f = expf(m - mnew);   // m == -inf -> 0
    L *= f;
    acc.x *= f;
    acc.y *= f;
    acc.z *= f;
    acc.w *= f;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float w = expf(lv[u] - mnew);  // -inf -> 0
      L += w;
      acc.x += w * x[u].x;
      acc.y += w * x[u].y;
      acc.z += w * x[u].z;
      acc.w += w * x[u].w;
    }
    m = mnew;
  }
  return acc;
}

// 4 dims of an output row (lane's 16 B of fp32 -> 8 B of bf16), scaled by inv.
__device__ __forceinline__ void store_out4(const Params& P, size_t orow, int lane, float4 t, float inv) {
  uint2 pk;
  pk.x = pack_bf16(t.x * inv, t.y * inv);
  pk.y = pack_bf16(t.z * inv, t.w * inv);
  reinterpret_cast<uint2*>(P.out + orow * kD)[lane] = pk;
}

// WARPS: warps per (row, pair) CTA. 8 by default; 32 (online form only) for plans whose longest pair has hundreds
// of chunks: its 8 CTAs then keep 4 x 32 chunks in flight per L2 round trip instead of 4 x 8, which shortens the
// step's tail where one long request is merged behind every other pair (1x64K+7x4K: ~171 chunks, 6 round trips
// of the 8-warp form -> 2).
template <bool ONLINE, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) combine_kernel(const Params P) {
  static_assert(ONLINE || WARPS == kCombineWarps, "the two-pass form is written for kCombineWarps warps");
  __shared__ float4 s_acc[WARPS][32];
  __shared__ float s_l[WARPS], s_m[WARPS];
  cudaGridDependencySynchronize();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rr = blockIdx.x;
  const int p = blockIdx.y;
  if (rr >= P.R || p >= P.batch * P.H) return;
  const int r = p % P.batch, h = p / P.batch;
  int n, first;
  pair_chunks(P, p, r, n, first);
  if constexpr (ONLINE) {
    if (n == 1 || (n > 1 && n <= P.fuse_max)) return;  // written by the attention kernel (directly / fused merge)
  } else {
    if (n == 1) return;  // written directly by the attention kernel
  }
  const int qi = rr / P.ratio, hl = rr % P.ratio;
  const size_t orow = P.head_row(r, h, qi, hl);
  const float* lse = P.part_lse + P.part_row(first, rr);  // chunk i at lse[i * R]
  if constexpr (ONLINE) {
    const float4* po = reinterpret_cast<const float4*>(P.part_o + P.part_row(first, rr) * kD) + lane;
    float m, L;
    const float4 acc = combine_online<WARPS>(P, lse, po, n, warp, m, L);
    s_acc[warp][lane] = acc;
    if (lane == 0) {
      s_l[warp] = L;
      s_m[warp] = m;
    }
    __syncthreads();
    if (warp != 0) return;
    float M = s_m[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) M = fmaxf(M, s_m[w]);
    float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
    float Lt = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float f = expf(s_m[w] - M);
        const float4 y = s_acc[w][lane];
        t.x += f * y.x;
        t.y += f * y.y;
        t.z += f * y.z;
        t.w += f * y.w;
        Lt += f * s_l[w];
      }
    }
    store_out4(P, orow, lane, t, (Lt > 0.f) ? 1.f / Lt : 0.f);  // n == 0 or no key seen: zeros
  } else {
    float L;
    const float4 acc = combine_two_pass(P, lse, first, rr, n, warp, lane, s_m, L);
    s_acc[warp][lane] = acc;
    if (lane == 0) s_l[warp] = L;
    __syncthreads();
    if (warp != 0) return;
    float4 t = s_acc[0][lane];
    float Lt = s_l[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) {
      const float4 y = s_acc[w][lane];
      t.x += y.x;
      t.y += y.y;
      t.z += y.z;
      t.w += y.w;
      Lt += s_l[w];
    }
    store_out4(P, orow, lane, t, (Lt > 0.f) ? 1.f / Lt : 0.f);
  }
}

Params make_params(const void* q, const float* q_scale, const void* k, const void* v, const int* block_table,
                   const int* kv_lens, const float* k_scale, const float* v_scale, void* out, float* part_o,
                   float* part_lse, const int* ws, float sm_scale, int batch, int H, int q_heads, int q_len,
                   int page_size, int max_pages, int num_pages, int C, int max_pairs, int mode, int splits,
                   int chunk_tiles) {
  // One aggregate in Params' field order; derived: ratio, R, page_shift (log2 of page_size, rounded up).
  const int ratio = q_heads / H;
  int page_shift = 0;
  while ((1 << page_shift) < page_size) ++page_shift;
  return Params{q,
                q_scale,
                k,
                v,
                block_table,
                kv_lens,
                k_scale,
                v_scale,
                reinterpret_cast<__nv_bfloat16*>(out),
                part_o,
                part_lse,
                ws,
                sm_scale,
                batch,
                H,
                q_heads,
                ratio,
                q_len,
                ratio * q_len,  // R
                page_size,
                page_shift,
                max_pages,
                num_pages,
                C,
                max_pairs,
                mode,
                splits,
                chunk_tiles,
                nullptr,  // counters: set by the launcher when the merge is fused
                0,        // fuse_max
                0};       // early
}

// Kernel configurations, by the id the Python loader passes (hotpaths.kernels.split_kv_decode.CONFIGS maps the
// variant names; kCfg* below):
//   0 "v2": row layout (FP8 4 stages, BF16 2; 2 CTAs per SM).
//   1..4 "v3", "v3s3c3", "v3s5", "v3s2c4": transposed layout {stages, CTAs per SM} 4/2, 3/3, 5/2, 2/4. Row groups
//     of 9-16 rows run 4 stages / 2 CTAs per SM (their merge buffer is twice as large); a config whose CTAs per SM
//     is higher then runs its persistent grid in more than one wave (correct, slower).
//   5 "v3m" (MTP): transposed, every row group sized to the pair: R <= 8 rows as "v3", 9-16 one NT = 2 group
//     (4 stages), 17-32 one NT = 4 group, 33-64 two; NT = 4 with {stages, CTAs per SM} 2/2 (the merge buffer of 32
//     rows leaves room for 2 stages at 2 CTAs per SM). The grid is sized 2 per SM for every R, so R = 9..16 does
//     not run a 4-per-SM grid on a 2-per-SM kernel.
//   6..8 "v3b", "v3bs3", "v3bc3": the transposed layout for BF16 KV (S^T = K Q^T and O^T += V^T P^T on bf16
//     m16n8k16 MMAs: half the MMAs of the row layout at 8 rows, 32 O^T accumulators instead of 64) with {stages,
//     CTAs per SM} 2/2, 3/2, 2/3 (the last two with the merge buffer in a stage: see Traits). FP8 KV runs "v3"
//     (6, 7) or "v3s3c3" (8) under them. BF16 with more than 8 rows per group runs the row layout (its m16 is full).
//   9, 10 "v3w", "v3wc3" (MTP): the warpgroup-MMA body (attention_wg, TraitsWg) for every row count (groups of 64
//     rows), FP8 {stages, CTAs per SM} 3/2 and 2/3; BF16 under "v3w" only, 2/2 (48 KB stages: 3 CTAs per SM do not
//     fit two of them).
// BF16 KV runs the row layout under every other configuration.
// spills-ok(TraitsILb1ELb1ELi2ELi4ELi1EE): transposed, 2 stages / 4 CTAs per SM caps the kernel at 128 registers and it spills 4
// bytes; it is the configuration `auto` picks for batches without a dominant request, and the fastest there as
// measured, spill included (docs/ops/split_kv_decode.md).
// spills-ok(TraitsILb1ELb1ELi2ELi2ELi4EE): MTP NT = 4 ("v3m"): 128 O^T accumulators per thread, live across
// descriptors, leave ~16 words over the 255-register cap (stack 64 B, after Q, the row scales and the causal limits
// moved to shared memory and the epilogues to 16-row passes); the alternative, two 16-row groups, reads every K/V
// tile twice. Measured on the H200, spill included, it is the fastest at q_len 2-4 (docs/ops/split_kv_decode.md).
constexpr int kNumConfigs = 11;
constexpr int kCfgMtp = 5;
constexpr int kCfgWg = 9;
constexpr int kCfgWgc3 = 10;
using Wg = TraitsWg<3, 2>;
using Wgc3 = TraitsWg<2, 3>;
using WgBf16 = TraitsWg<2, 2, false>;  // v3w with BF16 KV: 48 KB stages, two of them at v3w's 2 CTAs per SM
using MtpNt4 = Transposed<2, 2, 4>;
using TrBf16 = TransposedBf16<2, 2>;
using TrBf16s3 = TransposedBf16<3, 2>;
using TrBf16c3 = TransposedBf16<2, 3>;
constexpr int kConfigCps[kNumConfigs] = {
    RowFp8::CPS, Transposed<4, 2>::CPS, Transposed<3, 3>::CPS, Transposed<5, 2>::CPS, Transposed<2, 4>::CPS,
    MtpNt4::CPS, TrBf16::CPS,           TrBf16s3::CPS,         TrBf16c3::CPS,         Wg::CPS,
    Wgc3::CPS};
static_assert(RowFp8::CPS == RowBf16::CPS, "the row layout sizes its grid the same for both dtypes");
static_assert(Transposed<4, 2>::CPS == MtpNt4::CPS && Transposed<4, 2, 2>::CPS == MtpNt4::CPS,
              "v3m's grid (2 per SM) fits every kernel it runs (R <= 8, 9-16, 17-64)");
static_assert(WgBf16::CPS == Wg::CPS, "v3w's grid is the same for both KV dtypes");
static_assert(TrBf16::CPS == Transposed<4, 2>::CPS && TrBf16s3::CPS == Transposed<4, 2>::CPS &&
                  TrBf16c3::CPS == Transposed<3, 3>::CPS,
              "a BF16 configuration's FP8 kernel is sized for the same grid");
static_assert(!TrBf16::MERGE_IN_STAGE && TrBf16s3::MERGE_IN_STAGE && TrBf16c3::MERGE_IN_STAGE &&
                  !Transposed<2, 4>::MERGE_IN_STAGE && !MtpNt4::MERGE_IN_STAGE,
              "the merge buffer moves into a stage only for the configurations that need it");
constexpr bool is_row_config(int config) {
  return config == 0;
}
// Configurations whose BF16 kernel is the transposed layout (at most 8 query rows per group).
constexpr bool is_bf16_transposed_config(int config) {
  return config >= 6 && config <= 8;
}
// Whether `config` runs the transposed layout (or the warpgroup body, which shares its task map, partials and fused
// merge) for this KV dtype and R query rows per (request, KV head). BF16: the transposed configurations up to 8 rows,
// v3w at any row count; v3wc3 (whose 3 CTAs per SM leave no room for 48 KB BF16 stages) the row layout.
constexpr bool runs_transposed(int config, bool kv_fp8, int R) {
  return !is_row_config(config) && (kv_fp8 || (is_bf16_transposed_config(config) && R <= 8) || config == kCfgWg);
}

template <class T>
int launch_attention(const dim3 grid, bool pdl, cudaStream_t stream, const Params& P) {
  hp::LaunchOptions opt;
  opt.pdl = pdl;
  return (int)hp::launch(attention_kernel<T>, grid, dim3(T::THREADS), T::SMEM, stream, opt, P);
}

bool valid_shape(int batch, int H, int q_heads, int q_len) {
  return batch > 0 && H > 0 && q_heads % H == 0 && q_len > 0;
}

}  // namespace

// Resident CTAs per SM the configuration's kernel is sized for (the default persistent grid is this x SMs); -1 for
// an unknown configuration.
extern "C" int hp_decode_ctas_per_sm(int config) {
  return (config >= 0 && config < kNumConfigs) ? kConfigCps[config] : -1;
}

// Whether `config` runs the transposed layout (1) or the row layout (0) for this KV dtype and `rows` query rows per
// (request, KV head); the fused merge (fuse_max) needs the transposed layout. -1 for an unknown configuration.
extern "C" int hp_decode_transposed(int config, int kv_fp8, int rows) {
  if (config < 0 || config >= kNumConfigs) return -1;
  return runs_transposed(config, kv_fp8 != 0, rows) ? 1 : 0;
}

// Dynamic shared memory per CTA of the kernel `config` runs for this KV dtype (row groups of up to 8 rows); -1 for an
// unknown configuration.
extern "C" int hp_decode_smem_bytes(int config, int kv_fp8) {
  if (config < 0 || config >= kNumConfigs) return -1;
  if (!kv_fp8) {
    switch (config) {
      case 6:
        return TrBf16::SMEM;
      case 7:
        return TrBf16s3::SMEM;
      case 8:
        return TrBf16c3::SMEM;
      case kCfgWg:
        return WgBf16::SMEM;
      default:
        return RowBf16::SMEM;
    }
  }
  switch (config) {
    case 8:
      return Transposed<3, 3>::SMEM;

    case 0:
      return RowFp8::SMEM;
    case 2:
      return Transposed<3, 3>::SMEM;
    case 3:
      return Transposed<5, 2>::SMEM;
    case 4:
      return Transposed<2, 4>::SMEM;
    case kCfgMtp:
      return MtpNt4::SMEM;
    case kCfgWg:
      return Wg::SMEM;
    case kCfgWgc3:
      return Wgc3::SMEM;
    default:
      return Transposed<4, 2>::SMEM;
  }
}

// Int32 entries of the task-map workspace (task_map.cuh) for C CTAs and max_pairs pairs.
extern "C" long long hp_decode_workspace_len(int num_ctas, int max_pairs) {
  return hp_decode::task_map_len(num_ctas, max_pairs);
}

// Attention. mode: 0 dynamic (grid.x = C persistent CTAs reading ws), 1 static fixed split count, 2 static fixed
// chunk size (grid.x = H * batch * splits). config: above. Fused merge (transposed layout only): counters
// [max_pairs * 8] int32, zero before the first launch (each launch leaves them zero), and fuse_max (pairs with
// 2..fuse_max chunks are merged by their last-arriving CTA; 0 disables; >= kFuseAll, dynamic mode only: all of them,
// and the empty pairs' zero rows too, so the caller runs no combine). The row layout must be called with
// fuse_max = 0. early: 1 = prefetch the start-up chain's arrays into L2 before the PDL wait (prefetch_start_up;
// no effect on any value read). Returns a cudaError_t (cudaErrorInvalidValue for bad shapes / configurations).
extern "C" int hp_decode_attention(const void* q, const float* q_scale, const void* k, const void* v,
                                   const int* block_table, const int* kv_lens, const float* k_scale,
                                   const float* v_scale, void* out, float* part_o, float* part_lse, const int* ws,
                                   float sm_scale, int batch, int H, int q_heads, int q_len, int page_size,
                                   int max_pages, int num_pages, int C, int max_pairs, int mode, int splits,
                                   int chunk_tiles, int kv_fp8, int pdl, void* stream, int config, int* counters,
                                   int fuse_max, int early) {
  if (config < 0 || config >= kNumConfigs) return (int)cudaErrorInvalidValue;
  if (!valid_shape(batch, H, q_heads, q_len) || page_size <= 0 || (page_size & (page_size - 1)))
    return (int)cudaErrorInvalidValue;  // page_size: a power of two (shift/mask addressing)
  Params P =
      make_params(q, q_scale, k, v, block_table, kv_lens, k_scale, v_scale, out, part_o, part_lse, ws, sm_scale, batch,
                  H, q_heads, q_len, page_size, max_pages, num_pages, C, max_pairs, mode, splits, chunk_tiles);
  P.early = early != 0;
  const cudaStream_t s = (cudaStream_t)stream;
  const bool transposed = runs_transposed(config, kv_fp8 != 0, P.R);
  if (!transposed) {
    if (fuse_max != 0) return (int)cudaErrorInvalidValue;  // the fused merge is the transposed layout's
    const int G = (P.R + RowFp8::MROWS - 1) / RowFp8::MROWS;
    const dim3 grid(mode == kDynamic ? C : batch * H * splits, G);
    return kv_fp8 ? launch_attention<RowFp8>(grid, pdl, s, P) : launch_attention<RowBf16>(grid, pdl, s, P);
  }
  if (fuse_max > 0 && (counters == nullptr || P.R > 8 * kMaxRowGroups)) return (int)cudaErrorInvalidValue;
  if (fuse_max >= kFuseAll && mode != kDynamic) return (int)cudaErrorInvalidValue;  // zero rows: dynamic map only
  P.counters = counters;
  P.fuse_max = fuse_max;
  if (!kv_fp8 && config == kCfgWg) {  // BF16 on the warpgroup body: groups of 64 rows
    const dim3 grid(mode == kDynamic ? C : batch * H * splits, (P.R + WgBf16::MROWS - 1) / WgBf16::MROWS);
    return launch_attention<WgBf16>(grid, pdl, s, P);
  }
  if (!kv_fp8) {  // BF16, R <= 8: one row group
    const dim3 grid(mode == kDynamic ? C : batch * H * splits, 1);
    switch (config) {
      case 7:
        return launch_attention<TrBf16s3>(grid, pdl, s, P);
      case 8:
        return launch_attention<TrBf16c3>(grid, pdl, s, P);
      default:
        return launch_attention<TrBf16>(grid, pdl, s, P);
    }
  }
  if (config == kCfgWg || config == kCfgWgc3) {
    const dim3 grid(mode == kDynamic ? C : batch * H * splits, (P.R + Wg::MROWS - 1) / Wg::MROWS);
    return config == kCfgWg ? launch_attention<Wg>(grid, pdl, s, P) : launch_attention<Wgc3>(grid, pdl, s, P);
  }
  const bool mtp = config == kCfgMtp;
  const int NT = P.R <= 8 ? 1 : (P.R <= 16 || !mtp) ? 2 : 4;  // MTP configs: one pass over the KV up to 32 rows
  const int G = (P.R + 8 * NT - 1) / (8 * NT);
  const dim3 grid(mode == kDynamic ? C : batch * H * splits, G);
  if (NT == 4) return launch_attention<MtpNt4>(grid, pdl, s, P);
  if (NT == 2) return launch_attention<Transposed<4, 2, 2>>(grid, pdl, s, P);
  switch (config) {
    case 2:
    case 8:
      return launch_attention<Transposed<3, 3>>(grid, pdl, s, P);
    case 3:
      return launch_attention<Transposed<5, 2>>(grid, pdl, s, P);
    case 4:
      return launch_attention<Transposed<2, 4>>(grid, pdl, s, P);

    default:
      return launch_attention<Transposed<4, 2>>(grid, pdl, s, P);
  }
}

// Combine: merges the partials of pairs with more than one chunk into out. online: 0 the two-pass form (after the
// row layout), 1 the online form (after the transposed layout), which also skips pairs of 2..fuse_max chunks (the
// value given to hp_decode_attention). warps: 8, or 32 with the online form (combine_kernel's WARPS). Returns a
// cudaError_t (cudaErrorInvalidValue for another warps value).
extern "C" int hp_decode_combine(const int* kv_lens, void* out, const float* part_o, const float* part_lse,
                                 const int* ws, int batch, int H, int q_heads, int q_len, int C, int max_pairs,
                                 int mode, int splits, int chunk_tiles, int pdl, void* stream, int online, int fuse_max,
                                 int warps) {
  if (warps != kCombineWarps && (warps != 32 || !online)) return (int)cudaErrorInvalidValue;
  if (!valid_shape(batch, H, q_heads, q_len)) return (int)cudaErrorInvalidValue;
  Params P = make_params(nullptr, nullptr, nullptr, nullptr, nullptr, kv_lens, nullptr, nullptr, out,
                         const_cast<float*>(part_o), const_cast<float*>(part_lse), ws, 0.f, batch, H, q_heads, q_len, 0,
                         0, 0, C, max_pairs, mode, splits, chunk_tiles);
  P.fuse_max = online ? fuse_max : 0;
  const dim3 grid(P.R, batch * H);
  hp::LaunchOptions opt;
  opt.pdl = pdl != 0;
  const cudaStream_t s = (cudaStream_t)stream;
  if (warps == 32) return (int)hp::launch(combine_kernel<true, 32>, grid, dim3(32 * 32), 0, s, opt, P);
  return (int)(online ? hp::launch(combine_kernel<true, kCombineWarps>, grid, dim3(kCombineWarps * 32), 0, s, opt, P)
                      : hp::launch(combine_kernel<false, kCombineWarps>, grid, dim3(kCombineWarps * 32), 0, s, opt, P));
}
