// Fused CPU forward and backward of one (layer-normalised) LSTM layer, all directions.
//
// Computes, per direction d and valid frame (equations as in asr/models/lnlstm.py):
//   gates = LN_x(W_x x_t) + LN_h(W_h h_{t-1}) + b         i, j, f, o = split(gates)
//   c_t   = c_{t-1} * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
//   h_t   = tanh(LN_c(c_t)) * sigmoid(o)
// Without layer norm every LN is the identity. The un-normalised c_t is carried.
//
// The cell "tf_contrib" (TensorFlow's LayerNormBasicLSTMCell, asr/models/lnlstm/variants.py) is a
// branch of its own in the row kernels; the chunked products, the directions and the lengths are
// shared:
//   a     = W_x x_t + W_h h_{t-1}                         (no b, no LN_x, no LN_h)
//   i, j, f, o = LN_i(a_i), LN_j(a_j), LN_f(a_f), LN_o(a_o) each over its own H units, gain and shift
//   c_t   = LN_c(c_{t-1} * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j))
//   h_t   = tanh(c_t) * sigmoid(o)
// Here the normalised c_t is carried. Its gate norms' gains and shifts arrive in LN_h's slots
// (asr/models/lnlstm/backends/__init__.py, LAYER_INPUTS); b and LN_x are absent (empty).
//
// Why it is fast:
// * Each direction runs in its own thread (at::parallel_for over directions;
//   BLAS calls inside run single-threaded, as nested OpenMP regions do), so
//   two directions use two cores without any per-step synchronisation.
// * W_x x_t does not depend on the recurrence: it is one product per chunk of
//   time steps (chunk * B rows, large enough to run at full speed),
//   computed by the direction's thread just before the chunk is needed, so the
//   input projections of a whole sequence are never all materialised when
//   nothing is saved for backward.
// * Per time step: one small product (W_h h_{t-1} for the batch), then a
//   pass over each row fusing LN_x, LN_h, the gates, the cell, LN_c and the
//   output, in loops the compiler vectorises (a branch-free exp).
// * The products with W_h and W_x run in this file's register-blocked kernel
//   on weights packed once per call (PackedMatrix), not in BLAS, which repacks
//   the weights on every call; BLAS computes only the weight gradients.
// * The backward pass is hand-written from saved normalised values and inverse
//   standard deviations; dW_h, dW_x and dx come from one GEMM per chunk.
//
// Variable lengths: row b has len[b] valid frames. Step s touches row b only
// if s < len[b]; the forward direction reads frame s, the backward direction
// frame len[b] - 1 - s, so it starts at the row's own last frame. Rows past
// their length keep their state frozen and their outputs are zero.

// Only the headers needed (not <torch/extension.h>): the first-use JIT build
// then takes seconds, not a minute. The ops are registered with the
// dispatcher (TORCH_LIBRARY) and called as torch.ops.asr_lnlstm.*.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "fast_math.h"  // asr/models/csrc, on the build's include path

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// The BLAS inside libtorch (MKL on x86 wheels) exports the Fortran GEMMs. They
// are declared weak so the module still loads where they are missing; then the
// slower at::mm path below is used.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc) __attribute__((weak));
}

namespace {

// Column-major C (m x n) = op(A) op(B) (+ C if accumulate), op given by 'n'/'t'.
template <typename T>
void gemm_fallback(char ta, char tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                   const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  // A column-major (rows x cols, ld) matrix is a tensor with strides {1, ld}.
  auto A = ta == 'n' ? at::from_blob(const_cast<T*>(a), {m, k}, {1, lda}, opts)
                     : at::from_blob(const_cast<T*>(a), {k, m}, {1, lda}, opts).t();
  auto B = tb == 'n' ? at::from_blob(const_cast<T*>(b), {k, n}, {1, ldb}, opts)
                     : at::from_blob(const_cast<T*>(b), {n, k}, {1, ldb}, opts).t();
  auto C = at::from_blob(c, {m, n}, {1, ldc}, opts);
  if (accumulate) {
    C.add_(at::mm(A, B));
  } else {
    C.copy_(at::mm(A, B));
  }
}

void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (sgemm_ == nullptr || k == 0) {
    if (k == 0) {
      if (!accumulate) for (int64_t j = 0; j < n; ++j) std::fill(c + j * ldc, c + j * ldc + m, 0.f);
      return;
    }
    gemm_fallback<float>(ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    return;
  }
  const int im = m, in = n, ik = k, ilda = lda, ildb = ldb, ildc = ldc;
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  sgemm_(&ta, &tb, &im, &in, &ik, &alpha, a, &ilda, b, &ildb, &beta, c, &ildc);
}

void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
          const double* b, int64_t ldb, bool accumulate, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (dgemm_ == nullptr || k == 0) {
    if (k == 0) {
      if (!accumulate) for (int64_t j = 0; j < n; ++j) std::fill(c + j * ldc, c + j * ldc + m, 0.0);
      return;
    }
    gemm_fallback<double>(ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    return;
  }
  const int im = m, in = n, ik = k, ilda = lda, ildb = ldb, ildc = ldc;
  const double alpha = 1.0, beta = accumulate ? 1.0 : 0.0;
  dgemm_(&ta, &tb, &im, &in, &ik, &alpha, a, &ilda, b, &ildb, &beta, c, &ildc);
}

// ---- products with a weight matrix: packed once, register-blocked -------
// The per-step products (W_h h_{t-1} forward, dG W_h backward) have only B
// rows. A BLAS call repacks its weight operand on every call, and MKL runs its
// AVX2 code on AMD CPUs (docs/benchmarks.md has the profile). The weights do
// not change during a layer call, so each direction packs them once, in
// panels of kPanelVectors vectors of columns, and a small kernel keeps a block
// of rows x one panel of outputs in registers while it walks the inner
// dimension: each weight vector loaded feeds a whole block of rows. The same
// kernel computes the input projections and dx, where it matches the BLAS.
// The vector width is that of the ISA the module is compiled for
// (-march=native where the compiler has it).
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
constexpr int kRowBlock = 8;  // 16 accumulators of 32 vector registers
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
constexpr int kRowBlock = 6;  // 12 accumulators, 2 weight vectors, 1 broadcast: of 16 registers
#else  // SSE2 or NEON; on x86 without AVX (and FMA) slower than the BLAS
constexpr int kVectorBytes = 16;
constexpr int kRowBlock = 6;
#endif
constexpr int kPanelVectors = 2;

// out (M x N, row stride ldo) = a (M x K, row stride lda) W, with W (K x N)
// read through strides when packed: W(k, n) = w[k * k_stride + n * n_stride].
template <typename T>
class PackedMatrix {
 public:
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  static constexpr int64_t kLanes = kVectorBytes / sizeof(T);
  static constexpr int64_t kPanel = kPanelVectors * kLanes;  // columns per panel

  PackedMatrix(const T* w, int64_t K, int64_t N, int64_t k_stride, int64_t n_stride)
      : K_(K), N_(N), panels_((N + kPanel - 1) / kPanel), data_(panels_ * K * kPanel) {
    // Layout [panel][k][column in panel]; columns past N are zero.
    for (int64_t p = 0; p < panels_; ++p)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < kPanel; ++c) {
          const int64_t n = p * kPanel + c;
          data_[(p * K + k) * kPanel + c] = n < N ? w[k * k_stride + n * n_stride] : T(0);
        }
  }

