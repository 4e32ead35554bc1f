// RMSNorm backward (Zhang & Sennrich 2019). With xhat = x * rstd, g = dy * w:
//   dx[i,j]  = rstd[i] * (g[i,j] - xhat[i,j] * mean_j(g[i,j] * xhat[i,j]))
//   dw[j]    = sum_i dy[i,j] * xhat[i,j]
// dw is reduced deterministically in two stages: this persistent kernel
// (gridDim.x programs, each a fixed set of rows in a fixed order) writes one
// fp32 partial row per program into `partial` (gridDim.x x N, never M x N);
// normjit_dw_finalize (dweight_finalize.cuh) sums the partial rows in order.
// A grid of one program writes dweight itself and needs no finalize.
//
// Spec (see rmsnorm_fwd.cuh) plus STAGES and DW_SMEM; x_t is also dx's
// dtype, y_t dy's. DW_SMEM keeps weight and dw sums in N * (4 + sizeof w_t)
// bytes of dynamic shared memory after the stages instead of registers (rows
// too long for those; STAGES > 0, ROWS == 1).
// TWO_PASS needs ROWS == 1. STAGES > 0 streams rows through STAGES shared-
// memory buffers with cp.async (dynamic shared memory of STAGES * ROWS * N *
// (sizeof x_t + sizeof y_t) bytes; rows must split exactly into chunks);
// STAGES == 0 double-buffers rows in registers.
#pragma once
#include "common.cuh"

namespace nj {

// One row's x and dy in registers (their own dtypes), and its rstd.
template <class S> struct BwdRow {
  using L = RowLayout<S::N, S::VEC, S::TPR>;
  Vec<typename S::x_t, S::VEC> x[L::ITERS];
  Vec<typename S::y_t, S::VEC> dy[L::ITERS];
  float r;
  bool valid;

  __device__ __forceinline__ void load(const typename S::x_t* __restrict__ xp, const typename S::y_t* __restrict__ dyp,
                                       const float* __restrict__ rstd, long long row, long long M, int lane,
                                       long long x_stride, long long dy_stride) {
    using index_t = typename S::index_t;
    valid = row < M;
    r = valid ? rstd[row] : 0.f;
    const typename S::x_t* xr = xp + (index_t)(valid ? row : 0) * (index_t)x_stride;
    const typename S::y_t* dyr = dyp + (index_t)(valid ? row : 0) * (index_t)dy_stride;
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = (lane + i * S::TPR) * S::VEC;
      if (valid && (L::EXACT || col < S::N)) {
        x[i] = load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
        dy[i] = load_chunk<S::N, S::VEC>(dyr, col, L::EXACT);
      } else {
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          x[i].v[k] = from_float<typename S::x_t>(0.f);
          dy[i].v[k] = from_float<typename S::y_t>(0.f);
        }
      }
    }
  }
};

// A thread's weight values and dw sums for its chunks. In registers (the
// usual case), or, for rows too long for that (DW_SMEM), in shared memory
// after the row stages: N fp32 dw sums, then the N weights as w_t; one row
// per program then.
template <class S, bool IN_SMEM = S::DW_SMEM> struct DwShare {
  using L = RowLayout<S::N, S::VEC, S::TPR>;
  float wf[L::ITERS][S::VEC], acc[L::ITERS][S::VEC];
  __device__ __forceinline__ void init(const typename S::w_t* __restrict__ w, int lane, float*) {
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = (lane + i * S::TPR) * S::VEC;
      Vec<typename S::w_t, S::VEC> wv;
      if (L::EXACT || col < S::N) {
        wv = load_chunk<S::N, S::VEC>(w, col, L::EXACT);
      } else {
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) wv.v[k] = from_float<typename S::w_t>(0.f);
      }
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        wf[i][k] = to_float(wv.v[k]);
        acc[i][k] = 0.f;
      }
    }
  }
  __device__ __forceinline__ float weight(int i, int k, int) const { return wf[i][k]; }
  __device__ __forceinline__ void add(int i, int k, int, float v) { acc[i][k] += v; }
  __device__ __forceinline__ float total(int i, int k, int) const { return acc[i][k]; }
};

