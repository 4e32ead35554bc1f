// RMSNorm (Zhang & Sennrich 2019) and LayerNorm (Ba et al. 2016) forward:
//   h     = x, or x + residual (fused residual add; rounded to r_t when ROUND_RES)
//   mean  = mean_j h[i,j]                  (LayerNorm; 0 for RMSNorm)
//   rstd  = 1 / sqrt(mean_j (h - mean)^2 + eps)
//   y     = round_y(xhat * (w + W_OFFSET) + b),  xhat = (h - mean) * rstd
// in fp32 (LLAMA: xhat rounded to x_t before the weight), rounded once to y.
//
// FP8: an FP8 x is dequantized on load (x = q * x_scale[row, col / XGROUP]);
// a quantized y (QUANT) is written as FP8 codes with its scales, and
// optionally y unquantized (STORE_YHP) and q transposed (at decode by the
// row kernel, whose prelude then sets STORE_YT; else by q_transpose.cuh's
// launch after it). The quantization helpers come from Spec::Q
// (nj::QuantOps, quant.cuh), which only quantized variants include: the
// other kernels do not depend on it.
//
// Specialised by a prelude that defines `struct Spec` before including this
// file: using x_t, y_t, w_t, r_t, ro_t, h_t, yhp_t, index_t; constexpr int N,
// VEC, TPR, ROWS, CLUSTER, QUANT, QGROUP, XGROUP; constexpr bool LAYERNORM,
// TWO_PASS, STORE_RSTD, STORE_MEAN, HAS_W, HAS_B, RESIDUAL, STORE_RES,
// ROUND_RES, LLAMA, HEADS, UE8M0, COLMAJOR, STORE_YHP, STORE_YT, PEEL,
// WB_WITH_ROW, STORE_AMAX, KEEP_U; constexpr int STAGES, WB_BATCH; constexpr
// float W_OFFSET. h_t is the type a cached row is kept in (x_t, r_t when the
// sum is rounded, else float; float for an FP8 x). Only FP8 variants define
// XGROUP (FP8 x) and QUANT, QGROUP, UE8M0, COLMAJOR, STORE_YHP, STORE_YT,
// yhp_t and `using Q = nj::QuantOps` (quantized y); only rows whose stride
// is no multiple of VEC define PEEL (see FwdRow); the others read 0.
// One program (CTA) of TPR * ROWS threads normalises
// ROWS rows at a time; with CLUSTER > 1, the CLUSTER CTAs of a cluster
// normalise one row, each holding a slice of it in registers (wide rows read
// once, or a decode row spread over several SMs).
#pragma once
#include "common.cuh"
#include "norm_args.cuh"
#include "quant_args.cuh"