  void multiply(const T* a, int64_t lda, int64_t M, T* out, int64_t ldo) const {
    for (int64_t p = 0; p < panels_; ++p) {
      const T* panel = data_.data() + p * K_ * kPanel;
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N_ - n0);
      int64_t m = 0;
      for (; m + kRowBlock <= M; m += kRowBlock) block<kRowBlock>(a + m * lda, lda, panel, out + m * ldo + n0, ldo, cols);
      if (m < M) remainder<kRowBlock - 1>(M - m, a + m * lda, lda, panel, out + m * ldo + n0, ldo, cols);
    }
  }

 private:
  template <int R>
  void block(const T* __restrict__ a, int64_t lda, const T* __restrict__ panel, T* __restrict__ out, int64_t ldo,
             int64_t cols) const {
    Vec acc[R][kPanelVectors];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kPanelVectors; ++v) acc[r][v] = Vec{};
    for (int64_t k = 0; k < K_; ++k) {
      Vec w[kPanelVectors];
      for (int v = 0; v < kPanelVectors; ++v) std::memcpy(&w[v], panel + k * kPanel + v * kLanes, sizeof(Vec));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const T ark = a[r * lda + k];
#pragma GCC unroll 4
        for (int v = 0; v < kPanelVectors; ++v) acc[r][v] += ark * w[v];
      }
    }
    // Through a fixed-size copy: a copy of variable size from acc would make
    // the compiler keep the accumulators in memory instead of registers.
    for (int r = 0; r < R; ++r) {
      T row[kPanel];
      std::memcpy(row, acc[r], sizeof(row));
      std::memcpy(out + r * ldo, row, cols * sizeof(T));
    }
  }

  // The last rows (fewer than a block): one instantiation per count.
  template <int R>
  void remainder(int64_t rows, const T* a, int64_t lda, const T* panel, T* out, int64_t ldo, int64_t cols) const {
    if constexpr (R > 1) {
      if (rows < R) return remainder<R - 1>(rows, a, lda, panel, out, ldo, cols);
    }
    block<R>(a, lda, panel, out, ldo, cols);
  }

  int64_t K_, N_, panels_;
  std::vector<T> data_;
};

// ---- elementwise math: asr/models/csrc/fast_math.h ----------------------
using namespace asr_math;

// Mean and 1/sqrt(biased variance + eps), the variance from centred values
// (E[x^2] - E[x]^2 cancels catastrophically for large or constant inputs).
template <typename T>
inline void moments(const T* x, int64_t n, T eps, T& mean, T& rstd) {
  mean = sum(x, n) / n;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      T v = x[i + l] - mean;
      acc[l] += v * v;
    }
  T var = 0;
  for (int l = 0; l < kLanes; ++l) var += acc[l];
  for (; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  rstd = T(1) / std::sqrt(var / n + eps);
}

// Gradient through x_hat = (x - mean) * rstd given d x_hat:
// dx = rstd * (dxh - mean(dxh) - xh * mean(dxh * xh)). In place on dxh_out.
template <typename T>
inline void ln_backward(const T* xh, T* dxh, T rstd, int64_t n, T* dx) {
  const T m1 = sum(dxh, n) / n;
  const T m2 = dot(dxh, xh, n) / n;
  for (int64_t k = 0; k < n; ++k) dx[k] = rstd * (dxh[k] - m1 - xh[k] * m2);
}

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() && t.numel() ? t.const_data_ptr<T>() : nullptr;
}

// Values per saved row in `stats`: ba2016 mean_x, rstd_x, rstd_h, rstd_c; tf_contrib the four gate
// norms' rstd, then rstd_c.
constexpr int64_t kStats = 4;
constexpr int64_t kStatsTfContrib = 5;

template <typename T>
struct Layer {
  int64_t B, Tn, I, D, H, S;
  bool layer_norm, save;
  bool tf_contrib;  // the tf_contrib cell (layer_norm is true too)
  T forget_bias, eps;
  int64_t chunk;  // time steps per input-projection GEMM
  const int64_t* len;
  const T* x;     // (B, T, I)
  const T* w_x;   // (D, 4H, I)
  const T* w_h;   // (D, 4H, H)
  const T* bias;  // (D, 4H)
  const T *lxg, *lxb, *lhg, *lhb;  // (D, 4H) LN_x, LN_h gain/bias (tf_contrib: the gate norms', no LN_x)
  const T *lcg, *lcb;              // (D, H) LN_c gain/bias
  // saved for backward (save == true), indexed [d][s][b] (step s, not frame):
  T* gx;        // (D, S, B, 4H) W_x x_t, before LN_x (not saved for tf_contrib)
  T* states_h;  // (D, S+1, B, H): state before step s; [S] is the final one
  T* states_c;  // (D, S+1, B, H)
  T* act;       // (D, S, B, 4H): sigmoid(i), tanh(j), sigmoid(f+fb), sigmoid(o)
  T* xhat_h;    // (D, S, B, 4H) LN_h normalised values (tf_contrib: the gate norms')
  T* stats;     // (D, S, B, kStats or kStatsTfContrib)
  T* xhat_c;    // (D, S, B, H) LN_c normalised values
  T* y;         // (B, T, D*H)
  T* h_n;       // (D, B, H)
  T* c_n;       // (D, B, H)
  const T* h0;  // (D, B, H)
  const T* c0;  // (D, B, H)

  bool active(int64_t s, int64_t b) const { return s < len[b]; }
  // The frame direction d reads at step s in row b (only for active rows).
  int64_t frame(int64_t d, int64_t s, int64_t b) const { return d == 1 ? len[b] - 1 - s : s; }
};

// Gather the input frames of steps [s0, s0 + k) into rows (s - s0) * B + b of
// xc (k*B x I); rows past their length get zeros.
template <typename T>
void gather_frames(const Layer<T>& p, int64_t d, int64_t s0, int64_t k, T* xc) {
  for (int64_t j = 0; j < k; ++j)
    for (int64_t b = 0; b < p.B; ++b) {
      T* row = xc + (j * p.B + b) * p.I;
      const int64_t s = s0 + j;
      if (p.active(s, b)) {
        const T* src = p.x + (b * p.Tn + p.frame(d, s, b)) * p.I;
        std::copy(src, src + p.I, row);
      } else {
        std::fill(row, row + p.I, T(0));
      }
    }
}

// The forward row kernels: one row (batch element) of one step. They take
// __restrict__ pointers: without them the compiler cannot prove the arrays
// distinct and leaves the loops scalar.

// pre = LN_x(gx) + LN_h(gh) + bsum (bsum: b and both LN biases), from the
// rows' means and inverse standard deviations; LN_h's x_hat into xh.
template <typename T>
inline void gates_ln(int64_t G, const T* __restrict__ gx, const T* __restrict__ gh, T mx, T rx, T mh, T rh,
                     const T* __restrict__ gxg, const T* __restrict__ ghg, const T* __restrict__ bsum,
                     T* __restrict__ xh, T* __restrict__ pre) {
  for (int64_t k = 0; k < G; ++k) {
    xh[k] = (gh[k] - mh) * rh;
    pre[k] = (gx[k] - mx) * rx * gxg[k] + xh[k] * ghg[k] + bsum[k];
  }
}

