// TPU numerics of scaled-dot-product attention (gap attention_precision): on a chip, F.scaled_dot_product_attention
// computes in bfloat16 whatever the matmul precision. The emulator's rule is a bfloat16 flash kernel's: q, k, v and
// the mask rounded to bfloat16; scores, the softmax's running max and sum in float32, keys in blocks of 512; the
// probabilities rounded to bfloat16 before they multiply v; the output rounded to bfloat16 (returned in float32).
// (Evidence and the other rules: hf_tpu/emulator/numerics.py.)
//
// Two implementations of that one rule, which differ only in float32 summation order:
//  - short queries (decode; see kShortRows): computed here, on float32 values rounded where the bfloat16 kernel
//    rounds. The other way casts q, k, v (the whole KV cache, every step) to bfloat16 and the output back, which
//    costs more than a decode step's attention itself;
//  - longer queries (prefill, training) and the backward pass: the CPU's bfloat16 flash kernel, on q, k, v cast
//    to bfloat16.
#include "aten/attention.h"
#include "aten/fallback.h"
#include "aten/numerics.h"
#include "tpu/gaps.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace hf_tpu {
namespace {

// Attention runs here for up to kShortRows query rows per head and kShortWork rows x keys: decode with up to ~1k
// cached tokens (measured: faster than casting to bfloat16 for the CPU's kernel there, slower beyond).
constexpr int64_t kShortRows = 16;
constexpr int64_t kShortWork = 1024;
constexpr int64_t kKeyBlock = 512;   // the CPU flash kernel's key block (its running max is per block)
constexpr int64_t kMaxChunks = 16;   // head dims up to 256 (16 vectors of 16) run here

// 16 floats: one AVX-512 register, two AVX2 or four SSE registers (GCC vector extensions; the clones of
// attend_group below pick the instruction set when the core loads).
using Lanes = float __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

// An attention mask in the dtype the kernel computes in. Gap fully_masked_attention_row: a
// boolean mask becomes an additive one with a large finite negative, so a row masked everywhere
// softmaxes to a uniform mix of the values instead of zeros.
c10::IValue attention_mask(const c10::IValue& mask, at::ScalarType dtype) {
  if (!mask.isTensor() || !mask.toTensor().defined()) {
    return mask;
  }
  const at::Tensor m = mask.toTensor();
  const double lowest = dtype == at::kBFloat16 ? -3.3895313892515355e38
                        : dtype == at::kHalf    ? -65504.0
                                                : -3.4028234663852886e38;
  if (m.scalar_type() == at::kBool) {
    if (!gap_enabled(Gap::kFullyMaskedAttentionRow)) {
      return mask;
    }
    return at::where(m, at::scalar_tensor(0.0, m.options().dtype(dtype)),
                     at::scalar_tensor(lowest, m.options().dtype(dtype)));
  }
  if (m.scalar_type() == dtype) {
    return mask;
  }
  return m.clamp(lowest, -lowest).to(dtype);
}

// ---- short queries: the rule computed here ---------------------------------------------------------------

// Element strides of a 4-d tensor (batch, head, row, column); 0 where a mask broadcasts.
struct Strides4 {
  int64_t b, h, r, c;
};

Strides4 strides_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

struct ShortQuery {
  const float* q;
  const float* k;
  const float* v;
  const c10::BFloat16* mask;  // null: no mask
  float* out;
  float* lse;
  Strides4 qs, ks, vs, ms, os;
  int64_t lse_b, lse_h, lse_r;
  int64_t heads, kv_heads, rows, keys, dim;
  float scale;
  bool causal;
};

// Per-thread scratch: one group's rounded keys and values (rows padded to whole vectors), a query row, scores.
struct Scratch {
  std::vector<float> keys, values, query, scores;
};

__attribute__((always_inline)) inline Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void store(float* p, Lanes v) {
  std::memcpy(p, &v, sizeof(v));
}
__attribute__((always_inline)) inline float sum_lanes(Lanes v) {  // pairwise: 4 shuffles and adds
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  return v[0] + v[1];
}

using Bits = uint32_t __attribute__((vector_size(64)));

// bf16_rounded on 16 lanes.
__attribute__((always_inline)) inline Lanes round_lanes(Lanes x) {
  Bits bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const Bits rounded = (bits + ((bits >> 16) & 1U) + 0x7fffU) & 0xffff0000U;
  bits = (bits & 0x7fffffffU) > 0x7f800000U ? Bits{} + 0x7fc00000U : rounded;  // NaN stays NaN
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// exp on 16 lanes, within about 1 ulp of float32 expf (Cody-Waite reduction by ln 2, Cephes' degree-6
// polynomial); results below float32's normal range are 0 (a probability that small cannot move a sum >= 1).
__attribute__((always_inline)) inline Lanes exp_lanes(Lanes x) {
  const Lanes clamped = x < 88.3762626647949F ? x : Lanes{} + 88.3762626647949F;
  const Lanes n = (clamped * 1.44269504088896341F + 12582912.0F) - 12582912.0F;  // nearest integer (1.5 * 2^23)
  const Lanes r = (clamped - n * 0.693359375F) - n * -2.12194440e-4F;
  Lanes p = Lanes{} + 1.9875691500E-4F;
  p = p * r + 1.3981999507E-3F;
  p = p * r + 8.3334519073E-3F;
  p = p * r + 4.1665795894E-2F;
  p = p * r + 1.6666665459E-1F;
  p = p * r + 5.0000001201E-1F;
  p = p * r * r + r + 1.0F;
  using Ints = int32_t __attribute__((vector_size(64)));
  const Ints exponent = (__builtin_convertvector(n, Ints) + 127) << 23;  // 2^n
  Lanes scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  p *= scale;
  p = x < -87.3365447505531F ? Lanes{} : p;
  return x != x ? x : p;  // NaN stays NaN
}

// A row of `n` values rounded to bfloat16, zero-padded to `padded` (a whole number of vectors).
__attribute__((always_inline)) inline void round_row(const float* src, int64_t stride, int64_t n, int64_t padded,
                                                     float* dst) {
  int64_t d = 0;
  if (stride == 1) {
    for (; d + kLanes <= n; d += kLanes) {
      store(dst + d, round_lanes(load(src + d)));
    }
  }
  for (; d < n; ++d) {
    dst[d] = bf16_rounded(src[d * stride]);
  }
  for (; d < padded; ++d) {
    dst[d] = 0.0F;
  }
}

// The query heads that share kv head `kv_head` of batch `b` (all of them when there is no GQA).
// Products of bfloat16 values are exact in float32, so only the order of the float32 sums differs from the
// CPU's bfloat16 kernel: here each score sums 16 lanes (then the lanes), and the output sums 4 streams of keys.
__attribute__((target_clones("avx512f", "avx2", "default"))) void attend_group(const ShortQuery& a, int64_t b,
                                                                              int64_t kv_head, Scratch& s) {
  const int64_t keys = a.keys;
  const int64_t dim = a.dim;
  const int64_t padded = (dim + kLanes - 1) / kLanes * kLanes;
  s.keys.resize(static_cast<size_t>(keys * padded));
  s.values.resize(static_cast<size_t>(keys * padded));
  s.query.resize(static_cast<size_t>(padded));
  s.scores.resize(static_cast<size_t>((std::min(keys, kKeyBlock) + kLanes - 1) / kLanes * kLanes));
  float* kr = s.keys.data();
  float* vr = s.values.data();
  float* qr = s.query.data();
  float* sc = s.scores.data();
  const float* k = a.k + b * a.ks.b + kv_head * a.ks.h;
  const float* v = a.v + b * a.vs.b + kv_head * a.vs.h;
  for (int64_t j = 0; j < keys; ++j) {
    round_row(k + j * a.ks.r, a.ks.c, dim, padded, kr + j * padded);
    round_row(v + j * a.vs.r, a.vs.c, dim, padded, vr + j * padded);
  }
  const int64_t group = a.heads / a.kv_heads;
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    for (int64_t i = 0; i < a.rows; ++i) {
      round_row(a.q + b * a.qs.b + h * a.qs.h + i * a.qs.r, a.qs.c, dim, padded, qr);
      const c10::BFloat16* mask = a.mask != nullptr ? a.mask + b * a.ms.b + h * a.ms.h + i * a.ms.r : nullptr;
      const int64_t end = a.causal ? std::min(i + 1, keys) : keys;  // causal: top-left aligned, as the CPU's
      float max = kMinusInf;
      float sum = 0.0F;
      const int64_t chunks = padded / kLanes;
      Lanes acc[4][kMaxChunks];  // four streams of keys, summed at the end
      for (auto& stream : acc) {
        for (int64_t c = 0; c < chunks; ++c) {
          stream[c] = Lanes{};
        }
      }
      for (int64_t n0 = 0; n0 < end; n0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, end - n0);
        float block_max = kMinusInf;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = kr + (n0 + j) * padded;
          Lanes dot = {};
          for (int64_t c = 0; c < padded; c += kLanes) {
            dot += load(qr + c) * load(kj + c);
          }
          float score = sum_lanes(dot) * a.scale;
          if (mask != nullptr) {
            score += static_cast<float>(mask[(n0 + j) * a.ms.c]);
          }
          sc[j] = score;
          block_max = std::max(block_max, score);
        }
        const float new_max = std::max(max, block_max);
        if (new_max == kMinusInf) {
          continue;  // nothing to attend to yet: probabilities 0, sums unchanged
        }
        // The probabilities that multiply v, in bfloat16; their sum unrounded, as the kernel's. The block's
        // scores are padded with -inf to whole vectors (probability 0).
        for (int64_t j = n; j % kLanes != 0; ++j) {
          sc[j] = kMinusInf;
        }
        Lanes block_sum = {};
        for (int64_t j = 0; j < n; j += kLanes) {
          const Lanes p = exp_lanes(load(sc + j) - new_max);
          block_sum += p;
          store(sc + j, round_lanes(p));
        }
        const float rescale = std::exp(max - new_max);  // 0 while max is -inf
        sum = sum_lanes(block_sum) + rescale * sum;
        max = new_max;
        if (n0 > 0) {
          for (auto& stream : acc) {
            for (int64_t c = 0; c < chunks; ++c) {
              stream[c] *= rescale;
            }
          }
        }
        for (int64_t j = 0; j < n; ++j) {
          Lanes* stream = acc[j % 4];
          const float* vj = vr + (n0 + j) * padded;
          for (int64_t c = 0; c < chunks; ++c) {
            stream[c] += sc[j] * load(vj + c * kLanes);
          }
        }
      }
      // A row with nothing to attend to: output 0 and logsumexp 0, as the CPU kernel.
      max = max == kMinusInf ? 0.0F : max;
      sum = sum == 0.0F ? 1.0F : sum;
      const float reciprocal = 1.0F / sum;
      float* out = a.out + b * a.os.b + h * a.os.h + i * a.os.r;
      for (int64_t c = 0; c < chunks; ++c) {
        const Lanes total = round_lanes(((acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c])) * reciprocal);
        const int64_t d0 = c * kLanes;
        if (a.os.c == 1 && d0 + kLanes <= dim) {
          store(out + d0, total);
          continue;
        }
        for (int64_t l = 0; l < kLanes && d0 + l < dim; ++l) {
          out[(d0 + l) * a.os.c] = total[l];
        }
      }
      a.lse[b * a.lse_b + h * a.lse_h + i * a.lse_r] = max + std::log(sum);
    }
  }
}

