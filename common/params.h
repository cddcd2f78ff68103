/// @file params.h
/// @brief The attention problem every stage computes (README, "The contract") and its validation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "status.h"

namespace attn {

/// Element type of Q, K, V and O. Accumulation is always fp32.
enum class DType : int { f16 = 0, bf16 = 1 };

/// Memory order of a [batch, sequence, head, head-dim] tensor. Only used to build strides:
/// kernels address every tensor through the strides in AttnParams.
enum class Layout : int {
  BSHD = 0,  ///< [B][S][H][D], FlashAttention's
  BHSD = 1,  ///< [B][H][S][D], PyTorch's
};

/// "fp16" or "bf16" (or "dtype(N)" for a value outside the enum).
std::string to_string(DType dtype);
/// "BSHD" or "BHSD".
std::string to_string(Layout layout);

/// One forward attention call: sizes, pointers and element strides.
///
/// The head dimension is contiguous; every other dimension has an element stride. The optional
/// LSE output is fp32, contiguous [B][Hq][Sq] (FlashAttention's softmax_lse).
/// Sizes are 64-bit so that offsets computed from them never overflow.
struct AttnParams {
  const void* q = nullptr;  ///< [B][Sq][Hq][D] through q_*_stride
  const void* k = nullptr;  ///< [B][Sk][Hkv][D] through k_*_stride
  const void* v = nullptr;  ///< [B][Sk][Hkv][D] through v_*_stride
  void* o = nullptr;        ///< [B][Sq][Hq][D] through o_*_stride, same dtype as q
  float* lse = nullptr;     ///< [B][Hq][Sq] contiguous, natural log; may be null (not written)

  int64_t b = 0;    ///< batch
  int64_t hq = 0;   ///< query heads
  int64_t hkv = 0;  ///< key/value heads; query head h reads kv head h / (hq / hkv)
  int64_t sq = 0;   ///< query length
  int64_t sk = 0;   ///< key length
  int64_t d = 0;    ///< head dimension (64 or 128)

  int64_t q_batch_stride = 0;  ///< Q: elements between batches
  int64_t q_seq_stride = 0;  ///< Q: elements between sequence positions
  int64_t q_head_stride = 0;  ///< Q: elements between heads
  int64_t k_batch_stride = 0;  ///< K: elements between batches
  int64_t k_seq_stride = 0;  ///< K: elements between sequence positions
  int64_t k_head_stride = 0;  ///< K: elements between heads
  int64_t v_batch_stride = 0;  ///< V: elements between batches
  int64_t v_seq_stride = 0;  ///< V: elements between sequence positions
  int64_t v_head_stride = 0;  ///< V: elements between heads
  int64_t o_batch_stride = 0;  ///< O: elements between batches
  int64_t o_seq_stride = 0;  ///< O: elements between sequence positions
  int64_t o_head_stride = 0;  ///< O: elements between heads

  DType dtype = DType::f16;  ///< element type of q, k, v, o
  bool causal = false;       ///< bottom-right aligned: row i sees keys j <= i + (sk - sq)
  float scale = 0.0f;        ///< softmax scale; 0 selects the default 1/sqrt(d)
};

/// The scale a kernel applies: p.scale, or 1/sqrt(d) when p.scale is 0.
float effective_scale(const AttnParams& p);

/// Scratch memory the harness allocates once for a stage (no cudaMalloc inside a timed launch).
/// It must be zero-filled before its first launch (DeviceBuffer::allocate does this): stages that
/// keep counters in it (03 onwards) need them zero at the start of a launch and leave them zero
/// at its end, so one workspace serves any number of launches, of any shape, with no memset.
struct Workspace {
  void* ptr = nullptr;  ///< device memory, 256-byte aligned, or null when bytes == 0
  size_t bytes = 0;     ///< size of the allocation
};

/// Check @p p against the contract's rules shared by every stage: pointers, sizes, heads, D, dtype,
/// alignment and strides. Touches no GPU state, so it is safe to call anywhere.
/// @return an error naming the first offending field and its value, e.g.
///         "Hq (12) is not a multiple of Hkv (5)".
Status validate_params(const AttnParams& p);

/// The checks of validate_params() that need no pointer or stride: sizes, heads, D, dtype and
/// scale. The command-line programs run them on a shape before they look for a GPU.
Status validate_sizes(const AttnParams& p);

/// Check that a stage needing compute capability @p min_sm (e.g. 90) may run on a device of
/// compute capability @p device_sm; the message names the stage's requirement and the device's.
Status check_compute_capability(const char* stage, int min_sm, int device_sm);

/// Check that @p ws holds the @p workspace_bytes_needed bytes @p stage needs.
Status check_workspace(const char* stage, const Workspace& ws, size_t workspace_bytes_needed);

/// What every stage's launch does first: validate_params(), then the current device's compute
/// capability against @p min_sm, then the workspace size. Nothing is launched or written.
Status validate_launch(const AttnParams& p, const char* stage, int min_sm, const Workspace& ws,
                       size_t workspace_bytes_needed);

/// After a kernel launch: turn cudaGetLastError() into a Status naming @p stage.
Status check_launch(const char* stage);

}  // namespace attn
