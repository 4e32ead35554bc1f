// RMSNorm (Zhang & Sennrich 2019) and LayerNorm (Ba et al. 2016) backward.
// With xhat = (x - mean) * rstd (mean = 0 for RMSNorm), w' = w + W_OFFSET (1
// without a weight) and g = dy * w':
//   dx[i,j] = rstd[i] * (g - c1 - xhat * c2) (+ dresidual[i,j])
//             c2 = mean_j(g * xhat), c1 = mean_j(g) for LayerNorm, 0 for RMSNorm
//   dw[j]   = sum_i dy[i,j] * xhat[i,j],   db[j] = sum_i dy[i,j]
// x here is the tensor the forward normalised (h with a fused residual add).
// dw and db are reduced deterministically in two stages: this persistent
// kernel (gridDim.x programs, each a fixed set of rows in a fixed order)
// writes fp32 partial rows into `partial` (gridDim.x x N for dw, then as many
// for db: never M x N); normjit_dw_finalize (dweight_finalize.cuh) sums them
// in order. A grid of one program writes dw and db itself.
//
// With CLUSTER > 1, the CLUSTER CTAs of a cluster share each row (a slice
// of it in each CTA's registers, or streamed twice with TWO_PASS; the row
// sums are exchanged through distributed shared memory), and a program is a
// cluster: its CTAs write the disjoint column slices of one partial row.
//
// Spec (see norm_fwd.cuh) plus dx_t (dx's dtype; x_t is the normalised
// input's), ro_t (dresidual's), DRES, STAGES and DW_SMEM. DW_SMEM keeps
// weight and sums in shared memory after the stages instead of registers
// (rows too long for those; STAGES > 0, ROWS == 1). TWO_PASS needs ROWS ==
// 1. STAGES > 0 streams rows (a cluster CTA: its slice of each row) through
// STAGES shared-memory buffers with cp.async (STAGES * ROWS * SLICE *
// (sizeof x_t + sizeof y_t) bytes of dynamic shared memory; rows must split
// exactly into chunks); STAGES == 0 double-buffers rows in registers.
// XGROUP > 0 (FP8 variants only define it): x is FP8 with one fp32 scale per
// XGROUP elements of a row (a.x_scale, [M, N / XGROUP]): x = q * scale
// wherever x is used.
#pragma once
#include "common.cuh"
#include "norm_args.cuh"

namespace nj {

// DW_CLUSTER: defined only by the preludes of configs whose grid is one
// cluster (decode rows, norm_bwd_dc below): its CTAs split every row's
// columns, and since the one cluster sees every row, each CTA writes the
// dw / db of its columns itself: no partial rows, no finalize launch. A
// function, not a data member (see peel_of).
template <class S> constexpr auto dw_cluster_or0(int) -> decltype(S::DW_CLUSTER + 0) { return S::DW_CLUSTER; }
template <class S> constexpr int dw_cluster_or0(long) { return 0; }
template <class S> constexpr bool dw_cluster_of() { return dw_cluster_or0<S>(0) != 0; }
template <class S> constexpr auto dc_rows_or0(int) -> decltype(S::DC_ROWS + 0) { return S::DC_ROWS; }
template <class S> constexpr int dc_rows_or0(long) { return 0; }

__host__ __device__ constexpr int pad16(int bytes) { return (bytes + 15) / 16 * 16; }

template <class S> constexpr int kPartials = (S::HAS_W ? 1 : 0) + (S::HAS_B ? 1 : 0);

// The row sums a backward row reduces: sum g * xhat, and for LayerNorm sum g.
// An RMSNorm row of fewer than 8 warps carries LayerNorm's second sum (0)
// all the same: with one, ptxas scheduled the staged row loop of 4-warp rows
// so that its loads waited (ncu, rms bf16 16384x1536 v4.t128.r4.s2: L1TEX
// scoreboard stalls 4.7 cycles an instruction, DRAM 51% -> 72% of peak with
// two sums; 63.6 -> 47.1 us, 4096x32768 258 -> 202 us on an H200), while
// rows of 8+ warps (the warp butterfly) run faster with one (3000x98305
// v1.t1024: 795 -> 743 us).
template <class S> constexpr int kSums = S::LAYERNORM || kWarpsPerRow<S::TPR> < 8 ? 2 : 1;
template <class S> using red_t = float[S::ROWS][kWarpsPerRow<S::TPR>][kSums<S>];
// PEEL: defined only by the preludes of rows whose tensors' rows do not
// start at a vector boundary (odd N, or strides no multiple of VEC; engine:
// config_grid.hpp's peeled). A thread's chunks are aligned vectors of the
// row's view (VEC - 1 columns more, the row at columns [lo, lo + N) of it),
// and since every row of a row group starts at the same lo (the engine
// makes a program's row step a whole number of vectors), the weight and the
// dw / db sums are shifted to the view once a program: each row moves as
// whole vectors but for its first and last chunk, as an unpeeled row does.
// (common.cuh's peel_of).
template <class S> constexpr int bwd_span_of() { return S::N + (peel_of<S>() ? S::VEC - 1 : 0); }

template <class S> using Layout = RowLayout<bwd_span_of<S>(), S::VEC, S::TPR, S::CLUSTER>;
// Every chunk of every thread whole and inside the row: no guards at all.
template <class S> constexpr bool kExact = Layout<S>::EXACT && !peel_of<S>();

// The columns of one thread (ThreadCols over the row's span), and a peeled
// row's lo: its chunks of the view in the row are those in_row, whole
// those wholly inside it.
template <class S> struct Cols : ThreadCols<bwd_span_of<S>(), S::VEC, S::TPR, S::CLUSTER> {
  using L = Layout<S>;
  int lo;  // 0 unless peeled
  // A peeled row's edges, whatever its lo, are view chunks 0 and C1 or
  // C1 + 1 (its last element at column lo + N - 1): a chunk slot i of a CTA
  // may hold one only where these land, which the compiler knows once the
  // loops over i unroll. Every other slot holds a whole chunk or none, and
  // moves as an unpeeled row's does, untested.
  static constexpr int C1 = (S::N - 1) / S::VEC;
  static constexpr bool at_slot(int chunk, int i) {
    return chunk < L::CHUNKS && chunk % L::SLICE_CHUNKS / S::TPR == i;
  }
  static constexpr bool may_edge(int i) { return peel_of<S>() && (i == 0 || at_slot(C1, i) || at_slot(C1 + 1, i)); }
  __device__ __forceinline__ bool in_row(int i) const {
    if constexpr (peel_of<S>()) return this->in(i) && (!at_slot(C1 + 1, i) || this->col(i) < lo + S::N);
    else return this->in(i);
  }
  __device__ __forceinline__ bool whole(int i) const {
    return !may_edge(i) || (this->col(i) >= lo && this->col(i) + S::VEC <= lo + S::N);
  }
  // Column col + k of the view in the row, as a column of the row (or -1).
  __device__ __forceinline__ int row_col(int col, int k) const { return row_col(col, k, lo); }
  static __device__ __forceinline__ int row_col(int col, int k, int lo) {
    const int c = col + k - lo;
    return c >= 0 && c < S::N ? c : -1;
  }
  // lo as a value the compiler cannot trace to the one the weight was
  // loaded with: the end of a program computes the same columns again, and
  // ptxas, sharing them, kept ITERS x VEC of them (and their predicates)
  // live across all the rows (rms bf16 N = 30001 v4.t128.c16: 142
  // registers, 96 without; its unpeeled twin 96).
  __device__ __forceinline__ int opaque_lo() const {
    int r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(lo));
    return r;
  }
};

