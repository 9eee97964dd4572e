// Router GEMM, SM90 wgmma prefill variants (router_wgmma.cu): the host entry points router_gemm.cu calls. The
// variants (ids, tiles, split-K kinds) are listed in router_variants.cuh. Two-part weight only (BF16x2).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace hp_router {

#if !defined(__CUDACC_RTC__)
// out[M, N] = x @ (w0 + s1 * w1)^T with wgmma variant `variant`, K split `splits` (1, 2, 4, 8) ways. Returns
// cudaErrorInvalidValue for a shape the variant cannot run (N % BN, K % 64, M < 1, bad splits, a cluster of more
// than 8 CTAs, a pointer not 16-byte aligned for TMA, a global split-K variant with splits > 1 and no workspace
// of router_wgmma_workspace_bytes() 256-byte aligned, a cooperative grid beyond one wave).
cudaError_t launch_router_wgmma(int variant, const __nv_bfloat16* x, const __nv_bfloat16* w0, const __nv_bfloat16* w1,
                                float* out, int M, int N, int K, float s1, int splits, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);
// Bytes of device workspace launch_router_wgmma needs (0 unless a global split-K variant with splits > 1).
size_t router_wgmma_workspace_bytes(int variant, int M, int N, int splits);
#endif

}  // namespace hp_router
