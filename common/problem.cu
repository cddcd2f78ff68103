// Device data of a problem: allocation with layout strides, random fill, poison, download.
#include "problem.h"

#include <cmath>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <curand_kernel.h>

namespace attn {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

// normal(0,1) rounded to the element type: each thread draws four values from its own Philox
// subsequence, so the result depends only on (seed, index), not on the launch shape.
template <typename T>
__global__ void fill_normal_kernel(T* data, int64_t n, uint64_t seed) {
  const int64_t i4 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i4 >= n) return;
  curandStatePhilox4_32_10_t state;
  curand_init(seed, static_cast<unsigned long long>(i4 / 4), 0, &state);
  const float4 r = curand_normal4(&state);
  const float vals[4] = {r.x, r.y, r.z, r.w};
  for (int e = 0; e < 4 && i4 + e < n; ++e) data[i4 + e] = static_cast<T>(vals[e]);
}

Status fill_normal(void* data, int64_t n, DType dtype, uint64_t seed, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = (n + 4 * kThreads - 1) / (4 * kThreads);
  if (dtype == DType::f16) {
    fill_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<__half*>(data), n, seed);
  } else {
    fill_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), n,
                                                                                seed);
  }
  return cuda_status(cudaGetLastError(), "fill_normal launch");
}