// The program (CTA, or cluster) this CTA belongs to, and how many there are:
// each owns one partial row of dw (and of db).
template <class S> __device__ __forceinline__ long long program_id() {
  if constexpr (S::CLUSTER > 1) return cluster_id();
  else return blockIdx.x;
}
template <class S> __device__ __forceinline__ long long num_programs() {
  if constexpr (S::CLUSTER > 1) return num_clusters();
  else return gridDim.x;
}

// Row sums of the backward (sum g * xhat; LayerNorm: and sum g): over the
// row's threads, then, in a cluster, over its CTAs.
template <class S> struct RowSums {
  using Exchange = ClusterExchange<S::CLUSTER, kSums<S>>;
  red_t<S>& red;  // shared
  Exchange xc;    // its buffers are shared
  __device__ __forceinline__ void reduce(float (&c)[2]) {
    constexpr int K = kSums<S>;
    float v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = c[k];
    row_reduce<S::TPR, S::ROWS, K>(v, red);
    if constexpr (S::CLUSTER > 1) {
      xc.exchange(v);
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) c[k] = v[k];
  }
};

// The scales of an FP8 row's chunks (XG > 0; an empty base otherwise, so
// that rows of other dtypes hold nothing more).
template <int XG, int ITERS, int N> struct XScales {
  float xsc[ITERS];
  __device__ __forceinline__ float scale(int i) const { return xsc[i]; }
  // The scale of chunk i at column col of row `row` (a chunk lies in one group).
  __device__ __forceinline__ void load_scale(const NormArgs& a, long long row, int i, int col, bool in) {
    xsc[i] = in ? a.x_scale[row * (N / XG) + col / XG] : 0.f;
  }
};
template <int ITERS, int N> struct XScales<0, ITERS, N> {
  __device__ __forceinline__ float scale(int) const { return 1.f; }
  __device__ __forceinline__ void load_scale(const NormArgs&, long long, int, int, bool) {}
};

// One row's x and dy in registers (their own dtypes), and its statistics.
template <class S> struct BwdRow : XScales<xgroup_of<S>(), Layout<S>::ITERS, S::N> {
  using L = Layout<S>;
  Vec<typename S::x_t, S::VEC> x[L::ITERS];
  Vec<typename S::y_t, S::VEC> dy[L::ITERS];
  float r, mu;
  bool valid;

  // Element k of chunk i of x, in fp32 (dequantized).
  __device__ __forceinline__ float xv(int i, int k) const {
    if constexpr (xgroup_of<S>() > 0) return to_float(x[i].v[k]) * this->scale(i);
    else return to_float(x[i].v[k]);
  }

  __device__ __forceinline__ void stats(const NormArgs& a, long long row) {
    valid = row < a.M;
    r = valid ? a.rstd[row] : 0.f;
    mu = S::LAYERNORM && valid ? a.mean[row] : 0.f;
  }
  __device__ __forceinline__ void load(const NormArgs& a, long long row, const Cols<S>& tc) {
    using index_t = typename S::index_t;
    stats(a, row);
    const long long rr = valid ? row : 0;
    const auto* xr = static_cast<const typename S::x_t*>(a.x) + row_offset<S::HEADS, index_t>(rr, a.x_ld, a.x_hs, a.heads);
    const auto* dyr = static_cast<const typename S::y_t*>(a.dy) + row_offset<S::HEADS, index_t>(rr, a.dy_ld, a.dy_hs, a.heads);
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = tc.col(i);
      if (valid && tc.in_row(i)) {
        if constexpr (peel_of<S>()) {  // the view's chunk: the row's edges element by element
          if (tc.whole(i)) {
            x[i] = *reinterpret_cast<const Vec<typename S::x_t, S::VEC>*>((xr - tc.lo) + col);
            dy[i] = *reinterpret_cast<const Vec<typename S::y_t, S::VEC>*>((dyr - tc.lo) + col);
          } else {
            x[i] = load_span<S::VEC>((xr - tc.lo), col, tc.lo, tc.lo + S::N);
            dy[i] = load_span<S::VEC>((dyr - tc.lo), col, tc.lo, tc.lo + S::N);
          }
        } else {
          x[i] = load_chunk<S::N, S::VEC>(xr, col, L::EXACT);
          dy[i] = load_chunk<S::N, S::VEC>(dyr, col, L::EXACT);
        }
        this->load_scale(a, rr, i, col, true);
      } else {
        this->load_scale(a, rr, i, col, false);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          x[i].v[k] = from_float<typename S::x_t>(0.f);
          dy[i].v[k] = from_float<typename S::y_t>(0.f);
        }
      }
    }
  }
};

// A thread's weights (w') and dw / db sums for its chunks. In registers (the
// usual case), or, for rows too long for that (DW_SMEM), in shared memory
// after the row stages: N fp32 dw sums, N fp32 db sums (HAS_B), then the N
// weights as w_t; one row per program then.
template <class S, bool IN_SMEM = S::DW_SMEM> struct DwShare {
  using L = Layout<S>;
  float wf[S::HAS_W ? L::ITERS : 1][S::VEC];
  float aw[S::HAS_W ? L::ITERS : 1][S::VEC], ab[S::HAS_B ? L::ITERS : 1][S::VEC];
  __device__ __forceinline__ void init(const typename S::w_t* __restrict__ w, const Cols<S>& tc, float*) {
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = tc.col(i);
      if constexpr (S::HAS_W) {
        Vec<typename S::w_t, S::VEC> wv;
        if constexpr (peel_of<S>()) {  // shifted to the view of the thread's rows, once
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) {
            const int c = tc.in(i) ? tc.row_col(col, k) : -1;
            wv.v[k] = c >= 0 ? w[c] : from_float<typename S::w_t>(0.f);
          }
        } else if (tc.in(i)) {
          wv = load_chunk<S::N, S::VEC>(w, col, L::EXACT);
        } else {
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) wv.v[k] = from_float<typename S::w_t>(0.f);
        }
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          wf[i][k] = to_float(wv.v[k]) + S::W_OFFSET;
          aw[i][k] = 0.f;
        }
      }
      if constexpr (S::HAS_B)
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) ab[i][k] = 0.f;
    }
  }
  // w' of chunk i (at column col; `in`: the chunk is part of the slice).
  __device__ __forceinline__ void weights(int i, int, bool, float (&wk)[S::VEC]) const {
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) {
      if constexpr (S::HAS_W) wk[k] = wf[i][k];
      else wk[k] = 1.f;
    }
  }
  // This row's dw and db terms of chunk i at column col (of a chunk in the
  // slice; its columns past N are left out).
  __device__ __forceinline__ void add(int i, int col, const float (&dw)[S::VEC], const float (&db)[S::VEC]) {
#pragma unroll
    for (int k = 0; k < S::VEC; ++k)
      if (Layout<S>::EXACT || peel_of<S>() || col + k < S::N) {  // (a peeled row's dy is 0 past it)
        if constexpr (S::HAS_W) aw[i][k] += dw[k];
        if constexpr (S::HAS_B) ab[i][k] += db[k];
      }
  }
  __device__ __forceinline__ float total(int p, int i, int k, int) const {
    if constexpr (S::HAS_W) return p == 0 ? aw[i][k] : ab[i][k];
    else return ab[i][k];
  }
};

