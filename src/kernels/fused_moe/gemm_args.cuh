// The arguments of one expert GEMM launch, shared by both GEMM families of the fused MoE (mma.sync: expert_gemm.cu,
// wgmma: expert_wgmma.cu), and the one definition of their extern "C" entry points. Why shared: the gate-up and down
// GEMMs of both families take the same arguments in the same order (the loader's argtypes), so the mapping from
// (hidden, inter) to the GEMM's K, weight rows and output columns is written once instead of four times.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hp_moe {

struct GemmArgs {
  const int* ws;
  int num_experts, max_pairs, block_m;
  const uint8_t* w;        // [E, w_rows, kdim] e4m3
  const float* w_scale;    // per-tensor [E]; block [E, ceil(w_rows/128), ceil(kdim/128)]
  const float* a_scale;    // per-tensor activation scale [1] (unused in block mode)
  const uint8_t* src;      // e4m3 rows: gate_up xq [T, H]; down aq [max_pairs, I] (by sorted position)
  const float* src_scale;  // block mode: group scales of src [rows, ceil(kdim/128)]; unused per-tensor
  __nv_bfloat16* dst;      // gate_up: act [max_pairs, I]; down: ybuf [max_pairs, H]
  int topk;                // K (pair p -> token p / topk)
  int kdim;                // reduction length: H (gate_up) or I (down)
  int inter;               // I
  int w_rows;              // 2I (gate_up) or H (down)
  int dst_cols;            // I (gate_up) or H (down)
  int* splitk;             // split-K workspace (splitk_layout) or nullptr: never split (the wgmma GEMMs never split)
  // gate_up, per-tensor, wgmma kernels: the epilogue also writes aq = e4m3(act / q_scale[0]) [max_pairs, I] (the down
  // GEMM's input, the bytes the activation pre-pass would write), so that pre-pass launch goes; nullptr elsewhere
  uint8_t* q_dst;
  const float* q_scale;
};

// gate_up: xq [T, H] (x_scale) against w13 [E, 2I, H] (w13_scale, a1_scale) into act [max_pairs, I];
// down: aq [max_pairs, I] (act_scale) against w2 [E, H, I] (w2_scale, a2_scale) into ybuf [max_pairs, H].
inline GemmArgs gemm_args(bool gate_up, const int* ws, const void* src, const float* src_scale, const void* w,
                          const float* w_scale, const float* a_scale, void* dst, int topk, int num_experts, int hidden,
                          int inter, int max_pairs, int block_m, void* splitk, void* q_dst = nullptr,
                          const float* q_scale = nullptr) {
  return GemmArgs{ws,
                  num_experts,
                  max_pairs,
                  block_m,
                  static_cast<const uint8_t*>(w),
                  w_scale,
                  a_scale,
                  static_cast<const uint8_t*>(src),
                  src_scale,
                  static_cast<__nv_bfloat16*>(dst),
                  topk,
                  gate_up ? hidden : inter,
                  inter,
                  gate_up ? 2 * inter : hidden,
                  gate_up ? inter : hidden,
                  static_cast<int*>(splitk),
                  static_cast<uint8_t*>(q_dst),
                  q_scale};
}

}  // namespace hp_moe

// Defines the extern "C" entry point NAME of one expert GEMM (arguments: see gemm_args; block: block-scaled weights
// and activations, else per-tensor; pdl: launch with programmatic dependent launch; q_dst / q_scale: GemmArgs, only
// where Q_OK, else they must be null). RUN<GATE_UP, BLOCK>(const GemmArgs&, int pdl, cudaStream_t) launches it and
// returns a cudaError_t.
#define HP_MOE_GEMM_ENTRY(NAME, GATE_UP, RUN, Q_OK)                                                                    \
  int NAME(const int* ws, const void* src, const float* src_scale, const void* w, const float* w_scale,                \
           const float* a_scale, void* dst, int topk, int num_experts, int hidden, int inter, int max_pairs,           \
           int block_m, int block, int pdl, void* splitk, void* q_dst, const float* q_scale, cudaStream_t stream) {    \
    if (q_dst != nullptr && (!(Q_OK) || !(GATE_UP) || block || q_scale == nullptr)) return (int)cudaErrorInvalidValue; \
    const hp_moe::GemmArgs a =                                                                                         \
        hp_moe::gemm_args(GATE_UP, ws, src, src_scale, w, w_scale, a_scale, dst, topk, num_experts, hidden, inter,     \
                          max_pairs, block_m, splitk, q_dst, q_scale);                                                 \
    return block ? RUN<GATE_UP, true>(a, pdl, stream) : RUN<GATE_UP, false>(a, pdl, stream);                           \
  }
