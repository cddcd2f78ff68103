/// @file device.h
/// @brief What the harness needs to know about the GPU: identity, size, and spec-sheet peaks.
#pragma once

#include <cstddef>
#include <string>

#include "status.h"

namespace attn {

/// Properties of one CUDA device, read once.
struct DeviceInfo {
  int id = 0;                    ///< CUDA device ordinal
  std::string name;              ///< e.g. "NVIDIA H200"
  int sm = 0;                    ///< compute capability x10, e.g. 90
  int sm_count = 0;              ///< streaming multiprocessors
  size_t l2_bytes = 0;           ///< L2 cache size
  size_t smem_per_block_optin = 0;  ///< largest dynamic shared memory a CTA may opt in to
  size_t smem_per_sm = 0;        ///< shared memory per SM
  int max_threads_per_sm = 0;    ///< resident threads per SM
  double clock_ghz = 0;          ///< peak SM clock
  double dram_peak_gbps = 0;     ///< spec-sheet DRAM bandwidth: 2 x memory clock x bus width
  double fp32_peak_tflops = 0;   ///< spec-sheet fp32 FMA rate on CUDA cores
  double tensor_peak_tflops = 0; ///< spec-sheet dense fp16/bf16 tensor-core rate (0 if unknown)
  int driver_version = 0;        ///< e.g. 13000 for CUDA 13.0
  int runtime_version = 0;       ///< e.g. 13000
};

/// Properties of the current device, queried on first use and cached per device.
/// @return an error when there is no usable CUDA device.
Status current_device(const DeviceInfo** out);

/// Resident CTAs per SM of @p kernel (a __global__ function) launched with @p threads threads and
/// @p dynamic_smem bytes of dynamic shared memory, on the current device: the occupancy calculator's
/// answer, at least 1, cached per (kernel, device, threads, dynamic_smem). When dynamic_smem is
/// not 0, the first call also lifts the kernel's dynamic shared-memory limit to it (above the
/// default 48 KB takes that opt-in).
Status resident_ctas_per_sm(const void* kernel, int threads, size_t dynamic_smem, int* out);

/// Number of CUDA devices, 0 when there is none or the driver is missing (never an error).
int cuda_device_count();

/// "13.0" from 13000.
std::string cuda_version_string(int version);

/// The NVIDIA driver's version string (e.g. "580.159.04") from NVML's library when it can be
/// loaded, else the CUDA driver API version (e.g. "CUDA 13.0").
std::string driver_version_string();

}  // namespace attn
