// RMSNorm (Zhang & Sennrich 2019) and LayerNorm (Ba et al. 2016) forward:
//   h     = x, or x + residual (fused residual add; rounded to r_t when ROUND_RES)
//   mean  = mean_j h[i,j]                  (LayerNorm; 0 for RMSNorm)
//   rstd  = 1 / sqrt(mean_j (h - mean)^2 + eps)
//   y     = round_y(xhat * (w + W_OFFSET) + b),  xhat = (h - mean) * rstd
// in fp32 (LLAMA: xhat rounded to x_t before the weight), rounded once to y.
//
// Specialised by a prelude that defines `struct Spec` before including this
// file: using x_t, y_t, w_t, r_t, ro_t, h_t, index_t; constexpr int N, VEC,
// TPR, ROWS, CLUSTER; constexpr bool LAYERNORM, TWO_PASS, STORE_RSTD, STORE_MEAN,
// HAS_W, HAS_B, RESIDUAL, STORE_RES, ROUND_RES, LLAMA, HEADS; constexpr float
// W_OFFSET. h_t is the type a cached row is kept in (x_t, r_t when the sum is
// rounded, else float). One program (CTA) of TPR * ROWS threads normalises
// ROWS rows at a time; with CLUSTER > 1, the CLUSTER CTAs of a cluster
// normalise one row, each holding a slice of it in registers (wide rows read
// once, or a decode row spread over several SMs).
#pragma once
#include "common.cuh"
#include "norm_args.cuh"

namespace nj {

// One row's pointers and the fused residual add.
template <class S> struct FwdRow {
  using index_t = typename S::index_t;
  const typename S::x_t* x;
  const typename S::r_t* r;
  typename S::ro_t* ro;
  typename S::y_t* y;

  __device__ __forceinline__ FwdRow(const NormArgs& a, long long row) {
    x = static_cast<const typename S::x_t*>(a.x) + row_offset<S::HEADS, index_t>(row, a.x_ld, a.x_hs, a.heads);
    y = static_cast<typename S::y_t*>(a.y) + row_offset<S::HEADS, index_t>(row, a.y_ld, a.y_hs, a.heads);
    r = static_cast<const typename S::r_t*>(a.residual) + (S::RESIDUAL ? (index_t)row * (index_t)a.res_ld : 0);
    ro = static_cast<typename S::ro_t*>(a.residual_out) + (S::STORE_RES ? (index_t)row * (index_t)a.res_out_ld : 0);
  }

  // The chunk of h at `col`, and (first_pass) h written to residual_out.
  __device__ __forceinline__ Vec<typename S::h_t, S::VEC> load_h(int col, bool exact, bool first_pass) const {
    const Vec<typename S::x_t, S::VEC> xv = load_chunk<S::N, S::VEC>(x, col, exact);
    Vec<typename S::h_t, S::VEC> h;
    if constexpr (!S::RESIDUAL) {
      h = xv;
    } else {
      const Vec<typename S::r_t, S::VEC> rv = load_chunk<S::N, S::VEC>(r, col, exact);
      Vec<typename S::ro_t, S::VEC> out;
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        float sum = to_float(xv.v[k]) + to_float(rv.v[k]);
        if constexpr (S::ROUND_RES) sum = round_to<typename S::r_t>(sum);
        h.v[k] = from_float<typename S::h_t>(sum);
        out.v[k] = from_float<typename S::ro_t>(sum);
      }
      if (S::STORE_RES && first_pass) store_chunk<S::N, S::VEC>(ro, col, out, exact);
    }
    return h;
  }

  // y of one chunk of h, given that chunk's weight and bias; the mean is
  // shift + m (see norm_fwd), kept apart so that h - mean loses nothing when
  // the mean is large.
  __device__ __forceinline__ void store_y(int col, bool exact, const Vec<typename S::h_t, S::VEC>& h, float shift,
                                          float m, float rstd, const Vec<typename S::w_t, S::VEC>& wv,
                                          const Vec<typename S::w_t, S::VEC>& bv) const {
    Vec<typename S::y_t, S::VEC> yv;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) {
      float v = ((to_float(h.v[k]) - shift) - m) * rstd;
      if constexpr (S::LLAMA) v = round_to<typename S::x_t>(v);  // normalised row in the input dtype
      if constexpr (S::HAS_W) v *= to_float(wv.v[k]) + S::W_OFFSET;
      if constexpr (S::HAS_B) v += to_float(bv.v[k]);
      yv.v[k] = from_float<typename S::y_t>(v);
    }
    store_chunk<S::N, S::VEC>(y, col, yv, exact);
  }
};