namespace nj {

// The columns a row's chunk slots cover (RowLayout's N; the engine's
// row_span). A peeled row's chunks cover its view, the VEC - 1 columns
// before it too, whose partial first and last chunk are edges, held apart
// (FwdRow::edge). A peeled cluster row's slots hold only its inner chunks
// (those wholly inside it: at most N / VEC, from the first vector boundary
// at or after its start): over the whole view, a row of N = 8k + 1 had a
// slot more than its even twin, in the last CTA's slice an iteration of
// its own (H200, A/B: ln bf16 700x98305:res v8.t1024.r1.c4 1.15x, 16x98305
// c16 1.11x, rms bf16 4096x65537 c4 1.08x). Rows of one CTA kept the view:
// their many CTAs lost up to 1.4x with inner slots (ln fp16 6108x5333).
template <class S> constexpr bool inner_slots_of() { return peel_of<S>() && S::CLUSTER > 1; }
template <class S> constexpr int span_of() {
  return inner_slots_of<S>() ? (S::N / S::VEC > 0 ? S::N / S::VEC * S::VEC : S::VEC)
                             : S::N + (peel_of<S>() ? S::VEC - 1 : 0);
}
// STORE_AMAX: a static scale's kernel that writes amax too (only its prelude
// defines it), as peel_or0.
template <class S> constexpr auto store_amax_or(int) -> decltype(S::STORE_AMAX + 0) { return S::STORE_AMAX; }
template <class S> constexpr bool store_amax_or(long) { return false; }
template <class S> constexpr bool store_amax_of() { return store_amax_or<S>(0) != 0; }
// KEEP_U: quantized RMSNorm rows that keep u = h * w' (engine: keeps_u in
// config/row_budget.hpp; only their preludes define it), as peel_or0.
template <class S> constexpr auto keep_u_or(int) -> decltype(S::KEEP_U + 0) { return S::KEEP_U; }
template <class S> constexpr bool keep_u_or(long) { return false; }
template <class S> constexpr bool keep_u_of() { return keep_u_or<S>(0) != 0; }
// Whether norm_fwd_rows<S> reduces its rows' max|u| with their sums (its
// ROW_FOLD; FOLD written out, see there).
template <class S> constexpr bool row_fold_of() {
  constexpr int QUANT = quant_of<S>();
  constexpr bool STATIC_AMAX = store_amax_of<S>();
  constexpr bool ROW_AMAX = QUANT == Q_TOKEN || QUANT == Q_TENSOR || STATIC_AMAX;
  constexpr bool FOLD = ROW_AMAX && (QUANT != Q_TENSOR || keep_u_of<S>()) && !S::LLAMA && !S::HAS_B &&
                        !(S::LAYERNORM && (S::TWO_PASS || S::CLUSTER > 1));
  using L = RowLayout<span_of<S>(), S::VEC, S::TPR, S::CLUSTER>;
  constexpr bool SHORT = !S::TWO_PASS && S::ROWS == 1 && L::ITERS * S::VEC <= 32;
  return FOLD && (QUANT == Q_TOKEN || (STATIC_AMAX && SHORT));
}

// Staged kernels' weight staging (WB_WITH_ROW, WB_BATCH: only their preludes
// define them, so the unstaged kernels' sources stay what they were).
// Functions, as peel_or0: a static data member became a device variable.
template <class S> constexpr auto wb_with_row_or(int) -> decltype(S::WB_WITH_ROW + 0) { return S::WB_WITH_ROW; }
template <class S> constexpr bool wb_with_row_or(long) { return false; }
template <class S> constexpr auto wb_batch_or(int) -> decltype(S::WB_BATCH + 0) { return S::WB_BATCH; }
template <class S> constexpr int wb_batch_or(long) { return 1; }
// WB_SMEM (the engine's weight_smem_bytes): only the preludes of the
// persistent cluster rows that keep their weight and bias in shared memory
// define it.
template <class S> constexpr auto wb_smem_or(int) -> decltype(S::WB_SMEM + 0) { return S::WB_SMEM; }
template <class S> constexpr bool wb_smem_or(long) { return false; }
// WB_RO (the engine's weight_read_only): cluster rows that load their
// weight and bias through the read-only path (load_wb).
template <class S> constexpr auto wb_ro_or(int) -> decltype(S::WB_RO + 0) { return S::WB_RO; }
template <class S> constexpr bool wb_ro_or(long) { return false; }
// Does the chunk at `col` lie wholly inside the row (a peeled row's inner
// chunks; every chunk of an unpeeled one)? A function: written inline in
// the conditions, the unpeeled kernels compiled to other machine code.
template <bool PEEL, class Row> __device__ __forceinline__ bool whole_chunk(const Row& r, int col) {
  if constexpr (PEEL) return r.inner(col);
  else return true;
}

// Whole-chunk rows: unstaged rows of one program a row (a CTA or a
// cluster's slice: at most a few an SM) whose threads hold several chunks
// (2 to 8), each wholly inside the row or wholly past it (VEC divides N),
// not all of them in it, and no FP8 x (whose scales are read at a chunk's
// column). Their chunks load under one predicate each, into words zeroed
// whole (load_vec_if), and store under one (see the row's loads in
// norm_fwd_rows). Guarded by a branch and an element-wise path instead, a
// row's chunks loaded one round trip after another (on an H100, rms bf16
// 512x100000 in clusters of 8: 120 -> 93 us; ln fp16 162x113664: 73 -> 38).
// (With one chunk a thread, ptxas sank a prefetched weight past the
// reduction; rows of 16 threads, 8 chunks each, spilled.) few_chunk_rows:
// the program geometry these loads take, under the row layout L (peeled
// rows' covers VEC - 1 columns more).
template <class S, class L> constexpr bool few_chunk_rows() {
  return S::STAGES == 0 && S::ROWS == 1 && S::TPR >= 128 && L::ITERS > 1 && L::ITERS <= 8;
}
// Is column col + k of an unpeeled row's chunk at `col` part of the row?
// Where VEC divides N a chunk inside the row (tc.in) is wholly inside it:
// tested element by element, ptxas kept a branch an element and sank the
// weight's and bias's loads past the warp's sums (SASS of ln fp16 10x2136,
// v8.t512.r1: loaded after the first shuffle, not with x).
template <class S> __device__ __forceinline__ bool col_in_row(int col, int k) {
  return S::N % S::VEC == 0 || col + k < S::N;
}
template <class S> constexpr bool whole_rows_of() {
  using L = RowLayout<S::N, S::VEC, S::TPR, S::CLUSTER>;
  return !peel_of<S>() && !L::EXACT && few_chunk_rows<S, L>() && S::N % S::VEC == 0 && xgroup_of<S>() == 0;
}
// An unpeeled row's chunk of p (a row tensor, the weight or the bias):
// whole-chunk rows' under one predicate, the others' load_chunk.
template <class S, class T>
__device__ __forceinline__ Vec<T, S::VEC> unpeeled_chunk(const T* p, int col, bool exact) {
  if constexpr (whole_rows_of<S>()) return load_vec_if<T, S::VEC>(p + col, exact || col < S::N);
  else return load_chunk<S::N, S::VEC>(p, col, exact);
}

// One row's pointers and the fused residual add.
template <class S> struct FwdRow {
  using index_t = typename S::index_t;
  const typename S::x_t* x;
  const typename S::r_t* r;
  typename S::ro_t* ro;
  typename S::y_t* y;
  // Quantized y only (untyped here: yhp_t exists in quantized Specs only):
  // y_hp and the [N, M] transpose, and this row's offset and index.
  void* yhp;
  void* yt;
  index_t yo;
  long long row, M;
  const float* xs;  // FP8 x: this row's scales
  // Peeled rows (an odd N, say, whose rows start anywhere inside a vector):
  // the row pointers move back to the vector boundary at or before the
  // row's start, so every chunk is one aligned vector, and the row is
  // columns [lo, hi) of that view. The engine checks that the rows of x, y,
  // residual and residual_out all start at the same place in a vector.
  // Otherwise [0, N).
  int lo = 0, hi = S::N;
  // Peeled rows: the first inner chunk's column (lo rounded up to a vector;
  // inner_slots_of's rows start their slots there).
  int base = 0;

  __device__ __forceinline__ FwdRow(const NormArgs& a, const QuantArgs& q, long long row_) {
    x = static_cast<const typename S::x_t*>(a.x) + row_offset<S::HEADS, index_t>(row_, a.x_ld, a.x_hs, a.heads);
    yo = row_offset<S::HEADS, index_t>(row_, a.y_ld, a.y_hs, a.heads);
    y = static_cast<typename S::y_t*>(a.y) + yo;
    r = static_cast<const typename S::r_t*>(a.residual) + (S::RESIDUAL ? (index_t)row_ * (index_t)a.res_ld : 0);
    ro = static_cast<typename S::ro_t*>(a.residual_out) + (S::STORE_RES ? (index_t)row_ * (index_t)a.res_out_ld : 0);
    row = row_;
    yhp = q.y_hp;
    yt = q.y_t;
    M = a.M;
    xs = a.x_scale + (xgroup_of<S>() > 0 ? (index_t)row_ * (S::N / (xgroup_of<S>() > 0 ? xgroup_of<S>() : 1)) : 0);
    if constexpr (peel_of<S>()) {
      lo = static_cast<int>((reinterpret_cast<unsigned long long>(x) / sizeof(typename S::x_t)) % S::VEC);
      hi = lo + S::N;
      base = lo > 0 ? S::VEC : 0;
      x -= lo;
      y = align_down<S::VEC>(y);
      yo -= lo;  // y_hp's rows (quantized y) share y's layout
      if constexpr (S::RESIDUAL) r -= lo;
      if constexpr (S::STORE_RES) ro = align_down<S::VEC>(ro);
    }
  }

  // A chunk of a row tensor at column `col` of the row's view, and its store.
  // Peeled rows: `exact` says the chunk lies inside the row (inner).
  // PRED: a chunk wholly inside the row where `take`, else zeros loaded and
  // nothing stored: a predicate where a guard around the chunk would be a
  // branch (see the row's loads in norm_fwd_rows).
  template <bool PRED = false, class T>
  __device__ __forceinline__ Vec<T, S::VEC> ld(const T* p, int col, bool exact, bool take = true) const {
    if constexpr (PRED) return load_vec_if<T, S::VEC>(p + col, take);
    else if constexpr (peel_of<S>()) return exact ? load_chunk<S::N, S::VEC>(p, col, true) : load_span<S::VEC>(p, col, lo, hi);
    else return unpeeled_chunk<S>(p, col, exact);
  }
  template <bool PRED = false, class T>
  __device__ __forceinline__ void st(T* p, int col, const Vec<T, S::VEC>& v, bool exact, bool take = true) const {
    if constexpr (PRED) {
      if (take) store_chunk<S::N, S::VEC>(p, col, v, true);
    } else if constexpr (peel_of<S>()) {
      if (exact) store_chunk<S::N, S::VEC>(p, col, v, true);
      else store_span<S::VEC>(p, col, v, lo, hi);
    } else if constexpr (whole_rows_of<S>()) {
      if (exact || col < S::N) store_chunk<S::N, S::VEC>(p, col, v, true);
    } else {
      store_chunk<S::N, S::VEC>(p, col, v, exact);
    }
  }
  // Is column `col` of a peeled row's view part of the row (unpeeled rows
  // test col < N where they need to: written out, their kernels keep the
  // machine code, and so the tuned entries, they had); how many of [b, e) are.
  __device__ __forceinline__ bool has(int col) const { return col >= lo && col < hi; }
  // Does the chunk at `col` lie wholly inside the row?
  __device__ __forceinline__ bool inner(int col) const { return col >= lo && col + S::VEC <= hi; }
  // The column of a peeled row's last chunk (partial where not inner).
  __device__ __forceinline__ int last_chunk() const { return (hi - 1) / S::VEC * S::VEC; }
  // Edge j of a peeled row in the slice [c0, c0 + slice) of a cluster's C:
  // j < VEC, the first chunk's column j; j < 2 VEC, the last chunk's column
  // j - VEC; -1 where that column is not in the row or its chunk is inner.
  // Inner slots (inner_slots_of): the first CTA holds the first chunk's
  // edges, the last CTA the last chunk's; else the CTA whose slice holds
  // the column.
  __device__ __forceinline__ int edge(int j, int c0, int slice, int C) const {
    constexpr bool INNER = inner_slots_of<S>();
    const bool first_cta = !INNER || c0 == 0, last_cta = !INNER || c0 == (C - 1) * slice;
    int p = -1;
    const int last = last_chunk();
    if (j < S::VEC) {
      if (first_cta && !inner(0)) p = j;
    } else if (j < 2 * S::VEC && last_cta && last > 0 && !inner(last)) {
      p = last + j - S::VEC;
    }
    return p >= lo && p < hi && (INNER || (p >= c0 && p < c0 + slice)) ? p : -1;
  }
  // Elements of the row in the slice of `slice` columns at c0 (a cluster's
  // CTA; C of them): a peeled row's inner chunks in it (from base) and the
  // edges edge() gives that CTA.
  __device__ __forceinline__ int slice_count(int c0, int slice, int C) const {
    if constexpr (inner_slots_of<S>()) {
      const int b = base + c0, e = base + c0 + slice, hf = hi / S::VEC * S::VEC, last = last_chunk();
      int n = max(0, min(e, hf) - max(b, base));
      if (c0 == 0 && !inner(0)) n += min(S::VEC, hi) - lo;
      if (c0 == (C - 1) * slice && last > 0 && !inner(last)) n += hi - last;
      return n;
    } else {
      return min(slice, max(0, S::N - c0));
    }
  }

  // x of one chunk in fp32: an FP8 x times its group's scale (a chunk lies
  // in one group: VEC divides XGROUP).
  __device__ __forceinline__ float x_at(const Vec<typename S::x_t, S::VEC>& xv, int k, float xscale) const {
    if constexpr (xgroup_of<S>() > 0) return to_float(xv.v[k]) * xscale;
    else return to_float(xv.v[k]);
  }

  // The chunk of h at `col`, and (store) h written to residual_out. Staged
  // kernels store apart (store_res), after all of a thread's loads: x,
  // residual, weight and y are not restrict, so the compiler keeps a load
  // behind any earlier store, and a loop of load-store pairs waits one memory
  // round trip a chunk. Unstaged kernels keep the pairs: fewer registers.
  template <bool PRED = false>
  __device__ __forceinline__ Vec<typename S::h_t, S::VEC> load_h(int col, bool exact, bool store,
                                                                  bool take = true) const {
    const Vec<typename S::x_t, S::VEC> xv = ld<PRED>(x, col, exact, take);
    Vec<typename S::h_t, S::VEC> h;
    float xscale = 1.f;
    if constexpr (xgroup_of<S>() > 0) xscale = xs[col / (xgroup_of<S>() > 0 ? xgroup_of<S>() : 1)];
    if constexpr (!S::RESIDUAL && xgroup_of<S>() == 0) {
      h = xv;
    } else if constexpr (!S::RESIDUAL) {
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) h.v[k] = from_float<typename S::h_t>(x_at(xv, k, xscale));
    } else {
      const Vec<typename S::r_t, S::VEC> rv = ld<PRED>(r, col, exact, take);
      Vec<typename S::ro_t, S::VEC> out;
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        float sum = x_at(xv, k, xscale) + to_float(rv.v[k]);
        if constexpr (S::ROUND_RES) sum = round_to<typename S::r_t>(sum);
        h.v[k] = from_float<typename S::h_t>(sum);
        out.v[k] = from_float<typename S::ro_t>(sum);
      }
      if (S::STORE_RES && store) st<PRED>(ro, col, out, exact, take);
    }
    return h;
  }

  // Staged kernels: a chunk's x and residual as loaded, and h from them.
  // Loaded for all of a thread's chunks before any is summed: summed as they
  // came, ptxas widened each chunk on arrival and issued the next chunk's
  // loads only then.
  struct Raw {
    Vec<typename S::x_t, S::VEC> x;
    Vec<typename S::r_t, S::VEC> r;
  };
  template <bool PRED = false> __device__ __forceinline__ Raw load_raw(int col, bool exact, bool take = true) const {
    Raw w;
    w.x = ld<PRED>(x, col, exact, take);
    if constexpr (S::RESIDUAL) w.r = ld<PRED>(r, col, exact, take);
    return w;
  }
  __device__ __forceinline__ Vec<typename S::h_t, S::VEC> combine(const Raw& w) const {
    Vec<typename S::h_t, S::VEC> h;
    if constexpr (!S::RESIDUAL) {
      h = w.x;
    } else {
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        float sum = to_float(w.x.v[k]) + to_float(w.r.v[k]);
        if constexpr (S::ROUND_RES) sum = round_to<typename S::r_t>(sum);
        h.v[k] = from_float<typename S::h_t>(sum);
      }
    }
    return h;
  }

  // residual_out of the chunk at `col` from its h (staged kernels): h holds
  // the sum exactly (as float, or as r_t when the sum is rounded to r_t), so
  // this is the value the sum rounds to.
  __device__ __forceinline__ void store_res(int col, bool exact, const Vec<typename S::h_t, S::VEC>& h) const {
    if constexpr (S::STORE_RES) {
      Vec<typename S::ro_t, S::VEC> out;
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) out.v[k] = from_float<typename S::ro_t>(to_float(h.v[k]));
      st(ro, col, out, exact);
    }
  }

  // The row's first element of h in fp32 (LayerNorm's shift: every thread
  // of the row must read the same one).
  __device__ __forceinline__ float first_h() const {
    if constexpr (peel_of<S>()) {
      float v = to_float(x[lo]);
      if constexpr (S::RESIDUAL) {
        v += to_float(r[lo]);
        if constexpr (S::ROUND_RES) v = round_to<typename S::r_t>(v);
      }
      return to_float(from_float<typename S::h_t>(v));
    } else {
      return to_float(load_h(0, false, false).v[0]);
    }
  }

  // first_h's two elements (x and the residual at the row's first column)
  // as loaded, and the shift from them: residual rows load them before the
  // row and sum them after its loads (RAW_SHIFT in norm_fwd_rows).
  struct First {
    typename S::x_t x;
    typename S::r_t r;
  };
  __device__ __forceinline__ First first_raw() const { return {x[lo], r[lo]}; }
  __device__ __forceinline__ float first_h(const First& f) const {
    float v = to_float(f.x) + to_float(f.r);
    if constexpr (S::ROUND_RES) v = round_to<typename S::r_t>(v);
    return to_float(from_float<typename S::h_t>(v));
  }

  // One element of h at column p (a peeled row's edge), and (store) its
  // residual_out; as load_h and store_res do for a chunk.
  __device__ __forceinline__ typename S::h_t load_h1(int p, bool store) const {
    if constexpr (!S::RESIDUAL) {
      return from_float<typename S::h_t>(to_float(x[p]));
    } else {
      float sum = to_float(x[p]) + to_float(r[p]);
      if constexpr (S::ROUND_RES) sum = round_to<typename S::r_t>(sum);
      if (S::STORE_RES && store) ro[p] = from_float<typename S::ro_t>(sum);
      return from_float<typename S::h_t>(sum);
    }
  }
  __device__ __forceinline__ void store_res1(int p, typename S::h_t h) const {
    if constexpr (S::STORE_RES) ro[p] = from_float<typename S::ro_t>(to_float(h));
  }

  // y of one element at column p (a peeled row's edge), stored; weight and
  // bias at column p - lo.
  __device__ __forceinline__ void store_y1(int p, typename S::h_t h, float shift, float m, float rstd,
                                           const NormArgs& a) const {
    Vec<typename S::h_t, S::VEC> hv;
    Vec<typename S::w_t, S::VEC> wv, bv;
    hv.v[0] = h;
    if constexpr (S::HAS_W) wv.v[0] = static_cast<const typename S::w_t*>(a.w)[p - lo];
    if constexpr (S::HAS_B) bv.v[0] = static_cast<const typename S::w_t*>(a.b)[p - lo];
    y[p] = from_float<typename S::y_t>(y_at(hv, 0, shift, m, rstd, wv, bv));
  }

  // A quantized peeled row's edge at column p: y in fp32 as y_values gives
  // it (or u * rstd, keep_u: as the row's KEEP_U chunks compute it), and
  // |u| = |(h - shift - m) * w'| (the folded amax); weight at column p - lo.
  __device__ __forceinline__ float w1(int p, const NormArgs& a) const {
    Vec<typename S::w_t, S::VEC> wv;
    if constexpr (S::HAS_W) wv.v[0] = static_cast<const typename S::w_t*>(a.w)[p - lo];
    return S::HAS_W ? w_prime(wv, 0) : 1.f;
  }
  __device__ __forceinline__ float y1(int p, typename S::h_t h, float shift, float m, float rstd, const NormArgs& a,
                                      bool keep_u) const {
    Vec<typename S::h_t, S::VEC> hv;
    Vec<typename S::w_t, S::VEC> wv, bv;
    hv.v[0] = h;
    if (keep_u) return to_float(h) * w1(p, a) * rstd;
    if constexpr (S::HAS_W) wv.v[0] = static_cast<const typename S::w_t*>(a.w)[p - lo];
    if constexpr (S::HAS_B) bv.v[0] = static_cast<const typename S::w_t*>(a.b)[p - lo];
    float v = y_at(hv, 0, shift, m, rstd, wv, bv);
    if constexpr (S::LLAMA) v = round_to<typename S::x_t>(v);
    return v;
  }

  // w' = w + W_OFFSET of element k of a chunk of the weight (nj::w_prime:
  // a zero offset skipped). Widened from its 16-bit element, not its word
  // (elem_f32): from the word, ptxas sank a one-chunk row's weight load
  // past the warp's first shuffles (rms bf16 1x4096, v8.t512.r1).
  __device__ __forceinline__ float w_prime(const Vec<typename S::w_t, S::VEC>& wv, int k) const {
    return nj::w_prime<S>(wv.v[k]);
  }

  // y of element k of a chunk of h, in fp32, given that chunk's weight and
  // bias; the mean is shift + m (see norm_fwd), kept apart so that h - mean
  // loses nothing when the mean is large.
  __device__ __forceinline__ float y_at(const Vec<typename S::h_t, S::VEC>& h, int k, float shift, float m, float rstd,
                                        const Vec<typename S::w_t, S::VEC>& wv,
                                        const Vec<typename S::w_t, S::VEC>& bv) const {
    float v = ((elem_f32(h, k) - shift) - m) * rstd;
    if constexpr (S::LLAMA) v = round_to<typename S::x_t>(v);  // normalised row in the input dtype
    if constexpr (S::HAS_W) v *= w_prime(wv, k);
    if constexpr (S::HAS_B) v += elem_f32(bv, k);
    return v;
  }

  // y of one chunk, rounded once to y_t and stored.
  __device__ __forceinline__ void store_y(int col, bool exact, const Vec<typename S::h_t, S::VEC>& h, float shift,
                                          float m, float rstd, const Vec<typename S::w_t, S::VEC>& wv,
                                          const Vec<typename S::w_t, S::VEC>& bv) const {
    Vec<typename S::y_t, S::VEC> yv;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) yv.v[k] = from_float<typename S::y_t>(y_at(h, k, shift, m, rstd, wv, bv));
    st(y, col, yv, exact);
  }

  // The largest |(h - shift - m) * w'| over the chunk's columns in the row
  // (rows that fold their amax, see norm_fwd_rows' FOLD).
  __device__ __forceinline__ float u_absmax(const Vec<typename S::h_t, S::VEC>& h, int col, bool exact, float shift,
                                            float m, const Vec<typename S::w_t, S::VEC>& wv) const {
    float r = 0.f;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) {
      float v = (elem_f32(h, k) - shift) - m;
      if constexpr (S::HAS_W) v *= w_prime(wv, k);
      if (exact || has(col + k)) r = fmaxf(r, fabsf(v));
    }
    return r;
  }

  // u = h * w' of one chunk in fp32 (KEEP_U rows).
  __device__ __forceinline__ void u_values(const Vec<typename S::h_t, S::VEC>& h, const Vec<typename S::w_t, S::VEC>& wv,
                                           float (&u)[S::VEC]) const {
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) {
      u[k] = elem_f32(h, k);
      if constexpr (S::HAS_W) u[k] *= w_prime(wv, k);
    }
  }

  // y of one chunk in fp32 (quantized variants: the scales need it first).
  __device__ __forceinline__ void y_values(const Vec<typename S::h_t, S::VEC>& h, float shift, float m, float rstd,
                                           const Vec<typename S::w_t, S::VEC>& wv,
                                           const Vec<typename S::w_t, S::VEC>& bv, float (&v)[S::VEC]) const {
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) {
      v[k] = y_at(h, k, shift, m, rstd, wv, bv);
      // Llama: the y the unfused Llama forward would store (in x's dtype) is
      // what gets quantized, as vLLM's fused quant norms do.
      if constexpr (S::LLAMA) v[k] = round_to<typename S::x_t>(v[k]);
    }
  }
};

