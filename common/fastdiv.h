/// @file fastdiv.h
/// @brief Division by a divisor fixed at launch, by multiplication: a helper no stage is about.
///        A division by a run-time value compiles to about 20 dependent instructions; a kernel
///        that decodes a work item into (split, query block, head, batch) pays three of them per
///        item. With the divisor's multiplier computed once on the host, each is a multiply-high,
///        an add and a shift (Granlund and Montgomery, "Division by invariant integers using
///        multiplication", PLDI 1994, section 4).
///        CCCL has such a divider only in an internal namespace (cub::detail), so it is written here.
#pragma once

#include <cstdint>

/// Host and device under nvcc, host only in a C++ compiler (test_cpu includes this header).
#if defined(__CUDACC__)
#define ATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ATTN_HOST_DEVICE inline
#endif

namespace attn {

/// n / d for 0 <= n <= 2^31 and a divisor 1 <= d < 2^31 (the remainder is n - (n / d) d, with the
/// caller's d). With l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 (under 2^32, since
/// 2^l - d < d): n / d = (mulhi(m, n) + n) >> l, where mulhi(m, n) < n keeps the sum under 2^32 for
/// n <= 2^31. Eight bytes, without d: it travels in kernel parameters, which a launch copies.
struct FastDiv {
  uint32_t m = 1;  ///< the multiplier m (d = 1: m = 1 and l = 0 give (0 + n) >> 0 = n)
  uint32_t l = 0;  ///< the shift l = ceil(log2 d)

  /// Division by 1.
  FastDiv() = default;
  /// The multiplier and shift of divisor @p d (1 <= d < 2^31), on the host.
  explicit FastDiv(uint32_t d) {
    while ((uint64_t{1} << l) < d) ++l;
    m = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << l) - d) / d + 1);
  }

  /// n / d.
  ATTN_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(m, n);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{m} * n) >> 32);
#endif
    return (hi + n) >> l;
  }
};

}  // namespace attn
