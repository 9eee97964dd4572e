// One launch helper for every kernel family: cudaLaunchKernelEx with the attributes this project uses
// (programmatic dependent launch, thread-block clusters, cooperative launch), the per-kernel function attributes
// set once per device (dynamic shared memory above 48 KiB, non-portable cluster sizes), and one error path.
// Why one helper: the same dozen lines were written once per kernel family, each with its own idea of when to set
// a function attribute (once per process is wrong on a multi-GPU host: attributes are per device).
#pragma once

namespace hp {
// Shared memory one block may take on sm_90: 228 KB per SM less the 1 KB the runtime reserves per block. Every
// kernel family's static_asserts and stage-count fits are written against it.
constexpr int kSmemPerBlock = 227 * 1024;
}  // namespace hp

#if !defined(__CUDACC_RTC__)
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace hp {

struct LaunchOptions {
  bool pdl = false;          // programmatic stream serialization: the kernel may start before its predecessor ends
  int cluster = 1;           // thread-block cluster size along x (1 = no cluster attribute)
  bool cooperative = false;  // grid-wide barrier support (every CTA co-resident)
  // Cluster extent along z (split-K ranks that reduce through distributed shared memory): 0 = none; >= 1 = the
  // cluster is (cluster, 1, cluster_z), and the attribute is set even for a one-CTA cluster, so a kernel whose
  // split count varies per call is launched the same way at every split count.
  int cluster_z = 0;
};

// The device the calling thread launches on (cudaGetDevice); -1 if the runtime cannot say.
inline int current_device() {
  int d = -1;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

// Function attributes, set once per (kernel, device, value). Keyed by the kernel's address, so every template
// instantiation has its own entry. Thread-safe: ctypes callers may launch from several Python threads.
class FuncAttributeCache {
 public:
  static FuncAttributeCache& instance() {
    static FuncAttributeCache c;
    return c;
  }
  template <typename Kernel>
  cudaError_t ensure(Kernel kernel, int smem_bytes, int cluster) {
    const int dev = current_device();
    const Key k{reinterpret_cast<const void*>(kernel), dev};
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = map_[k];
    // Without the opt-in a CTA gets 48 KB of shared memory, static and dynamic together: a kernel with static
    // arrays needs the attribute for less than 48 KB of dynamic memory (the route kernel at 370-384 experts).
    if (e.static_smem < 0) {
      cudaFuncAttributes fa{};
      e.static_smem = cudaFuncGetAttributes(&fa, kernel) == cudaSuccess ? static_cast<int>(fa.sharedSizeBytes) : 0;
    }
    if (smem_bytes + e.static_smem > 48 * 1024 && e.smem < smem_bytes) {
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      if (err != cudaSuccess) return err;
      e.smem = smem_bytes;
    }
    if (cluster > 8 && !e.nonportable) {
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (err != cudaSuccess) return err;
      e.nonportable = true;
    }
    return cudaSuccess;
  }

 private:
  struct Key {
    const void* fn;
    int dev;
    bool operator==(const Key& o) const { return fn == o.fn && dev == o.dev; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<const void*>()(k.fn) ^ (size_t(k.dev) << 1); }
  };
  struct Entry {
    int smem = 0;
    int static_smem = -1;  // the kernel's static shared memory, bytes (-1: not read yet)
    bool nonportable = false;
  };
  std::mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> map_;
};

// Launch `kernel<<<grid, block, smem, stream>>>(args...)` with the options; returns the launch's cudaError_t
// (including an error left by an earlier asynchronous failure, so the caller's op name is attached to it).
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                   const LaunchOptions& opt, Args&&... args) {
  const int cluster_size = opt.cluster * (opt.cluster_z > 0 ? opt.cluster_z : 1);
  cudaError_t err = FuncAttributeCache::instance().ensure(kernel, smem_bytes, cluster_size);
  // A refused attribute or launch also sets the thread's last error: consume it here, where it is reported, or the
  // next op's launch would report it under its own name.
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[3];
  int n = 0;
  if (opt.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (opt.cluster > 1 || opt.cluster_z > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(opt.cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = static_cast<unsigned>(opt.cluster_z > 0 ? opt.cluster_z : 1);
    ++n;
  }
  if (opt.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  err = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  return cudaGetLastError();
}

// Per-device cached query (SM count, co-resident CTAs of a kernel, ...): `compute(device)` runs once per device.
template <typename F>
int per_device_cached(std::atomic<int> (&slots)[16], F compute) {
  const int dev = current_device();
  if (dev < 0 || dev >= 16) return compute(dev);
  int v = slots[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = compute(dev);
    slots[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// Resident CTAs per SM of `kernel` at `threads` threads and `smem_bytes` of dynamic shared memory (at least 1: a
// failed query counts as 1), computed once per device into the caller's slots (one array per kernel). Sets the
// kernel's shared-memory attribute first: the occupancy query needs it.
template <typename Kernel>
int ctas_per_sm(std::atomic<int> (&slots)[16], Kernel kernel, int threads, int smem_bytes) {
  return per_device_cached(slots, [&](int) {
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
      (void)cudaGetLastError();  // the launch reports a size the kernel cannot take, under the op's name
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 1;
    }
    return n > 0 ? n : 1;
  });
}

inline int sm_count() {
  static std::atomic<int> slots[16];
  return per_device_cached(slots, [](int dev) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : 0;
  });
}

}  // namespace hp
#endif  // !__CUDACC_RTC__

// Device side of PDL, usable in NVRTC builds too: wait for the predecessor's writes / let the successor start.
#if defined(__CUDACC__)
namespace hp {
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
}  // namespace hp
#endif