template <class S> struct DwShare<S, true> {
  static_assert(!peel_of<S>(), "peeled rows keep dw in registers");
  // A cluster CTA keeps only its slice's columns; `s` and `ws` point at the
  // slice's first column, so they are indexed by the column minus c0.
  static constexpr int SL = Layout<S>::SLICE;
  float* s;              // kPartials<S> x SL sums
  typename S::w_t* ws;   // weight
  int c0;
  __device__ __forceinline__ void init(const typename S::w_t* __restrict__ w, const Cols<S>& tc, float* smem) {
    c0 = tc.c0;
    s = smem;
    ws = reinterpret_cast<typename S::w_t*>(smem + kPartials<S> * SL);
    for (int j = threadIdx.x; j < SL && c0 + j < S::N; j += S::TPR * S::ROWS) {
#pragma unroll
      for (int p = 0; p < kPartials<S>; ++p) s[p * SL + j] = 0.f;
      if constexpr (S::HAS_W) ws[j] = w[c0 + j];
    }
    __syncthreads();  // the weight is read by other threads than its loader
  }
  // A chunk moves as vectors: element by element, the lanes' VEC-strided
  // columns fell into the same banks (ncu, rms bf16 48x262144 v4.c16.s2: 46%
  // of shared wavefronts excessive, half the stalls on a full MIO queue).
  __device__ __forceinline__ void weights(int, int col, bool in, float (&wk)[S::VEC]) const {
    if constexpr (S::HAS_W) {
      Vec<typename S::w_t, S::VEC> v;
      if (in) v = *reinterpret_cast<const Vec<typename S::w_t, S::VEC>*>(ws + col - c0);
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) wk[k] = in ? w_prime<S>(v.v[k]) : 0.f;
    } else {
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) wk[k] = 1.f;
    }
  }
  // Each column belongs to one thread: no barrier between adds. Staged rows
  // are whole chunks (VEC divides N): a chunk is all in the row.
  __device__ __forceinline__ void add(int, int col, const float (&dw)[S::VEC], const float (&db)[S::VEC]) {
    if constexpr (S::HAS_W) add_to(s + col - c0, dw);
    if constexpr (S::HAS_B) add_to(s + (S::HAS_W ? SL : 0) + col - c0, db);
  }
  // Float vectors of at most 16 bytes (one shared access a lane).
  static constexpr int FV = S::VEC < 4 ? S::VEC : 4;
  __device__ __forceinline__ static void add_to(float* p, const float (&t)[S::VEC]) {
#pragma unroll
    for (int q = 0; q < S::VEC; q += FV) {
      auto& v = *reinterpret_cast<Vec<float, FV>*>(p + q);
      Vec<float, FV> u = v;
#pragma unroll
      for (int k = 0; k < FV; ++k) u.v[k] += t[q + k];
      v = u;
    }
  }
  __device__ __forceinline__ float total(int p, int, int, int col) const { return s[p * SL + col - c0]; }
};

// Writes partial sum p (0: dw, or db without a weight; 1: db) of columns
// col .. col + PV - 1: into this program's partial row, as one PV-float
// store, or, with a grid of one program, the final values into dw / db.
// Scalar stores of the partial rows were most of a mid-M program's memory
// instructions (ncu: the load/store queue full 39% of the time).
template <class S, int PV = 1>
__device__ __forceinline__ void emit(const NormArgs& a, int p, int col, const Vec<float, PV>& v) {
  const bool is_db = !S::HAS_W || p == 1;
  const long long programs = num_programs<S>();
  if (programs == 1) {
    auto* out = static_cast<typename S::w_t*>(is_db ? a.db : a.dw);
#pragma unroll
    for (int k = 0; k < PV; ++k) out[col + k] = from_float<typename S::w_t>(v.v[k]);
  } else {
    *reinterpret_cast<Vec<float, PV>*>(a.partial + ((long long)p * programs + program_id<S>()) * S::N + col) = v;
  }
}
template <class S> __device__ __forceinline__ void emit(const NormArgs& a, int p, int col, float v) {
  emit<S, 1>(a, p, col, Vec<float, 1>{{v}});
}
// The widest float vector of partial-row columns a store may take: it
// divides VEC (so lies in one chunk) and N (so partial rows, N floats each
// in a 32-byte aligned workspace, keep it aligned, and a vector is wholly in
// or past the row).
template <class S> constexpr int partial_vec() {
  if constexpr (peel_of<S>()) return 1;  // (written element by element, shifted back to the row)
  return S::VEC % 4 == 0 && S::N % 4 == 0 ? 4 : S::VEC % 2 == 0 && S::N % 2 == 0 ? 2 : 1;
}

// dx of one row, and its share of dw / db added to `share`. Called by every
// thread of the block (row_reduce may hold a barrier).
template <class S, class Share>
__device__ __forceinline__ void bwd_row(const NormArgs& a, const BwdRow<S>& R, Share& share, long long row,
                                        const Cols<S>& tc, RowSums<S>& sums) {
  using L = Layout<S>;
  using index_t = typename S::index_t;
  float c[2] = {0.f, 0.f};  // sum g * xhat, sum g
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i) {
    const int col = tc.col(i);
    float wk[S::VEC];
    share.weights(i, col, tc.in(i), wk);
#pragma unroll
    for (int k = 0; k < S::VEC; ++k)
      if (kExact<S> || (tc.in_row(i) && (peel_of<S>() || col + k < S::N))) {  // (peeled: 0 outside the row)
        const float g = to_float(R.dy[i].v[k]) * wk[k];
        c[0] += g * (R.xv(i, k) - R.mu);
        if constexpr (S::LAYERNORM) c[1] += g;
      }
  }
  sums.reduce(c);
  if (!R.valid) return;
  const float c2 = c[0] * R.r * (1.0f / S::N), c1 = S::LAYERNORM ? c[1] * (1.0f / S::N) : 0.f;
  auto* dxr = static_cast<typename S::dx_t*>(a.dx) + row_offset<S::HEADS, index_t>(row, a.dx_ld, a.dx_hs, a.heads);
  const auto* drr = static_cast<const typename S::ro_t*>(a.dresidual) + (S::DRES ? (index_t)row * (index_t)a.dres_ld : 0);
  constexpr bool PEEL = peel_of<S>();
  if constexpr (PEEL) {  // the rows' view: aligned vectors, the row at [lo, lo + N)
    dxr -= tc.lo;
    drr -= tc.lo;
  }
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i) {
    const int col = tc.col(i);
    if (tc.in_row(i)) {
      Vec<typename S::ro_t, S::VEC> dr;
      if constexpr (S::DRES && PEEL)
        dr = tc.whole(i) ? *reinterpret_cast<const Vec<typename S::ro_t, S::VEC>*>(drr + col)
                         : load_span<S::VEC>(drr, col, tc.lo, tc.lo + S::N);
      else if constexpr (S::DRES) dr = load_chunk<S::N, S::VEC>(drr, col, L::EXACT);
      Vec<typename S::dx_t, S::VEC> dxv;
      float wk[S::VEC], dw[S::VEC], db[S::VEC];
      share.weights(i, col, true, wk);
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        const float xh = (R.xv(i, k) - R.mu) * R.r;
        const float d = to_float(R.dy[i].v[k]);
        float v = R.r * (d * wk[k] - c1 - xh * c2);
        if constexpr (S::DRES) v += to_float(dr.v[k]);
        dxv.v[k] = from_float<typename S::dx_t>(v);
        dw[k] = d * xh;
        db[k] = d;
      }
      share.add(i, col, dw, db);
      if constexpr (PEEL) {
        if (tc.whole(i)) st_global(reinterpret_cast<Vec<typename S::dx_t, S::VEC>*>(dxr + col), dxv);
        else store_span<S::VEC>(dxr, col, dxv, tc.lo, tc.lo + S::N);
      }
      else store_chunk<S::N, S::VEC>(dxr, col, dxv, L::EXACT);
    }
  }
}

