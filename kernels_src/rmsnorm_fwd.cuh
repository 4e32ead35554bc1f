// RMSNorm forward (Zhang & Sennrich 2019):
//   rstd[i] = 1 / sqrt(mean_j x[i,j]^2 + eps),  y[i,j] = x[i,j] * rstd[i] * w[j]
// accumulated in fp32, rounded once to y's dtype.
//
// Specialised by a prelude that defines `struct Spec` before including this
// file:
//   using x_t, y_t, w_t, index_t;  constexpr int N, VEC, TPR, ROWS;
//   constexpr bool TWO_PASS, STORE_RSTD;
// One program (CTA) of TPR * ROWS threads normalises ROWS rows at a time.
#pragma once
#include "common.cuh"

// A template, so that `if constexpr` discards the path a Spec does not take.
template <class S>
__device__ __forceinline__ void rms_fwd(const typename S::x_t* __restrict__ x, const typename S::w_t* __restrict__ w,
                                        typename S::y_t* __restrict__ y, float* __restrict__ rstd_out, long long M,
                                        long long x_stride, long long y_stride, float eps) {
  using x_t = typename S::x_t;
  using y_t = typename S::y_t;
  using w_t = typename S::w_t;
  using index_t = typename S::index_t;
  using L = nj::RowLayout<S::N, S::VEC, S::TPR>;
  __shared__ float red[S::ROWS][S::TPR > 32 ? S::TPR / 32 : 1];

  const int lane = threadIdx.x % S::TPR;
  const long long row = (long long)blockIdx.x * S::ROWS + threadIdx.x / S::TPR;
  // Rows past M still take part in the reductions' barriers; they only skip memory.
  const bool valid = row < M;
  const x_t* xr = x + (index_t)(valid ? row : 0) * (index_t)x_stride;
  y_t* yr = y + (index_t)(valid ? row : 0) * (index_t)y_stride;
  constexpr float inv_n = 1.0f / S::N;

  if constexpr (!S::TWO_PASS) {
    // The row stays in registers (in x's dtype) between the two uses.
    nj::Vec<x_t, S::VEC> xv[L::ITERS];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = (lane + i * S::TPR) * S::VEC;
      if (valid && (L::EXACT || col < S::N)) {
        xv[i] = nj::load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
      } else {
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) xv[i].v[k] = nj::from_float<x_t>(0.f);
      }
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        const float f = nj::to_float(xv[i].v[k]);
        ss += f * f;
      }
    }
    ss = nj::row_sum<S::TPR, S::ROWS>(ss, red);
    const float r = rsqrtf(ss * inv_n + eps);
    if (S::STORE_RSTD && valid && lane == 0) rstd_out[row] = r;
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = (lane + i * S::TPR) * S::VEC;
      if (valid && (L::EXACT || col < S::N)) {
        const nj::Vec<w_t, S::VEC> wv = nj::load_chunk<S::N, S::VEC>(w, col, L::EXACT);
        nj::Vec<y_t, S::VEC> yv;
#pragma unroll
        for (int k = 0; k < S::VEC; ++k)
          yv.v[k] = nj::from_float<y_t>(nj::to_float(xv[i].v[k]) * r * nj::to_float(wv.v[k]));
        nj::store_chunk<S::N, S::VEC>(yr, col, yv, L::EXACT);
      }
    }
  } else {
    // Wide rows: too long for registers. Read the row twice; the second read
    // mostly hits L2 because only a few rows per SM are in flight.
    float ss = 0.f;
    if (valid) {
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        const nj::Vec<x_t, S::VEC> xv = nj::load_chunk<S::N, S::VEC>(xr, c * S::VEC, L::EXACT);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float f = nj::to_float(xv.v[k]);
          ss += f * f;
        }
      }
    }
    ss = nj::row_sum<S::TPR, S::ROWS>(ss, red);
    const float r = rsqrtf(ss * inv_n + eps);
    if (S::STORE_RSTD && valid && lane == 0) rstd_out[row] = r;
    if (valid) {
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        const int col = c * S::VEC;
        const nj::Vec<x_t, S::VEC> xv = nj::load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
        const nj::Vec<w_t, S::VEC> wv = nj::load_chunk<S::N, S::VEC>(w, col, L::EXACT);
        nj::Vec<y_t, S::VEC> yv;
#pragma unroll
        for (int k = 0; k < S::VEC; ++k)
          yv.v[k] = nj::from_float<y_t>(nj::to_float(xv.v[k]) * r * nj::to_float(wv.v[k]));
        nj::store_chunk<S::N, S::VEC>(yr, col, yv, L::EXACT);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(Spec::TPR * Spec::ROWS)
normjit_rms_fwd(const typename Spec::x_t* __restrict__ x, const typename Spec::w_t* __restrict__ w,
                typename Spec::y_t* __restrict__ y, float* __restrict__ rstd_out, long long M,
                long long x_stride, long long y_stride, float eps) {
  rms_fwd<Spec>(x, w, y, rstd_out, M, x_stride, y_stride, eps);
}
