#include "shapes.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace attn {

std::string describe(const ProblemShape& s) {
  std::ostringstream out;
  out << "B" << s.b << " Hq" << s.hq << " Hkv" << s.hkv << " Sq" << s.sq << " Sk" << s.sk << " D" << s.d
      << " " << to_string(s.dtype) << " " << to_string(s.layout) << (s.causal ? " causal" : "");
  if (s.seq_pad != 0) out << " pad" << s.seq_pad;
  return out.str();
}

Status validate_shape(const ProblemShape& s) {
  AttnParams p;
  p.b = s.b, p.hq = s.hq, p.hkv = s.hkv, p.sq = s.sq, p.sk = s.sk, p.d = s.d;
  p.dtype = s.dtype, p.scale = s.scale;
  ATTN_TRY(validate_sizes(p));
  if (s.layout != Layout::BSHD && s.layout != Layout::BHSD) {
    return Status::Error("layout (" + std::to_string(static_cast<int>(s.layout)) +
                         ") is not supported: BSHD (0) and BHSD (1) are");
  }
  if (s.seq_pad < 0 || s.seq_pad % 8 != 0) {
    return Status::Error("seq_pad (" + std::to_string(s.seq_pad) + ") is not a non-negative multiple of 8 elements");
  }
  // Far beyond any GPU's memory, and small enough that no element offset overflows 64 bits.
  const double max_bytes = std::ldexp(1.0, 50);
  ProblemShape padded = s;  // an upper bound: every head's row padded
  padded.d = s.d + s.seq_pad;
  const double bytes = attention_bytes(padded);
  if (bytes > max_bytes) {
    std::ostringstream msg;
    msg << "the sizes (" << describe(s) << ") need " << bytes << " bytes for Q, K, V and O, more than 2^50";
    return Status::Error(msg.str());
  }
  return Status::Ok();
}

int64_t visible_keys(const ProblemShape& s, int64_t i) {
  if (!s.causal) return s.sk;
  return std::clamp<int64_t>(i + s.sk - s.sq + 1, 0, s.sk);
}

double attention_flops(const ProblemShape& s) {
  const double per_pair = 4.0 * s.d;  // Q.K^T and P.V: 2 FLOPs per multiply-add each
  double pairs = static_cast<double>(s.sq) * s.sk;
  if (s.causal && s.sq == s.sk) {
    pairs /= 2;  // FlashAttention's convention: half of the square
  } else if (s.causal) {
    pairs = 0;
    for (int64_t i = 0; i < s.sq; ++i) pairs += static_cast<double>(visible_keys(s, i));
  }
  return per_pair * s.b * s.hq * pairs;
}

double attention_bytes(const ProblemShape& s) {
  const double elem_bytes = 2.0;  // fp16 and bf16
  const double q_or_o = static_cast<double>(s.b) * s.sq * s.hq * s.d;
  const double k_or_v = static_cast<double>(s.b) * s.sk * s.hkv * s.d;
  return elem_bytes * (2 * q_or_o + 2 * k_or_v);
}

std::string to_string(ShapeKind kind) {
  switch (kind) {
    case ShapeKind::seed: return "seed";
    case ShapeKind::prefill: return "prefill";
    case ShapeKind::decode: return "decode";
    case ShapeKind::sweep: return "sweep";
  }
  return "unknown";
}

namespace {

std::vector<NamedShape> build_suite() {
  std::vector<NamedShape> suite;

  // The latency-bound case this project started from.
  ProblemShape seed;
  seed.b = 1, seed.hq = seed.hkv = 1, seed.sq = seed.sk = 128, seed.d = 64, seed.dtype = DType::f16;
  suite.push_back({"seed", ShapeKind::seed, seed, /*graph=*/true});

  // Prefill: 16,384 tokens per batch, hidden size 2048, bf16.
  constexpr int64_t kTokens = 16384, kHidden = 2048;
  for (int64_t d : {64, 128}) {
    for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384}) {
      for (bool causal : {false, true}) {
        ProblemShape p;
        p.b = kTokens / s, p.hq = p.hkv = kHidden / d, p.sq = p.sk = s, p.d = d;
        p.dtype = DType::bf16, p.causal = causal;
        std::string name = "prefill_d" + std::to_string(d) + "_s" + std::to_string(s) + (causal ? "_causal" : "");
        suite.push_back({name, ShapeKind::prefill, p, false});
      }
    }
  }

  // Decode: one query token per sequence against a long KV cache, grouped-query 32/8.
  for (int64_t b : {1, 8}) {
    for (int64_t sk : {4096, 32768, 131072}) {
      ProblemShape p;
      p.b = b, p.hq = 32, p.hkv = 8, p.sq = 1, p.sk = sk, p.d = 128, p.dtype = DType::bf16;
      suite.push_back({"decode_b" + std::to_string(b) + "_sk" + std::to_string(sk), ShapeKind::decode, p, false});
    }
  }
  // The parallelism sweep: the seed shape with more and more heads, all latency-bound. It shows
  // where a grid over (batch, head, query block) stops filling the GPU.
  for (int64_t n = 1; n <= 256; n *= 2) {
    ProblemShape p = seed;
    p.hq = p.hkv = n;
    suite.push_back({"sweep_bh" + std::to_string(n), ShapeKind::sweep, p, /*graph=*/true});
  }
  return suite;
}

}  // namespace

const std::vector<NamedShape>& shape_suite() {
  static const std::vector<NamedShape> suite = build_suite();
  return suite;
}

Status find_shape(const std::string& name, const NamedShape** out) {
  for (const NamedShape& s : shape_suite()) {
    if (s.name == name) {
      *out = &s;
      return Status::Ok();
    }
  }
  std::string names;
  for (const NamedShape& s : shape_suite()) names += (names.empty() ? "" : ", ") + s.name;
  return Status::Error("shape '" + name + "' is not in the suite; known shapes: " + names);
}

int input_sets_for(double bytes, size_t l2_bytes) {
  if (bytes <= 0) return 1;
  const double sets = std::ceil(2.0 * static_cast<double>(l2_bytes) / bytes);
  return static_cast<int>(std::clamp(sets, 1.0, 16.0));
}

std::string shapes_json(const std::vector<NamedShape>& shapes, size_t l2_bytes) {
  std::ostringstream out;
  out.precision(17);
  out << "{\"l2_bytes\": " << l2_bytes << ", \"shapes\": [\n";
  for (size_t n = 0; n < shapes.size(); ++n) {
    const NamedShape& ns = shapes[n];
    const ProblemShape& s = ns.shape;
    const float scale = s.scale != 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.d));
    out << "  {\"name\": \"" << ns.name << "\", \"kind\": \"" << to_string(ns.kind) << "\", \"b\": " << s.b
        << ", \"hq\": " << s.hq << ", \"hkv\": " << s.hkv << ", \"sq\": " << s.sq << ", \"sk\": " << s.sk
        << ", \"d\": " << s.d << ", \"dtype\": \"" << to_string(s.dtype) << "\", \"causal\": "
        << (s.causal ? "true" : "false") << ", \"layout\": \"" << to_string(s.layout) << "\", \"scale\": " << scale
        << ", \"graph\": " << (ns.graph ? "true" : "false") << ", \"flops\": " << attention_flops(s)
        << ", \"bytes\": " << attention_bytes(s) << ", \"input_sets\": "
        << input_sets_for(attention_bytes(s), l2_bytes) << "}" << (n + 1 < shapes.size() ? "," : "") << "\n";
  }
  out << "]}\n";
  return out.str();
}

}  // namespace attn