// End of a program: its dw / db sums to the partial rows. Several row groups
// per program add their shares in group order through `smem`
// (kPartials x N floats).
template <class S, class Share>
__device__ __forceinline__ void emit_sums(const NormArgs& a, const Share& share, const Cols<S>& tc, float* smem) {
  using L = Layout<S>;
  constexpr int P = kPartials<S>;
  if constexpr (P == 0) return;
  constexpr int PV = partial_vec<S>();
  const int lo = peel_of<S>() ? tc.opaque_lo() : 0;
  if constexpr (peel_of<S>() && S::ROWS == 1) {  // the view's columns back to the row's
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i)
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const int c = tc.in_row(i) ? Cols<S>::row_col(tc.col(i), k, lo) : -1;
          if (c >= 0) emit<S>(a, p, c, share.total(p, i, k, tc.col(i) + k));
        }
  } else if constexpr (S::ROWS == 1) {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
#pragma unroll
        for (int q = 0; q < S::VEC; q += PV)
          if (L::EXACT || (tc.in(i) && col + q < S::N)) {
            Vec<float, PV> v;
#pragma unroll
            for (int k = 0; k < PV; ++k) v.v[k] = share.total(p, i, q + k, col + q + k);
            emit<S, PV>(a, p, col + q, v);
          }
      }
  } else {
    const int rg = threadIdx.x / S::TPR;
    for (int g = 0; g < S::ROWS; ++g) {
      if (rg == g) {
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int i = 0; i < L::ITERS; ++i) {
            const int col = tc.col(i);
#pragma unroll
            for (int k = 0; k < S::VEC; ++k)
              if constexpr (peel_of<S>()) {  // a peeled row group's view column back to the row's
                const int c = tc.in_row(i) ? Cols<S>::row_col(col, k, lo) : -1;
                if (c >= 0) {
                  float& s = smem[p * S::N + c];
                  s = (g == 0 ? 0.f : s) + share.total(p, i, k, col + k);
                }
              } else if (L::EXACT || (tc.in(i) && col + k < S::N)) {
                float& s = smem[p * S::N + col + k];
                s = (g == 0 ? 0.f : s) + share.total(p, i, k, col + k);
              }
          }
      }
      __syncthreads();
    }
    for (int j = threadIdx.x * PV; j < P * S::N; j += S::TPR * S::ROWS * PV)
      emit<S, PV>(a, j / S::N, j % S::N, *reinterpret_cast<const Vec<float, PV>*>(smem + j));
  }
}

}  // namespace nj