// Host-side decode of one stored element.
float element_to_float(uint16_t bits, DType dtype) {
  if (dtype == DType::f16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  uint32_t word = static_cast<uint32_t>(bits) << 16;  // bf16 is the top half of an fp32
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

constexpr uint16_t kPoison16 = (kPoisonByte << 8) | kPoisonByte;

}  // namespace

Problem::Strides Problem::strides_for(const ProblemShape& s, int64_t seq_len, int64_t heads) {
  Strides st;
  if (s.layout == Layout::BSHD) {
    st.head = s.d;
    st.seq = heads * s.d + s.seq_pad;
    st.batch = seq_len * st.seq;
  } else {
    st.seq = s.d + s.seq_pad;
    st.head = seq_len * st.seq;
    st.batch = heads * st.head;
  }
  st.elems = s.b * st.batch;
  return st;
}

Status Problem::create(const ProblemShape& shape, int input_sets, bool with_lse, Problem* out) {
  if (input_sets < 1) return Status::Error("input_sets (" + std::to_string(input_sets) + ") must be >= 1");
  Problem p;
  p.shape_ = shape;
  p.with_lse_ = with_lse;
  p.q_ = strides_for(shape, shape.sq, shape.hq);
  p.kv_ = strides_for(shape, shape.sk, shape.hkv);
  p.o_ = p.q_;
  p.sets_.resize(static_cast<size_t>(input_sets));
  const size_t elem = 2;
  for (Set& set : p.sets_) {
    ATTN_TRY(set.q.allocate(p.q_.elems * elem));
    ATTN_TRY(set.k.allocate(p.kv_.elems * elem));
    ATTN_TRY(set.v.allocate(p.kv_.elems * elem));
    ATTN_TRY(set.o.allocate(p.o_.elems * elem));
    if (with_lse) ATTN_TRY(set.lse.allocate(shape.b * shape.hq * shape.sq * sizeof(float)));
  }
  *out = std::move(p);
  return Status::Ok();
}

AttnParams Problem::params(int set) const {
  const Set& s = sets_.at(static_cast<size_t>(set));
  AttnParams p;
  p.q = s.q.get(), p.k = s.k.get(), p.v = s.v.get(), p.o = s.o.get();
  p.lse = with_lse_ ? s.lse.as<float>() : nullptr;
  p.b = shape_.b, p.hq = shape_.hq, p.hkv = shape_.hkv, p.sq = shape_.sq, p.sk = shape_.sk, p.d = shape_.d;
  p.q_batch_stride = q_.batch, p.q_seq_stride = q_.seq, p.q_head_stride = q_.head;
  p.k_batch_stride = kv_.batch, p.k_seq_stride = kv_.seq, p.k_head_stride = kv_.head;
  p.v_batch_stride = kv_.batch, p.v_seq_stride = kv_.seq, p.v_head_stride = kv_.head;
  p.o_batch_stride = o_.batch, p.o_seq_stride = o_.seq, p.o_head_stride = o_.head;
  p.dtype = shape_.dtype;
  p.causal = shape_.causal;
  p.scale = shape_.scale;
  return p;
}

Status Problem::fill_random(uint64_t seed, cudaStream_t stream) {
  uint64_t tensor_seed = seed * 0x9E3779B97F4A7C15ull;  // distinct streams per tensor and set
  for (Set& set : sets_) {
    ATTN_TRY(fill_normal(set.q.get(), q_.elems, shape_.dtype, ++tensor_seed, stream));
    ATTN_TRY(fill_normal(set.k.get(), kv_.elems, shape_.dtype, ++tensor_seed, stream));
    ATTN_TRY(fill_normal(set.v.get(), kv_.elems, shape_.dtype, ++tensor_seed, stream));
  }
  return cuda_status(cudaStreamSynchronize(stream), "fill_random");
}

Status Problem::poison_outputs(cudaStream_t stream) {
  for (Set& set : sets_) {
    ATTN_TRY(cuda_status(cudaMemsetAsync(set.o.get(), kPoisonByte, set.o.bytes(), stream), "poison O"));
    if (with_lse_) ATTN_TRY(cuda_status(cudaMemsetAsync(set.lse.get(), kPoisonByte, set.lse.bytes(), stream), "poison LSE"));
  }
  return cuda_status(cudaStreamSynchronize(stream), "poison_outputs");
}

namespace {

// Copy a strided device tensor to canonical [B][H][S][D] floats.
Status download_canonical(const DeviceBuffer& buf, const ProblemShape& shape, int64_t seq_len, int64_t heads,
                          int64_t batch_stride, int64_t seq_stride, int64_t head_stride, std::vector<float>* out) {
  std::vector<uint16_t> raw(buf.bytes() / 2);
  ATTN_TRY(cuda_status(cudaMemcpy(raw.data(), buf.get(), buf.bytes(), cudaMemcpyDeviceToHost), "download"));
  out->assign(static_cast<size_t>(shape.b * heads * seq_len * shape.d), 0.0f);
  size_t n = 0;
  for (int64_t b = 0; b < shape.b; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s = 0; s < seq_len; ++s) {
        const uint16_t* row = raw.data() + b * batch_stride + s * seq_stride + h * head_stride;
        for (int64_t d = 0; d < shape.d; ++d) (*out)[n++] = element_to_float(row[d], shape.dtype);
      }
  return Status::Ok();
}

}  // namespace

Status Problem::download_inputs(HostInputs* out, int set) const {
  const Set& s = sets_.at(static_cast<size_t>(set));
  out->shape = shape_;
  ATTN_TRY(download_canonical(s.q, shape_, shape_.sq, shape_.hq, q_.batch, q_.seq, q_.head, &out->q));
  ATTN_TRY(download_canonical(s.k, shape_, shape_.sk, shape_.hkv, kv_.batch, kv_.seq, kv_.head, &out->k));
  ATTN_TRY(download_canonical(s.v, shape_, shape_.sk, shape_.hkv, kv_.batch, kv_.seq, kv_.head, &out->v));
  return Status::Ok();
}

Status Problem::download_output(HostOutput* out, int set) const {
  const Set& s = sets_.at(static_cast<size_t>(set));
  std::vector<uint16_t> raw(s.o.bytes() / 2);
  ATTN_TRY(cuda_status(cudaMemcpy(raw.data(), s.o.get(), s.o.bytes(), cudaMemcpyDeviceToHost), "download O"));

  // Walk the whole allocation once: logical elements go to canonical order, the rest is padding.
  const ProblemShape& sh = shape_;
  out->o.assign(static_cast<size_t>(sh.b * sh.hq * sh.sq * sh.d), 0.0f);
  out->o_unwritten = 0;
  std::vector<char> logical(raw.size(), 0);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.hq; ++h)
      for (int64_t i = 0; i < sh.sq; ++i) {
        const int64_t base = b * o_.batch + i * o_.seq + h * o_.head;
        float* dst = out->o.data() + ((b * sh.hq + h) * sh.sq + i) * sh.d;
        for (int64_t d = 0; d < sh.d; ++d) {
          const uint16_t bits = raw[static_cast<size_t>(base + d)];
          logical[static_cast<size_t>(base + d)] = 1;
          out->o_unwritten += bits == kPoison16;
          dst[d] = element_to_float(bits, sh.dtype);
        }
      }
  out->padding_written = 0;
  for (size_t n = 0; n < raw.size(); ++n) out->padding_written += !logical[n] && raw[n] != kPoison16;

  out->lse.clear();
  out->lse_unwritten = 0;
  if (with_lse_) {
    std::vector<uint32_t> lse_raw(s.lse.bytes() / 4);
    ATTN_TRY(cuda_status(cudaMemcpy(lse_raw.data(), s.lse.get(), s.lse.bytes(), cudaMemcpyDeviceToHost),
                         "download LSE"));
    out->lse.resize(lse_raw.size());
    for (size_t n = 0; n < lse_raw.size(); ++n) {
      out->lse_unwritten += lse_raw[n] == 0xFFFFFFFFu;
      std::memcpy(&out->lse[n], &lse_raw[n], sizeof(float));
    }
  }
  return Status::Ok();
}

}  // namespace attn
