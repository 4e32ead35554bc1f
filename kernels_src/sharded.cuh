// Norms over a hidden dimension sharded across ranks (tensor parallelism):
// each rank holds columns [c0, c0 + N) of every row of N_total, and a row's
// statistics need every rank's columns. Four kernels, between which the
// caller all-reduces a row's partial sums (torch.distributed / NCCL: no
// collective here):
//   normjit_shard_stats      partial sums of x:        (sum x, sum x^2)
//   normjit_shard_apply      y from the summed stats:  mean, rstd, y
//   normjit_shard_bwd_stats  partial sums of dy:       (sum g, sum g * xhat), g = dy * w'
//   normjit_shard_bwd_apply  dx from the summed ones, and this rank's
//                            dweight / dbias as partial rows a program
//                            (summed by normjit_dw_finalize)
// The partial sums are float64: x and x^2 of 16- and 32-bit inputs are
// exact in a double, so var = E[x^2] - mean^2 keeps 1e-8 of a unit variance
// at a mean of 1e4 (float32 sums would lose all of it), and a row's sums
// are 16 bytes to reduce across ranks. RMSNorm: mean = 0 (Zhang & Sennrich
// 2019); LayerNorm: Ba et al. 2016.
//
// Rows are dense (row stride = N). A block of THREADS threads works on one
// row at a time; thread t owns chunks t, t + THREADS, ... of VEC elements.
//
// Spec: using x_t (x), y_t (y, dy), w_t (weight, bias), dx_t; N (local
// columns), VEC, THREADS; LAYERNORM, HAS_W, HAS_B; W_OFFSET.
#pragma once
#include "common.cuh"

namespace nj {

struct Shard {
  using S = Spec;
  static constexpr int CHUNKS = S::N / S::VEC;  // the engine picks VEC dividing N
  static constexpr int ITERS = (CHUNKS + S::THREADS - 1) / S::THREADS;
  static constexpr bool EXACT = CHUNKS % S::THREADS == 0;
  static_assert(S::N % S::VEC == 0, "VEC divides N");

  __device__ __forceinline__ static bool in(int i) { return EXACT || i * S::THREADS + (int)threadIdx.x < CHUNKS; }
  __device__ __forceinline__ static int col(int i) { return (i * S::THREADS + threadIdx.x) * S::VEC; }

  template <class T> __device__ __forceinline__ static Vec<T, S::VEC> load(const T* row, int c) {
    return *reinterpret_cast<const Vec<T, S::VEC>*>(row + c);
  }
  template <class T> __device__ __forceinline__ static void store(T* row, int c, const float (&v)[S::VEC]) {
    Vec<T, S::VEC> o;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) o.v[k] = from_float<T>(v[k]);
    *reinterpret_cast<Vec<T, S::VEC>*>(row + c) = o;
  }
  // w' = weight + W_OFFSET (1 without a weight).
  __device__ __forceinline__ static float wt(const typename S::w_t* w, int j) {
    if constexpr (S::HAS_W) return to_float(w[j]) + S::W_OFFSET;
    return 1.f;
  }

  // Sums (a, b) over the block; every thread gets them. Fixed order: the
  // same inputs give the same bits.
  __device__ __forceinline__ static void block_sum(double& a, double& b) {
    __shared__ double red[2][32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    constexpr int WARPS = S::THREADS / 32;
    if constexpr (WARPS > 1) {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      __syncthreads();  // red is free (the previous row's readers are done)
      if (lane == 0) {
        red[0][warp] = a;
        red[1][warp] = b;
      }
      __syncthreads();
      a = 0;
      b = 0;
#pragma unroll
      for (int i = 0; i < WARPS; ++i) {
        a += red[0][i];
        b += red[1][i];
      }
    }
  }
};

}  // namespace nj

extern "C" __global__ void __launch_bounds__(Spec::THREADS)
normjit_shard_stats(const typename Spec::x_t* __restrict__ x, double* __restrict__ stats, long long M) {
  using Sh = nj::Shard;
  for (long long r = blockIdx.x; r < M; r += gridDim.x) {
    const typename Spec::x_t* row = x + r * Spec::N;
    double s1 = 0, s2 = 0;
#pragma unroll 4  // four chunks in flight: a wide shard's whole row would not fit the registers
    for (int i = 0; i < Sh::ITERS; ++i)
      if (Sh::in(i)) {
        const auto v = Sh::load(row, Sh::col(i));
        double d1 = 0, d2 = 0;
#pragma unroll
        for (int k = 0; k < Spec::VEC; ++k) {
          const double e = nj::to_float(v.v[k]);
          d1 += e;
          d2 += e * e;
        }
        s1 += d1;
        s2 += d2;
      }
    Sh::block_sum(s1, s2);
    if (threadIdx.x == 0) {
      stats[2 * r] = s1;
      stats[2 * r + 1] = s2;
    }
  }
}