// A template, so that `if constexpr` discards the paths a Spec does not take.
template <class S> __device__ __forceinline__ void norm_bwd(const nj::NormArgs& a) {
  using x_t = typename S::x_t;
  using y_t = typename S::y_t;
  using w_t = typename S::w_t;
  using index_t = typename S::index_t;
  using L = nj::Layout<S>;
  constexpr int P = nj::kPartials<S>;
  static_assert(!S::TWO_PASS || S::ROWS == 1, "two-pass backward handles one row per program");
  static_assert(S::CLUSTER == 1 || S::ROWS == 1, "a cluster shares one row");
  __shared__ nj::red_t<S> red;
  __shared__ typename nj::RowSums<S>::Exchange::Shared xsh;
  nj::RowSums<S> sums{red, typename nj::RowSums<S>::Exchange(xsh)};
  if constexpr (S::CLUSTER > 1) sums.xc.init();

  const int lane = threadIdx.x % S::TPR;
  const int rg = threadIdx.x / S::TPR;
  const long long M = a.M;
  const long long pid = nj::program_id<S>();
  const long long step = nj::num_programs<S>() * S::ROWS;
  constexpr bool PEEL = nj::peel_of<S>();
  static_assert(!PEEL || (!S::TWO_PASS && !S::HEADS && nj::xgroup_of<S>() == 0),
                "peeled rows: one pass, 2-D rows, no FP8 x");
  int lo = 0;  // a peeled row group's: where each of its rows starts in a vector (the same for all)
  if constexpr (PEEL) {
    const long long r0 = pid * S::ROWS + rg < M ? pid * S::ROWS + rg : 0;
    lo = static_cast<int>(reinterpret_cast<unsigned long long>(static_cast<const x_t*>(a.x) + (index_t)r0 * (index_t)a.x_ld) /
                          sizeof(x_t) % S::VEC);
  }
  const nj::Cols<S> tc{{S::CLUSTER > 1 ? static_cast<int>(nj::cluster_rank()) * L::SLICE : 0, lane}, lo};
  const w_t* w = static_cast<const w_t*>(a.w);

  if constexpr (S::STAGES > 0 && !S::TWO_PASS) {
    static_assert(S::N % S::VEC == 0 || PEEL, "staged rows need whole chunks");
    constexpr int XB = S::VEC * sizeof(x_t), YB = S::VEC * sizeof(y_t);
    // Layout: [stage][row group][SLICE] of x, then the same of dy. Each
    // thread copies exactly the chunks it later reads, so cp.async.wait_group
    // (no barrier) makes them visible to it.
    constexpr int SL = L::SLICE;
    extern __shared__ __align__(16) unsigned char stage_smem[];
    x_t* xs = reinterpret_cast<x_t*>(stage_smem);
    y_t* dys = reinterpret_cast<y_t*>(stage_smem + sizeof(x_t) * S::STAGES * S::ROWS * SL);
    auto issue = [&](long long base, int stage) {
      const long long row = base + rg;
      if (row < M) {
        const x_t* xr = static_cast<const x_t*>(a.x) + nj::row_offset<S::HEADS, index_t>(row, a.x_ld, a.x_hs, a.heads);
        const y_t* dyr = static_cast<const y_t*>(a.dy) + nj::row_offset<S::HEADS, index_t>(row, a.dy_ld, a.dy_hs, a.heads);
        const int off = (stage * S::ROWS + rg) * SL - tc.c0;
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i) {
          const int col = tc.col(i);
          if constexpr (PEEL) {
            // The view's chunks, whole from the vector boundary before the
            // row (its first chunk's lo columns are masked where read); the
            // last as far as the row goes, zeros after it.
            if (tc.in_row(i)) {
              if (!nj::Cols<S>::may_edge(i)) {
                nj::cp_async<XB>(xs + off + col, (xr - tc.lo) + col);
                nj::cp_async<YB>(dys + off + col, (dyr - tc.lo) + col);
              } else {
                const int n = tc.lo + S::N - col < S::VEC ? tc.lo + S::N - col : S::VEC;
                nj::cp_async_zfill<XB>(xs + off + col, (xr - tc.lo) + col, n * (int)sizeof(x_t));
                nj::cp_async_zfill<YB>(dys + off + col, (dyr - tc.lo) + col, n * (int)sizeof(y_t));
              }
            }
          } else if (tc.in(i)) {
            nj::cp_async<XB>(xs + off + col, xr + col);
            nj::cp_async<YB>(dys + off + col, dyr + col);
          }
        }
      }
      nj::cp_async_commit();  // an empty group past the end keeps the count uniform
    };
    static_assert(!S::DW_SMEM || S::ROWS == 1, "dw in shared memory is per program: one row per program");
    nj::DwShare<S> share;
    share.init(w, tc, reinterpret_cast<float*>(dys + S::STAGES * S::ROWS * SL));
    long long base = pid * S::ROWS;
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) issue(base + s * step, s);
    if constexpr (S::CLUSTER > 1) sums.xc.ready();  // the cluster's mbarriers are initialised
    nj::BwdRow<S> next;
    next.stats(a, base + rg);
    for (int k = 0; base < M; base += step, ++k) {
      issue(base + (S::STAGES - 1) * step, (k + S::STAGES - 1) % S::STAGES);
      const long long row = base + rg;
      nj::BwdRow<S> cur;
      cur.valid = next.valid;
      cur.r = next.r;
      cur.mu = next.mu;
      next.stats(a, row + step);  // one row ahead
      nj::cp_async_wait<S::STAGES - 1>();  // this row's copies have landed
      const int off = ((k % S::STAGES) * S::ROWS + rg) * SL - tc.c0;
      // The view's first chunk: the lo columns before the row read as 0 (in
      // shared memory: masked in registers, the chunks were kept unpacked).
      // Braced: unbraced, NVRTC took the loop below into the discarded
      // statement, and every unpeeled staged kernel lost its rows.
      if constexpr (PEEL) {
        if (tc.col(0) < tc.lo) {
          for (int j = 0; j < tc.lo; ++j) {
            xs[off + j] = nj::from_float<x_t>(0.f);
            dys[off + j] = nj::from_float<y_t>(0.f);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
        if (tc.in_row(i)) {
          cur.x[i] = *reinterpret_cast<const nj::Vec<x_t, S::VEC>*>(xs + off + col);
          cur.dy[i] = *reinterpret_cast<const nj::Vec<y_t, S::VEC>*>(dys + off + col);
          cur.load_scale(a, cur.valid ? row : 0, i, col, true);
        } else {  // past the row: zeros, so the row sums see nothing
          cur.load_scale(a, 0, i, col, false);
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) {
            cur.x[i].v[k] = nj::from_float<x_t>(0.f);
            cur.dy[i].v[k] = nj::from_float<y_t>(0.f);
          }
        }
      }
      nj::bwd_row<S>(a, cur, share, row, tc, sums);
    }
    nj::cp_async_wait<0>();
    if constexpr (S::ROWS > 1) __syncthreads();  // every thread is done with the stages: reuse them
    nj::emit_sums<S>(a, share, tc, reinterpret_cast<float*>(stage_smem));
  } else if constexpr (!S::TWO_PASS) {
    static_assert(!S::DW_SMEM, "rows in registers keep dw in registers");
    nj::DwShare<S> share;
    share.init(w, tc, nullptr);
    // Two row buffers: the next row's loads are in flight while this row is
    // reduced and written, so one program keeps two rows of memory traffic
    // going and the grid (and so the partial buffer) can stay small. The
    // trip count is the same for every thread of the block (barriers).
    nj::BwdRow<S> r0, r1;
    long long base = pid * S::ROWS;
    r0.load(a, base + rg, tc);
    if constexpr (S::CLUSTER > 1) sums.xc.ready();  // the cluster's mbarriers are initialised
    while (base < M) {
      const long long next = base + step;
      r1.load(a, next + rg, tc);
      nj::bwd_row<S>(a, r0, share, base + rg, tc, sums);
      if (next >= M) break;
      base = next + step;
      r0.load(a, base + rg, tc);
      nj::bwd_row<S>(a, r1, share, next + rg, tc, sums);
    }
    __shared__ __align__(16) float dsum[S::ROWS > 1 ? (P > 0 ? P : 1) * S::N : 1];
    nj::emit_sums<S>(a, share, tc, dsum);
  } else {
    // Wide rows: two passes over x and dy per row; this program's partial
    // rows (fp32, mostly L2-resident) accumulate dw and db in place. In a
    // cluster each CTA streams its slice twice (the second pass mostly from
    // L2): rows too wide for the cluster's registers still spread over
    // CLUSTER SMs, which a few rows (decode) need to draw the bandwidth.
    using dx_t = typename S::dx_t;
    using ro_t = typename S::ro_t;
    float* pw = a.partial + pid * S::N;                                                   // dw (or db without a weight)
    float* pb = a.partial + ((long long)(P - 1) * nj::num_programs<S>() + pid) * S::N;  // db
    // This CTA's chunks [c_lo, c_hi) and columns [tc.c0, j_hi) of the row.
    const int c_lo = tc.c0 / S::VEC;
    const int c_hi = c_lo + L::SLICE_CHUNKS < L::CHUNKS ? c_lo + L::SLICE_CHUNKS : L::CHUNKS;
    const int j_hi = tc.c0 + L::SLICE < S::N ? tc.c0 + L::SLICE : S::N;
    // STAGES > 0: the CTA's slice of x and dy lands in shared memory with
    // cp.async, all of it in flight at once (one memory latency a row, where
    // the registers of a streaming pass keep only a few chunks in flight);
    // both passes read it there. Layout as the one-pass stages: [stage][SLICE]
    // of x, then of dy; each thread copies the chunks it reads (no barrier).
    constexpr int ST = S::STAGES;
    constexpr int SL = L::SLICE;
    extern __shared__ __align__(16) unsigned char row_smem[];
    x_t* xs = reinterpret_cast<x_t*>(row_smem);
    y_t* dys = reinterpret_cast<y_t*>(row_smem + sizeof(x_t) * (ST > 0 ? ST : 1) * SL);
    auto issue = [&](long long row, int stage) {
      if constexpr (ST > 0) {
        if (row < M) {
          const x_t* xr = static_cast<const x_t*>(a.x) + nj::row_offset<S::HEADS, index_t>(row, a.x_ld, a.x_hs, a.heads);
          const y_t* dyr = static_cast<const y_t*>(a.dy) + nj::row_offset<S::HEADS, index_t>(row, a.dy_ld, a.dy_hs, a.heads);
          const int off = stage * SL - tc.c0;
          for (int cidx = c_lo + lane; cidx < c_hi; cidx += S::TPR) {
            nj::cp_async<S::VEC * sizeof(x_t)>(xs + off + cidx * S::VEC, xr + cidx * S::VEC);
            nj::cp_async<S::VEC * sizeof(y_t)>(dys + off + cidx * S::VEC, dyr + cidx * S::VEC);
          }
        }
        nj::cp_async_commit();  // an empty group past the end keeps the count uniform
      }
    };
    if constexpr (ST > 0) {
      static_assert(S::N % S::VEC == 0, "staged rows need whole chunks");
#pragma unroll
      for (int s = 0; s < ST - 1; ++s) issue(pid + s * step, s);
    }
    if constexpr (S::CLUSTER > 1) sums.xc.ready();  // the cluster's mbarriers are initialised
    bool first = true;
    for (long long row = pid, k = 0; row < M; row += step, ++k) {
      const x_t* xr = static_cast<const x_t*>(a.x) + nj::row_offset<S::HEADS, index_t>(row, a.x_ld, a.x_hs, a.heads);
      const y_t* dyr = static_cast<const y_t*>(a.dy) + nj::row_offset<S::HEADS, index_t>(row, a.dy_ld, a.dy_hs, a.heads);
      const int soff = ST > 0 ? static_cast<int>(k % (ST > 0 ? ST : 1)) * SL - tc.c0 : 0;
      if constexpr (ST > 0) {
        issue(row + (ST - 1) * step, static_cast<int>((k + ST - 1) % ST));
        nj::cp_async_wait<ST - 1>();  // this row's copies have landed
      }
      // Chunk col of x and dy (columns >= N read as 0): shared or global memory.
      auto ld_x = [&](int col, bool in) {
        if constexpr (ST > 0) {
          nj::Vec<x_t, S::VEC> v;
          if (in) return *reinterpret_cast<const nj::Vec<x_t, S::VEC>*>(xs + soff + col);
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) v.v[k] = nj::from_float<x_t>(0.f);
          return v;
        } else {
          return nj::load_chunk<S::N, S::VEC>(xr, in ? col : S::N, false);
        }
      };
      auto ld_dy = [&](int col, bool in) {
        if constexpr (ST > 0) {
          nj::Vec<y_t, S::VEC> v;
          if (in) return *reinterpret_cast<const nj::Vec<y_t, S::VEC>*>(dys + soff + col);
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) v.v[k] = nj::from_float<y_t>(0.f);
          return v;
        } else {
          return nj::load_chunk<S::N, S::VEC>(dyr, in ? col : S::N, false);
        }
      };
      dx_t* dxr = static_cast<dx_t*>(a.dx) + nj::row_offset<S::HEADS, index_t>(row, a.dx_ld, a.dx_hs, a.heads);
      const ro_t* drr = static_cast<const ro_t*>(a.dresidual) + (S::DRES ? (index_t)row * (index_t)a.dres_ld : 0);
      const float r = a.rstd[row], mu = S::LAYERNORM ? a.mean[row] : 0.f;
      auto wprime = [&](const nj::Vec<w_t, S::VEC>& wv, int k) {
        if constexpr (S::HAS_W) return nj::w_prime<S>(wv.v[k]);
        else return 1.f;
      };
      auto x_scale = [&](int col) {  // FP8 x: the chunk's group scale
        constexpr int XGL = nj::xgroup_of<S>();
        if constexpr (XGL > 0) return a.x_scale[row * (S::N / XGL) + col / XGL];
        else return 1.f;
      };
      // Each pass moves U chunks a thread at a time, all loads of a batch
      // issued before any is used: the compiler may not hoist a load above
      // the previous chunk's stores (the pointers may alias), so without
      // batches a thread would wait out one memory latency per chunk. A
      // 1024-thread block has 64 registers a thread: two chunks a batch.
      constexpr int U = S::TPR * S::ROWS >= 1024 ? 2 : 4;
      float c[2] = {0.f, 0.f};
      for (int cb = c_lo + lane; cb < c_hi; cb += U * S::TPR) {
        nj::Vec<x_t, S::VEC> xv[U];
        nj::Vec<y_t, S::VEC> dyv[U];
        nj::Vec<w_t, S::VEC> wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int col = (cb + u * S::TPR) * S::VEC;
          const bool in = cb + u * S::TPR < c_hi;
          xv[u] = ld_x(col, in);
          dyv[u] = ld_dy(col, in);
          if constexpr (S::HAS_W) wv[u] = nj::load_chunk<S::N, S::VEC>(w, in ? col : S::N, false);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float xsc = cb + u * S::TPR < c_hi ? x_scale((cb + u * S::TPR) * S::VEC) : 0.f;
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) {
            const float g = nj::to_float(dyv[u].v[k]) * wprime(wv[u], k);
            c[0] += g * (nj::to_float(xv[u].v[k]) * xsc - mu);  // padding reads as 0: g = 0 there
            if constexpr (S::LAYERNORM) c[1] += g;
          }
        }
      }
      sums.reduce(c);
      const float c2 = c[0] * r * (1.0f / S::N), c1 = S::LAYERNORM ? c[1] * (1.0f / S::N) : 0.f;
      for (int cb = c_lo + lane; cb < c_hi; cb += U * S::TPR) {
        nj::Vec<x_t, S::VEC> xv[U];
        nj::Vec<y_t, S::VEC> dyv[U];
        nj::Vec<w_t, S::VEC> wv[U];
        nj::Vec<ro_t, S::VEC> dr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int col = (cb + u * S::TPR) * S::VEC;
          const bool in = cb + u * S::TPR < c_hi;
          xv[u] = ld_x(col, in);
          dyv[u] = ld_dy(col, in);
          if constexpr (S::HAS_W) wv[u] = nj::load_chunk<S::N, S::VEC>(w, in ? col : S::N, false);
          if constexpr (S::DRES) dr[u] = nj::load_chunk<S::N, S::VEC>(drr, in ? col : S::N, false);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int col = (cb + u * S::TPR) * S::VEC;
          if (cb + u * S::TPR >= c_hi) continue;
          nj::Vec<dx_t, S::VEC> dxv;
          nj::Vec<float, S::VEC> sw, sb;  // this row's dw and db terms
          const float xsc = x_scale(col);
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) {
            const float xh = (nj::to_float(xv[u].v[k]) * xsc - mu) * r;
            const float d = nj::to_float(dyv[u].v[k]);
            float v = r * (d * wprime(wv[u], k) - c1 - xh * c2);
            if constexpr (S::DRES) v += nj::to_float(dr[u].v[k]);
            dxv.v[k] = nj::from_float<dx_t>(v);
            sw.v[k] = d * xh;
            sb.v[k] = d;
          }
          nj::store_chunk<S::N, S::VEC>(dxr, col, dxv, L::EXACT);
          // A program's later rows add to its partial rows (L2-resident): whole
          // vectors where N splits into chunks (the partial rows are then
          // aligned to them), else element by element.
          auto add_to = [&](float* p, nj::Vec<float, S::VEC>& t) {
            if constexpr (S::N % S::VEC == 0) {
              auto* pv = reinterpret_cast<nj::Vec<float, S::VEC>*>(p + col);
              if (!first) {
                const nj::Vec<float, S::VEC> o = *pv;
#pragma unroll
                for (int k = 0; k < S::VEC; ++k) t.v[k] += o.v[k];
              }
              *pv = t;
            } else {
#pragma unroll
              for (int k = 0; k < S::VEC; ++k)
                if (col + k < S::N) p[col + k] = (first ? 0.f : p[col + k]) + t.v[k];
            }
          };
          if constexpr (S::HAS_W) add_to(pw, sw);
          if constexpr (S::HAS_B) add_to(pb, sb);
        }
      }
      first = false;
    }
    if constexpr (P > 0) {
      if (first)  // a program with no rows still owns its partial rows
        for (int j = tc.c0 + threadIdx.x; j < j_hi; j += S::TPR) {
          pw[j] = 0.f;
          pb[j] = 0.f;
        }
      if (nj::num_programs<S>() == 1) {  // the partial rows are final: convert them (each CTA its slice)
        __syncthreads();
        // Eight columns' loads in flight before their stores (which may alias).
        for (int j0 = tc.c0 + threadIdx.x; j0 < j_hi; j0 += 8 * S::TPR) {
          float v[P][8];
#pragma unroll
          for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int p = 0; p < P; ++p)
              v[p][u] = j0 + u * S::TPR < j_hi ? a.partial[(long long)p * S::N + j0 + u * S::TPR] : 0.f;
#pragma unroll
          for (int u = 0; u < 8; ++u)
            if (j0 + u * S::TPR < j_hi)
#pragma unroll
              for (int p = 0; p < P; ++p) nj::emit<S>(a, p, j0 + u * S::TPR, v[p][u]);
        }
      }
    }
  }
}