// Peeled rows: columns col - lo .. col - lo + VEC - 1 of a weight or bias
// (whose vectors stay aligned to its own columns), for the chunk at column
// `col` of the row's view [lo, hi). They start anywhere, so they are read
// as 32-bit words from L1 (16-bit columns at an odd start: one word more,
// and a byte permute a word) rather than as two vectors shifted in
// registers (a select-stage shifter cost 60 instructions a chunk). `inner`:
// the chunk lies wholly inside the row (FwdRow::inner); else column by
// column, so nothing outside the weight is read.
template <class S, class T>
__device__ __forceinline__ Vec<T, S::VEC> peeled_cols(const T* __restrict__ w, int col, int lo, int hi, bool inner) {
  constexpr int VEC = S::VEC;
  Vec<T, VEC> r;
  const int e0 = col - lo;  // the chunk's first column of the weight
  if (inner) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) r.v[k] = w[e0 + k];
    } else {
      static_assert(sizeof(T) == 2, "16- or 32-bit weights");
      constexpr int W = VEC / 2;  // words a chunk (VEC >= 2 when peeled)
      const unsigned* p = reinterpret_cast<const unsigned*>(w) + (e0 >> 1);
      unsigned u[W + 1];
#pragma unroll
      for (int j = 0; j < W; ++j) u[j] = p[j];
      if (e0 & 1) {
        // The word after the chunk; at the weight's end only its first column.
        u[W] = col + VEC < hi ? p[W] : static_cast<unsigned>(reinterpret_cast<const unsigned short*>(w)[e0 + VEC - 1]);
#pragma unroll
        for (int j = 0; j < W; ++j) u[j] = __byte_perm(u[j], u[j + 1], 0x5432);
      }
#pragma unroll
      for (int j = 0; j < W; ++j) {
        r.v[2 * j].bits = static_cast<unsigned short>(u[j]);
        r.v[2 * j + 1].bits = static_cast<unsigned short>(u[j] >> 16);
      }
    }
    return r;
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) r.v[k] = col + k >= lo && col + k < hi ? w[e0 + k] : from_float<T>(0.f);
  return r;
}

