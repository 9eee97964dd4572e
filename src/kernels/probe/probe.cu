// Bandwidth probe: dst[i] = src[i] over n bytes, 16-byte vector loads/stores, grid-stride loop.
// Launch: grid = 4 x SMs (persistent-ish), 256 threads. Traffic: n bytes read + n bytes written.
// Design: the smallest real kernel that exercises the whole build path (nvcc -> C-ABI .so -> ctypes -> current
// torch stream -> CUDA graph capture -> PDL launch attribute); notebook 00 compares it with torch's copy to show
// that a hand-written streaming kernel reaches the measured copy ceiling.
#include <cuda_runtime.h>
#include <stdint.h>

#ifndef PROBE_UNROLL
#define PROBE_UNROLL 4
#endif

namespace {

__global__ void __launch_bounds__(256)
    probe_copy_kernel(int4* __restrict__ dst, const int4* __restrict__ src, int64_t n_vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // With PDL the next kernel may start its prologue now; our own reads do not depend on a predecessor here,
  // but waiting keeps the probe correct when chained after a producer.
  cudaGridDependencySynchronize();
#endif
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  // PROBE_UNROLL independent 16-byte loads in flight per thread before the first store (memory-level
  // parallelism); notebook 00 recompiles this with NVRTC at other values to show the effect.
  for (; i + (PROBE_UNROLL - 1) * stride < n_vec; i += PROBE_UNROLL * stride) {
    int4 v[PROBE_UNROLL];
#pragma unroll
    for (int u = 0; u < PROBE_UNROLL; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < PROBE_UNROLL; ++u) __stcs(dst + i + u * stride, v[u]);
  }
  for (; i < n_vec; i += stride) __stcs(dst + i, __ldcs(src + i));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

__global__ void probe_tail_kernel(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, int64_t begin,
                                  int64_t n) {
  int64_t i = begin + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

}  // namespace

// Host launcher: NVRTC (hotpaths.harness.nvrtc) compiles device code only, so it is guarded out there.
#if !defined(__CUDACC_RTC__)
extern "C" int hp_probe_copy(void* dst, const void* src, int64_t n_bytes, int grid, int use_pdl, void* stream) {
  if (n_bytes < 0 || grid <= 0) return (int)cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15)
    return (int)cudaErrorMisalignedAddress;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t n_vec = n_bytes / 16;
  if (n_vec > 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = use_pdl ? 1 : 0;
    cudaError_t e =
        cudaLaunchKernelEx(&cfg, probe_copy_kernel, static_cast<int4*>(dst), static_cast<const int4*>(src), n_vec);
    if (e != cudaSuccess) return (int)e;
  }
  const int64_t done = n_vec * 16;
  if (done < n_bytes) {
    const int64_t rest = n_bytes - done;
    probe_tail_kernel<<<(unsigned)((rest + 255) / 256), 256, 0, s>>>(static_cast<uint8_t*>(dst),
                                                                     static_cast<const uint8_t*>(src), done, n_bytes);
  }
  return (int)cudaGetLastError();
}
#endif  // !__CUDACC_RTC__