// The mask's strides over (batch, head, row, key), broadcasting size-1 dimensions; false if its shape is not
// one the CPU kernel takes (it then runs, and raises its own error).
bool mask_strides(const at::Tensor& mask, int64_t batch, int64_t heads, int64_t rows, int64_t keys, Strides4& out) {
  if (mask.dim() == 2) {
    if (mask.size(0) != rows && mask.size(0) != 1) {
      return false;
    }
    out = {0, 0, mask.size(0) == 1 ? 0 : mask.stride(0), mask.stride(1)};
    return mask.size(1) == keys;
  }
  if (mask.dim() != 4 || mask.size(3) != keys) {
    return false;
  }
  const int64_t want[3] = {batch, heads, rows};
  int64_t stride[3];
  for (int d = 0; d < 3; ++d) {
    if (mask.size(d) != want[d] && mask.size(d) != 1) {
      return false;
    }
    stride[d] = mask.size(d) == 1 ? 0 : mask.stride(d);
  }
  out = {stride[0], stride[1], stride[2], mask.stride(3)};
  return true;
}

bool is_short_query(const torch::jit::Stack& stack, size_t begin) {
  if (!is_f32(stack[begin]) || !is_f32(stack[begin + 1]) || !is_f32(stack[begin + 2]) ||
      stack[begin + 3].toDouble() != 0.0) {
    return false;
  }
  const at::Tensor& q = stack[begin].toTensor();
  const at::Tensor& k = stack[begin + 1].toTensor();
  const at::Tensor& v = stack[begin + 2].toTensor();
  const bool shapes = q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == k.size(0) &&
                      q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0;  // else: the kernel's error
  return shapes && q.size(3) <= kMaxChunks * kLanes && k.size(2) > 0 && q.size(2) <= kShortRows &&
         q.size(2) * k.size(2) <= kShortWork;
}

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
// -> (output, logsumexp), for short float32 queries; false leaves the stack to the CPU kernel.
bool short_query_attention(torch::jit::Stack* stack, size_t begin) {
  if (!is_short_query(*stack, begin)) {
    return false;
  }
  const at::Tensor q = (*stack)[begin].toTensor();
  const at::Tensor k = (*stack)[begin + 1].toTensor();
  const at::Tensor v = (*stack)[begin + 2].toTensor();
  const int64_t batch = q.size(0), heads = q.size(1), rows = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  at::Tensor mask;
  Strides4 ms{0, 0, 0, 0};
  if (const c10::IValue& m = (*stack)[begin + 5]; m.isTensor() && m.toTensor().defined()) {
    mask = m.toTensor();
    if (mask.scalar_type() != at::kBFloat16 || !mask_strides(mask, batch, heads, rows, keys, ms)) {
      return false;
    }
  }
  const std::optional<double> scale = (*stack)[begin + 6].toOptional<double>();
  at::Tensor out = at::empty_like(q);  // the CPU kernel's layouts: output like the query, logsumexp (B, L, H)
  at::Tensor lse = at::empty({batch, rows, heads}, q.options()).transpose(1, 2);
  ShortQuery a{q.const_data_ptr<float>(),
               k.const_data_ptr<float>(),
               v.const_data_ptr<float>(),
               mask.defined() ? mask.const_data_ptr<c10::BFloat16>() : nullptr,
               out.mutable_data_ptr<float>(),
               lse.mutable_data_ptr<float>(),
               strides_of(q),
               strides_of(k),
               strides_of(v),
               ms,
               strides_of(out),
               lse.stride(0),
               lse.stride(1),
               lse.stride(2),
               heads,
               kv_heads,
               rows,
               keys,
               dim,
               static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(dim))),
               (*stack)[begin + 4].toBool()};
  // Decode's whole attention is smaller than a thread's start-up: split only larger problems.
  const int64_t work = (heads / kv_heads) * rows * keys * dim;
  at::parallel_for(0, batch * kv_heads, std::max<int64_t>(1, 262144 / std::max<int64_t>(work, 1)),
                   [&](int64_t lo, int64_t hi) {
                     thread_local Scratch scratch;
                     for (int64_t g = lo; g < hi; ++g) {
                       attend_group(a, g / kv_heads, g % kv_heads, scratch);
                     }
                   });
  torch::jit::drop(*stack, 7);
  stack->emplace_back(std::move(out));
  stack->emplace_back(std::move(lse));
  return true;
}

