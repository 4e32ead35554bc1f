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

/// The persistent grid of the backward under `cfg`, whose kernel (compiled
/// with cfg's vec) is `k`. It is fixed by the config, not by the kernel that
/// finally runs (alignment may lower vec and so change occupancy), so the
/// workspace size and the results do not depend on pointer alignment.
Geometry backward_geometry(const LoadedKernel& k, const NormDesc& d, const LaunchConfig& cfg, int sm_count);

/// Bytes of partial dweight rows for `g` (programs x N fp32).
std::size_t backward_workspace_bytes(const Geometry& g, const NormDesc& d);

/// The row kernel `k` on grid `g`, then (when g has more than one program)
/// the dweight finalize kernel `fin`.
void launch_backward(const LoadedKernel& k, const LoadedKernel& fin, const NormDesc& d, const BackwardPtrs& p,
                     const Geometry& g, CUstream s);

}  // namespace normjit::detail