template <typename T>
inline void gates_plain(int64_t G, const T* __restrict__ gx, const T* __restrict__ gh, const T* __restrict__ bsum,
                        T* __restrict__ pre) {
  for (int64_t k = 0; k < G; ++k) pre[k] = gx[k] + gh[k] + bsum[k];
}

// act = sigmoid(i), tanh(j), sigmoid(f + forget_bias), sigmoid(o).
template <typename T>
inline void activations(int64_t H, const T* __restrict__ pre, T forget_bias, T* __restrict__ act) {
  for (int64_t k = 0; k < H; ++k) act[k] = sigmoid(pre[k]);
  for (int64_t k = H; k < 2 * H; ++k) act[k] = tanh_(pre[k]);
  for (int64_t k = 2 * H; k < 3 * H; ++k) act[k] = sigmoid(pre[k] + forget_bias);
  for (int64_t k = 3 * H; k < 4 * H; ++k) act[k] = sigmoid(pre[k]);
}

// c = c_prev * sigmoid(f) + sigmoid(i) * tanh(j); h = y = tanh(LN_c(c)) * sigmoid(o).
// LN_c's x_hat into xc; returns its inverse standard deviation.
template <typename T>
inline T cell_and_output_ln(int64_t H, const T* __restrict__ act, const T* __restrict__ c_prev,
                            const T* __restrict__ gcg, const T* __restrict__ gcb, T eps, T* __restrict__ c,
                            T* __restrict__ xc, T* __restrict__ h, T* __restrict__ y) {
  for (int64_t k = 0; k < H; ++k) c[k] = c_prev[k] * act[2 * H + k] + act[k] * act[H + k];
  T mc, rc;
  moments(c, H, eps, mc, rc);
  for (int64_t k = 0; k < H; ++k) {
    xc[k] = (c[k] - mc) * rc;
    h[k] = tanh_(xc[k] * gcg[k] + gcb[k]) * act[3 * H + k];
    y[k] = h[k];
  }
  return rc;
}

template <typename T>
inline void cell_and_output_plain(int64_t H, const T* __restrict__ act, const T* __restrict__ c_prev,
                                  T* __restrict__ c, T* __restrict__ h, T* __restrict__ y) {
  for (int64_t k = 0; k < H; ++k) {
    c[k] = c_prev[k] * act[2 * H + k] + act[k] * act[H + k];
    h[k] = tanh_(c[k]) * act[3 * H + k];
    y[k] = h[k];
  }
}

// tf_contrib: pre = per-gate LN of gx + gh (gain and shift), each gate's x_hat into xh and its
// inverse standard deviation into rstd[0..4).
template <typename T>
inline void gates_per_gate_ln(int64_t H, const T* __restrict__ gx, const T* __restrict__ gh,
                              const T* __restrict__ gain, const T* __restrict__ shift, T eps, T* __restrict__ xh,
                              T* __restrict__ pre, T* __restrict__ rstd) {
  for (int64_t k = 0; k < 4 * H; ++k) pre[k] = gx[k] + gh[k];
  for (int64_t gate = 0; gate < 4; ++gate) {
    const int64_t o = gate * H;
    T mean;
    moments(pre + o, H, eps, mean, rstd[gate]);
    const T r = rstd[gate];
    for (int64_t k = o; k < o + H; ++k) {
      xh[k] = (pre[k] - mean) * r;
      pre[k] = xh[k] * gain[k] + shift[k];
    }
  }
}

// tf_contrib: c = LN_c(c_prev * sigmoid(f) + sigmoid(i) * tanh(j)), the cell carried;
// h = y = tanh(c) * sigmoid(o). LN_c's x_hat into xc; returns its inverse standard deviation.
template <typename T>
inline T cell_and_output_tf_contrib(int64_t H, const T* __restrict__ act, const T* __restrict__ c_prev,
                                    const T* __restrict__ gcg, const T* __restrict__ gcb, T eps,
                                    T* __restrict__ c, T* __restrict__ xc, T* __restrict__ h, T* __restrict__ y) {
  for (int64_t k = 0; k < H; ++k) c[k] = c_prev[k] * act[2 * H + k] + act[k] * act[H + k];
  T mc, rc;
  moments(c, H, eps, mc, rc);
  for (int64_t k = 0; k < H; ++k) {
    xc[k] = (c[k] - mc) * rc;
    c[k] = xc[k] * gcg[k] + gcb[k];
    h[k] = tanh_(c[k]) * act[3 * H + k];
    y[k] = h[k];
  }
  return rc;
}

