// Fused CPU forward and backward of one step of the additive (Bahdanau) and location-aware
// (Chorowski et al. 2015) attention of asr/models/attention.py, for one head.
//
// Per utterance b, frame t (PK the projected keys, K the keys, q the projected query):
//   loc[t, c] = sum_j conv_w[c, j] * p(t + j - K_w / 2)     p: the previous weights, 0 on padded
//                                                          frames and outside the utterance
//   z[t]      = PK[t] + q + loc_w loc[t]                     (additive: no loc term)
//   e[t]      = scaling * v . tanh(z[t]) + bias[t]           (-inf on frames not allowed)
//   w         = softmax(e);   context = sum_t w[t] K[t]
//
// Why it is fast: autograd runs this step as a dozen passes over (T, dim) tensors, each with its
// own temporary, and as many again in backward (where every step's gradient of the projected keys is
// accumulated in another pass). Here each frame's row is computed once, in cache, and backward
// reads only the saved tanh(z) rows; frames a row may not attend (padding, a window) are skipped.
// Utterances run in parallel (at::parallel_for over b); the parameter gradients are summed per
// utterance and reduced in a fixed order, so results do not depend on the number of threads.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fast_math.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

using namespace asr_math;

// exp for the softmax: 0 where float's exp underflows (exp_approx clamps there, which would leave every
// frame far from the attention's peak with a tiny weight instead of none).
inline float softmax_exp(float x) { return x < -87.3f ? 0.f : exp_approx(x); }
inline double softmax_exp(double x) { return std::exp(x); }

// Denormal numbers flushed to zero while an operator runs (restored after): a sharp attention, or the
// diagonal prior's energies, leave most frames' weights and gradients far below float's smallest normal
// number, and arithmetic on denormals is many times slower. Frames whose weight is exactly 0 are skipped.
struct FlushDenormals {
#if defined(__SSE__)
  unsigned int saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }  // flush-to-zero and denormals-are-zero
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// A dot product of a short vector (a frame's dim or key values): 16 partial sums, where fast_math.h's
// dot keeps 64 and then spends longer adding them up than on the products.
template <typename T>
inline T dot16(const T* __restrict__ x, const T* __restrict__ y, int64_t n) {
  T acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l] * y[i + l];
  T s = 0;
  for (int l = 0; l < 16; ++l) s += acc[l];
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

struct Shapes {
  int64_t B, T, D, H, C, KW;  // batch, frames, attention dim, key size, location channels, filter width
  bool location, has_bias;
};

Shapes check_inputs(const at::Tensor& pk, const at::Tensor& keys, const at::Tensor& mask,
                    const at::Tensor& allowed, const at::Tensor& prev, const at::Tensor& conv_w,
                    const at::Tensor& loc_w, const at::Tensor& v, const at::Tensor& bias) {
  TORCH_CHECK(pk.dim() == 3 && pk.is_contiguous(), "attention: projected keys must be contiguous (B, T, dim)");
  Shapes s{};
  s.B = pk.size(0);
  s.T = pk.size(1);
  s.D = pk.size(2);
  TORCH_CHECK(keys.dim() == 3 && keys.size(0) == s.B && keys.size(1) == s.T && keys.is_contiguous(),
              "attention: keys must be contiguous (B, T, H)");
  s.H = keys.size(2);
  for (const at::Tensor* m : {&mask, &allowed})
    TORCH_CHECK(m->scalar_type() == at::kBool && m->dim() == 2 && m->size(0) == s.B && m->size(1) == s.T &&
                    m->is_contiguous(),
                "attention: masks must be contiguous bool (B, T)");
  TORCH_CHECK(v.numel() == s.D, "attention: v must have dim elements");
  s.location = conv_w.numel() > 0;
  if (s.location) {
    TORCH_CHECK(conv_w.dim() == 2 && conv_w.is_contiguous(), "attention: conv_w must be contiguous (C, width)");
    s.C = conv_w.size(0);
    s.KW = conv_w.size(1);
    TORCH_CHECK(s.KW % 2 == 1, "attention: the location filter width must be odd");
    TORCH_CHECK(loc_w.dim() == 2 && loc_w.size(0) == s.D && loc_w.size(1) == s.C, "attention: loc_w must be (dim, C)");
    TORCH_CHECK(prev.dim() == 2 && prev.size(0) == s.B && prev.size(1) == s.T && prev.is_contiguous(),
                "attention: previous weights must be contiguous (B, T)");
  }
  s.has_bias = bias.numel() > 0;
  if (s.has_bias)
    TORCH_CHECK(bias.dim() == 2 && bias.size(0) == s.B && bias.size(1) == s.T && bias.is_contiguous(),
                "attention: bias must be contiguous (B, T)");
  return s;
}