// Weight and bias chunks (left unset when the variant has none); lo: the
// row's FwdRow::lo.
// RO: 1 read-only, 0 plain, -1 by the rule below.
template <class S, int RO = -1>
__device__ __forceinline__ void load_wb(const NormArgs& a, int col, bool exact, Vec<typename S::w_t, S::VEC>& wv,
                                        Vec<typename S::w_t, S::VEC>& bv, int lo) {
  using w_t = typename S::w_t;
  if constexpr (peel_of<S>()) {
    // `exact`: the chunk lies inside the row.
    if constexpr (S::HAS_W) wv = peeled_cols<S>(static_cast<const w_t*>(a.w), col, lo, lo + S::N, exact);
    if constexpr (S::HAS_B) bv = peeled_cols<S>(static_cast<const w_t*>(a.b), col, lo, lo + S::N, exact);
  } else {
    if constexpr (RO == 1 || (RO == -1 && S::N % S::VEC == 0 && ((S::ROWS > 1 && S::TPR >= 4 && !S::RESIDUAL) || wb_ro_or<S>(0)))) {
      // Programs of several (short) rows: read-only loads (load_vec_if),
      // which ptxas issues together ahead of the row's stores: rms bf16
      // 32768x128 v8.t4.r32 6.66 -> 6.18 us, rms fp16 39864x424 v8.t8.r4
      // 22.3 -> 20.5, ln bf16 35215x160 1.07x on an H200. So do a cluster's
      // slices where their launch bound leaves ptxas room to hoist them
      // (WB_RO, row_budget.hpp's weight_read_only): plain, each chunk's
      // weight loaded after the store before it, 8 L2 round trips a row at
      // 8 chunks a thread (SASS of ln bf16 N = 65536, v8.t256.r1.c4); on an
      // H200 rms bf16 300x98304 with a residual 1.09x, rms fp32 512x65536
      // 1.04x, rms bf16 3000x40960 1.04x, ln fp32 512x131072 1.04x. The
      // other programs of one row keep plain loads: read-only, all of a
      // row's weight and bias chunks were held at once, up to the register
      // bound (ln bf16 2048x20000 v8.t512.r1, one CTA an SM: 64 -> 117
      // registers, 45.4 -> 63.0 us); rows of 2 threads (8-16 chunks each)
      // and rows with a residual (two row tensors) spilled at theirs (rms
      // bf16 N = 128 v8.t2.r16, rms fp16 N = 512 with a residual v8.t16.r32).
      const bool take = exact || col < S::N;
      if constexpr (S::HAS_W) wv = load_vec_if<w_t, S::VEC, true>(static_cast<const w_t*>(a.w) + col, take);
      if constexpr (S::HAS_B) bv = load_vec_if<w_t, S::VEC, true>(static_cast<const w_t*>(a.b) + col, take);
    } else {
      if constexpr (S::HAS_W) wv = unpeeled_chunk<S>(static_cast<const w_t*>(a.w), col, exact);
      if constexpr (S::HAS_B) bv = unpeeled_chunk<S>(static_cast<const w_t*>(a.b), col, exact);
    }
  }
}

}  // namespace nj