template <typename T>
void forward_direction(const Layer<T>& p, int64_t d) {
  const int64_t B = p.B, H = p.H, G = 4 * H, D = p.D, S = p.S, I = p.I;
  // gx = x W_x^T and gates_h = h W_h^T: W(k, n) = w[n][k].
  const PackedMatrix<T> Wx_t(p.w_x + d * G * I, I, G, 1, I);
  const PackedMatrix<T> Wh_t(p.w_h + d * G * H, H, G, 1, H);
  // ba2016 and the plain LSTM add b and the LN biases as one vector; tf_contrib has none of them.
  std::vector<T> bsum(p.tf_contrib ? 0 : G);
  if (!p.tf_contrib)
    for (int64_t k = 0; k < G; ++k)
      bsum[k] = p.bias[d * G + k] + (p.layer_norm ? p.lxb[d * G + k] + p.lhb[d * G + k] : T(0));
  const T* gate_shift = p.tf_contrib ? p.lhb + d * G : nullptr;
  const T* gxg = p.layer_norm && !p.tf_contrib ? p.lxg + d * G : nullptr;
  const T* ghg = p.layer_norm ? p.lhg + d * G : nullptr;
  const T* gcg = p.layer_norm ? p.lcg + d * H : nullptr;
  const T* gcb = p.layer_norm ? p.lcb + d * H : nullptr;

  // Per-row scratch where nothing is saved.
  std::vector<T> gates_h(B * G), pre(G), act_row(G), xh_row(G), xc_row(H);
  T stats_row[kStatsTfContrib];
  std::vector<T> x_chunk(p.chunk * B * I);
  // Saved runs of ba2016 and the plain LSTM write into p.gx (backward reads it); tf_contrib's backward
  // needs only its gate norms' x_hat, so its products stay in the chunk's scratch.
  const bool keep_gx = p.save && !p.tf_contrib;
  std::vector<T> gx_chunk(keep_gx ? 0 : p.chunk * B * G);
  // Saved runs write every state into states_h/c[s]; inference ping-pongs
  // between two buffers.
  std::vector<T> ping(p.save ? 0 : 4 * B * H);
  T* h_base = p.save ? p.states_h + d * (S + 1) * B * H : ping.data();
  T* c_base = p.save ? p.states_c + d * (S + 1) * B * H : ping.data() + 2 * B * H;
  auto slot = [&](T* base, int64_t s) { return base + (p.save ? s : s % 2) * B * H; };
  std::copy(p.h0 + d * B * H, p.h0 + (d + 1) * B * H, h_base);
  std::copy(p.c0 + d * B * H, p.c0 + (d + 1) * B * H, c_base);
  T* h_prev = h_base;
  T* c_prev = c_base;
  T* gx = nullptr;
  int64_t chunk_start = 0;

  for (int64_t s = 0; s < S; ++s) {
    if (s % p.chunk == 0) {
      // gx (k*B x 4H) = x_chunk (k*B x I) W_x^T.
      chunk_start = s;
      const int64_t k = std::min(p.chunk, S - s);
      gather_frames(p, d, s, k, x_chunk.data());
      gx = keep_gx ? p.gx + (d * S + s) * B * G : gx_chunk.data();
      Wx_t.multiply(x_chunk.data(), I, k * B, gx, G);
    }
    T* h_next = slot(h_base, s + 1);
    T* c_next = slot(c_base, s + 1);
    // gates_h (B x 4H) = h_prev (B x H) W_h^T.
    Wh_t.multiply(h_prev, H, B, gates_h.data(), G);
    for (int64_t b = 0; b < B; ++b) {
      T* hn = h_next + b * H;
      T* cn = c_next + b * H;
      const T* hp = h_prev + b * H;
      const T* cp = c_prev + b * H;
      if (!p.active(s, b)) {  // past this row's end: state frozen
        std::copy(hp, hp + H, hn);
        std::copy(cp, cp + H, cn);
        continue;
      }
      const int64_t t = p.frame(d, s, b);
      const T* xr = gx + ((s - chunk_start) * B + b) * G;
      const T* gh = gates_h.data() + b * G;
      const int64_t saved = (d * S + s) * B + b;
      T* act = p.save ? p.act + saved * G : act_row.data();
      T* xc = p.save ? p.xhat_c + saved * H : xc_row.data();
      T* yr = p.y + (b * p.Tn + t) * D * H + d * H;
      if (p.tf_contrib) {
        T* st = p.save ? p.stats + saved * kStatsTfContrib : stats_row;
        T* xh = p.save ? p.xhat_h + saved * G : xh_row.data();
        gates_per_gate_ln(H, xr, gh, ghg, gate_shift, p.eps, xh, pre.data(), st);
        activations(H, pre.data(), p.forget_bias, act);
        st[4] = cell_and_output_tf_contrib(H, act, cp, gcg, gcb, p.eps, cn, xc, hn, yr);
      } else if (p.layer_norm) {
        T* st = p.save ? p.stats + saved * kStats : stats_row;
        T* xh = p.save ? p.xhat_h + saved * G : xh_row.data();
        moments(xr, G, p.eps, st[0], st[1]);
        T mh;
        moments(gh, G, p.eps, mh, st[2]);
        gates_ln(G, xr, gh, st[0], st[1], mh, st[2], gxg, ghg, bsum.data(), xh, pre.data());
        activations(H, pre.data(), p.forget_bias, act);
        st[3] = cell_and_output_ln(H, act, cp, gcg, gcb, p.eps, cn, xc, hn, yr);
      } else {
        gates_plain(G, xr, gh, bsum.data(), pre.data());
        activations(H, pre.data(), p.forget_bias, act);
        cell_and_output_plain(H, act, cp, cn, hn, yr);
      }
    }
    h_prev = h_next;
    c_prev = c_next;
  }
  std::copy(h_prev, h_prev + B * H, p.h_n + d * B * H);
  std::copy(c_prev, c_prev + B * H, p.c_n + d * B * H);
}

template <typename T>
struct Grads {
  const T* dy;   // (B, T, D*H)
  const T* dhn;  // (D, B, H)
  const T* dcn;  // (D, B, H)
  T* dx;         // (D, B, T, I): per direction, summed by the caller; null if not needed
  T* dw_x;       // (D, 4H, I)
  T* dw_h;       // (D, 4H, H)
  T* dbias;      // (D, 4H)
  T *dlxg, *dlxb, *dlhg, *dlhb;  // (D, 4H)
  T *dlcg, *dlcb;                // (D, H)
  T* dh0;        // (D, B, H)
  T* dc0;        // (D, B, H)
};

// The row kernels below take __restrict__ pointers: without them the compiler
// cannot prove the many arrays distinct and leaves the loops scalar.

// Through h = tanh(LN_c(c)) * sigmoid(o): d(o pre-activation) into dgates[3H..4H),
// d c into dct (adding the carried dc), LN_c parameter grads accumulated.
template <typename T>
inline void output_backward_ln(int64_t H, const T* __restrict__ act, const T* __restrict__ xc, T rc,
                               const T* __restrict__ gcg, const T* __restrict__ gcb, const T* __restrict__ dh,
                               const T* __restrict__ dc, T* __restrict__ dgates, T* __restrict__ dxc,
                               T* __restrict__ dct, T* __restrict__ acc_gc, T* __restrict__ acc_bc) {
  for (int64_t k = 0; k < H; ++k) {
    const T so = act[3 * H + k];
    const T tc = tanh_(xc[k] * gcg[k] + gcb[k]);  // recomputed: cheaper than saving it
    dgates[3 * H + k] = dh[k] * tc * so * (T(1) - so);
    const T dcn = dh[k] * so * (T(1) - tc * tc);  // d LN_c(c)
    acc_gc[k] += dcn * xc[k];
    acc_bc[k] += dcn;
    dxc[k] = dcn * gcg[k];
  }
  ln_backward(xc, dxc, rc, H, dct);
  for (int64_t k = 0; k < H; ++k) dct[k] += dc[k];
}

// tf_contrib, through h = tanh(c) * sigmoid(o) and the carried c = LN_c(u): d(o pre-activation) into
// dgates[3H..4H), d u into dct; c is the carried (normalised) cell, dc its gradient from the next
// step, which flows through LN_c too; LN_c parameter grads accumulated.
template <typename T>
inline void output_backward_tf_contrib(int64_t H, const T* __restrict__ act, const T* __restrict__ c,
                                       const T* __restrict__ xc, T rc, const T* __restrict__ gcg,
                                       const T* __restrict__ dh, const T* __restrict__ dc, T* __restrict__ dgates,
                                       T* __restrict__ dxc, T* __restrict__ dct, T* __restrict__ acc_gc,
                                       T* __restrict__ acc_bc) {
  for (int64_t k = 0; k < H; ++k) {
    const T so = act[3 * H + k];
    const T tc = tanh_(c[k]);
    dgates[3 * H + k] = dh[k] * tc * so * (T(1) - so);
    const T dcn = dc[k] + dh[k] * so * (T(1) - tc * tc);  // d c, the normalised cell
    acc_gc[k] += dcn * xc[k];
    acc_bc[k] += dcn;
    dxc[k] = dcn * gcg[k];
  }
  ln_backward(xc, dxc, rc, H, dct);
}

template <typename T>
inline void output_backward_plain(int64_t H, const T* __restrict__ act, const T* __restrict__ c,
                                  const T* __restrict__ dh, const T* __restrict__ dc, T* __restrict__ dgates,
                                  T* __restrict__ dct) {
  for (int64_t k = 0; k < H; ++k) {
    const T so = act[3 * H + k];
    const T tc = tanh_(c[k]);
    dgates[3 * H + k] = dh[k] * tc * so * (T(1) - so);
    dct[k] = dc[k] + dh[k] * so * (T(1) - tc * tc);
  }
}