// The previous weights p (T) of one utterance with its padded frames zeroed, into pm (T + width - 1):
// width / 2 zeros, the T frames, width / 2 zeros.
template <typename T>
void padded_previous(const Shapes& s, const T* p, const bool* valid, T* pm) {
  const int64_t pad = s.KW / 2;
  std::fill(pm, pm + s.T + s.KW - 1, T(0));
  for (int64_t f = 0; f < s.T; ++f) pm[pad + f] = valid[f] ? p[f] : T(0);
}

// locT (C, T): locT[c][t] = sum_j conv_w[c][j] pm[t + j], one vectorised pass over t per tap.
template <typename T>
void location_features(const Shapes& s, const T* pm, const T* conv_w, T* locT) {
  for (int64_t c = 0; c < s.C; ++c) {
    T* out = locT + c * s.T;
    std::fill(out, out + s.T, T(0));
    for (int64_t j = 0; j < s.KW; ++j) {
      const T w = conv_w[c * s.KW + j];
      const T* in = pm + j;
      for (int64_t t = 0; t < s.T; ++t) out[t] += w * in[t];
    }
  }
}

// One attended frame's backward: dz = dd v (1 - tanh(z)^2); dz is added to the projected keys' and the
// query's gradients, dd tanh(z) to v's.
template <typename T>
inline void frame_backward(int64_t n, T dd, const T* __restrict__ v, const T* __restrict__ g, T* __restrict__ dz,
                           T* __restrict__ dpk, T* __restrict__ dq, T* __restrict__ dv) {
  for (int64_t d = 0; d < n; ++d) {
    const T x = dd * v[d] * (T(1) - g[d] * g[d]);
    dz[d] = x;
    dpk[d] += x;
    dq[d] += x;
    dv[d] += dd * g[d];
  }
}

