// The arguments of the row kernels: one struct passed by value. Plain C++
// with no device code, so the engine includes this same file to fill it:
// host and device agree on the layout by construction.
#pragma once

namespace nj {

struct NormArgs {
  // Forward: x (+ residual) -> y, residual_out (h), mean, rstd.
  const void* x;
  const void* residual;
  const void* w;
  const void* b;
  void* y;
  void* residual_out;
  float* mean;
  float* rstd;
  // Backward: dy, x (the normalised input h), w, mean, rstd (+ dresidual) ->
  // dx and fp32 partial dweight / dbias rows, or dw / db directly.
  const void* dy;
  const void* dresidual;
  void* dx;
  float* partial;
  void* dw;
  void* db;
  long long M;      // rows
  long long heads;  // rows per token of a 3-D tensor (row r = token r / heads, head r % heads)
  // Element offsets: *_ld between tokens, *_hs between heads (3-D only).
  long long x_ld, x_hs, y_ld, y_hs, dy_ld, dy_hs, dx_ld, dx_hs;
  long long res_ld, res_out_ld, dres_ld;
  float eps;
  const float* x_scale;  // FP8 x (forward and backward): [M, N / XGROUP] fp32, x = q * x_scale
};

// Constants a prelude defines only for FP8 variants, 0 where it does not:
// the other variants' preludes (and so their tuned entries) stay as they
// were before FP8 existed. XGROUP: elements per scale of an FP8 x; QUANT:
// how y is quantized (quant_args.cuh numbers them). Functions, not static
// data members, so that no variable joins the other kernels' code.
template <class S> constexpr auto xgroup_or0(int) -> decltype(S::XGROUP + 0) { return S::XGROUP; }
template <class S> constexpr int xgroup_or0(long) { return 0; }
template <class S> constexpr auto quant_or0(int) -> decltype(S::QUANT + 0) { return S::QUANT; }
template <class S> constexpr int quant_or0(long) { return 0; }
template <class S> constexpr int xgroup_of() { return xgroup_or0<S>(0); }
template <class S> constexpr int quant_of() { return quant_or0<S>(0); }

}  // namespace nj
