// The quantized-output arguments of the forward kernel, a second parameter
// beside NormArgs (which the backward shares). Plain C++: the engine includes this
// file to fill it, so host and device agree on the layout.
#pragma once

namespace nj {

// Spec::QUANT values, as normjit::QuantScaling numbers them.
enum : int { Q_NONE = 0, Q_TENSOR_STATIC = 1, Q_TENSOR = 2, Q_TOKEN = 3, Q_GROUP = 4, Q_MX = 5 };

// The tile of q_transpose.cuh's CTAs (the engine sizes its grid by it).
// Functions, not variables: a namespace-scope constant became a device
// variable in every kernel's machine code.
constexpr int qt_tile_rows() { return 64; }
constexpr int qt_tile_cols() { return 256; }

struct QuantArgs {
  void* scale;           // y's scales: fp32 ([1], [M], [M, N / G] or [N / G, scale_ld]) or E8M0 bytes (MX)
  float* amax;           // per-tensor current scaling: [1], max |y|
  void* y_hp;            // y unquantized, y's strides
  void* y_t;             // q transposed, [N, M]: written by the row kernel only at decode (else null)
  long long scale_ld;    // column-major group scales: elements between two groups' scale rows
  float scale_ub;        // per-token and per-group: upper bound on a scale (0: none)
  float scale_min;       // least computed scale (> 0: the engine resolves 0 to 2^-126)
  int phase;             // per-tensor current scaling: 0 finds amax, 1 quantizes (normjit_norm_fwd_once: both)
};

}  // namespace nj