// y += a x
template <typename T>
inline void axpy(int64_t n, T a, const T* __restrict__ x, T* __restrict__ y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

// Returns [context (B, H), weights (B, T), tanh(z) (B, T, dim), loc (B, C, T)]; the last two are
// what backward needs, empty unless save (loc also without location).
std::vector<at::Tensor> attention_forward(const at::Tensor& pk, const at::Tensor& keys, const at::Tensor& mask,
                                          const at::Tensor& allowed, const at::Tensor& prev, const at::Tensor& q,
                                          const at::Tensor& conv_w, const at::Tensor& loc_w, const at::Tensor& v,
                                          const at::Tensor& bias, double scaling, bool save) {
  const Shapes s = check_inputs(pk, keys, mask, allowed, prev, conv_w, loc_w, v, bias);
  TORCH_CHECK(q.dim() == 2 && q.size(0) == s.B && q.size(1) == s.D, "attention: query must be (B, dim)");
  auto opts = pk.options();
  at::Tensor context = at::empty({s.B, s.H}, opts);
  at::Tensor weights = at::empty({s.B, s.T}, opts);
  at::Tensor gates = at::empty({save ? s.B : 0, s.T, s.D}, opts);  // rows of frames not attended stay unset
  at::Tensor loc = save && s.location ? at::empty({s.B, s.C, s.T}, opts) : at::empty({0}, opts);
  AT_DISPATCH_FLOATING_TYPES(pk.scalar_type(), "attention_forward", [&] {
    using T = scalar_t;
    const at::Tensor qc = q.contiguous(), vc = v.contiguous();
    const at::Tensor loc_wt = s.location ? loc_w.t().contiguous() : loc_w;  // (C, dim): rows added to z
    const T *PK = pk.const_data_ptr<T>(), *K = keys.const_data_ptr<T>(), *Q = qc.const_data_ptr<T>();
    const T* V = vc.const_data_ptr<T>();
    const bool *M = mask.const_data_ptr<bool>(), *A = allowed.const_data_ptr<bool>();
    const T* P = s.location ? prev.const_data_ptr<T>() : nullptr;
    const T* CW = s.location ? conv_w.const_data_ptr<T>() : nullptr;
    const T* LW = s.location ? loc_wt.const_data_ptr<T>() : nullptr;
    const T* BI = s.has_bias ? bias.const_data_ptr<T>() : nullptr;
    T *CTX = context.mutable_data_ptr<T>(), *W = weights.mutable_data_ptr<T>();
    T* G = save ? gates.mutable_data_ptr<T>() : nullptr;
    T* L = save && s.location ? loc.mutable_data_ptr<T>() : nullptr;
    at::parallel_for(0, s.B, 1, [&](int64_t begin, int64_t end) {
      FlushDenormals flushed;
      std::vector<T> z(s.D), own_loc(s.location && !L ? s.C * s.T : 0), pm(s.location ? s.T + s.KW - 1 : 0);
      for (int64_t b = begin; b < end; ++b) {
        const bool* allow = A + b * s.T;
        T* w = W + b * s.T;
        T* locb = nullptr;  // (C, T)
        if (s.location) {
          locb = L ? L + b * s.C * s.T : own_loc.data();
          padded_previous(s, P + b * s.T, M + b * s.T, pm.data());
          location_features(s, pm.data(), CW, locb);
        }
        T top = -std::numeric_limits<T>::infinity();
        for (int64_t t = 0; t < s.T; ++t) {
          if (!allow[t]) {
            w[t] = -std::numeric_limits<T>::infinity();
            continue;
          }
          const T* pkt = PK + (b * s.T + t) * s.D;
          const T* qb = Q + b * s.D;
          T* g = G ? G + (b * s.T + t) * s.D : z.data();
          for (int64_t d = 0; d < s.D; ++d) g[d] = pkt[d] + qb[d];
          for (int64_t c = 0; c < (s.location ? s.C : 0); ++c) axpy(s.D, locb[c * s.T + t], LW + c * s.D, g);
          for (int64_t d = 0; d < s.D; ++d) g[d] = tanh_(g[d]);
          T e = T(scaling) * dot16(V, g, s.D);
          if (BI) e += BI[b * s.T + t];
          w[t] = e;
          top = std::max(top, e);
        }
        T total = 0;
        for (int64_t t = 0; t < s.T; ++t) {
          w[t] = allow[t] ? softmax_exp(w[t] - top) : T(0);
          total += w[t];
        }
        T* ctx = CTX + b * s.H;
        std::fill(ctx, ctx + s.H, T(0));
        for (int64_t t = 0; t < s.T; ++t) {
          w[t] /= total;
          if (!allow[t] || w[t] == T(0)) continue;
          axpy(s.H, w[t], K + (b * s.T + t) * s.H, ctx);
        }
      }
    });
  });
  return {context, weights, gates, loc};
}

// Gradients of attention_forward's context (B, H) and weights (B, T) (either may be empty: zero) ->
// [d_pk (B, T, dim), d_keys (B, T, H), d_prev (B, T), d_q (B, dim), d_conv_w (C, width), d_loc_w (dim, C),
//  d_v (dim), d_bias (B, T)] (d_prev, d_conv_w and d_loc_w empty without location).
// d_pk_into: where non-empty, d_pk is added into it (and it is returned): a loop's steps share one
// buffer instead of each allocating, filling and adding a (B, T, dim) tensor. need_d_keys false: d_keys
// is left empty (the caller sums weights x grad_context over the loop's steps in one product).
std::vector<at::Tensor> attention_backward(const at::Tensor& grad_context, const at::Tensor& grad_weights,
                                           const at::Tensor& pk, const at::Tensor& keys, const at::Tensor& mask,
                                           const at::Tensor& allowed, const at::Tensor& prev,
                                           const at::Tensor& conv_w, const at::Tensor& loc_w, const at::Tensor& v,
                                           const at::Tensor& bias, const at::Tensor& weights,
                                           const at::Tensor& gates, const at::Tensor& loc, double scaling,
                                           const at::Tensor& d_pk_into, bool need_d_keys) {
  const Shapes s = check_inputs(pk, keys, mask, allowed, prev, conv_w, loc_w, v, bias);
  TORCH_CHECK(gates.numel() == s.B * s.T * s.D, "attention_backward: forward did not save tanh(z)");
  auto opts = pk.options();
  at::Tensor d_pk = d_pk_into.numel() ? d_pk_into : at::zeros({s.B, s.T, s.D}, opts);
  TORCH_CHECK(d_pk.sizes() == pk.sizes() && d_pk.is_contiguous() && d_pk.scalar_type() == pk.scalar_type(),
              "attention_backward: d_pk_into must be a contiguous tensor like the projected keys");
  at::Tensor d_keys = need_d_keys ? at::zeros({s.B, s.T, s.H}, opts) : at::empty({0}, opts);
  at::Tensor d_q = at::zeros({s.B, s.D}, opts);
  at::Tensor d_bias = at::zeros({s.B, s.T}, opts);
  at::Tensor d_prev = s.location ? at::zeros({s.B, s.T}, opts) : at::empty({0}, opts);
  // Per utterance, summed over b below in a fixed order.
  at::Tensor d_v_b = at::zeros({s.B, s.D}, opts);
  at::Tensor d_lw_b = s.location ? at::zeros({s.B, s.C, s.D}, opts) : at::empty({0}, opts);
  at::Tensor d_cw_b = s.location ? at::zeros({s.B, s.C, s.KW}, opts) : at::empty({0}, opts);
  AT_DISPATCH_FLOATING_TYPES(pk.scalar_type(), "attention_backward", [&] {
    using T = scalar_t;
    const at::Tensor gc = grad_context.numel() ? grad_context.contiguous() : grad_context;
    const at::Tensor gw = grad_weights.numel() ? grad_weights.contiguous() : grad_weights;
    const at::Tensor vc = v.contiguous();
    const T* GC = gc.numel() ? gc.const_data_ptr<T>() : nullptr;
    const T* GW = gw.numel() ? gw.const_data_ptr<T>() : nullptr;
    const T *K = keys.const_data_ptr<T>(), *V = vc.const_data_ptr<T>(), *WT = weights.const_data_ptr<T>();
    const T* G = gates.const_data_ptr<T>();
    const bool *M = mask.const_data_ptr<bool>(), *A = allowed.const_data_ptr<bool>();
    const T* P = s.location ? prev.const_data_ptr<T>() : nullptr;
    const T* CW = s.location ? conv_w.const_data_ptr<T>() : nullptr;
    const at::Tensor loc_wt = s.location ? loc_w.t().contiguous() : loc_w;  // (C, dim)
    const T* LWT = s.location ? loc_wt.const_data_ptr<T>() : nullptr;
    const T* L = s.location ? loc.const_data_ptr<T>() : nullptr;
    T *DPK = d_pk.mutable_data_ptr<T>(), *DK = need_d_keys ? d_keys.mutable_data_ptr<T>() : nullptr;
    T* DQ = d_q.mutable_data_ptr<T>();
    T *DB = d_bias.mutable_data_ptr<T>(), *DV = d_v_b.mutable_data_ptr<T>();
    T* DP = s.location ? d_prev.mutable_data_ptr<T>() : nullptr;
    T* DLW = s.location ? d_lw_b.mutable_data_ptr<T>() : nullptr;
    T* DCW = s.location ? d_cw_b.mutable_data_ptr<T>() : nullptr;
    at::parallel_for(0, s.B, 1, [&](int64_t begin, int64_t end) {
      FlushDenormals flushed;
      std::vector<T> ge(s.T), dz(s.D), dl(s.location ? s.C * s.T : 0), pm(s.location ? s.T + s.KW - 1 : 0),
          dpm(s.location ? s.T + s.KW - 1 : 0);
      for (int64_t b = begin; b < end; ++b) {
        const bool* allow = A + b * s.T;
        const T* w = WT + b * s.T;
        // d loss / d weights, through the context as well
        T inner = 0;
        for (int64_t t = 0; t < s.T; ++t) {
          if (!allow[t] || w[t] == T(0)) {  // no share in the context, the softmax's backward gives 0
            ge[t] = 0;
            continue;
          }
          T g = GW ? GW[b * s.T + t] : T(0);
          if (GC) {
            const T* kt = K + (b * s.T + t) * s.H;
            const T* gcb = GC + b * s.H;
            g += dot16(gcb, kt, s.H);
            if (DK) {
              T* dkt = DK + (b * s.T + t) * s.H;
              for (int64_t h = 0; h < s.H; ++h) dkt[h] = w[t] * gcb[h];
            }
          }
          ge[t] = g;
          inner += w[t] * g;
        }
        T* dqb = DQ + b * s.D;
        T* dvb = DV + b * s.D;
        T* dlwb = s.location ? DLW + b * s.C * s.D : nullptr;
        std::fill(dl.begin(), dl.end(), T(0));  // (C, T), zero on the frames not attended
        for (int64_t t = 0; t < s.T; ++t) {
          if (!allow[t] || w[t] == T(0)) continue;
          const T de = w[t] * (ge[t] - inner);  // softmax backward: d loss / d e[t]
          DB[b * s.T + t] = de;
          const T dd = T(scaling) * de;  // d loss / d (v . tanh z)
          frame_backward(s.D, dd, V, G + (b * s.T + t) * s.D, dz.data(), DPK + (b * s.T + t) * s.D, dqb, dvb);
          if (!s.location) continue;
          for (int64_t c = 0; c < s.C; ++c) {
            dl[c * s.T + t] = dot16(dz.data(), LWT + c * s.D, s.D);  // d loss / d loc[c][t]
            axpy(s.D, L[(b * s.C + c) * s.T + t], dz.data(), dlwb + c * s.D);
          }
        }
        if (!s.location) continue;
        // Through the location filter to the previous weights (zero on padding) and the filter: the
        // forward's correlation transposed, one vectorised pass over t per tap.
        const int64_t pad = s.KW / 2;
        const bool* valid = M + b * s.T;
        padded_previous(s, P + b * s.T, valid, pm.data());
        std::fill(dpm.begin(), dpm.end(), T(0));
        T* dcw = DCW + b * s.C * s.KW;
        for (int64_t c = 0; c < s.C; ++c) {
          const T* g = dl.data() + c * s.T;
          for (int64_t j = 0; j < s.KW; ++j) {
            const T tap = CW[c * s.KW + j];
            T* out = dpm.data() + j;
            for (int64_t t = 0; t < s.T; ++t) out[t] += tap * g[t];
            dcw[c * s.KW + j] = dot(g, pm.data() + j, s.T);
          }
        }
        T* dp = DP + b * s.T;
        for (int64_t f = 0; f < s.T; ++f) dp[f] = valid[f] ? dpm[pad + f] : T(0);
      }
    });
  });
  at::Tensor d_v = d_v_b.sum(0);
  at::Tensor d_loc_w = s.location ? d_lw_b.sum(0).t().contiguous() : at::empty({0}, opts);
  at::Tensor d_conv_w = s.location ? d_cw_b.sum(0) : at::empty({0}, opts);
  return {d_pk, d_keys, d_prev, d_q, d_conv_w, d_loc_w, d_v, d_bias};
}

TORCH_LIBRARY(asr_attention, m) {
  m.def("forward", &attention_forward);
  m.def("backward", &attention_backward);
}
