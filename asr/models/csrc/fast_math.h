// Elementwise math and reductions shared by the toolkit's C++ operators (lnlstm.cpp, attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace asr_math {

// ---- elementwise math ----------------------------------------------------
// float: a branch-free exp (Cephes polynomial, ~1 ulp) that the compiler can
// vectorise, since libm calls would keep the row loops scalar. double: libm,
// so the float64 gradcheck sees exact functions.

inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // n = round(x / ln 2) with the 1.5 * 2^23 trick (round-to-nearest, no libm).
  const float magic = 12582912.f;
  float n = (x * 1.44269504088896341f + magic) - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float sigmoid(float x) { return 1.f / (1.f + exp_approx(-x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline float tanh_(float x) {
  // tanh(|x|) = (1 - e) / (1 + e), e = exp(-2|x|): no overflow for large |x|.
  float ax = x < 0.f ? -x : x;
  float e = exp_approx(-2.f * ax);
  float r = (1.f - e) / (1.f + e);
  return x < 0.f ? -r : r;
}
inline double tanh_(double x) { return std::tanh(x); }

// Independent partial sums, so reductions vectorise, in several vector
// registers, so the adds do not wait for each other.
constexpr int kLanes = 64;

template <typename T>
inline T sum(const T* x, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l];
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += x[i];
  return s;
}

template <typename T>
inline T dot(const T* x, const T* y, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * y[i + l];
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

}  // namespace asr_math