// Through c = c_prev * sigmoid(f + fb) + sigmoid(i) * tanh(j): d(i, j, f
// pre-activations) into dgates[0..3H), d c_prev into dc_prev; sums all gate grads.
template <typename T>
inline void cell_backward(int64_t H, const T* __restrict__ act, const T* __restrict__ c_prev,
                          const T* __restrict__ dct, T* __restrict__ dgates, T* __restrict__ dc_prev,
                          T* __restrict__ acc_b) {
  for (int64_t k = 0; k < H; ++k) {
    const T si = act[k], tj = act[H + k], sf = act[2 * H + k];
    dgates[k] = dct[k] * tj * si * (T(1) - si);
    dgates[H + k] = dct[k] * si * (T(1) - tj * tj);
    dgates[2 * H + k] = dct[k] * c_prev[k] * sf * (T(1) - sf);
    dc_prev[k] = dct[k] * sf;
  }
  for (int64_t k = 0; k < 4 * H; ++k) acc_b[k] += dgates[k];
}

// Through out = x_hat * gain (+ bias) with x_hat = (x - mean) * rstd: dx and the gain grad.
template <typename T>
inline void affine_ln_backward(int64_t n, const T* __restrict__ xh, T rstd, const T* __restrict__ gain,
                               const T* __restrict__ dout, T* __restrict__ scratch, T* __restrict__ acc_gain,
                               T* __restrict__ dx) {
  for (int64_t k = 0; k < n; ++k) {
    acc_gain[k] += dout[k] * xh[k];
    scratch[k] = dout[k] * gain[k];
  }
  ln_backward(xh, scratch, rstd, n, dx);
}

template <typename T>
void backward_direction(const Layer<T>& p, const Grads<T>& g, int64_t d) {
  const int64_t B = p.B, H = p.H, G = 4 * H, D = p.D, S = p.S, I = p.I;
  // dh_{t-1} = dG_h W_h and dx = dG_x W_x, both weights read as stored (4H x H), (4H x I).
  const PackedMatrix<T> Wh(p.w_h + d * G * H, G, H, H, 1);
  const PackedMatrix<T> Wx(p.w_x + d * G * I, G, I, I, 1);
  const T* gxg = p.layer_norm && !p.tf_contrib ? p.lxg + d * G : nullptr;
  const T* ghg = p.layer_norm ? p.lhg + d * G : nullptr;  // tf_contrib: the gate norms' gains
  const T* gcg = p.layer_norm ? p.lcg + d * H : nullptr;
  const T* gcb = p.layer_norm ? p.lcb + d * H : nullptr;
  const T* h_states = p.states_h + d * (S + 1) * B * H;
  const T* c_states = p.states_c + d * (S + 1) * B * H;
  T* dx = g.dx ? g.dx + d * B * p.Tn * I : nullptr;
  T* dw_x = g.dw_x + d * G * I;
  T* dw_h = g.dw_h + d * G * H;

  std::vector<T> dh(g.dhn + d * B * H, g.dhn + (d + 1) * B * H);
  std::vector<T> dc(g.dcn + d * B * H, g.dcn + (d + 1) * B * H);
  std::vector<T> dh_prev(B * H);
  std::vector<T> acc_gx(G, T(0)), acc_gh(G, T(0)), acc_b(G, T(0)), acc_gc(H, T(0)), acc_bc(H, T(0));
  std::vector<T> dgates(G), scratch(G), xx(G), dct(H);
  // Gradients w.r.t. W_h h_{t-1} (dGh) and W_x x_t (dGx) are kept for one
  // chunk of steps; at the chunk's first step one GEMM each gives its share of
  // dW_h, dW_x and dx.
  std::vector<T> dGh_chunk(p.chunk * B * G), dGx_chunk(p.chunk * B * G);
  std::vector<T> x_chunk(p.chunk * B * I), dx_chunk(p.chunk * B * I);
  std::fill(dw_x, dw_x + G * I, T(0));
  std::fill(dw_h, dw_h + G * H, T(0));

  for (int64_t s = S - 1; s >= 0; --s) {
    const int64_t chunk_start = s - s % p.chunk;
    const int64_t row0 = (s - chunk_start) * B;
    T* dGh = dGh_chunk.data() + row0 * G;
    bool all_active = true;
    for (int64_t b = 0; b < B; ++b) {
      T* dGhb = dGh + b * G;
      T* dGxb = dGx_chunk.data() + (row0 + b) * G;
      if (!p.active(s, b)) {  // frozen row: gradient passes through untouched
        std::fill(dGhb, dGhb + G, T(0));
        std::fill(dGxb, dGxb + G, T(0));
        all_active = false;
        continue;
      }
      const int64_t t = p.frame(d, s, b);
      const int64_t saved = (d * S + s) * B + b;
      const T* act = p.act + saved * G;
      const T* dyr = g.dy + (b * p.Tn + t) * D * H + d * H;
      T* dhb = dh.data() + b * H;
      T* dcb = dc.data() + b * H;
      for (int64_t k = 0; k < H; ++k) dhb[k] += dyr[k];
      if (p.tf_contrib) {
        // acc_b gathers the gate norms' shift gradients, acc_gh their gains'; one gradient of
        // W_x x + W_h h feeds both products.
        const T* st = p.stats + saved * kStatsTfContrib;
        output_backward_tf_contrib(H, act, c_states + (s + 1) * B * H + b * H, p.xhat_c + saved * H, st[4], gcg,
                                   dhb, dcb, dgates.data(), scratch.data(), dct.data(), acc_gc.data(),
                                   acc_bc.data());
        cell_backward(H, act, c_states + s * B * H + b * H, dct.data(), dgates.data(), dcb, acc_b.data());
        const T* xh = p.xhat_h + saved * G;
        for (int64_t gate = 0; gate < 4; ++gate) {
          const int64_t o = gate * H;
          affine_ln_backward(H, xh + o, st[gate], ghg + o, dgates.data() + o, scratch.data(), acc_gh.data() + o,
                             dGhb + o);
        }
        std::copy(dGhb, dGhb + G, dGxb);
        continue;
      }
      if (p.layer_norm) {
        output_backward_ln(H, act, p.xhat_c + saved * H, p.stats[saved * kStats + 3], gcg, gcb, dhb, dcb,
                           dgates.data(), scratch.data(), dct.data(), acc_gc.data(), acc_bc.data());
      } else {
        output_backward_plain(H, act, c_states + (s + 1) * B * H + b * H, dhb, dcb, dgates.data(), dct.data());
      }
      cell_backward(H, act, c_states + s * B * H + b * H, dct.data(), dgates.data(), dcb, acc_b.data());
      if (p.layer_norm) {
        const T* st = p.stats + saved * kStats;
        const T mx = st[0], rx = st[1], rh = st[2];
        const T* xr = p.gx + saved * G;
        for (int64_t k = 0; k < G; ++k) xx[k] = (xr[k] - mx) * rx;  // LN_x's x_hat, recomputed
        affine_ln_backward(G, xx.data(), rx, gxg, dgates.data(), scratch.data(), acc_gx.data(), dGxb);
        affine_ln_backward(G, p.xhat_h + saved * G, rh, ghg, dgates.data(), scratch.data(), acc_gh.data(), dGhb);
      } else {
        std::copy(dgates.begin(), dgates.end(), dGxb);
        std::copy(dgates.begin(), dgates.end(), dGhb);
      }
    }
    // dh_{t-1} (B x H) = dGh (B x 4H) W_h (4H x H).
    if (all_active) {
      Wh.multiply(dGh, G, B, dh.data(), H);
    } else {
      Wh.multiply(dGh, G, B, dh_prev.data(), H);
      for (int64_t b = 0; b < B; ++b)
        if (p.active(s, b)) std::copy(dh_prev.begin() + b * H, dh_prev.begin() + (b + 1) * H, dh.begin() + b * H);
    }
    if (s == chunk_start) {
      // Frozen rows have zero dG, a finite frozen state and zero input: they add nothing.
      const int64_t rows = std::min(p.chunk, S - chunk_start) * B;
      // dW_h^T (H x 4H) += H_prev^T dGh over the chunk's rows.
      gemm('n', 't', H, G, rows, h_states + chunk_start * B * H, H, dGh_chunk.data(), G, true, dw_h, H);
      // dW_x^T (I x 4H) += X^T dGx; dX (rows x I) = dGx W_x, scattered to frames.
      gather_frames(p, d, chunk_start, rows / B, x_chunk.data());
      gemm('n', 't', I, G, rows, x_chunk.data(), I, dGx_chunk.data(), G, true, dw_x, I);
      if (dx) {
        Wx.multiply(dGx_chunk.data(), G, rows, dx_chunk.data(), I);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t sr = chunk_start + r / B, b = r % B;
          if (!p.active(sr, b)) continue;
          const T* src = dx_chunk.data() + r * I;
          std::copy(src, src + I, dx + (b * p.Tn + p.frame(d, sr, b)) * I);
        }
      }
    }
  }
  std::copy(dh.begin(), dh.end(), g.dh0 + d * B * H);
  std::copy(dc.begin(), dc.end(), g.dc0 + d * B * H);
  if (p.tf_contrib) {
    std::copy(acc_b.begin(), acc_b.end(), g.dlhb + d * G);
    std::copy(acc_gh.begin(), acc_gh.end(), g.dlhg + d * G);
    std::copy(acc_gc.begin(), acc_gc.end(), g.dlcg + d * H);
    std::copy(acc_bc.begin(), acc_bc.end(), g.dlcb + d * H);
    return;
  }
  std::copy(acc_b.begin(), acc_b.end(), g.dbias + d * G);
  if (p.layer_norm) {
    // b, LN_x's bias and LN_h's bias all add to the gates: same gradient.
    std::copy(acc_b.begin(), acc_b.end(), g.dlxb + d * G);
    std::copy(acc_b.begin(), acc_b.end(), g.dlhb + d * G);
    std::copy(acc_gx.begin(), acc_gx.end(), g.dlxg + d * G);
    std::copy(acc_gh.begin(), acc_gh.end(), g.dlhg + d * G);
    std::copy(acc_gc.begin(), acc_gc.end(), g.dlcg + d * H);
    std::copy(acc_bc.begin(), acc_bc.end(), g.dlcb + d * H);
  }
}

