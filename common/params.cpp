// Validation of AttnParams against the contract (README). Host-only: nothing here touches the GPU except
// validate_launch(), which reads the current device's compute capability after every other check.
#include "params.h"

#include <cmath>
#include <cstdint>
#include <sstream>

#include <cuda_runtime_api.h>

#include "device.h"

namespace attn {

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "dtype(" + std::to_string(static_cast<int>(dtype)) + ")";
}

std::string to_string(Layout layout) {
  switch (layout) {
    case Layout::BSHD: return "BSHD";
    case Layout::BHSD: return "BHSD";
  }
  return "layout(" + std::to_string(static_cast<int>(layout)) + ")";
}

float effective_scale(const AttnParams& p) {
  return p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.d));
}

namespace {

Status null_pointer(const char* field) { return Status::Error(std::string(field) + " is null"); }

Status check_size(const char* field, int64_t value) {
  if (value >= 1) return Status::Ok();
  return Status::Error(std::string(field) + " (" + std::to_string(value) + ") must be >= 1");
}

// Every stage may move 16 bytes (8 fp16/bf16 elements) per access, so bases are 16-byte aligned.
Status check_alignment(const char* field, const void* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 == 0) return Status::Ok();
  std::ostringstream msg;
  msg << field << " (" << ptr << ") is not aligned to 16 bytes";
  return Status::Error(msg.str());
}

// ...and every row start stays 16-byte aligned: strides are multiples of 8 elements.
Status check_stride(const char* field, int64_t stride) {
  if (stride >= 0 && stride % 8 == 0) return Status::Ok();
  return Status::Error(std::string(field) + " (" + std::to_string(stride) +
                       ") is not a non-negative multiple of 8 elements");
}

}  // namespace

Status validate_sizes(const AttnParams& p) {
  ATTN_TRY(check_size("B", p.b));
  ATTN_TRY(check_size("Hq", p.hq));
  ATTN_TRY(check_size("Hkv", p.hkv));
  ATTN_TRY(check_size("Sq", p.sq));
  ATTN_TRY(check_size("Sk", p.sk));
  ATTN_TRY(check_size("D", p.d));
  if (p.hq % p.hkv != 0) {
    return Status::Error("Hq (" + std::to_string(p.hq) + ") is not a multiple of Hkv (" +
                         std::to_string(p.hkv) + ")");
  }
  if (p.d != 64 && p.d != 128) {
    return Status::Error("D (" + std::to_string(p.d) + ") is not supported: every stage supports 64 and 128");
  }
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return Status::Error("dtype (" + std::to_string(static_cast<int>(p.dtype)) +
                         ") is not supported: fp16 (0) and bf16 (1) are");
  }
  if (!std::isfinite(p.scale)) {
    std::ostringstream msg;
    msg << "scale (" << p.scale << ") is not finite";
    return Status::Error(msg.str());
  }
  return Status::Ok();
}

Status validate_params(const AttnParams& p) {
  if (p.q == nullptr) return null_pointer("q");
  if (p.k == nullptr) return null_pointer("k");
  if (p.v == nullptr) return null_pointer("v");
  if (p.o == nullptr) return null_pointer("o");
  ATTN_TRY(validate_sizes(p));

  ATTN_TRY(check_alignment("q", p.q));
  ATTN_TRY(check_alignment("k", p.k));
  ATTN_TRY(check_alignment("v", p.v));
  ATTN_TRY(check_alignment("o", p.o));
  if (p.lse != nullptr) ATTN_TRY(check_alignment("lse", p.lse));

  ATTN_TRY(check_stride("q_batch_stride", p.q_batch_stride));
  ATTN_TRY(check_stride("q_seq_stride", p.q_seq_stride));
  ATTN_TRY(check_stride("q_head_stride", p.q_head_stride));
  ATTN_TRY(check_stride("k_batch_stride", p.k_batch_stride));
  ATTN_TRY(check_stride("k_seq_stride", p.k_seq_stride));
  ATTN_TRY(check_stride("k_head_stride", p.k_head_stride));
  ATTN_TRY(check_stride("v_batch_stride", p.v_batch_stride));
  ATTN_TRY(check_stride("v_seq_stride", p.v_seq_stride));
  ATTN_TRY(check_stride("v_head_stride", p.v_head_stride));
  ATTN_TRY(check_stride("o_batch_stride", p.o_batch_stride));
  ATTN_TRY(check_stride("o_seq_stride", p.o_seq_stride));
  ATTN_TRY(check_stride("o_head_stride", p.o_head_stride));
  return Status::Ok();
}

Status check_compute_capability(const char* stage, int min_sm, int device_sm) {
  if (device_sm >= min_sm) return Status::Ok();
  return Status::Error(std::string("stage ") + stage + " requires sm_" + std::to_string(min_sm) +
                       " or newer, found sm_" + std::to_string(device_sm));
}

Status check_workspace(const char* stage, const Workspace& ws, size_t workspace_bytes_needed) {
  if (ws.bytes >= workspace_bytes_needed && (workspace_bytes_needed == 0 || ws.ptr != nullptr)) return Status::Ok();
  return Status::Error(std::string("workspace (") + std::to_string(ws.bytes) + " bytes) is smaller than the " +
                       std::to_string(workspace_bytes_needed) + " bytes stage " + stage + " needs");
}

Status validate_launch(const AttnParams& p, const char* stage, int min_sm, const Workspace& ws,
                       size_t workspace_bytes_needed) {
  ATTN_TRY(validate_params(p));
  ATTN_TRY(check_workspace(stage, ws, workspace_bytes_needed));
  const DeviceInfo* device = nullptr;
  ATTN_TRY(current_device(&device));
  return check_compute_capability(stage, min_sm, device->sm);
}

Status check_launch(const char* stage) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(std::string("stage ") + stage + ": CUDA error during launch: " +
                       cudaGetErrorString(err));
}

}  // namespace attn