template <class S> struct DwShare<S, true> {
  float* s;                 // dw sums
  typename S::w_t* ws;      // weight
  __device__ __forceinline__ void init(const typename S::w_t* __restrict__ w, int, float* smem) {
    s = smem;
    ws = reinterpret_cast<typename S::w_t*>(smem + S::N);
    for (int j = threadIdx.x; j < S::N; j += S::TPR * S::ROWS) {
      s[j] = 0.f;
      ws[j] = w[j];
    }
    __syncthreads();  // the weight is read by other threads than its loader
  }
  __device__ __forceinline__ float weight(int, int, int col) const { return to_float(ws[col]); }
  // Each column belongs to one thread: no barrier between adds.
  __device__ __forceinline__ void add(int, int, int col, float v) { s[col] += v; }
  __device__ __forceinline__ float total(int, int, int col) const { return s[col]; }
};

// dx of one row, and its share of dw added to `share`. Called by every thread
// of the block (row_sum may hold a barrier).
template <class S, class Share>
__device__ __forceinline__ void bwd_row(const BwdRow<S>& R, Share& share, typename S::x_t* __restrict__ dx,
                                        long long row, long long dx_stride, int lane,
                                        float (*red)[S::TPR > 32 ? S::TPR / 32 : 1]) {
  using L = RowLayout<S::N, S::VEC, S::TPR>;
  using index_t = typename S::index_t;
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i) {
    const int col = (lane + i * S::TPR) * S::VEC;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k)
      if (L::EXACT || col + k < S::N)
        dot += to_float(R.dy[i].v[k]) * share.weight(i, k, col + k) * to_float(R.x[i].v[k]);
  }
  // mean(g * xhat) = rstd * mean(dy * w * x)
  const float c = row_sum<S::TPR, S::ROWS>(dot, red) * R.r * (1.0f / S::N);
  if (!R.valid) return;
  typename S::x_t* dxr = dx + (index_t)row * (index_t)dx_stride;
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i) {
    const int col = (lane + i * S::TPR) * S::VEC;
    if (L::EXACT || col < S::N) {
      Vec<typename S::x_t, S::VEC> dxv;
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        const float xh = to_float(R.x[i].v[k]) * R.r;
        const float d = to_float(R.dy[i].v[k]);
        if (L::EXACT || col + k < S::N) {
          dxv.v[k] = from_float<typename S::x_t>(R.r * (d * share.weight(i, k, col + k) - xh * c));
          share.add(i, k, col + k, d * xh);
        }
      }
      store_chunk<S::N, S::VEC>(dxr, col, dxv, L::EXACT);
    }
  }
}

}  // namespace nj