// Decode rows (DW_CLUSTER): the grid is one cluster of CLUSTER CTAs, CTA k
// owning slice k of every row's columns. Rows go in batches of DC_ROWS
// through dynamic shared memory:
//  1. every copy of the batch (x, dy, dresidual slices) issued at once by
//     all threads with cp.async: one memory latency a batch, where a loop
//     over rows pays one a row;
//  2. a warp a row sums its slice (sum g * xhat, sum g) and stores the sums
//     into every peer's receive buffer; one cluster barrier; each CTA adds
//     the CTAs' sums in rank order (the same bits in every CTA);
//  3. ROWS row groups of TPR threads, each thread a column chunk, write dx
//     (group g the rows g, g + ROWS, ...) and add dw / db in registers.
// Since the one cluster sees every row, the groups' sums are final after
// the last batch: they are added in group order through shared memory and
// each CTA writes its columns of dw and db. No partial rows, no finalize
// launch. Every phase spreads over all the CTA's threads: with a thread a
// column for every row, 64 rows of 7168 ran 18 us on an H200 against 6.6
// for the best two-launch config.
// The receive buffers alternate between batches: a CTA stores into a
// peer's buffer b only after the barrier that the peer reaches when done
// reading it two batches back. Shared memory layout (16-byte aligned
// arrays; row_budget.cpp's dc_batch computes the same size): x[R][SL],
// dy[R][SL], dresidual[R][SL] (DRES) -- after the last batch the groups'
// sums [ROWS - 1][P][SL] floats in their place --, w[SL], then floats
// recv[2][C][R][K], sums[R][K], stats[R][2] (rstd, mean).
template <class S> __device__ __forceinline__ void norm_bwd_dc(const nj::NormArgs& a) {
  using x_t = typename S::x_t;
  using y_t = typename S::y_t;
  using w_t = typename S::w_t;
  using ro_t = typename S::ro_t;
  using dx_t = typename S::dx_t;
  using index_t = typename S::index_t;
  using L = nj::Layout<S>;
  constexpr int V = S::VEC, T = S::TPR * S::ROWS, G = S::ROWS, C = S::CLUSTER, R = nj::dc_rows_or0<S>(0);
  constexpr int SL = L::SLICE, SLC = L::SLICE_CHUNKS, P = nj::kPartials<S>;
  constexpr int K = S::LAYERNORM ? 2 : 1;  // row sums: sum g * (x - mean), and sum g
  static_assert(C > 1 && R > 0 && T >= 32 && !S::TWO_PASS && nj::xgroup_of<S>() == 0 && P > 0,
                "a decode cluster: whole warps, rows in shared memory, no FP8 x, dw or db to sum");
  static_assert(S::N % V == 0, "whole chunks");
  using nj::pad16;
  constexpr int XO = 0, YO = XO + pad16(R * SL * (int)sizeof(x_t)), RO = YO + pad16(R * SL * (int)sizeof(y_t));
  constexpr int ROWS_END = RO + (S::DRES ? pad16(R * SL * (int)sizeof(ro_t)) : 0);
  constexpr int RED_END = G > 1 ? pad16((G - 1) * P * SL * 4) : 0;
  constexpr int WO = ROWS_END > RED_END ? ROWS_END : RED_END;
  constexpr int FO = WO + (S::HAS_W ? pad16(SL * (int)sizeof(w_t)) : 0);
  extern __shared__ __align__(16) unsigned char dc_smem[];
  x_t* xs = reinterpret_cast<x_t*>(dc_smem + XO);
  y_t* dys = reinterpret_cast<y_t*>(dc_smem + YO);
  ro_t* drs = reinterpret_cast<ro_t*>(dc_smem + RO);
  w_t* ws = reinterpret_cast<w_t*>(dc_smem + WO);
  float* recv = reinterpret_cast<float*>(dc_smem + FO);  // [2][C][R][K]
  float* sums = recv + 2 * C * R * K;                    // [R][K]
  float* stats = sums + R * K;                           // [R][2]

  // The row sums travel by st.async, each landing on its receiver's
  // mbarrier of the batch's buffer (two, alternating): a CTA waits only for
  // its own buffer to fill. A release / acquire cluster barrier a batch
  // compiled to MEMBAR.ALL.GPU and an L1 invalidation (see ClusterMax).
  // Peers' stores may target this CTA's shared memory (and mbarriers) only
  // once it runs and has set them up: arrive now, wait before the first
  // store (the copies overlap it).
  __shared__ unsigned long long bars[2];
  nj::mbarriers_init(bars, 2);
  const unsigned rank = nj::cluster_rank();
  const int c0 = static_cast<int>(rank) * SL;
  const int grp = threadIdx.x / S::TPR;
  const nj::Cols<S> tc{{c0, static_cast<int>(threadIdx.x % S::TPR)}, 0};
  const long long M = a.M;
  // Chunks of this CTA's slice that lie in the row (the last CTAs' may end early).
  const int rest = S::N / V - static_cast<int>(rank) * SLC;
  const int chunks = rest < 0 ? 0 : rest < SLC ? rest : SLC;

  // The slice's weight lands in shared memory with the first batch's rows
  // (the row sums read all of it; each thread then takes its chunks into
  // registers): loaded before them, its round trip had preceded theirs.
  if constexpr (S::HAS_W)
    for (int j = threadIdx.x; j < chunks; j += T) {
      const w_t* src = static_cast<const w_t*>(a.w) + c0 + j * V;
      if constexpr (sizeof(w_t) * V >= 4) nj::cp_async<(int)sizeof(w_t) * V>(ws + j * V, src);
      else *reinterpret_cast<nj::Vec<w_t, V>*>(ws + j * V) = *reinterpret_cast<const nj::Vec<w_t, V>*>(src);
    }
  float wf[L::ITERS][V], aw[L::ITERS][V], ab[L::ITERS][V];
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) {
      aw[i][k] = 0.f;
      ab[i][k] = 0.f;
    }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int batch = 0;
  for (long long b0 = 0; b0 < M; b0 += R, ++batch) {
    const int rows = M - b0 < R ? static_cast<int>(M - b0) : R;
    // 1. The batch's slices, all in flight; chunk q of the batch is chunk
    // q % chunks of its row q / chunks.
    auto source = [&](int q, int& o, long long& row, int& col) {
      const int m = q / chunks, j = q - m * chunks;
      row = b0 + m;
      col = c0 + j * V;
      o = m * SL + j * V;
    };
    static_assert(sizeof(x_t) * V >= 4 && sizeof(y_t) * V >= 4 && (!S::DRES || sizeof(ro_t) * V >= 4),
                  "cp.async moves 4 bytes or more");
    for (int q = threadIdx.x; q < rows * chunks; q += T) {
      int o, col;
      long long row;
      source(q, o, row, col);
      nj::cp_async<(int)sizeof(x_t) * V>(
          xs + o, static_cast<const x_t*>(a.x) + nj::row_offset<S::HEADS, index_t>(row, a.x_ld, a.x_hs, a.heads) + col);
      nj::cp_async<(int)sizeof(y_t) * V>(
          dys + o, static_cast<const y_t*>(a.dy) + nj::row_offset<S::HEADS, index_t>(row, a.dy_ld, a.dy_hs, a.heads) + col);
      if constexpr (S::DRES)
        nj::cp_async<(int)sizeof(ro_t) * V>(
            drs + o, static_cast<const ro_t*>(a.dresidual) + (index_t)row * (index_t)a.dres_ld + col);
    }
    for (int m = threadIdx.x; m < rows; m += T) {  // also in flight: no load waits before the copies land
      nj::cp_async<4>(stats + 2 * m, a.rstd + b0 + m);
      if constexpr (S::LAYERNORM) nj::cp_async<4>(stats + 2 * m + 1, a.mean + b0 + m);
      else stats[2 * m + 1] = 0.f;
    }
    nj::cp_async_commit();
    nj::cp_async_wait<0>();
    __syncthreads();  // rows, weights and stats are read by other threads than their loaders
    if (batch == 0) {
      asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i)
#pragma unroll
        for (int k = 0; k < V; ++k)
          wf[i][k] = S::HAS_W && tc.in(i) ? nj::to_float(ws[tc.chunk(i) * V + k]) + S::W_OFFSET : 0.f;
    }
    // 2. Row sums: a warp a row over the slice, to every peer. A buffer is
    // refilled two batches on: a peer sends batch + 2 only once it has this
    // CTA's sums of batch + 1, sent after this CTA last read the buffer.
    float* rb = recv + (batch & 1) * C * R * K;
    const unsigned bar = nj::smem_addr(&bars[batch & 1]);
    if (threadIdx.x == 0) nj::mbarrier_expect_tx(bar, C * rows * K * 4);
    for (int m = warp; m < rows; m += T / 32) {
      const float mu = stats[2 * m + 1];
      float c[2] = {0.f, 0.f};
      for (int j = lane; j < chunks; j += 32) {
        const auto xv = *reinterpret_cast<const nj::Vec<x_t, V>*>(xs + m * SL + j * V);
        const auto dv = *reinterpret_cast<const nj::Vec<y_t, V>*>(dys + m * SL + j * V);
        nj::Vec<w_t, V> wv;
        if constexpr (S::HAS_W) wv = *reinterpret_cast<const nj::Vec<w_t, V>*>(ws + j * V);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float g = nj::to_float(dv.v[k]) * (S::HAS_W ? nj::w_prime<S>(wv.v[k]) : 1.f);
          c[0] += g * (nj::to_float(xv.v[k]) - mu);
          if constexpr (S::LAYERNORM) c[1] += g;
        }
      }
      const float t0 = nj::warp_sum(c[0]), t1 = K > 1 ? nj::warp_sum(c[1]) : 0.f;
      if (lane < C) {  // a row's K sums in one store a peer (rb's rows are 8-byte aligned)
        const unsigned dst = nj::dsmem_map(nj::smem_addr(rb + (rank * R + m) * K), lane), pb = nj::dsmem_map(bar, lane);
        if constexpr (K > 1) nj::dsmem_store_async(dst, t0, t1, pb);
        else nj::dsmem_store_async(dst, t0, pb);
      }
    }
    nj::mbarrier_wait(bar, (batch >> 1) & 1);  // every CTA's sums of this batch have landed here
    for (int t = threadIdx.x; t < rows * K; t += T) {
      float v = 0.f;
#pragma unroll
      for (int r = 0; r < C; ++r) v += rb[r * R * K + t];
      sums[t] = v;
    }
    __syncthreads();
    // 3. dx of the group's rows; dw and db in registers.
    for (int m = grp; m < rows; m += G) {
      const long long row = b0 + m;
      const float r = stats[2 * m], mu = stats[2 * m + 1];
      const float c2 = sums[m * K] * r * (1.0f / S::N), c1 = S::LAYERNORM ? sums[m * K + K - 1] * (1.0f / S::N) : 0.f;
      dx_t* dxr = static_cast<dx_t*>(a.dx) + nj::row_offset<S::HEADS, index_t>(row, a.dx_ld, a.dx_hs, a.heads);
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        if (!tc.in(i)) continue;
        const int o = m * SL + tc.chunk(i) * V;
        const auto xv = *reinterpret_cast<const nj::Vec<x_t, V>*>(xs + o);
        const auto dv = *reinterpret_cast<const nj::Vec<y_t, V>*>(dys + o);
        nj::Vec<ro_t, V> dr;
        if constexpr (S::DRES) dr = *reinterpret_cast<const nj::Vec<ro_t, V>*>(drs + o);
        nj::Vec<dx_t, V> dxv;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xh = (nj::to_float(xv.v[k]) - mu) * r;
          const float d = nj::to_float(dv.v[k]);
          float v = r * (d * (S::HAS_W ? wf[i][k] : 1.f) - c1 - xh * c2);
          if constexpr (S::DRES) v += nj::to_float(dr.v[k]);
          dxv.v[k] = nj::from_float<dx_t>(v);
          aw[i][k] += d * xh;
          ab[i][k] += d;
        }
        nj::store_chunk<S::N, V>(dxr, tc.col(i), dxv, true);
      }
    }
    __syncthreads();  // the next batch's copies (or the groups' sums) overwrite the rows
  }
  if (M <= 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // the arrival above needs its wait
  // The groups' sums: groups 1.. through shared memory, added by group 0
  // in group order (deterministic); then dw and db of this CTA's columns.
  float* red = reinterpret_cast<float*>(dc_smem);  // [G - 1][P][SL], over the rows
  auto slot = [&](int g, int p, int i, int k) { return ((g - 1) * P + p) * SL + tc.chunk(i) * V + k; };
  if constexpr (G > 1) {
    if (grp > 0) {
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i)
        if (tc.in(i))
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if constexpr (S::HAS_W) red[slot(grp, 0, i, k)] = aw[i][k];
            if constexpr (S::HAS_B) red[slot(grp, P - 1, i, k)] = ab[i][k];
          }
    }
    __syncthreads();
  }
  if (grp > 0) return;
