/// @file tma.h
/// @brief Tensor maps for Hopper's tensor-memory accelerator (TMA), encoded on the host.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap and its enums (header only: the driver is reached at run time)

#include "params.h"
#include "status.h"

namespace attn {

/// A tiled tensor map over a tensor of 16-bit elements (@p dtype) at @p base: @p rank dimensions
/// (2 to 5), innermost first, with sizes @p dims (elements), @p strides_bytes[i] the bytes between
/// consecutive indices of dimension i + 1 (rank - 1 of them; multiples of 16), and a box of
/// @p box elements per dimension (each at most 256; box[0] = 64, 128 bytes, as the 128-byte
/// swizzle needs). Shared memory receives the box in the 128-byte swizzled layout; elements
/// outside the tensor arrive as zeros. cuTensorMapEncodeTiled is reached through
/// cudaGetDriverEntryPointByVersion, so nothing links libcuda.
/// @p what names the tensor in error messages (e.g. "q").
Status encode_tensor_map(CUtensorMap* out, const void* base, DType dtype, int rank,
                         const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                         const char* what);

}  // namespace attn
