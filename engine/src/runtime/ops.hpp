// Launching the row kernels: argument packing and geometry, shared by the
// engine's calls, the tuner and the benchmark.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "config/config_grid.hpp"
#include "compile/jit.hpp"
#include "norm_args.cuh"
#include "normjit/normjit.hpp"

namespace normjit::detail {

/// Strides of every row tensor as the kernels index them, M and eps; the
/// pointers are left null. Backward: x is h with a fused residual.
nj::NormArgs row_layout(const NormDesc& d, bool backward);

/// The forward on `k` (compiled for `d`) with the tensors of `t`.
void launch_forward(const LoadedKernel& k, const NormDesc& d, const ForwardTensors& t, int sm_count, CUstream s);
/// The same with geometry and layout already derived (a Plan's launch);
/// `resident` is amax_grid's: per-tensor current scaling's first pass, and
/// the one launch of a static scale that writes amax; `qt_cols` is
/// transpose_columns'.
void launch_forward(const LoadedKernel& k, const NormDesc& d, const nj::NormArgs& layout, const ForwardTensors& t,
                    const Geometry& g, unsigned resident, int qt_cols, CUstream s);
/// Columns of q a CTA of the transpose launch takes (store_y_t): its tile's,
/// or fewer (down to 16) where the row tiles of d are too few to give each
/// of `sm_count` SMs a CTA.
int transpose_columns(const NormDesc& d, int sm_count);
/// Grid of the amax pass of per-tensor current scaling: resident-sized, so
/// few programs meet in its one atomic; rows split over clusters (a static
/// scale that writes amax): the whole grid, a cluster a row.
unsigned amax_grid(const LoadedKernel& k, const Geometry& g, int sm_count);

/// The persistent grid of the backward under `cfg`, whose kernel (compiled
/// with cfg's vec) is `k`. It is fixed by the config, not by the kernel that
/// finally runs (alignment may lower vec and so change occupancy), so the
/// workspace size and the results do not depend on pointer alignment.
Geometry backward_geometry(const LoadedKernel& k, const NormDesc& d, const LaunchConfig& cfg, int sm_count);

/// Bytes of partial dweight / dbias rows for `g` (partials x programs x N fp32).
std::size_t backward_workspace_bytes(const Geometry& g, const NormDesc& d);

/// The row kernel `k` on grid `g`, then (when g has more than one program)
/// the finalize kernel `fin` once per partial (dweight, dbias).
void launch_backward(const LoadedKernel& k, const LoadedKernel& fin, const NormDesc& d, const BackwardTensors& t,
                     const Geometry& g, CUstream s);
/// The same with the layout derived; `fin` may be null when g has one program.
void launch_backward(const LoadedKernel& k, const LoadedKernel* fin, const nj::NormArgs& layout,
                     const BackwardTensors& t, const Geometry& g, CUstream s);

/// The finalize kernel `fin` on geometry `f`: out0 (and with f.partials 2,
/// out1) = the sum of f.programs fp32 partial rows of f.N each (a partial's
/// rows, then the next's).
void launch_finalize(const LoadedKernel& fin, void* partial, void* out0, void* out1, const FinalizeGeometry& f,
                     CUstream s);

/// A sharded norm's launch (sharded.cuh): vector width, block size, the row
/// kernels' grid and the backward apply's programs (its partial rows).
struct ShardGeometry {
  int vec = 1, threads = 64;
  unsigned grid = 0;
  std::int64_t programs = 0;
  FinalizeGeometry finalize;  ///< the backward apply's finalize launch
};
/// An operand of a sharded launch: its address and element type (its
/// alignment bounds the vector width).
struct ShardOperand {
  const void* ptr;
  DType t;
};
/// The one launch geometry of the sharded kernels, from the device's SM count.
ShardGeometry shard_geometry(const ShardedNormDesc& d, int sm_count, std::initializer_list<ShardOperand> operands);
/// Programs of the backward apply (partial dweight / dbias rows): min(M, 2 x SMs).
std::int64_t shard_programs(const ShardedNormDesc& d, int sm_count);
/// Partial rows a program of the backward apply writes: dweight, dbias (0-2).
inline int shard_partials(const ShardedNormDesc& d) { return (d.has_weight ? 1 : 0) + (d.has_bias ? 1 : 0); }
/// Bytes of its partial rows: programs x N x shard_partials x 4.
std::size_t shard_workspace_bytes(const ShardedNormDesc& d, int sm_count);

}  // namespace normjit::detail