// Run fn(d) for each direction: in parallel threads for two directions.
template <typename F>
void for_each_direction(int64_t D, const F& fn) {
  if (D == 1) {
    fn(0);
    return;
  }
  at::parallel_for(0, D, 1, [&](int64_t begin, int64_t end) {
    for (int64_t d = begin; d < end; ++d) fn(d);
  });
}

// ---- memory for the tensors saved for backward --------------------------
// Training saves some 150 MB per layer and step (at the benchmark's sizes) and
// frees it after backward. Fresh memory every step costs page faults and
// zeroing, and in a virtual machine at times the host's faults as well
// (docs/benchmarks.md has the system times measured). So freed
// buffers are kept for the next step: a later forward takes the smallest
// cached buffer that fits (up to twice its size). The cache never makes the
// process hold more than the most this operator had in use at once: buffers
// in use plus cached stay under that peak, the smallest cached going first.
// New buffers are 2 MB-aligned with transparent huge pages requested (fewer
// faults where the kernel grants them on request, Debian's default).
class SavedMemory {
 public:
  static SavedMemory& instance() {
    static SavedMemory* memory = new SavedMemory();  // never destroyed: tensors may outlive statics
    return *memory;
  }

  // A buffer of at least `bytes` (a multiple of kHugePage) and its length, or
  // {nullptr, 0} where the system refuses.
  std::pair<void*, size_t> take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto fit = cached_.lower_bound(bytes);
    if (fit != cached_.end() && fit->first <= 2 * bytes) {
      const auto [length, buffer] = *fit;
      cached_.erase(fit);
      cached_bytes_ -= length;
      used_bytes_ += length;
      return {buffer, length};
    }
    void* buffer = map(bytes);
    if (buffer == nullptr) return {nullptr, 0};
    used_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, used_bytes_);
    evict();
    return {buffer, bytes};
  }

  void give(void* buffer, size_t length) {
    std::lock_guard<std::mutex> lock(mutex_);
    used_bytes_ -= length;
    cached_.emplace(length, buffer);
    cached_bytes_ += length;
    evict();
  }

  static constexpr size_t kHugePage = size_t(2) << 20;

 private:
  // Smallest first: sizes grow with the longest utterance of a batch.
  void evict() {
    while (!cached_.empty() && used_bytes_ + cached_bytes_ > peak_bytes_) {
      auto smallest = cached_.begin();
      munmap(smallest->second, smallest->first);
      cached_bytes_ -= smallest->first;
      cached_.erase(smallest);
    }
  }

  // A mapping of `length` bytes starting at a 2 MB boundary.
  static void* map(size_t length) {
    const size_t padded = length + kHugePage;
    void* base = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    const auto start = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1);
    const size_t head = start - reinterpret_cast<uintptr_t>(base);
    if (head > 0) munmap(base, head);
    if (padded - head > length) munmap(reinterpret_cast<char*>(start) + length, padded - head - length);
    void* buffer = reinterpret_cast<void*>(start);
#ifdef MADV_HUGEPAGE
    madvise(buffer, length, MADV_HUGEPAGE);  // a refusal only costs speed
#endif
    return buffer;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> cached_;  // length -> buffer
  size_t cached_bytes_ = 0, used_bytes_ = 0, peak_bytes_ = 0;
};

at::Tensor empty_saved(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  constexpr size_t kHugePage = SavedMemory::kHugePage;
  int64_t numel = 1;
  for (int64_t size : sizes) numel *= size;
  const size_t bytes = static_cast<size_t>(numel) * opts.dtype().itemsize();
  if (bytes < 4 * kHugePage) return at::empty(sizes, opts);  // small: the allocator does well
  const auto [buffer, length] = SavedMemory::instance().take((bytes + kHugePage - 1) / kHugePage * kHugePage);
  if (buffer == nullptr) return at::empty(sizes, opts);
  return at::from_blob(buffer, sizes, [length = length](void* data) { SavedMemory::instance().give(data, length); },
                       opts);
}

void check_input(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.device().is_cpu(), "lnlstm: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, "lnlstm: ", name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.is_contiguous(), "lnlstm: ", name, " must be contiguous");
}

