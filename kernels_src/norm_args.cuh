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

}  // namespace nj