// ---- the rules around the CPU kernels --------------------------------------------------------------------

// Whether this thread's current attention call computes in bfloat16 (set before, read after the kernel).
thread_local bool t_attention_in_bf16 = false;

void to_bf16(c10::IValue& iv) {
  iv = iv.toTensor().to(at::kBFloat16);
}

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
void flash_before(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t begin,
                  const std::vector<c10::IValue>& /*device_args*/) {
  t_attention_in_bf16 = gap_enabled(Gap::kAttentionPrecision) && is_f32((*stack)[begin]);
  const at::ScalarType dtype = t_attention_in_bf16 ? at::kBFloat16 : (*stack)[begin].toTensor().scalar_type();
  (*stack)[begin + 5] = attention_mask((*stack)[begin + 5], dtype);
}

// In bfloat16: a short query computed here, any other on the CPU's bfloat16 kernel.
bool flash_instead(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t begin) {
  if (!t_attention_in_bf16) {
    return false;
  }
  if (short_query_attention(stack, begin)) {
    return true;
  }
  for (int i = 0; i < 3; ++i) {
    to_bf16((*stack)[begin + i]);
  }
  return false;
}

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
//     dropout_p, is_causal, *, attn_mask, scale)
void flash_backward_before(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t begin,
                           const std::vector<c10::IValue>& /*device_args*/) {
  t_attention_in_bf16 = gap_enabled(Gap::kAttentionPrecision) && is_f32((*stack)[begin + 1]);
  const at::ScalarType dtype = t_attention_in_bf16 ? at::kBFloat16 : (*stack)[begin + 1].toTensor().scalar_type();
  if (t_attention_in_bf16) {
    for (int i = 0; i < 5; ++i) {
      to_bf16((*stack)[begin + i]);
    }
  }
  (*stack)[begin + 8] = attention_mask((*stack)[begin + 8], dtype);
}

// Outputs computed in bfloat16 (the attention output, or the three gradients) back to float32.
template <int N>
void attention_after(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t rbegin) {
  if (!t_attention_in_bf16) {
    return;
  }
  t_attention_in_bf16 = false;
  for (int i = 0; i < N; ++i) {
    c10::IValue& iv = (*stack)[rbegin + i];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().scalar_type() == at::kBFloat16) {
      iv = iv.toTensor().to(at::kFloat);
    }
  }
}

const OpRule kFlashRule{&flash_before, &attention_after<1>, &flash_instead};
const OpRule kFlashBackwardRule{&flash_backward_before, &attention_after<3>};

}  // namespace

void attention_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, &kFlashRule);
}

void attention_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, &kFlashBackwardRule);
}

}  // namespace hf_tpu