// One program's ROWS rows (`group` of them), or with CLUSTER > 1 the
// cluster's row. Tensor quantization, phase 0: only the rows' amax, into
// amax_acc (nothing is stored); ONCE (a grid of one program that holds
// every row, normjit_norm_fwd_once): the block's amax is the tensor's,
// stored and used in the same pass. static_scale: a static scale's value as
// norm_fwd read it (a static scale that writes amax reads it here).
// WB_SMEM cluster rows: `group` is the row, `iter` the rows this CTA took
// before it (its exchange's round; the first sets up the exchange and
// copies the weight).
template <class S, bool ONCE = false>
__device__ __forceinline__ void norm_fwd_rows(const nj::NormArgs& a, const nj::QuantArgs& q, long long group,
                                              float& amax_acc, float static_scale = 1.f, int iter = 0) {
  using h_t = typename S::h_t;
  using w_t = typename S::w_t;
  constexpr int C = S::CLUSTER;
  constexpr int QUANT = nj::quant_of<S>();
  // A peeled row's chunk slots: span_of.
  constexpr bool PEEL = nj::peel_of<S>();
  constexpr bool INNER = nj::inner_slots_of<S>();
  using L = nj::RowLayout<nj::span_of<S>(), S::VEC, S::TPR, C>;
  constexpr bool EXACT = L::EXACT && !PEEL;
  static_assert(C == 1 || (S::ROWS == 1 && !S::TWO_PASS), "a cluster shares one row held in registers");
  // (Tensor scaling's one-launch kernel takes a cluster's CTAs as row
  // groups: rows split over clusters take two launches, see norm_fwd.)
  static_assert(C == 1 || !ONCE, "the one-launch kernel's clusters are row groups");
  constexpr bool GROUPED = QUANT == nj::Q_GROUP || QUANT == nj::Q_MX;
  // Peeled rows: no FP8 x and no group scales (their groups start with the row).
  static_assert(!PEEL || (!GROUPED && nj::xgroup_of<S>() == 0), "peeled rows have neither FP8 x nor group scales");
  // Weight and bias staged ahead of the stores (LaunchConfig::stages 1).
  constexpr bool STAGED = S::STAGES > 0;
  // A static scale that writes amax (delayed scaling) measures each row as it
  // quantizes it, like the token and tensor scales.
  constexpr bool STATIC_AMAX = nj::store_amax_of<S>();
  constexpr bool ROW_AMAX = QUANT == nj::Q_TOKEN || QUANT == nj::Q_TENSOR || STATIC_AMAX;
  // Sums per reduction: one (register rows: sum of squares, or LayerNorm's
  // sum then squared deviations), two (two-pass rows: both at once).
  constexpr int K = S::TWO_PASS ? 2 : 1;
  __shared__ float red[S::ROWS][nj::kWarpsPerRow<S::TPR>][K];
  // Rows quantized with a row's amax whose y is u * rstd, u = (h - mean) * w'
  // (no bias, no Llama rounding): max|y| = rstd * max|u| (rstd > 0, one a
  // row). FOLD takes max|u| in the pass that sums (RMSNorm: the row's load;
  // LayerNorm: its squared deviations), a token row's in the same shuffles
  // as that sum: no pass over the row computes y for its amax alone (a
  // second pass cost as many instructions as the stores' and a second
  // reduction's latency). Rounded apart from max|y| by an fp32 ulp or two;
  // u overflows only where |h * w'| passes fp32's range. (Scaling u by
  // rstd / scale in one multiply as well overflowed to inf on zero rows,
  // whose scale is the minimum, and gave NaN codes: not done.)
  // Tensor scaling folds only where it keeps u (below): otherwise its
  // quantizing launch paid for a max it does not use (4096x16384 on an H100:
  // 1.3x the time).
  //
  // KEEP_U (the engine's keeps_u: quantized RMSNorm rows, unstaged, in
  // registers, without the Llama cast or a bias): u = h * w' in fp32 is
  // kept from the pass that sums to the stores, y = u * rstd, so the stores
  // convert neither the row nor the weight again, and the maxima of y (a
  // row's, a group's) are rstd times those of u, exactly: rounding is
  // monotonic. (Measured with ncu on an H200: a group128 row of 8192x4096
  // executed 21 instructions an element, token 16, the copy-speed bf16
  // forward 11; the quantized kernels issue-bound, at 65-81% of the copy.)
  constexpr bool KEEP_U = nj::keep_u_of<S>();
  static_assert(!KEEP_U || (QUANT != nj::Q_NONE && !S::LAYERNORM && !S::LLAMA && !S::HAS_B && !STAGED && C == 1),
                "u is kept by unstaged quantized RMSNorm rows without the Llama cast or a bias");
  // (Not LayerNorm's cluster rows: a CTA knows only its slice's mean when
  // it sums the squared deviations.)
  // (The one-launch kernel of tensor scaling does not fold: where it did, it
  // loaded the weight in both passes, and 32x7168 took 4.4 us, not 3.95.)
  constexpr bool FOLD = ROW_AMAX && (QUANT != nj::Q_TENSOR || KEEP_U) && !S::LLAMA && !S::HAS_B &&
                        !(S::LAYERNORM && (S::TWO_PASS || C > 1));
  // The rows whose max|u| rides with their sums' reduction (every thread of
  // the row then holds the row's): token rows, and a static scale's that
  // writes amax, one row a program of up to 32 elements a thread: that
  // spares the launch's block reduction after its rows (H200, CUPTI:
  // 1x4096 2.62 -> 2.40 us, 61x2880 2.72 -> 2.46, 32x7168 2.91 -> 2.59;
  // rows of 64 elements a thread ran slower, 4096x16384 56.5 -> 62.9).
  constexpr bool ROW_FOLD = nj::row_fold_of<S>();
  static_assert(!ROW_FOLD || FOLD, "row_fold_of folds only where FOLD does");
  float ua = 0.f;  // FOLD: this thread's max|u| (a token row's, once reduced)

  const int lane = threadIdx.x % S::TPR;
  long long row;
  int c0 = 0;  // the first column of this CTA's slice of the row
  constexpr bool WB_SMEM = nj::wb_smem_or<S>(0);
  if constexpr (C > 1) {
    row = WB_SMEM ? group : nj::cluster_id();
    c0 = static_cast<int>(nj::cluster_rank()) * L::SLICE;
  } else {
    // (Written apart: the kernels without tensor scaling then compile to
    // exactly the code they had before it existed; `group` is blockIdx.x.)
    if constexpr (QUANT == nj::Q_TENSOR || STATIC_AMAX) row = group * S::ROWS + threadIdx.x / S::TPR;
    else row = (long long)blockIdx.x * S::ROWS + threadIdx.x / S::TPR;
  }
  // Tensor scaling's first launch only measures.
  const bool measure = QUANT == nj::Q_TENSOR && !ONCE && q.phase == 0;
  // Cluster rows exchange one value per CTA (RMSNorm: the sum of squares;
  // LayerNorm: the slice's sum and M2). Set up before the loads, so the
  // cluster barrier that publishes the mbarriers overlaps them.
  // A token row's max|u| folded into its sums travels with them (XA); a
  // token row that measures its amax after rstd exchanges it apart (in the
  // first of the values).
  constexpr bool XA = C > 1 && FOLD && QUANT == nj::Q_TOKEN;
  constexpr int XK = (S::LAYERNORM ? 2 : 1) + (XA ? 1 : 0);
  using Exchange = nj::ClusterExchange<C, XK>;
  __shared__ typename Exchange::Shared xsh;
  Exchange xc(xsh);
  xc.round = iter;  // one exchange a row (WB_SMEM rows are unquantized)
  if constexpr (C > 1) {
    if (iter == 0) xc.init();
  }
  // Rows past M still take part in the reductions' barriers; they only skip memory.
  const bool valid = row < a.M;
  const nj::FwdRow<S> R(a, q, valid ? row : 0);
  // Inner slots start at the row's first inner chunk (R.base); a slot past
  // its inner chunks is not inner (whole_chunk), up to VEC columns past the
  // span.
  const nj::ThreadCols<nj::span_of<S>(), S::VEC, S::TPR, C, INNER ? S::VEC : 0> tc{INNER ? c0 + R.base : c0, lane};
  constexpr float inv_n = 1.0f / S::N;
  // LayerNorm sums are shifted by the row's first element, so a large mean
  // (1e4, say) does not cancel away the variance: mean = shift + m with m of
  // the order of the standard deviation. RMSNorm: shift = m = 0.
  float shift = 0.f, m = 0.f, rstd;

  if constexpr (!S::TWO_PASS) {
    // The row (this CTA's slice of it) stays in registers (as h_t) between its uses.
    nj::Vec<h_t, S::VEC> hv[L::ITERS];
    // A thread's weight and bias (the engine's weight_staging). Unstaged:
    // with the row when they are few (at small M the kernel waits on memory
    // latency, and this saves a round trip after the reduction), else one
    // chunk at a time after it (no registers beyond the row's). Staged
    // (STAGES 1): with the row where the prelude says (WB_WITH_ROW), else
    // WB_BATCH chunks' worth at once after the reduction, all loaded before
    // their stores (see load_h).
    constexpr bool PREFETCH_WB = STAGED || ROW_AMAX || KEEP_U ? nj::wb_with_row_or<S>(0) != 0
                                                    : L::ITERS * S::VEC * sizeof(w_t) * (S::HAS_B ? 2 : 1) <= 32;
    constexpr int WB_BATCH = PREFETCH_WB ? L::ITERS : nj::wb_batch_or<S>(0);
    // Rows whose loads need no row guard: a row past M reads row 0 (see R)
    // and stores nothing, and its sums and maxima reach no other row's. A
    // guarded load selects each loaded half or zero (the group128 row of
    // 8192x4096, v8.t64.r1: 1104 instructions guarded, 944 not; on an H200
    // 84% of the copy -> 91%, and 86% -> 100% at 32768x5120; a residual
    // before group128 scales 81-93% -> 95-99%). Other quantized rows only
    // where their weight loads after the reduction: loaded with an
    // unguarded row, ptxas sank it past the sum of squares (a static
    // scale's 1x4096, v8.t512.r1: 1.70 -> 1.84 us). Unquantized rows of
    // several chunks a thread, staged or not: behind the guard's branch a
    // thread's chunks loaded one round trip after another, and a staged
    // row's x only after its weight had arrived (H200, CUPTI, the same
    // config: rms bf16 1x8192 v8.t512.r1 2.46 -> 1.90 us, 32x8192
    // v4.t256.r1.s1 2.84 -> 2.26, 64x4096 v8.t256.r1 2.56 -> 1.99). Not rows
    // of one chunk a thread: the guard's predicate holds their weight's load
    // with x's; without it ptxas issued the weight after the reduction, a
    // round trip more (rms fp32 8x2048, v4.t512.r1: 1.66 -> 1.98 us).
    constexpr bool UNGUARDED =
        ROW_AMAX || KEEP_U || (QUANT == nj::Q_NONE ? L::ITERS > 1 : !STAGED && !PREFETCH_WB);
    nj::Vec<w_t, S::VEC> wv[PREFETCH_WB ? L::ITERS : 1], bv[PREFETCH_WB ? L::ITERS : 1];
    // WB_SMEM: persistent cluster rows keep their slice's weight and bias
    // in shared memory, copied once (cp.async, by the first row) and read by
    // every row's stores: loaded a chunk at a time after each row's
    // reduction, they were as much L2 traffic as the row's x (without a
    // weight, rms bf16 1024x131072 ran at 99.5% of the copy, with it 92%).
    // Each thread copies the chunks it reads back, so its own wait_group
    // makes them visible: no barrier. [chunk][weight, bias][thread]:
    // consecutive threads read consecutive vectors.
    static_assert(!WB_SMEM || (C > 1 && QUANT == nj::Q_NONE && !STAGED && !PREFETCH_WB && !PEEL &&
                               S::N % S::VEC == 0),
                  "WB_SMEM: unquantized, unstaged whole-chunk cluster rows that load their weight after the sums");
    constexpr int NWB = (S::HAS_W ? 1 : 0) + (S::HAS_B ? 1 : 0);
    using wvec_t = nj::Vec<w_t, S::VEC>;
    extern __shared__ __align__(16) unsigned char wb_smem[];
    auto wb_slot = [&](int i, int k) {
      return reinterpret_cast<wvec_t*>(wb_smem) + (i * NWB + k) * (S::TPR * S::ROWS) + threadIdx.x;
    };
    if constexpr (WB_SMEM) {
      if (iter == 0) {
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i) {
          if (tc.in(i)) {
            const int col = tc.col(i);
            if constexpr (S::HAS_W)
              nj::cp_async_vec(wb_slot(i, 0), reinterpret_cast<const wvec_t*>(static_cast<const w_t*>(a.w) + col));
            if constexpr (S::HAS_B)
              nj::cp_async_vec(wb_slot(i, NWB - 1), reinterpret_cast<const wvec_t*>(static_cast<const w_t*>(a.b) + col));
          }
        }
        nj::cp_async_commit();
      }
    }
    // Peeled rows: the chunks wholly inside the row move as vectors, and the
    // elements of its partial first and last chunk (its edges) one per lane
    // apart, in he / hp (value, column; -1: none). Element-wise code in each
    // chunk would be predicated into every chunk by the compiler: measured
    // 1.6x the instructions and 64% of the copy on an H200.
    constexpr int XE = PEEL ? (2 * S::VEC + S::TPR - 1) / S::TPR : 1;
    h_t he[XE];
    int hp[XE];
    // KEEP_U: u of every chunk; grouped rows: each chunk's max|u| too.
    float u[KEEP_U ? L::ITERS : 1][S::VEC];
    float um[KEEP_U && GROUPED ? L::ITERS : 1];
    float s[K] = {0.f};
    if constexpr ((STAGED || ROW_AMAX || KEEP_U) && PREFETCH_WB) {
      // Staged (and rows quantized with a row's amax): the weight and bias
      // first, in a loop of their own: loaded in the row's loop, ptxas
      // widened each chunk as it arrived and issued the next load only then
      // (measured: 8 round trips, 1.9x the time).
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i)
        if ((UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i)))
          nj::load_wb<S>(a, tc.col(i), PEEL || EXACT, wv[i], bv[i], R.lo);
    }
    // LayerNorm's shift (the row's first element) loads after the row when
    // the row's loads are not staged: loaded first, ptxas gave its register
    // to a later chunk's load, which then waited for the shift to arrive
    // and be converted (a round trip more: ln bf16 64x2928 3.01 -> 2.59 us
    // without the shift on an H100).
    // (Not after a residual add: the row's stores of h come first, and may
    // overwrite the residual the shift is computed from.)
    constexpr bool LATE_SHIFT = S::LAYERNORM && !STAGED && !S::RESIDUAL;
    // Unstaged rows with a residual add (RAW_SHIFT) load the shift's two
    // elements after the row's loads and before its first residual_out, and
    // sum them in the sums' loop. Loaded and summed first, ptxas gave the
    // shift's registers to the row's loads, which waited for the sum: a
    // round trip more (SASS of ln fp32 3x360:res, v4.t128.r1).
    constexpr bool RAW_SHIFT = S::LAYERNORM && S::RESIDUAL && !STAGED && nj::xgroup_of<S>() == 0;
    typename nj::FwdRow<S>::First first{};
    if constexpr (S::LAYERNORM && !LATE_SHIFT && !RAW_SHIFT) shift = valid ? R.first_h() : 0.f;
    // Unstaged rows of two chunks a thread or more that store residual_out
    // load as staged rows do, and store it after every load (below): with
    // each chunk's loads behind a branch and its residual_out stored as it
    // came (x, residual and residual_out are not restrict), the compiler
    // issued a chunk's loads only after the chunk before it had arrived and
    // been stored, one memory round trip a chunk (ln bf16 700x98305 with a
    // residual: 7). Their loads are predicated, so whole chunks only.
    constexpr bool LATE_RES =
        S::STORE_RES && !STAGED && L::ITERS > 1 && (PEEL || S::N % S::VEC == 0) && nj::xgroup_of<S>() == 0;
    if constexpr (STAGED || LATE_RES) {
      // Every load of the row first (see FwdRow::Raw), then h.
      typename nj::FwdRow<S>::Raw raw[L::ITERS];
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        if constexpr (STAGED) {
          if ((UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) raw[i] = R.load_raw(tc.col(i), PEEL || EXACT);
        } else {
          const bool take = (UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i));
          raw[i] = R.template load_raw<true>(tc.col(i), true, take);
          if constexpr (PREFETCH_WB && !ROW_AMAX && !KEEP_U) {
            if constexpr (PEEL) {
              if (take) nj::load_wb<S>(a, tc.col(i), true, wv[i], bv[i], R.lo);
            } else {
              // The weight under the same predicate: behind a branch, the
              // second chunk's waited for the first chunk to arrive.
              if constexpr (S::HAS_W) wv[i] = nj::load_vec_if<w_t, S::VEC>(static_cast<const w_t*>(a.w) + tc.col(i), take);
              if constexpr (S::HAS_B) bv[i] = nj::load_vec_if<w_t, S::VEC>(static_cast<const w_t*>(a.b) + tc.col(i), take);
            }
          }
        }
      }
      if constexpr (RAW_SHIFT) first = R.first_raw();
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        if ((UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) {
          hv[i] = R.combine(raw[i]);
        } else {
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) hv[i].v[k] = nj::from_float<h_t>(0.f);
        }
      }
    }
    // Every chunk's loads in a loop of their own, each under a predicate:
    // whole-chunk rows (whole_rows_of), and peeled rows alike (their inner
    // chunks; not with the weight loaded alongside: peeled_cols reads it by
    // the row's columns). Guarded in the loop that sums, ptxas branched
    // around the last chunk of a slice (not every thread holds one) and
    // widened the chunks before it ahead of its load: a round trip more.
    constexpr bool PRED_LOADS = !LATE_RES && (nj::whole_rows_of<S>() || (PEEL && nj::few_chunk_rows<S, L>() &&
                                                                        !(PREFETCH_WB && !ROW_AMAX && !KEEP_U)));
    if constexpr (PRED_LOADS) {
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
        // A chunk this thread does not hold (past the row, a peeled row's
        // partial chunk, whose elements are edges, below, or any chunk of a
        // row past M) loads zeros and stores nothing.
        const bool take = (UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, col);
        if constexpr (PEEL) {
          hv[i] = R.template load_h<true>(col, true, !measure && valid, take);
        } else {
          // (Unpeeled: as the chunk at column N, past the row, which
          // FwdRow::ld predicates. With `take` itself the predicate, rms bf16
          // 512x100000 in clusters of 8 took 95 registers, not 84, and 114
          // us, not 93.)
          const int c = take ? col : S::N;
          hv[i] = R.load_h(c, false, !measure && valid);
          if constexpr (PREFETCH_WB && !ROW_AMAX && !KEEP_U) nj::load_wb<S>(a, c, false, wv[i], bv[i], R.lo);
        }
      }
      // (These rows store no residual_out: such rows take LATE_RES's loads.)
      if constexpr (RAW_SHIFT) first = R.first_raw();
    }