// stats: every rank's sums added; inv_n = 1 / N_total.
extern "C" __global__ void __launch_bounds__(Spec::THREADS)
normjit_shard_apply(const typename Spec::x_t* __restrict__ x, const typename Spec::w_t* __restrict__ w,
                    const typename Spec::w_t* __restrict__ b, const double* __restrict__ stats,
                    typename Spec::y_t* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                    long long M, float eps, double inv_n) {
  using Sh = nj::Shard;
  for (long long r = blockIdx.x; r < M; r += gridDim.x) {
    const double m = Spec::LAYERNORM ? stats[2 * r] * inv_n : 0.0;
    const double var = stats[2 * r + 1] * inv_n - m * m;
    const float rstd = (float)(1.0 / sqrt(fmax(var, 0.0) + (double)eps));
    // The mean as hi + lo floats: x - hi is exact near a large mean
    // (Sterbenz), so xhat keeps the double mean's precision (one float mean
    // at 1e4 is 5e-4 off: y off by that much of a unit variance).
    const float mean = (float)m, mean_lo = (float)(m - (double)mean);
    if (threadIdx.x == 0) {
      if (rstd_out) rstd_out[r] = rstd;
      if (Spec::LAYERNORM && mean_out) mean_out[r] = mean;
    }
    const typename Spec::x_t* xr = x + r * Spec::N;
    typename Spec::y_t* yr = y + r * Spec::N;
#pragma unroll 4  // four chunks in flight: a wide shard's whole row would not fit the registers
    for (int i = 0; i < Sh::ITERS; ++i)
      if (Sh::in(i)) {
        const int c = Sh::col(i);
        const auto v = Sh::load(xr, c);
        float o[Spec::VEC];
#pragma unroll
        for (int k = 0; k < Spec::VEC; ++k) {
          float t = ((nj::to_float(v.v[k]) - mean) - mean_lo) * rstd * Sh::wt(w, c + k);
          if constexpr (Spec::HAS_B) t += nj::to_float(b[c + k]);
          o[k] = t;
        }
        Sh::store(yr, c, o);
      }
  }
}

// Partial sums of the backward: (sum g, sum g * xhat) over this rank's columns.
extern "C" __global__ void __launch_bounds__(Spec::THREADS)
normjit_shard_bwd_stats(const typename Spec::y_t* __restrict__ dy, const typename Spec::x_t* __restrict__ x,
                        const typename Spec::w_t* __restrict__ w, const float* __restrict__ mean,
                        const float* __restrict__ rstd, double* __restrict__ stats, long long M) {
  using Sh = nj::Shard;
  for (long long r = blockIdx.x; r < M; r += gridDim.x) {
    const float mu = Spec::LAYERNORM ? mean[r] : 0.f, rs = rstd[r];
    const typename Spec::x_t* xr = x + r * Spec::N;
    const typename Spec::y_t* dr = dy + r * Spec::N;
    double s1 = 0, s2 = 0;
#pragma unroll 4  // four chunks in flight: a wide shard's whole row would not fit the registers
    for (int i = 0; i < Sh::ITERS; ++i)
      if (Sh::in(i)) {
        const int c = Sh::col(i);
        const auto xv = Sh::load(xr, c);
        const auto dv = Sh::load(dr, c);
        float g1 = 0.f, g2 = 0.f;
#pragma unroll
        for (int k = 0; k < Spec::VEC; ++k) {
          const float g = nj::to_float(dv.v[k]) * Sh::wt(w, c + k);
          g1 += g;
          g2 += g * ((nj::to_float(xv.v[k]) - mu) * rs);
        }
        s1 += g1;
        s2 += g2;
      }
    Sh::block_sum(s1, s2);
    if (threadIdx.x == 0) {
      stats[2 * r] = s1;
      stats[2 * r + 1] = s2;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (RMSNorm: no mean(g)),
// the means over N_total from the summed stats. Program p (gridDim.x of
// them) takes rows p, p + gridDim.x, ... a column chunk at a time, so its
// dweight (and dbias) sums stay in registers: partial[p][j] (and
// partial[gridDim.x + p][j]), summed over programs by normjit_dw_finalize.
extern "C" __global__ void __launch_bounds__(Spec::THREADS)
normjit_shard_bwd_apply(const typename Spec::y_t* __restrict__ dy, const typename Spec::x_t* __restrict__ x,
                        const typename Spec::w_t* __restrict__ w, const float* __restrict__ mean,
                        const float* __restrict__ rstd, const double* __restrict__ stats,
                        typename Spec::dx_t* __restrict__ dx, float* __restrict__ partial, long long M, double inv_n) {
  using Sh = nj::Shard;
  constexpr bool DW = Spec::HAS_W, DB = Spec::HAS_B;
  float* pw = partial + (long long)blockIdx.x * Spec::N;
  float* pb = partial + ((long long)(DW ? gridDim.x : 0) + blockIdx.x) * Spec::N;
  for (int i = 0; i < Sh::ITERS; ++i) {  // not unrolled: the rows' loop is the long one
    if (!Sh::in(i)) continue;
    const int c = Sh::col(i);
    float aw[Spec::VEC], ab[Spec::VEC], wv[Spec::VEC];
#pragma unroll
    for (int k = 0; k < Spec::VEC; ++k) {
      aw[k] = 0.f;
      ab[k] = 0.f;
      wv[k] = Sh::wt(w, c + k);
    }
    for (long long r = blockIdx.x; r < M; r += gridDim.x) {
      const float mu = Spec::LAYERNORM ? mean[r] : 0.f, rs = rstd[r];
      const float a = Spec::LAYERNORM ? (float)(stats[2 * r] * inv_n) : 0.f;
      const float bc = (float)(stats[2 * r + 1] * inv_n);
      const auto xv = Sh::load(x + r * Spec::N, c);
      const auto dv = Sh::load(dy + r * Spec::N, c);
      float o[Spec::VEC];
#pragma unroll
      for (int k = 0; k < Spec::VEC; ++k) {
        const float d = nj::to_float(dv.v[k]);
        const float xh = (nj::to_float(xv.v[k]) - mu) * rs;
        o[k] = rs * (d * wv[k] - a - xh * bc);
        aw[k] += d * xh;
        ab[k] += d;
      }
      Sh::store(dx + r * Spec::N, c, o);
    }
#pragma unroll
    for (int k = 0; k < Spec::VEC; ++k) {
      if constexpr (DW) pw[c + k] = aw[k];
      if constexpr (DB) pb[c + k] = ab[k];
    }
  }
}