#pragma unroll
  for (int i = 0; i < L::ITERS; ++i) {
    if (!tc.in(i)) continue;
    nj::Vec<w_t, V> wv, bv;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float sw = aw[i][k], sb = ab[i][k];
#pragma unroll
      for (int g = 1; g < G; ++g) {
        if constexpr (S::HAS_W) sw += red[slot(g, 0, i, k)];
        if constexpr (S::HAS_B) sb += red[slot(g, P - 1, i, k)];
      }
      wv.v[k] = nj::from_float<w_t>(sw);
      bv.v[k] = nj::from_float<w_t>(sb);
    }
    if constexpr (S::HAS_W) nj::store_chunk<S::N, V>(static_cast<w_t*>(a.dw), tc.col(i), wv, true);
    if constexpr (S::HAS_B) nj::store_chunk<S::N, V>(static_cast<w_t*>(a.db), tc.col(i), bv, true);
  }
}

// A template, so that only the path a Spec takes is instantiated.
template <class S> __device__ __forceinline__ void norm_bwd_entry(const nj::NormArgs& a) {
  if constexpr (nj::dw_cluster_of<S>()) norm_bwd_dc<S>(a);
  else norm_bwd<S>(a);
}

extern "C" __global__ void __launch_bounds__(Spec::TPR * Spec::ROWS) normjit_norm_bwd(const nj::NormArgs a) {
  norm_bwd_entry<Spec>(a);
}