#pragma unroll
    for (int i = 0; i < L::ITERS; ++i) {
      const int col = tc.col(i);
      if constexpr (!STAGED && !LATE_RES && !PRED_LOADS) {
        // UNGUARDED rows load without the row's guard: guarded, ptxas
        // branched around each chunk of a row quantized with a row's amax and
        // issued its loads one round trip after another.
        if ((UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, col)) {
          // A row that stores residual_out (load_h) loads the chunk's weight
          // first: after that store, which waits for x and the residual,
          // the weight's load waited too (the pointers may alias), a second
          // round trip (rms bf16 5x992 with a residual, v8.t128.r1).
          constexpr bool WB = PREFETCH_WB && !ROW_AMAX && !KEEP_U;
          if constexpr (WB && S::STORE_RES) nj::load_wb<S>(a, col, PEEL || EXACT, wv[i], bv[i], R.lo);
          if constexpr (RAW_SHIFT) {
            // The shift's loads after the chunk's and before its residual_out.
            const auto raw = R.load_raw(col, PEEL || EXACT);
            if (i == 0) first = R.first_raw();
            hv[i] = R.combine(raw);
            if (!measure && valid) R.store_res(col, PEEL || EXACT, hv[i]);
          } else {
            hv[i] = R.load_h(col, PEEL || EXACT, !measure && valid);
          }
          if constexpr (WB && !S::STORE_RES) nj::load_wb<S>(a, col, PEEL || EXACT, wv[i], bv[i], R.lo);
        } else {
          if constexpr (RAW_SHIFT) {
            if (i == 0) first = R.first_raw();
          }
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) hv[i].v[k] = nj::from_float<h_t>(0.f);
        }
      }
      if constexpr (RAW_SHIFT) {
        if (i == 0) shift = valid ? R.first_h(first) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) {
        const float f = nj::elem_f32(hv[i], k);
        if constexpr (S::LAYERNORM) {
          if constexpr (!LATE_SHIFT)
            if (EXACT || (tc.in(i) && (PEEL ? R.inner(col) : nj::col_in_row<S>(col, k)))) s[0] += f - shift;  // padding is not part of the row
        } else {
          s[0] += f * f;
        }
      }
      if constexpr (KEEP_U) {
        // Columns past N hold h = w = 0: their u is 0 (a peeled row's partial
        // chunks too: their elements are its edges, below).
        if ((UNGUARDED || valid) && tc.in(i) && nj::whole_chunk<PEEL>(R, col)) {
          nj::Vec<w_t, S::VEC> w, b;
          if constexpr (PREFETCH_WB) w = wv[i];
          else nj::load_wb<S>(a, col, PEEL || EXACT, w, b, R.lo);
          R.u_values(hv[i], w, u[i]);
        } else {
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) u[i][k] = 0.f;
        }
        float cm = 0.f;
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) cm = fmaxf(cm, fabsf(u[i][k]));
        if constexpr (GROUPED) um[i] = cm;
        if constexpr (FOLD) {
          if (QUANT != nj::Q_TENSOR || measure) ua = fmaxf(ua, cm);
        }
      } else if constexpr (FOLD && !S::LAYERNORM) {
        if (valid && tc.in(i) && nj::whole_chunk<PEEL>(R, col)) {
          nj::Vec<w_t, S::VEC> w, b;
          if constexpr (PREFETCH_WB) w = wv[i];
          else nj::load_wb<S>(a, col, PEEL || EXACT, w, b, R.lo);
          ua = fmaxf(ua, R.u_absmax(hv[i], col, PEEL || EXACT, 0.f, 0.f, w));
        }
      }
    }
    if constexpr (PEEL) {
#pragma unroll
      for (int e = 0; e < XE; ++e) {
        hp[e] = R.edge(lane + e * S::TPR, c0, L::SLICE, C);
        he[e] = valid && hp[e] >= 0 ? R.load_h1(hp[e], !STAGED && !LATE_RES && !measure) : nj::from_float<h_t>(0.f);
        const float f = nj::to_float(he[e]);
        if constexpr (S::LAYERNORM) {
          if constexpr (!LATE_SHIFT)
            if (hp[e] >= 0) s[0] += f - shift;
        } else {
          s[0] += f * f;
          // A quantized row's edges join its folded max|u|.
          if constexpr (FOLD) {
            if (valid && hp[e] >= 0 && (QUANT != nj::Q_TENSOR || measure)) ua = fmaxf(ua, fabsf(f * R.w1(hp[e], a)));
          }
        }
      }
    }
    if constexpr (LATE_SHIFT) {
      shift = valid ? R.first_h() : 0.f;
      // The sums in the order above (the row's chunks, then its edges).
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k)
          if (EXACT || (tc.in(i) && (PEEL ? R.inner(col) : nj::col_in_row<S>(col, k)))) s[0] += nj::elem_f32(hv[i], k) - shift;
      }
      if constexpr (PEEL) {
#pragma unroll
        for (int e = 0; e < XE; ++e)
          if (hp[e] >= 0) s[0] += nj::to_float(he[e]) - shift;
      }
    }
    // Staged (and LATE_RES): residual_out once every load of the row is
    // issued (tensor scaling's measuring launch stores nothing).
    if constexpr ((STAGED || LATE_RES) && S::STORE_RES) {
      if (valid && !measure) {
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i)
          if (tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) R.store_res(tc.col(i), PEEL || EXACT, hv[i]);
        if constexpr (PEEL) {
#pragma unroll
          for (int e = 0; e < XE; ++e)
            if (hp[e] >= 0) R.store_res1(hp[e], he[e]);
        }
      }
    }
    // (A row's max|u| with the sums that hold it: see FOLD, ROW_FOLD.)
    auto reduce = [&](auto& sums) {
      if constexpr (ROW_FOLD) {
        __shared__ float red_a[S::ROWS][nj::kWarpsPerRow<S::TPR>][2];
        float v2[2] = {sums[0], ua};
        nj::row_reduce<S::TPR, S::ROWS, 2, 1>(v2, red_a);
        sums[0] = v2[0];
        ua = v2[1];
      } else {
        nj::row_reduce<S::TPR, S::ROWS>(sums, red);
      }
    };
    // A cluster's slice of a 16-bit row without a residual is counted packed
    // (row_budget.cpp): the fp32 copies a pass over the row widened must not
    // live on to the next. An empty asm that may rewrite each packed word
    // makes the next pass widen them again (one instruction an element).
    auto repack = [&]() {
      if constexpr (C > 1 && sizeof(h_t) == 2 && !S::RESIDUAL && S::VEC == 8 && L::ITERS * S::VEC >= 32 &&
                    L::ITERS * S::VEC <= 64) {
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i) {
          unsigned* w = reinterpret_cast<unsigned*>(&hv[i]);
#pragma unroll
          for (int k = 0; k < S::VEC / 2; ++k) asm volatile("" : "+r"(w[k]));
        }
      }
    };
    if constexpr (S::LAYERNORM) nj::row_reduce<S::TPR, S::ROWS>(s, red);
    else reduce(s);
    if constexpr (S::LAYERNORM) repack();
    if constexpr (S::LAYERNORM) {
      // Exact two-step variance from the cached row: stable for any mean.
      // (Measured on an H200: faster than a one-round mean/M2 combine.) In a
      // cluster, each CTA's slice: its count n, mean and M2, combined below.
      const int n = C > 1 ? R.slice_count(c0, L::SLICE, C) : S::N;
      const float sum = s[0];
      m = C > 1 ? (n > 0 ? sum / n : 0.f) : sum * inv_n;
      s[0] = 0.f;
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float d = (nj::elem_f32(hv[i], k) - shift) - m;
          if (EXACT || (tc.in(i) && (PEEL ? R.inner(col) : nj::col_in_row<S>(col, k)))) s[0] += d * d;  // padding is not part of the row
        }
        if constexpr (FOLD) {
          if (valid && tc.in(i) && nj::whole_chunk<PEEL>(R, col)) {
            nj::Vec<w_t, S::VEC> w, b;
            if constexpr (PREFETCH_WB) w = wv[i];
            else nj::load_wb<S>(a, col, PEEL || EXACT, w, b, R.lo);
            ua = fmaxf(ua, R.u_absmax(hv[i], col, PEEL || EXACT, shift, m, w));
          }
        }
      }
      if constexpr (PEEL) {
#pragma unroll
        for (int e = 0; e < XE; ++e) {
          const float d = (nj::to_float(he[e]) - shift) - m;
          if (hp[e] >= 0) s[0] += d * d;
          if constexpr (FOLD) {
            if (valid && hp[e] >= 0) ua = fmaxf(ua, fabsf(d * R.w1(hp[e], a)));
          }
        }
      }
      reduce(s);
      if constexpr (C > 1) {
        // Chan et al.'s pairwise combination of the slices' (n, mean, M2):
        // exact and stable, one exchange.
        float v[XK] = {sum, s[0]};
        if constexpr (XA) v[XK - 1] = ua;
        if (iter == 0) xc.ready();
        xc.exchange(v);
        const int r = threadIdx.x % 32, nr = R.slice_count(r * L::SLICE, L::SLICE, C);
        m = nj::warp_sum(v[0]) * inv_n;
        const float dm = nr > 0 ? v[0] / nr - m : 0.f;
        s[0] = nj::warp_sum(r < C ? v[1] + nr * dm * dm : 0.f);
        if constexpr (XA) ua = nj::warp_max(v[XK - 1]);
      }
    } else if constexpr (C > 1) {
      float v[XK] = {s[0]};
      if constexpr (XA) v[XK - 1] = ua;
      if (iter == 0) xc.ready();
      xc.exchange(v);
      s[0] = nj::warp_sum(v[0]);
      if constexpr (XA) ua = nj::warp_max(v[XK - 1]);
    }
    repack();
    rstd = rsqrtf(s[0] * inv_n + a.eps);
    float row_amax = 0.f;
    // Token rows of up to 32 elements a thread keep the y they computed for
    // the amax, rather than computing it again to store (fewer instructions
    // a chunk; measured within 3% either way on an H200's whole grids); so
    // do the one-launch tensor kernel's unstaged rows (decode: the weight
    // not loaded again after the amax).
    constexpr bool CACHE_Y = (QUANT == nj::Q_TOKEN || STATIC_AMAX || (QUANT == nj::Q_TENSOR && ONCE && !STAGED)) &&
                             !FOLD && L::ITERS * S::VEC <= 32;
    float yc[CACHE_Y ? L::ITERS : 1][S::VEC];
    if constexpr (ROW_AMAX) {
      // Token and tensor scales need the row's amax before its first store.
      if constexpr (FOLD) {
        row_amax = valid ? ua * rstd : 0.f;
      } else if (QUANT == nj::Q_TOKEN || measure || STATIC_AMAX || ONCE) {
#pragma unroll
        for (int i = 0; i < L::ITERS; ++i) {
          if (valid && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) {
            nj::Vec<w_t, S::VEC> w, b;
            if constexpr (PREFETCH_WB) {
              w = wv[i];
              b = bv[i];
            } else {
              nj::load_wb<S>(a, tc.col(i), PEEL || EXACT, w, b, R.lo);
            }
            float v[S::VEC];
            R.y_values(hv[i], shift, m, rstd, w, b, v);
#pragma unroll
            for (int k = 0; k < S::VEC; ++k) {
              if (EXACT || (PEEL ? R.has(tc.col(i) + k) : tc.col(i) + k < S::N)) row_amax = fmaxf(row_amax, fabsf(v[k]));
              if constexpr (CACHE_Y) yc[i][k] = v[k];
            }
          }
        }
        if constexpr (PEEL) {
#pragma unroll
          for (int e = 0; e < XE; ++e)
            if (valid && hp[e] >= 0) row_amax = fmaxf(row_amax, fabsf(R.y1(hp[e], he[e], shift, m, rstd, a, KEEP_U)));
        }
      }
      if constexpr (STATIC_AMAX) amax_acc = fmaxf(amax_acc, row_amax);
      if (measure) {
        amax_acc = fmaxf(amax_acc, row_amax);
        return;
      }
      if constexpr (QUANT == nj::Q_TOKEN && !FOLD) {
        row_amax = S::Q::template row_max<S::TPR, S::ROWS>(row_amax);
        if constexpr (C > 1) {  // and over the cluster's slices
          float v[XK] = {row_amax};
          xc.exchange(v);
          row_amax = nj::warp_max(v[0]);
        }
      }
      if constexpr (ONCE) row_amax = S::Q::tensor_amax_once(row_amax, q);
    }
    float inv = 1.f;  // 1 / the scale a row or the tensor shares
    if constexpr (STATIC_AMAX) static_scale = *static_cast<const float*>(q.scale);
    // Tensor scaling hands shared_inv_scale its amax in static_scale.
    if constexpr (QUANT == nj::Q_TENSOR) static_scale = ONCE ? row_amax : *q.amax;
    if constexpr (QUANT != nj::Q_NONE)
      inv = S::Q::template shared_inv_scale<S>(q, row_amax, valid && lane == 0 && c0 == 0, row, static_scale);
    // y of chunk i of the thread, given its weight and bias (staged kernels).
    auto store_chunk = [&](int i, const nj::Vec<w_t, S::VEC>& w, const nj::Vec<w_t, S::VEC>& b) {
      const int col = tc.col(i);
      if constexpr (QUANT == nj::Q_NONE) {
        R.store_y(col, PEEL || EXACT, hv[i], shift, m, rstd, w, b);
      } else {
        float v[S::VEC];
        R.y_values(hv[i], shift, m, rstd, w, b, v);
        float gi = inv;
        if constexpr (GROUPED) gi = S::Q::template group_inv_scale<S>(q, v, col, row);
        S::Q::template store<S>(R, col, EXACT, v, gi);
      }
    };
    // A group's lanes share `valid` and `in` (groups divide N): they meet in group_max together.
    if constexpr (KEEP_U) {
      // Every chunk's group scale at once (the whole warp meets in the shuffles).
      float ginv[GROUPED ? L::ITERS : 1];
      if constexpr (GROUPED) S::Q::template group_inv_scales<S>(q, um, rstd, row, valid, tc, ginv);
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        if (valid && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) {
          float v[S::VEC];
#pragma unroll
          for (int k = 0; k < S::VEC; ++k) v[k] = u[i][k] * rstd;
          S::Q::template store<S>(R, tc.col(i), PEEL || EXACT, v, GROUPED ? ginv[i] : inv);
        }
      }
    } else if constexpr (!STAGED) {
      if constexpr (WB_SMEM) nj::cp_async_wait<0>();
#pragma unroll
      for (int i = 0; i < L::ITERS; ++i) {
        const int col = tc.col(i);
        if (valid && tc.in(i) && nj::whole_chunk<PEEL>(R, col)) {
          nj::Vec<w_t, S::VEC> w, b;
          if constexpr (PREFETCH_WB) {
            w = wv[i];
            b = bv[i];
          } else if constexpr (WB_SMEM) {
            if constexpr (S::HAS_W) w = *wb_slot(i, 0);
            if constexpr (S::HAS_B) b = *wb_slot(i, NWB - 1);
          } else if constexpr (!CACHE_Y) {
            // RMSNorm cluster rows at their launch bound (no WB_RO): every
            // chunk's weight but the last through the read-only path, so
            // that ptxas holds one chunk fewer (read-only throughout, 16-bit
            // slices of 64 elements a thread spilled 8 bytes; LayerNorm's
            // weight and bias spilled 8-16 bytes either way).
            if constexpr (C > 1 && !nj::wb_ro_or<S>(0) && !S::LAYERNORM && !PEEL && S::N % S::VEC == 0 &&
                          QUANT == nj::Q_NONE) {
              if (i + 1 < L::ITERS) nj::load_wb<S, 1>(a, col, PEEL || EXACT, w, b, R.lo);
              else nj::load_wb<S, 0>(a, col, PEEL || EXACT, w, b, R.lo);
            } else {
              nj::load_wb<S>(a, col, PEEL || EXACT, w, b, R.lo);
            }
          }
          // (store_chunk's body written out: the lambda moved some kernels'
          // machine code, and with it their tuned entries.)
          if constexpr (QUANT == nj::Q_NONE) {
            R.store_y(col, PEEL || EXACT, hv[i], shift, m, rstd, w, b);
          } else {
            float v[S::VEC];
            if constexpr (CACHE_Y) {
#pragma unroll
              for (int k = 0; k < S::VEC; ++k) v[k] = yc[i][k];
            } else {
              R.y_values(hv[i], shift, m, rstd, w, b, v);
            }
            float gi = inv;
            if constexpr (GROUPED) gi = S::Q::template group_inv_scale<S>(q, v, col, row);
            S::Q::template store<S>(R, col, PEEL || EXACT, v, gi);
          }
        }
      }
    } else {
#pragma unroll
      for (int i0 = 0; i0 < L::ITERS; i0 += WB_BATCH) {
        nj::Vec<w_t, S::VEC> wb[PREFETCH_WB ? 1 : WB_BATCH], bb[PREFETCH_WB ? 1 : WB_BATCH];
        if constexpr (!PREFETCH_WB) {
#pragma unroll
          for (int j = 0; j < WB_BATCH; ++j) {
            const int i = i0 + j;
            if (i < L::ITERS && valid && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i)))
              nj::load_wb<S>(a, tc.col(i), PEEL || EXACT, wb[j], bb[j], R.lo);
          }
        }