// A template, so that `if constexpr` discards the paths a Spec does not take.
template <class S>
__device__ __forceinline__ void rms_bwd(const typename S::y_t* __restrict__ dy, const typename S::x_t* __restrict__ x,
                                        const typename S::w_t* __restrict__ w, const float* __restrict__ rstd,
                                        typename S::x_t* __restrict__ dx, float* __restrict__ partial,
                                        typename S::w_t* __restrict__ dw, long long M, long long dy_stride,
                                        long long x_stride, long long dx_stride) {
  using x_t = typename S::x_t;
  using y_t = typename S::y_t;
  using w_t = typename S::w_t;
  using index_t = typename S::index_t;
  using L = nj::RowLayout<S::N, S::VEC, S::TPR>;
  static_assert(!S::TWO_PASS || S::ROWS == 1, "two-pass backward handles one row per program");
  __shared__ float red[S::ROWS][S::TPR > 32 ? S::TPR / 32 : 1];

  const int lane = threadIdx.x % S::TPR;
  const int rg = threadIdx.x / S::TPR;
  constexpr float inv_n = 1.0f / S::N;
  const long long step = (long long)gridDim.x * S::ROWS;
  float* prow = partial + (index_t)blockIdx.x * S::N;
  // With a single program its sums are final: write dweight directly.
  auto emit = [&](int col, float v) {
    if (gridDim.x == 1) dw[col] = nj::from_float<w_t>(v);
    else prow[col] = v;
  };

  if constexpr (S::STAGES > 0) {
    static_assert(L::EXACT && !S::TWO_PASS, "staged rows need whole chunks");
    constexpr int XB = S::VEC * sizeof(x_t), YB = S::VEC * sizeof(y_t);
    // Layout: [stage][row group][N] of x, then the same of dy. Each thread
    // copies exactly the chunks it later reads, so cp.async.wait_group (no
    // barrier) makes them visible to it.
    extern __shared__ __align__(16) unsigned char stage_smem[];
    x_t* xs = reinterpret_cast<x_t*>(stage_smem);
    y_t* dys = reinterpret_cast<y_t*>(stage_smem + sizeof(x_t) * S::STAGES * S::ROWS * S::N);
    auto issue = [&](long long base, int stage) {
      const long long row = base + rg;
      if (row < M) {
        const x_t* xr = x + (index_t)row * (index_t)x_stride;
        const y_t* dyr = dy + (index_t)row * (index_t)dy_stride;
        const int off = (stage * S::ROWS + rg) * S::N;
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i) {
          const int col = (lane + i * S::TPR) * S::VEC;
          nj::cp_async<XB>(xs + off + col, xr + col);
          nj::cp_async<YB>(dys + off + col, dyr + col);
        }
      }
      nj::cp_async_commit();  // an empty group past the end keeps the count uniform
    };
    static_assert(!S::DW_SMEM || S::ROWS == 1, "dw in shared memory is per program: one row per program");
    nj::DwShare<S> share;
    share.init(w, lane, reinterpret_cast<float*>(dys + S::STAGES * S::ROWS * S::N));
    long long base = (long long)blockIdx.x * S::ROWS;
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) issue(base + s * step, s);
    float r_next = base + rg < M ? rstd[base + rg] : 0.f;
    for (int k = 0; base < M; base += step, ++k) {
      issue(base + (S::STAGES - 1) * step, (k + S::STAGES - 1) % S::STAGES);
      const long long row = base + rg;
      nj::BwdRow<S> cur;
      cur.valid = row < M;
      cur.r = r_next;
      r_next = row + step < M ? rstd[row + step] : 0.f;  // one row ahead
      nj::cp_async_wait<S::STAGES - 1>();  // this row's copies have landed
      const int off = ((k % S::STAGES) * S::ROWS + rg) * S::N;
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = (lane + i * S::TPR) * S::VEC;
        cur.x[i] = *reinterpret_cast<const nj::Vec<x_t, S::VEC>*>(xs + off + col);
        cur.dy[i] = *reinterpret_cast<const nj::Vec<y_t, S::VEC>*>(dys + off + col);
      }
      nj::bwd_row<S>(cur, share, dx, row, dx_stride, lane, red);
    }
    nj::cp_async_wait<0>();
    if constexpr (S::ROWS == 1) {
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i)
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const int col = (lane + i * S::TPR) * S::VEC + k;
          emit(col, share.total(i, k, col));
        }
    } else {
      __syncthreads();  // every thread is done with the stages: reuse them for dw
      float* dw_s = reinterpret_cast<float*>(stage_smem);
      for (int g = 0; g < S::ROWS; ++g) {
        if (rg == g) {
#pragma unroll
          for (int i = 0; i < L::ITERS; ++i)
#pragma unroll
            for (int k = 0; k < S::VEC; ++k) {
              const int col = (lane + i * S::TPR) * S::VEC + k;
              dw_s[col] = (g == 0 ? 0.f : dw_s[col]) + share.total(i, k, col);
            }
        }
        __syncthreads();
      }
      for (int j = threadIdx.x; j < S::N; j += S::TPR * S::ROWS) emit(j, dw_s[j]);
    }
  } else if constexpr (!S::TWO_PASS) {
    static_assert(!S::DW_SMEM, "rows in registers keep dw in registers");
    nj::DwShare<S> share;
    share.init(w, lane, nullptr);
    // Two row buffers: the next row's loads are in flight while this row is
    // reduced and written, so one program keeps two rows of memory traffic
    // going and the grid (and so the partial buffer) can stay small. The
    // trip count is the same for every thread of the block (barriers).
    nj::BwdRow<S> a, b;
    long long base = (long long)blockIdx.x * S::ROWS;
    a.load(x, dy, rstd, base + rg, M, lane, x_stride, dy_stride);
    while (base < M) {
      const long long next = base + step;
      b.load(x, dy, rstd, next + rg, M, lane, x_stride, dy_stride);
      nj::bwd_row<S>(a, share, dx, base + rg, dx_stride, lane, red);
      if (next >= M) break;
      base = next + step;
      a.load(x, dy, rstd, base + rg, M, lane, x_stride, dy_stride);
      nj::bwd_row<S>(b, share, dx, next + rg, dx_stride, lane, red);
    }
    if constexpr (S::ROWS == 1) {
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = (lane + i * S::TPR) * S::VEC;
#pragma unroll
        for (int k = 0; k < S::VEC; ++k)
          if (L::EXACT || col + k < S::N) emit(col + k, share.total(i, k, col + k));
      }
    } else {
      // Several rows per program: add the row groups' shares in group order.
      __shared__ float dw_s[S::N];
      for (int g = 0; g < S::ROWS; ++g) {
        if (rg == g) {
#pragma unroll
          for (int i = 0; i < L::ITERS; ++i) {
            const int col = (lane + i * S::TPR) * S::VEC;
#pragma unroll
            for (int k = 0; k < S::VEC; ++k)
              if (L::EXACT || col + k < S::N)
                dw_s[col + k] = (g == 0 ? 0.f : dw_s[col + k]) + share.total(i, k, col + k);
          }
        }
        __syncthreads();
      }
      for (int j = threadIdx.x; j < S::N; j += S::TPR * S::ROWS) emit(j, dw_s[j]);
    }
  } else {
    // Wide rows: two passes over x and dy per row; this program's partial row
    // (fp32, mostly L2-resident) accumulates dw in place.
    bool first = true;
    for (long long row = blockIdx.x; row < M; row += step) {
      const x_t* xr = x + (index_t)row * (index_t)x_stride;
      const y_t* dyr = dy + (index_t)row * (index_t)dy_stride;
      x_t* dxr = dx + (index_t)row * (index_t)dx_stride;
      const float r = rstd[row];
      float dot = 0.f;
#pragma unroll 4
      for (int cidx = lane; cidx < L::CHUNKS; cidx += S::TPR) {
        const int col = cidx * S::VEC;
        const auto xv = nj::load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
        const auto dyv = nj::load_chunk<S::N, S::VEC>(dyr, col, L::EXACT);
        const auto wv = nj::load_chunk<S::N, S::VEC>(w, col, L::EXACT);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k)
          dot += nj::to_float(dyv.v[k]) * nj::to_float(wv.v[k]) * nj::to_float(xv.v[k]);
      }
      const float c = nj::row_sum<S::TPR, S::ROWS>(dot, red) * r * inv_n;
#pragma unroll 4
      for (int cidx = lane; cidx < L::CHUNKS; cidx += S::TPR) {
        const int col = cidx * S::VEC;
        const auto xv = nj::load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
        const auto dyv = nj::load_chunk<S::N, S::VEC>(dyr, col, L::EXACT);
        const auto wv = nj::load_chunk<S::N, S::VEC>(w, col, L::EXACT);
        nj::Vec<x_t, S::VEC> dxv;
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float xh = nj::to_float(xv.v[k]) * r;
          const float d = nj::to_float(dyv.v[k]);
          dxv.v[k] = nj::from_float<x_t>(r * (d * nj::to_float(wv.v[k]) - xh * c));
          if (col + k < S::N) prow[col + k] = (first ? 0.f : prow[col + k]) + d * xh;
        }
        nj::store_chunk<S::N, S::VEC>(dxr, col, dxv, L::EXACT);
      }
      first = false;
    }
    if (first) {  // a program with no rows still owns a partial row
      for (int j = threadIdx.x; j < S::N; j += S::TPR) prow[j] = 0.f;
    }
    if (gridDim.x == 1) {  // the partial row is final: convert it
      __syncthreads();
      for (int j = threadIdx.x; j < S::N; j += S::TPR) dw[j] = nj::from_float<w_t>(prow[j]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(Spec::TPR * Spec::ROWS)
normjit_rms_bwd(const typename Spec::y_t* __restrict__ dy, const typename Spec::x_t* __restrict__ x,
                const typename Spec::w_t* __restrict__ w, const float* __restrict__ rstd,
                typename Spec::x_t* __restrict__ dx, float* __restrict__ partial, typename Spec::w_t* __restrict__ dw,
                long long M, long long dy_stride, long long x_stride, long long dx_stride) {
  rms_bwd<Spec>(dy, x, w, rstd, dx, partial, dw, M, dy_stride, x_stride, dx_stride);
}
