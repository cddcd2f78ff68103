// Division by a value known only at run time but fixed for a launch (a count of splits, query
// blocks or heads). A 32-bit division by a register is a chain of about twenty dependent
// instructions on the GPU; with a multiplier that the host works out once, it is a multiply-high,
// an add and a shift (Granlund and Montgomery, "Division by invariant integers using
// multiplication", PLDI 1994, section 4): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s for every n < 2^32, when
// the add is done in 33 bits. Here n < 2^31, so the add fits in 32.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTN_HOST_DEVICE __host__ __device__
#else
#define ATTN_HOST_DEVICE
#endif

namespace attn {

struct FastDiv {
  unsigned d, m, s;  // divisor (1 <= d < 2^31), multiplier, shift

  // m for divisor d, on the host (a 64-bit division): a kernel gets d and m as parameters.
  static unsigned multiplier(unsigned d) {
    const unsigned s = ceil_log2(d);
    return static_cast<unsigned>((uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1);
  }
  ATTN_HOST_DEVICE FastDiv(unsigned divisor, unsigned mult)
      : d(divisor), m(mult), s(ceil_log2(divisor)) {}

  // n / d, for n < 2^31.
  ATTN_HOST_DEVICE unsigned div(unsigned n) const {
#if defined(__CUDA_ARCH__)
    const unsigned hi = __umulhi(n, m);
#else
    const unsigned hi = static_cast<unsigned>((uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
  // n % d, given q = n / d.
  ATTN_HOST_DEVICE unsigned mod(unsigned n, unsigned q) const { return n - q * d; }

  ATTN_HOST_DEVICE static unsigned ceil_log2(unsigned d) {  // 0 for d = 1
#if defined(__CUDA_ARCH__)
    return 32 - __clz(d - 1);
#else
    unsigned s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    return s;
#endif
  }
};

}  // namespace attn