template <typename T>
Layer<T> make_layer(const at::Tensor& x, const at::Tensor& w_x, const at::Tensor& w_h, const at::Tensor& bias,
                    const at::Tensor& lxg, const at::Tensor& lxb, const at::Tensor& lhg, const at::Tensor& lhb,
                    const at::Tensor& lcg, const at::Tensor& lcb, const at::Tensor& lengths, double forget_bias,
                    double eps, const std::string& cell) {
  TORCH_CHECK(cell == "plain" || cell == "ba2016" || cell == "tf_contrib",
              "lnlstm: cell must be plain, ba2016 or tf_contrib, got ", cell);
  const bool layer_norm = cell != "plain", tf_contrib = cell == "tf_contrib";
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 3 && w_x.dim() == 3 && w_h.dim() == 3,
              "lnlstm: x must be (B, T, I), w_x (D, 4H, I), w_h (D, 4H, H)");
  Layer<T> p{};
  p.B = x.size(0);
  p.Tn = x.size(1);
  p.I = x.size(2);
  p.D = w_h.size(0);
  p.H = w_h.size(2);
  TORCH_CHECK(p.D == 1 || p.D == 2, "lnlstm: one or two directions");
  TORCH_CHECK(w_h.size(1) == 4 * p.H, "lnlstm: w_h must be (D, 4H, H)");
  TORCH_CHECK(w_x.size(0) == p.D && w_x.size(1) == 4 * p.H && w_x.size(2) == p.I, "lnlstm: w_x must be (D, 4H, I)");
  TORCH_CHECK(lengths.device().is_cpu() && lengths.scalar_type() == at::kLong && lengths.dim() == 1 &&
                  lengths.size(0) == p.B && lengths.is_contiguous(),
              "lnlstm: lengths must be a contiguous (B,) int64 CPU tensor");
  check_input(x, "x", dtype);
  check_input(w_x, "w_x", dtype);
  check_input(w_h, "w_h", dtype);
  if (tf_contrib) {
    TORCH_CHECK(bias.numel() == 0 && lxg.numel() == 0 && lxb.numel() == 0,
                "lnlstm: a tf_contrib cell has no bias and no LN_x (pass empty tensors)");
    for (auto* t : {&lhg, &lhb}) {
      check_input(*t, "layer-norm parameter", dtype);
      TORCH_CHECK(t->numel() == p.D * 4 * p.H, "lnlstm: the gate norms' parameters must be (D, 4H)");
    }
    for (auto* t : {&lcg, &lcb}) {
      check_input(*t, "layer-norm parameter", dtype);
      TORCH_CHECK(t->numel() == p.D * p.H, "lnlstm: LN_c parameters must be (D, H)");
    }
  } else {
    check_input(bias, "bias", dtype);
    TORCH_CHECK(bias.numel() == p.D * 4 * p.H, "lnlstm: bias must be (D, 4H)");
  }
  if (layer_norm && !tf_contrib) {
    for (auto* t : {&lxg, &lxb, &lhg, &lhb}) {
      check_input(*t, "layer-norm parameter", dtype);
      TORCH_CHECK(t->numel() == p.D * 4 * p.H, "lnlstm: LN_x/LN_h parameters must be (D, 4H)");
    }
    for (auto* t : {&lcg, &lcb}) {
      check_input(*t, "layer-norm parameter", dtype);
      TORCH_CHECK(t->numel() == p.D * p.H, "lnlstm: LN_c parameters must be (D, H)");
    }
  }
  p.len = lengths.const_data_ptr<int64_t>();
  int64_t max_len = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    TORCH_CHECK(p.len[b] >= 0 && p.len[b] <= p.Tn, "lnlstm: lengths must lie in [0, T]");
    max_len = std::max(max_len, p.len[b]);
  }
  p.S = max_len;
  // About 128 rows per input projection: the packed kernel needs only a few
  // blocks of rows for full speed, and the chunk's projections then stay in
  // the core's L2 cache until the steps read them (512 rows were slower).
  p.chunk = std::max<int64_t>(1, std::min<int64_t>(p.S, (128 + p.B - 1) / std::max<int64_t>(p.B, 1)));
  p.layer_norm = layer_norm;
  p.tf_contrib = tf_contrib;
  p.forget_bias = static_cast<T>(forget_bias);
  p.eps = static_cast<T>(eps);
  p.x = x.const_data_ptr<T>();
  p.w_x = w_x.const_data_ptr<T>();
  p.w_h = w_h.const_data_ptr<T>();
  p.bias = ptr_or_null<T>(bias);
  p.lxg = ptr_or_null<T>(lxg);
  p.lxb = ptr_or_null<T>(lxb);
  p.lhg = ptr_or_null<T>(lhg);
  p.lhb = ptr_or_null<T>(lhb);
  p.lcg = ptr_or_null<T>(lcg);
  p.lcb = ptr_or_null<T>(lcb);
  return p;
}

template <typename T>
void check_state(const at::Tensor& t, const char* name, const Layer<T>& p) {
  check_input(t, name, c10::CppTypeToScalarType<T>::value);
  TORCH_CHECK(t.numel() == p.D * p.B * p.H, "lnlstm: ", name, " must be (D, B, H)");
}

// Zero the padded frames (t >= len[b]) of a (B, T, width) tensor.
template <typename T>
void zero_padding(T* x, const int64_t* len, int64_t B, int64_t Tn, int64_t width) {
  for (int64_t b = 0; b < B; ++b)
    std::fill(x + (b * Tn + len[b]) * width, x + (b + 1) * Tn * width, T(0));
}

}  // namespace

