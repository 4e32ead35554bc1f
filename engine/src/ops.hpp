// Launching the RMSNorm kernels: argument packing and geometry, shared by the
// engine's calls, the tuner and the benchmark.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "config_grid.hpp"
#include "jit.hpp"

namespace normjit::detail {

struct ForwardPtrs {
  CUdeviceptr x = 0, w = 0, y = 0, rstd = 0;
};
struct BackwardPtrs {
  CUdeviceptr dy = 0, x = 0, w = 0, rstd = 0, dx = 0, dw = 0, workspace = 0;
};

void launch_forward(const LoadedKernel& k, const NormDesc& d, const ForwardPtrs& p, int sm_count, CUstream s);

/// Bytes of partial dweight rows `k` needs for `d` (programs x N fp32);
/// `programs_per_sm` as in LaunchConfig (a launch parameter).
std::size_t backward_workspace_bytes(const LoadedKernel& k, const NormDesc& d, int programs_per_sm, int sm_count);

/// The row kernel, then (when it ran more than one program) the dweight
/// finalize kernel `fin`.
void launch_backward(const LoadedKernel& k, const LoadedKernel& fin, const NormDesc& d, const BackwardPtrs& p,
                     int programs_per_sm, int sm_count, CUstream s);

}  // namespace normjit::detail
