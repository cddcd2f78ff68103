// Tensor maps: the driver's cuTensorMapEncodeTiled, found once through the runtime.
#include "tma.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

namespace attn {
namespace {

Status encoder(PFN_cuTensorMapEncodeTiled_v12000* out) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry,
                                                             12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
      error = std::string("cuTensorMapEncodeTiled is not available from the driver: ") +
              (err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found");
      return;
    }
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  });
  if (fn == nullptr) return Status::Error(error);
  *out = fn;
  return Status::Ok();
}

}  // namespace

Status encode_tensor_map(CUtensorMap* out, const void* base, DType dtype, int rank,
                         const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                         const char* what) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  ATTN_TRY(encoder(&encode));
  cuuint64_t global_dims[5];
  cuuint64_t global_strides[4];
  cuuint32_t box_dims[5];
  cuuint32_t element_strides[5];
  for (int i = 0; i < rank; ++i) {
    global_dims[i] = dims[i];
    box_dims[i] = box[i];
    element_strides[i] = 1;
  }
  for (int i = 0; i + 1 < rank; ++i) {
    // A dimension of one index never steps; TMA still wants a non-zero multiple of 16 bytes.
    global_strides[i] = strides_bytes[i] != 0 ? strides_bytes[i] : 16;
  }
  const CUresult r = encode(
      out,
      dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      static_cast<cuuint32_t>(rank), const_cast<void*>(base), global_dims, global_strides, box_dims,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string dims_text, strides_text;
    for (int i = 0; i < rank; ++i) dims_text += (i ? "," : "") + std::to_string(dims[i]);
    for (int i = 0; i + 1 < rank; ++i)
      strides_text += (i ? "," : "") + std::to_string(global_strides[i]);
    return Status::Error(std::string("tensor map of ") + what + " (dims " + dims_text +
                         ", strides " + strides_text +
                         " bytes) was refused by cuTensorMapEncodeTiled (CUresult " +
                         std::to_string(static_cast<int>(r)) + ")");
  }
  return Status::Ok();
}

}  // namespace attn