// cell: plain, ba2016 or tf_contrib (the header). Returns [y, h_n, c_n] and, when save is true, the
// tensors backward needs: [gx, states_h, states_c, act, xhat_h, stats, xhat_c] (the LN ones empty
// without layer norm; gx empty for tf_contrib).
std::vector<at::Tensor> lnlstm_forward(const at::Tensor& x, const at::Tensor& w_x, const at::Tensor& w_h,
                                       const at::Tensor& bias, const at::Tensor& lxg, const at::Tensor& lxb,
                                       const at::Tensor& lhg, const at::Tensor& lhb, const at::Tensor& lcg,
                                       const at::Tensor& lcb, const at::Tensor& h0, const at::Tensor& c0,
                                       const at::Tensor& lengths, double forget_bias, double eps, std::string cell,
                                       bool save) {
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lnlstm_forward", [&] {
    using T = scalar_t;
    auto p = make_layer<T>(x, w_x, w_h, bias, lxg, lxb, lhg, lhb, lcg, lcb, lengths, forget_bias, eps, cell);
    const bool layer_norm = p.layer_norm;
    check_state(h0, "h0", p);
    check_state(c0, "c0", p);
    p.h0 = h0.const_data_ptr<T>();
    p.c0 = c0.const_data_ptr<T>();
    const int64_t B = p.B, D = p.D, H = p.H, S = p.S;
    auto opts = x.options();
    at::Tensor y = at::empty({B, p.Tn, D * H}, opts);
    at::Tensor h_n = at::empty({D, B, H}, opts), c_n = at::empty({D, B, H}, opts);
    at::Tensor gx, states_h, states_c, act, xhat_h, stats, xhat_c;
    if (save) {
      if (!p.tf_contrib) gx = empty_saved({D, S, B, 4 * H}, opts);
      states_h = empty_saved({D, S + 1, B, H}, opts);
      states_c = empty_saved({D, S + 1, B, H}, opts);
      act = empty_saved({D, S, B, 4 * H}, opts);
      p.gx = p.tf_contrib ? nullptr : gx.mutable_data_ptr<T>();
      p.states_h = states_h.mutable_data_ptr<T>();
      p.states_c = states_c.mutable_data_ptr<T>();
      p.act = act.mutable_data_ptr<T>();
      if (layer_norm) {
        xhat_h = empty_saved({D, S, B, 4 * H}, opts);
        stats = empty_saved({D, S, B, p.tf_contrib ? kStatsTfContrib : kStats}, opts);
        xhat_c = empty_saved({D, S, B, H}, opts);
        p.xhat_h = xhat_h.mutable_data_ptr<T>();
        p.stats = stats.mutable_data_ptr<T>();
        p.xhat_c = xhat_c.mutable_data_ptr<T>();
      }
    }
    p.save = save;
    p.y = y.mutable_data_ptr<T>();
    p.h_n = h_n.mutable_data_ptr<T>();
    p.c_n = c_n.mutable_data_ptr<T>();
    zero_padding(p.y, p.len, B, p.Tn, D * H);
    for_each_direction(D, [&](int64_t d) { forward_direction<T>(p, d); });
    out = {y, h_n, c_n};
    if (save) {
      for (auto& t : {gx, states_h, states_c, act, xhat_h, stats, xhat_c}) out.push_back(t);
    }
    for (auto& t : out)  // the op schema returns Tensor[]: absent entries are empty
      if (!t.defined()) t = at::empty({0}, opts);
  });
  return out;
}

// Takes the gradients of the forward's three outputs, the forward's inputs
// (less h0, c0) and the tensors it saved.
// Returns [d_x, d_w_x, d_w_h, d_bias, d_lxg, d_lxb, d_lhg, d_lhb, d_lcg, d_lcb, d_h0, d_c0]
// (d_x is empty unless need_dx, the LN gradients are empty without layer norm, d_bias and the LN_x
// gradients empty for tf_contrib).
std::vector<at::Tensor> lnlstm_backward(const at::Tensor& dy, const at::Tensor& dhn, const at::Tensor& dcn,
                                        const at::Tensor& x, const at::Tensor& w_x, const at::Tensor& w_h,
                                        const at::Tensor& bias, const at::Tensor& lxg, const at::Tensor& lxb,
                                        const at::Tensor& lhg, const at::Tensor& lhb, const at::Tensor& lcg,
                                        const at::Tensor& lcb, const at::Tensor& lengths, at::TensorList saved,
                                        double forget_bias, double eps, std::string cell, bool need_dx) {
  TORCH_CHECK(saved.size() == 7, "lnlstm_backward: expected the 7 tensors saved by lnlstm_forward");
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lnlstm_backward", [&] {
    using T = scalar_t;
    auto p = make_layer<T>(x, w_x, w_h, bias, lxg, lxb, lhg, lhb, lcg, lcb, lengths, forget_bias, eps, cell);
    const bool layer_norm = p.layer_norm, tf_contrib = p.tf_contrib;
    const int64_t B = p.B, D = p.D, H = p.H, I = p.I;
    auto opts = x.options();
    p.save = true;
    p.gx = tf_contrib ? nullptr : saved[0].data_ptr<T>();
    p.states_h = saved[1].data_ptr<T>();
    p.states_c = saved[2].data_ptr<T>();
    p.act = saved[3].data_ptr<T>();
    if (layer_norm) {
      p.xhat_h = saved[4].data_ptr<T>();
      p.stats = saved[5].data_ptr<T>();
      p.xhat_c = saved[6].data_ptr<T>();
    }
    at::Tensor dy_c = dy.contiguous(), dhn_c = dhn.contiguous(), dcn_c = dcn.contiguous();
    TORCH_CHECK(dy_c.numel() == B * p.Tn * D * H, "lnlstm_backward: grad of y has the wrong size");
    check_state(dhn_c, "grad of h_n", p);
    check_state(dcn_c, "grad of c_n", p);

    at::Tensor dx;  // one slice per direction, summed below
    if (need_dx) dx = at::empty({D, B, p.Tn, I}, opts);
    at::Tensor dw_x = at::empty({D, 4 * H, I}, opts);
    at::Tensor dw_h = at::empty({D, 4 * H, H}, opts);
    at::Tensor dbias;
    if (!tf_contrib) dbias = at::empty({D, 4 * H}, opts);
    at::Tensor dlxg, dlxb, dlhg, dlhb, dlcg, dlcb;
    if (layer_norm) {
      if (!tf_contrib) {
        dlxg = at::empty({D, 4 * H}, opts);
        dlxb = at::empty({D, 4 * H}, opts);
      }
      dlhg = at::empty({D, 4 * H}, opts);
      dlhb = at::empty({D, 4 * H}, opts);
      dlcg = at::empty({D, H}, opts);
      dlcb = at::empty({D, H}, opts);
    }
    at::Tensor dh0 = at::empty({D, B, H}, opts), dc0 = at::empty({D, B, H}, opts);
    Grads<T> g{};
    g.dy = dy_c.const_data_ptr<T>();
    g.dhn = dhn_c.const_data_ptr<T>();
    g.dcn = dcn_c.const_data_ptr<T>();
    g.dx = need_dx ? dx.mutable_data_ptr<T>() : nullptr;
    g.dw_x = dw_x.mutable_data_ptr<T>();
    g.dw_h = dw_h.mutable_data_ptr<T>();
    g.dbias = tf_contrib ? nullptr : dbias.mutable_data_ptr<T>();
    if (layer_norm) {
      g.dlxg = tf_contrib ? nullptr : dlxg.mutable_data_ptr<T>();
      g.dlxb = tf_contrib ? nullptr : dlxb.mutable_data_ptr<T>();
      g.dlhg = dlhg.mutable_data_ptr<T>();
      g.dlhb = dlhb.mutable_data_ptr<T>();
      g.dlcg = dlcg.mutable_data_ptr<T>();
      g.dlcb = dlcb.mutable_data_ptr<T>();
    }
    g.dh0 = dh0.mutable_data_ptr<T>();
    g.dc0 = dc0.mutable_data_ptr<T>();
    if (need_dx)
      for (int64_t d = 0; d < D; ++d) zero_padding(g.dx + d * B * p.Tn * I, p.len, B, p.Tn, I);
    for_each_direction(D, [&](int64_t d) { backward_direction<T>(p, g, d); });
    at::Tensor dx_total;
    if (need_dx) dx_total = D == 1 ? dx[0] : dx[0].add_(dx[1]);
    out = {dx_total, dw_x, dw_h, dbias, dlxg, dlxb, dlhg, dlhb, dlcg, dlcb, dh0, dc0};
    for (auto& t : out)
      if (!t.defined()) t = at::empty({0}, opts);
  });
  return out;
}

TORCH_LIBRARY(asr_lnlstm, m) {
  m.def("forward", &lnlstm_forward);
  m.def("backward", &lnlstm_backward);
}