// Weight and bias chunks (left unset when the variant has none).
template <class S>
__device__ __forceinline__ void load_wb(const NormArgs& a, int col, bool exact, Vec<typename S::w_t, S::VEC>& wv,
                                        Vec<typename S::w_t, S::VEC>& bv) {
  if constexpr (S::HAS_W) wv = load_chunk<S::N, S::VEC>(static_cast<const typename S::w_t*>(a.w), col, exact);
  if constexpr (S::HAS_B) bv = load_chunk<S::N, S::VEC>(static_cast<const typename S::w_t*>(a.b), col, exact);
}

}  // namespace nj

// A template, so that `if constexpr` discards the paths a Spec does not take.
template <class S> __device__ __forceinline__ void norm_fwd(const nj::NormArgs& a) {
  using h_t = typename S::h_t;
  using w_t = typename S::w_t;
  constexpr int C = S::CLUSTER;
  using L = nj::RowLayout<S::N, S::VEC, S::TPR, C>;
  static_assert(C == 1 || (S::ROWS == 1 && !S::TWO_PASS), "a cluster shares one row held in registers");
  // Sums per reduction: one (register rows: sum of squares, or LayerNorm's
  // sum then squared deviations), two (two-pass rows: both at once).
  constexpr int K = S::TWO_PASS ? 2 : 1;
  __shared__ float red[S::ROWS][nj::kWarpsPerRow<S::TPR>][K];

  const int lane = threadIdx.x % S::TPR;
  long long row;
  int c0 = 0;  // the first column of this CTA's slice of the row
  if constexpr (C > 1) {
    row = nj::cluster_id();
    c0 = static_cast<int>(nj::cluster_rank()) * L::SLICE;
  } else {
    row = (long long)blockIdx.x * S::ROWS + threadIdx.x / S::TPR;
  }
  const nj::ThreadCols<S::N, S::VEC, S::TPR, C> tc{c0, lane};
  // Cluster rows exchange one value per CTA (RMSNorm: the sum of squares;
  // LayerNorm: the slice's sum and M2). Set up before the loads, so the
  // cluster barrier that publishes the mbarriers overlaps them.
  using Exchange = nj::ClusterExchange<C, S::LAYERNORM ? 2 : 1>;
  __shared__ typename Exchange::Shared xsh;
  Exchange xc(xsh);
  if constexpr (C > 1) xc.init();
  // Rows past M still take part in the reductions' barriers; they only skip memory.
  const bool valid = row < a.M;
  const nj::FwdRow<S> R(a, valid ? row : 0);
  constexpr float inv_n = 1.0f / S::N;
  // LayerNorm sums are shifted by the row's first element, so a large mean
  // (1e4, say) does not cancel away the variance: mean = shift + m with m of
  // the order of the standard deviation. RMSNorm: shift = m = 0.
  float shift = 0.f, m = 0.f, rstd;

  if constexpr (!S::TWO_PASS) {
    // The row (this CTA's slice of it) stays in registers (as h_t) between its uses.
    nj::Vec<h_t, S::VEC> hv[L::ITERS];
    // A thread's weight and bias, when few, are loaded with the row: at small
    // M the kernel is latency-bound, and this saves a memory round trip after
    // the reduction.
    constexpr bool PREFETCH_WB = L::ITERS * S::VEC * sizeof(w_t) * (S::HAS_B ? 2 : 1) <= 32;
    nj::Vec<w_t, S::VEC> wv[PREFETCH_WB ? L::ITERS : 1], bv[PREFETCH_WB ? L::ITERS : 1];
    float s[K] = {0.f};
    if constexpr (S::LAYERNORM) shift = valid ? nj::to_float(R.load_h(0, false, false).v[0]) : 0.f;
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = tc.col(i);
      if (valid && tc.in(i)) {
        hv[i] = R.load_h(col, L::EXACT, true);
        if constexpr (PREFETCH_WB) nj::load_wb<S>(a, col, L::EXACT, wv[i], bv[i]);
      } else {
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) hv[i].v[k] = nj::from_float<h_t>(0.f);
      }
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        const float f = nj::to_float(hv[i].v[k]);
        if constexpr (S::LAYERNORM) {
          if (L::EXACT || (tc.in(i) && col + k < S::N)) s[0] += f - shift;  // padding is not part of the row
        } else {
          s[0] += f * f;
        }
      }
    }
    nj::row_reduce<S::TPR, S::ROWS>(s, red);
    if constexpr (S::LAYERNORM) {
      // Exact two-step variance from the cached row: stable for any mean.
      // (Measured on an H200: faster than a one-round mean/M2 combine.) In a
      // cluster, each CTA's slice: its count n, mean and M2, combined below.
      const int n = C > 1 ? min(L::SLICE, max(0, S::N - c0)) : S::N;
      const float sum = s[0];
      m = C > 1 ? (n > 0 ? sum / n : 0.f) : sum * inv_n;
      s[0] = 0.f;
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float d = (nj::to_float(hv[i].v[k]) - shift) - m;
          if (L::EXACT || (tc.in(i) && col + k < S::N)) s[0] += d * d;  // padding is not part of the row
        }
      }
      nj::row_reduce<S::TPR, S::ROWS>(s, red);
      if constexpr (C > 1) {
        // Chan et al.'s pairwise combination of the slices' (n, mean, M2):
        // exact and stable, one exchange.
        float v[2] = {sum, s[0]};
        xc.ready();
        xc.exchange(v);
        const int r = threadIdx.x % 32, nr = min(L::SLICE, max(0, S::N - r * L::SLICE));
        m = nj::warp_sum(v[0]) * inv_n;
        const float dm = nr > 0 ? v[0] / nr - m : 0.f;
        s[0] = nj::warp_sum(r < C ? v[1] + nr * dm * dm : 0.f);
      }
    } else if constexpr (C > 1) {
      xc.ready();
      xc.exchange(s);
      s[0] = nj::warp_sum(s[0]);
    }
    rstd = rsqrtf(s[0] * inv_n + a.eps);
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = tc.col(i);
      if (valid && tc.in(i)) {
        nj::Vec<w_t, S::VEC> w, b;
        if constexpr (PREFETCH_WB) {
          w = wv[i];
          b = bv[i];
        } else {
          nj::load_wb<S>(a, col, L::EXACT, w, b);
        }
        R.store_y(col, L::EXACT, hv[i], shift, m, rstd, w, b);
      }
    }
  } else {
    // Wide rows without a cluster: too long for registers. Read the row
    // twice; the second read mostly hits L2 because only a few rows per SM
    // are in flight. LayerNorm: var = E[(h-shift)^2] - m^2, fine since m is
    // of the order of the std.
    float s[K] = {0.f, 0.f};
    if (valid) {
      if constexpr (S::LAYERNORM) shift = nj::to_float(R.load_h(0, false, false).v[0]);
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        const auto hv = R.load_h(c * S::VEC, L::EXACT, true);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float d = nj::to_float(hv.v[k]) - shift;
          if (L::EXACT || c * S::VEC + k < S::N) {
            s[0] += d * d;
            s[1] += d;
          }
        }
      }
    }
    nj::row_reduce<S::TPR, S::ROWS>(s, red);
    float var = s[0] * inv_n;
    if constexpr (S::LAYERNORM) {
      m = s[1] * inv_n;
      var = fmaxf(var - m * m, 0.f);
    }
    rstd = rsqrtf(var + a.eps);
    if (valid) {
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        nj::Vec<w_t, S::VEC> w, b;
        nj::load_wb<S>(a, c * S::VEC, L::EXACT, w, b);
        R.store_y(c * S::VEC, L::EXACT, R.load_h(c * S::VEC, L::EXACT, false), shift, m, rstd, w, b);
      }
    }
  }
  if (valid && lane == 0 && c0 == 0) {
    if constexpr (S::STORE_RSTD) a.rstd[row] = rstd;
    if constexpr (S::STORE_MEAN) a.mean[row] = shift + m;
  }
}

extern "C" __global__ void __launch_bounds__(Spec::TPR * Spec::ROWS) normjit_norm_fwd(const nj::NormArgs a) {
  norm_fwd<Spec>(a);
}