#pragma unroll
        for (int j = 0; j < WB_BATCH; ++j) {
          const int i = i0 + j;
          if (i < L::ITERS && valid && tc.in(i) && nj::whole_chunk<PEEL>(R, tc.col(i))) {
            if constexpr (PREFETCH_WB) store_chunk(i, wv[i], bv[i]);
            else store_chunk(i, wb[j], bb[j]);
          }
        }
      }
    }
    if constexpr (PEEL) {
#pragma unroll
      for (int e = 0; e < XE; ++e) {
        if (valid && hp[e] >= 0) {
          if constexpr (QUANT == nj::Q_NONE) R.store_y1(hp[e], he[e], shift, m, rstd, a);
          else S::Q::template store1<S>(R, hp[e], R.y1(hp[e], he[e], shift, m, rstd, a, KEEP_U), inv);
        }
      }
    }
  } else {
    // Wide rows without a cluster: too long for registers. Read the row
    // twice; the second read mostly hits L2 because only a few rows per SM
    // are in flight. LayerNorm: var = E[(h-shift)^2] - m^2, fine since m is
    // of the order of the std.
    float s[K] = {0.f, 0.f};
    if (valid) {
      if constexpr (S::LAYERNORM) shift = R.first_h();
      // Chunk by chunk (stores between loads, see load_h): only a few rows
      // an SM are in flight, and their registers decide how many (measured:
      // loads batched four chunks at a time took twice the registers, half
      // the CTAs an SM, and 1.3x the time).
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        const auto hv = R.load_h(c * S::VEC, EXACT, !measure);
#pragma unroll
        for (int k = 0; k < S::VEC; ++k) {
          const float d = nj::to_float(hv.v[k]) - shift;
          if (EXACT || (PEEL ? R.has(c * S::VEC + k) : c * S::VEC + k < S::N)) {
            s[0] += d * d;
            s[1] += d;
          }
        }
        if constexpr (FOLD) {  // RMSNorm only here (see FOLD)
          nj::Vec<w_t, S::VEC> w, b;
          nj::load_wb<S>(a, c * S::VEC, EXACT, w, b, R.lo);
          ua = fmaxf(ua, R.u_absmax(hv, c * S::VEC, EXACT, 0.f, 0.f, w));
        }
      }
    }
    if constexpr (ROW_FOLD) {
      __shared__ float red_a[S::ROWS][nj::kWarpsPerRow<S::TPR>][3];
      float v3[3] = {s[0], s[1], ua};
      nj::row_reduce<S::TPR, S::ROWS, 3, 1>(v3, red_a);
      s[0] = v3[0];
      s[1] = v3[1];
      ua = v3[2];
    } else {
      nj::row_reduce<S::TPR, S::ROWS>(s, red);
    }
    float var = s[0] * inv_n;
    if constexpr (S::LAYERNORM) {
      m = s[1] * inv_n;
      // Clamp rounding below 0, keep NaN (fmaxf would turn a NaN row's
      // variance into 0 and its rstd into 1/sqrt(eps)).
      var -= m * m;
      var = var < 0.f ? 0.f : var;
    }
    rstd = rsqrtf(var + a.eps);
    // y of chunk c in fp32 (quantized variants).
    auto chunk_y = [&](int c, float (&v)[S::VEC]) {
      nj::Vec<w_t, S::VEC> w, b;
      nj::load_wb<S>(a, c * S::VEC, EXACT, w, b, R.lo);
      R.y_values(R.load_h(c * S::VEC, EXACT, false), shift, m, rstd, w, b, v);
    };
    float row_amax = 0.f;
    if constexpr (ROW_AMAX) {
      // FOLD: max|u| came with the sums; else one more pass over the row
      // (from L2) for its amax.
      if constexpr (FOLD) {
        row_amax = valid ? ua * rstd : 0.f;
      } else if (valid && (QUANT == nj::Q_TOKEN || measure || STATIC_AMAX || ONCE)) {
#pragma unroll 4
        for (int c = lane; c < L::CHUNKS; c += S::TPR) {
          float v[S::VEC];
          chunk_y(c, v);
#pragma unroll
          for (int k = 0; k < S::VEC; ++k)
            if (EXACT || (PEEL ? R.has(c * S::VEC + k) : c * S::VEC + k < S::N)) row_amax = fmaxf(row_amax, fabsf(v[k]));
        }
      }
      if constexpr (STATIC_AMAX) amax_acc = fmaxf(amax_acc, row_amax);
      if (measure) {
        amax_acc = fmaxf(amax_acc, row_amax);
        return;
      }
      if constexpr (QUANT == nj::Q_TOKEN && !FOLD) row_amax = S::Q::template row_max<S::TPR, S::ROWS>(row_amax);
      if constexpr (ONCE) row_amax = S::Q::tensor_amax_once(row_amax, q);
    }
    float inv = 1.f;
    if constexpr (STATIC_AMAX) static_scale = *static_cast<const float*>(q.scale);
    // Tensor scaling hands shared_inv_scale its amax in static_scale.
    if constexpr (QUANT == nj::Q_TENSOR) static_scale = ONCE ? row_amax : *q.amax;
    if constexpr (QUANT != nj::Q_NONE)
      inv = S::Q::template shared_inv_scale<S>(q, row_amax, valid && lane == 0, row, static_scale);
    if (valid) {
      // A group's lanes run the same iterations (TPR and the chunk count are
      // multiples of the lanes of a group), so they meet in group_max.
#pragma unroll 4
      for (int c = lane; c < L::CHUNKS; c += S::TPR) {
        if constexpr (QUANT == nj::Q_NONE) {
          nj::Vec<w_t, S::VEC> w, b;
          nj::load_wb<S>(a, c * S::VEC, EXACT, w, b, R.lo);
          R.store_y(c * S::VEC, EXACT, R.load_h(c * S::VEC, EXACT, false), shift, m, rstd, w, b);
        } else {
          float v[S::VEC];
          chunk_y(c, v);
          float gi = inv;
          if constexpr (GROUPED) gi = S::Q::template group_inv_scale<S>(q, v, c * S::VEC, row);
          S::Q::template store<S>(R, c * S::VEC, EXACT, v, gi);
        }
      }
    }
  }
  if (valid && lane == 0 && c0 == 0) {
    if constexpr (S::STORE_RSTD) a.rstd[row] = rstd;
    if constexpr (S::STORE_MEAN) a.mean[row] = shift + m;
  }
}

