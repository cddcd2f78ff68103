#include "buffer.h"

#include <utility>

#include <cuda_runtime_api.h>

namespace attn {

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Status DeviceBuffer::allocate(size_t bytes) {
  reset();
  if (bytes == 0) return Status::Ok();
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    ptr_ = nullptr;
    (void)cudaGetLastError();
    return Status::Error("cudaMalloc(" + std::to_string(bytes) + " bytes): " + cudaGetErrorString(err));
  }
  bytes_ = bytes;
  // Zero-filled once, here: stages 03-05 keep their work-queue counters in the workspace and
  // leave them zero at the end of every launch, so no launch needs a memset of its own.
  if (cudaMemset(ptr_, 0, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    reset();
    return Status::Error("cudaMemset(" + std::to_string(bytes) + " bytes) failed");
  }
  return Status::Ok();
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace attn
