// Device properties, read once per device, and the spec-sheet peaks derived from them.
#include "device.h"

#include <dlfcn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <cuda_runtime_api.h>

namespace attn {
namespace {

// FP32 lanes per SM (an FMA each per clock) by compute capability: the CUDA cores' rate.
int fp32_lanes_per_sm(int sm) {
  if (sm == 80) return 64;  // A100: 64 FP32 lanes per SM
  return sm >= 86 ? 128 : 64;
}

// Dense fp16/bf16 tensor-core FLOPs per clock per SM, fp32 accumulate, from the vendors' data
// sheets (A100 312 TFLOP/s at 1.41 GHz x 108 SMs = 2048; H100 SXM 989 TFLOP/s = 4096 per clock).
int tensor_flops_per_clock_per_sm(int sm) {
  switch (sm) {
    case 80: return 2048;
    case 86: case 87: return 512;
    case 89: return 1024;
    case 90: return 4096;
    case 100: return 8192;
    default: return 0;  // unknown: reported as n/a rather than guessed
  }
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

Status query(int id, DeviceInfo* info) {
  cudaDeviceProp prop{};
  ATTN_TRY(cuda_status(cudaGetDeviceProperties(&prop, id), "cudaGetDeviceProperties"));
  int clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
  ATTN_TRY(cuda_status(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, id), "clock rate"));
  ATTN_TRY(cuda_status(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, id), "memory clock"));
  ATTN_TRY(cuda_status(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, id), "bus width"));

  info->id = id;
  info->name = prop.name;
  info->sm = prop.major * 10 + prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info->smem_per_block_optin = prop.sharedMemPerBlockOptin;
  info->smem_per_sm = prop.sharedMemPerMultiprocessor;
  info->max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  info->clock_ghz = clock_khz * 1e-6;
  // Double data rate: two transfers per memory clock across the whole bus.
  info->dram_peak_gbps = 2.0 * mem_clock_khz * 1e3 * (bus_bits / 8.0) * 1e-9;
  info->fp32_peak_tflops = 2.0 * fp32_lanes_per_sm(info->sm) * info->sm_count * info->clock_ghz * 1e-3;
  info->tensor_peak_tflops =
      static_cast<double>(tensor_flops_per_clock_per_sm(info->sm)) * info->sm_count * info->clock_ghz * 1e-3;
  ATTN_TRY(cuda_status(cudaDriverGetVersion(&info->driver_version), "cudaDriverGetVersion"));
  ATTN_TRY(cuda_status(cudaRuntimeGetVersion(&info->runtime_version), "cudaRuntimeGetVersion"));
  return Status::Ok();
}

// Why cudaGetDeviceCount() found nothing, in the words a user can act on.
std::string no_device_reason() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) return "no NVIDIA driver is loaded";
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  return err == cudaSuccess ? "the driver lists no GPU" : cudaGetErrorString(err);
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

Status current_device(const DeviceInfo** out) {
  constexpr int kMaxDevices = 64;
  static std::array<std::unique_ptr<DeviceInfo>, kMaxDevices> cache;
  static std::mutex mutex;
  int id = 0;
  if (cuda_device_count() == 0) return Status::Error("no CUDA device is available (" + no_device_reason() + ")");
  ATTN_TRY(cuda_status(cudaGetDevice(&id), "cudaGetDevice"));
  if (id < 0 || id >= kMaxDevices) return Status::Error("device ordinal (" + std::to_string(id) + ") out of range");
  std::lock_guard<std::mutex> lock(mutex);
  if (!cache[id]) {
    auto info = std::make_unique<DeviceInfo>();
    ATTN_TRY(query(id, info.get()));
    cache[id] = std::move(info);
  }
  *out = cache[id].get();
  return Status::Ok();
}

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string driver_version_string() {
  // NVML is loaded at run time, not linked: a machine without the driver must still start the
  // programs (CI runs them to see test_gpu skip).
  using InitFn = int (*)();
  using VersionFn = int (*)(char*, unsigned);
  if (void* nvml = dlopen("libnvidia-ml.so.1", RTLD_LAZY)) {
    auto init = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlInit_v2"));
    auto version = reinterpret_cast<VersionFn>(dlsym(nvml, "nvmlSystemGetDriverVersion"));
    auto shutdown = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlShutdown"));
    char buf[96] = {};
    const bool ok = init && version && shutdown && init() == 0 && version(buf, sizeof buf) == 0;
    if (init && shutdown && ok) shutdown();
    dlclose(nvml);
    if (ok) return buf;
  }
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) return "CUDA " + cuda_version_string(v);
  return "unknown";
}

Status resident_ctas_per_sm(const void* kernel, int threads, size_t dynamic_smem, int* out) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, size_t>, int> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::Error("cudaGetDevice failed");
  const auto key = std::make_tuple(kernel, device, threads, dynamic_smem);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    int n = 0;
    cudaError_t err = cudaSuccess;
    if (dynamic_smem > 0)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_smem));
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, dynamic_smem);
    if (err != cudaSuccess) return Status::Error(std::string("occupancy: ") + cudaGetErrorString(err));
    it = cache.emplace(key, n > 1 ? n : 1).first;
  }
  *out = it->second;
  return Status::Ok();
}

}  // namespace attn