// A template, so that `if constexpr` discards the paths a Spec does not take.
// One program per row group, except where amax is written (tensor scaling,
// a static scale with STORE_AMAX): a resident-sized grid strides over the row
// groups, so that few programs meet in the one atomic amax.
template <class S> __device__ __forceinline__ void norm_fwd(const nj::NormArgs& a, const nj::QuantArgs& q) {
  float amax_acc = 0.f;
  if constexpr (nj::quant_of<S>() != nj::Q_TENSOR && !nj::store_amax_of<S>()) {
    // A static scale is read before the row, so that its load overlaps the
    // row's: read where it is used, after the reduction, it was a round trip
    // of its own at decode (1x4096 on an H200: 2.02 -> 1.71 us). Not where
    // amax is written: there ptxas then took 79 registers where it took 64
    // (v8.t512, N = 16384), one CTA an SM where two fit, 1.4x the time.
    float static_scale = 1.f;
    if constexpr (nj::quant_of<S>() == nj::Q_TENSOR_STATIC) static_scale = *static_cast<const float*>(q.scale);
    if constexpr (nj::wb_smem_or<S>(0)) {
      // A resident grid of clusters strides over the rows (launch_geometry).
      int iter = 0;
      for (long long row = nj::cluster_id(); row < a.M; row += nj::num_clusters(), ++iter)
        norm_fwd_rows<S>(a, q, row, amax_acc, static_scale, iter);
    } else {
      norm_fwd_rows<S>(a, q, S::CLUSTER > 1 ? 0 : blockIdx.x, amax_acc, static_scale);
    }
  } else if constexpr (nj::quant_of<S>() != nj::Q_TENSOR) {
    if constexpr (S::CLUSTER > 1) {
      norm_fwd_rows<S>(a, q, 0, amax_acc);  // a cluster a row: the grid holds every row
    } else {
      for (long long g = blockIdx.x; g * S::ROWS < a.M; g += gridDim.x)
        norm_fwd_rows<S>(a, q, g, amax_acc);
    }
    // (One row a program, reduced with its sums: every thread holds the block's amax.)
    S::Q::template block_max_to<nj::row_fold_of<S>()>(amax_acc, q.amax);
  } else {
    // Tensor scaling: phase 0 measures, 1 quantizes, walking the row groups
    // last-measured first: those rows are the ones still in L2. One loop for
    // both (a loop a phase took 73-82 registers where one takes 64, and ran
    // a CTA an SM fewer); decode runs both in normjit_norm_fwd_once.
    const long long groups = (a.M + S::ROWS - 1) / S::ROWS;
    if constexpr (S::CLUSTER > 1) {
      norm_fwd_rows<S>(a, q, 0, amax_acc);  // a cluster a row, in both launches
    } else {
      for (long long k = blockIdx.x; k < groups; k += gridDim.x)
        norm_fwd_rows<S>(a, q, q.phase == 1 ? groups - 1 - k : k, amax_acc);
    }
    if (q.phase == 0) S::Q::block_max_to(amax_acc, q.amax);
  }
}

// Tensor scaling in one launch (decode): where one program, or a cluster
// with a program for each row group, holds every row, one pass whose amax
// over the block (or the cluster, through DSMEM) is the tensor's (ONCE);
// else, one program, both phases with a block barrier between. amax is
// stored, not accumulated: no zero first, no second launch. A kernel of its
// own (normjit_norm_fwd_once): the two phases' loops in one function took
// 73-82 registers where the two-launch kernel takes 64, and ran a CTA an SM
// fewer.
template <class S> __device__ __forceinline__ void norm_fwd_once(const nj::NormArgs& a, const nj::QuantArgs& q) {
  float amax_acc = 0.f;
  const long long groups = (a.M + S::ROWS - 1) / S::ROWS;
  const unsigned ctas = nj::cluster_ctas();
  if (groups == ctas) {
    if (ctas > 1) nj::ClusterMax::init();  // its barrier overlaps the row's loads
    norm_fwd_rows<S, true>(a, q, nj::cluster_rank_any(), amax_acc);
    return;
  }
  nj::QuantArgs qp = q;
  qp.phase = 0;
  for (long long g = 0; g < groups; ++g) norm_fwd_rows<S>(a, qp, g, amax_acc);
  S::Q::block_max_to(amax_acc, q.amax);
  __syncthreads();  // amax is visible to the block
  qp.phase = 1;
  for (long long g = groups - 1; g >= 0; --g) norm_fwd_rows<S>(a, qp, g, amax_acc);
}

// NJ_MIN_BLOCKS (the prelude's, only where > 1): the CTAs an SM must hold
// at once. Left to itself ptxas spends up to 65536 / threads registers
// (a 1024-thread LayerNorm row of 8 elements a thread took 60: one CTA an
// SM, and a grid of 147 rows ran in two rounds on 132 SMs); the engine
// derives the count from the registers the row needs, and the config model
// counts on it.
#ifdef NJ_MIN_BLOCKS
#define NJ_FWD_BOUNDS __launch_bounds__(Spec::TPR * Spec::ROWS, NJ_MIN_BLOCKS)
#else
#define NJ_FWD_BOUNDS __launch_bounds__(Spec::TPR * Spec::ROWS)
#endif
extern "C" __global__ void NJ_FWD_BOUNDS normjit_norm_fwd(const nj::NormArgs a, const nj::QuantArgs q) {
  norm_fwd<Spec>(a, q);
}
// Only the preludes of tensor-scaled variants define NJ_FWD_ONCE.
#ifdef NJ_FWD_ONCE
extern "C" __global__ void NJ_FWD_BOUNDS normjit_norm_fwd_once(const nj::NormArgs a, const nj::QuantArgs q) {
  norm_fwd_once<Spec>(a, q);
}
#endif
