#include "ops.hpp"

#include <fmt/format.h>

namespace normjit::detail {

void launch_forward(const LoadedKernel& k, const NormDesc& d, const ForwardPtrs& p, int sm_count, CUstream s) {
  const Geometry g = launch_geometry(Op::RmsForward, d, k.spec().cfg, sm_count, k.blocks_per_sm);
  long long M = d.M, xs = d.x_ld(), ys = d.y_ld();
  float eps = d.eps;
  CUdeviceptr x = p.x, w = p.w, y = p.y, rstd = p.rstd;
  void* args[] = {&x, &w, &y, &rstd, &M, &xs, &ys, &eps};
  k.launch(g.grid, g.block, s, args);
}

Geometry backward_geometry(const LoadedKernel& k, const NormDesc& d, const LaunchConfig& cfg, int sm_count) {
  return launch_geometry(Op::RmsBackward, d, cfg, sm_count, k.blocks_per_sm);
}

std::size_t backward_workspace_bytes(const Geometry& g, const NormDesc& d) {
  return d.M == 0 ? 0 : static_cast<std::size_t>(g.grid) * static_cast<std::size_t>(d.N) * sizeof(float);
}

void launch_backward(const LoadedKernel& k, const LoadedKernel& fin, const NormDesc& d, const BackwardPtrs& p,
                     const Geometry& g, CUstream s) {
  long long M = d.M, dys = d.dy_ld(), xs = d.x_ld(), dxs = d.dx_ld();
  CUdeviceptr dy = p.dy, x = p.x, w = p.w, rstd = p.rstd, dx = p.dx, ws = p.workspace, dw = p.dw;
  void* args[] = {&dy, &x, &w, &rstd, &dx, &ws, &dw, &M, &dys, &xs, &dxs};
  k.launch(g.grid, g.block, s, args);
  if (g.grid == 1) return;  // one program wrote dweight itself
  int programs = static_cast<int>(g.grid), n = static_cast<int>(d.N);
  void* fargs[] = {&ws, &dw, &programs, &n};
  fin.launch(static_cast<unsigned>((d.N + 31) / 32), 1024, s, fargs);
}

}  // namespace normjit::detail
