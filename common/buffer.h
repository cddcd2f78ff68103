/// @file buffer.h
/// @brief RAII device memory.
#pragma once

#include <cstddef>

#include "status.h"

namespace attn {

/// One cudaMalloc'd allocation, freed when the buffer goes out of scope. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Frees the allocation.
  ~DeviceBuffer();
  /// Take over @p other's allocation, leaving it empty.
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  /// Free this allocation and take over @p other's.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// Free any previous allocation and allocate @p bytes (nothing for 0), zero-filled.
  Status allocate(size_t bytes);
  /// Free the allocation now.
  void reset();

  /// Device pointer, null when empty.
  void* get() const { return ptr_; }
  /// Device pointer cast to T*.
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  /// Size in bytes.
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace attn
