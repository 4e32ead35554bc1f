#include "runtime/ops.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "norm_args.cuh"
#include "quant_args.cuh"
#include "device/driver.hpp"

namespace normjit::detail {

nj::NormArgs row_layout(const NormDesc& d, bool backward) {
  nj::NormArgs a{};
  a.M = d.M;
  a.heads = d.heads;
  // The backward of a fused residual add reads h (residual_out) as its x.
  const bool h_in = backward && d.residual;
  a.x_ld = h_in ? d.residual_out_ld() : d.x_ld();
  a.x_hs = h_in ? d.N : d.x_hs();
  a.y_ld = d.y_ld();
  a.y_hs = d.y_hs();
  a.dy_ld = d.dy_ld();
  a.dy_hs = d.dy_hs();
  a.dx_ld = d.dx_ld();
  a.dx_hs = d.dx_hs();
  a.res_ld = d.residual_ld();
  a.res_out_ld = d.residual_out_ld();
  a.dres_ld = d.dresidual_ld();
  a.eps = d.eps;
  return a;
}

void launch_forward(const LoadedKernel& k, const NormDesc& d, const ForwardTensors& t, int sm_count, CUstream s) {
  const Geometry g = launch_geometry(Op::Forward, d, k.spec().cfg, sm_count, k.blocks_per_sm, k.max_clusters);
  launch_forward(k, d, row_layout(d, false), t, g, amax_grid(k, g, sm_count), transpose_columns(d, sm_count), s);
}

int transpose_columns(const NormDesc& d, int sm_count) {
  // A decode-sized q is one row tile: 256-column tiles left 12 CTAs for
  // 61 x 2880 and took 5.2 us to transpose it, 16-column tiles 2.7 us.
  const std::int64_t row_tiles = (d.M + nj::qt_tile_rows() - 1) / nj::qt_tile_rows();
  int tc = nj::qt_tile_cols();
  while (tc > 16 && row_tiles * ((d.N + tc - 1) / tc) < sm_count) tc /= 2;
  return tc;
}

unsigned amax_grid(const LoadedKernel& k, const Geometry& g, int sm_count) {
  // Rows split over clusters take the whole grid, a cluster a row.
  if (k.spec().cfg.cluster > 1) return g.grid;
  return std::min(g.grid, static_cast<unsigned>(std::max(1, sm_count * k.blocks_per_sm)));
}

namespace {
void launch_rows(const LoadedKernel& k, const NormDesc& d, const ForwardTensors& t, const Geometry& g,
                 unsigned resident, nj::QuantArgs& q, void** args, CUstream s) {
  if (d.quant == QuantScaling::Tensor) {
    // Current scaling in two launches: the first reads the rows once for
    // amax (a resident-sized grid striding over them, so few programs meet
    // in its one atomic), the second recomputes y and quantizes with it
    // (walking the rows backwards, so it reads the last-measured ones
    // from L2). A grid that one cluster holds (decode) does both in one
    // launch and stores amax itself: no zero first, no second launch
    // (norm_fwd_once takes a cluster's CTAs as one program a row group: the
    // cluster is the whole grid, never part of it).
    if (resident == 1 || g.grid <= static_cast<unsigned>(k.once_ctas)) {
      k.launch_once(resident == 1 ? 1 : g.grid, g.block, s, args);
      return;
    }
    NJ_CU(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t.amax), 0, 1, s));
    k.launch(resident, g.block, s, args);
    q.phase = 1;
    k.launch(g.grid, g.block, s, args);
    return;
  } else if (d.store_amax) {
    // A static scale that writes amax: one launch, quantizing and measuring,
    // striding over the rows in a resident-sized grid as the amax pass does.
    if (resident > 1) NJ_CU(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t.amax), 0, 1, s));
    k.launch(resident, g.block, s, args);
    return;
  }
  k.launch(g.grid, g.block, s, args);
}
}  // namespace

void launch_forward(const LoadedKernel& k, const NormDesc& d, const nj::NormArgs& layout, const ForwardTensors& t,
                    const Geometry& g, unsigned resident, int qt_cols, CUstream s) {
  nj::NormArgs a = layout;
  a.x = t.x;
  a.residual = t.residual;
  a.w = t.weight;
  a.b = t.bias;
  a.y = t.y;
  a.residual_out = t.residual_out;
  a.mean = t.mean;
  a.rstd = t.rstd;
  nj::QuantArgs q{};
  a.x_scale = t.x_scale;
  q.scale = t.y_scale;
  q.amax = t.amax;
  q.y_hp = t.y_hp;
  q.y_t = t.y_t;
  q.scale_ld = d.scale_ld();
  q.scale_ub = d.scale_ub;
  q.scale_min = d.scale_min > 0.f ? d.scale_min : kMinScale;
  // q transposed: by the row kernel at decode, else by a launch of its own after it.
  const bool own_transpose = d.store_y_t && !transposed_by_rows(d);
  if (own_transpose) q.y_t = nullptr;
  void* args[] = {&a, &q};
  launch_rows(k, d, t, g, resident, q, args, s);
  if (own_transpose) {
    const void* qp = t.y;
    void* qtp = t.y_t;
    long long M = d.M, ld = d.y_ld();
    int n = static_cast<int>(d.N), tc = qt_cols;
    void* targs[] = {&qp, &qtp, &M, &ld, &n, &tc};
    k.launch_transpose(static_cast<unsigned>((d.M + nj::qt_tile_rows() - 1) / nj::qt_tile_rows()),
                       static_cast<unsigned>((d.N + tc - 1) / tc), s, targs);
  }
}

Geometry backward_geometry(const LoadedKernel& k, const NormDesc& d, const LaunchConfig& cfg, int sm_count) {
  LaunchConfig c = cfg;
  c.cluster = k.spec().cfg.cluster;  // the kernel's own: its clusters are its programs
  return launch_geometry(Op::Backward, d, c, sm_count, k.blocks_per_sm, k.max_clusters);
}

std::size_t backward_workspace_bytes(const Geometry& g, const NormDesc& d) {
  const int partials = make_variant(Op::Backward, d).partials();
  return d.M == 0 ? 0 : static_cast<std::size_t>(partials) * g.programs * static_cast<std::size_t>(d.N) * sizeof(float);
}

void launch_backward(const LoadedKernel& k, const LoadedKernel& fin, const NormDesc& d, const BackwardTensors& t,
                     const Geometry& g, CUstream s) {
  launch_backward(k, &fin, row_layout(d, true), t, g, s);
}

void launch_backward(const LoadedKernel& k, const LoadedKernel* fin, const nj::NormArgs& layout,
                     const BackwardTensors& t, const Geometry& g, CUstream s) {
  nj::NormArgs a = layout;
  a.dy = t.dy;
  a.x = t.x;
  a.w = t.weight;
  a.mean = const_cast<float*>(t.mean);
  a.rstd = const_cast<float*>(t.rstd);
  a.dresidual = t.dresidual;
  a.x_scale = t.x_scale;
  a.dx = t.dx;
  a.partial = static_cast<float*>(t.workspace);
  a.dw = t.dweight;
  a.db = t.dbias;
  void* args[] = {&a};
  k.launch(g.grid, g.block, s, args);
  if (g.programs == 1) return;  // one program wrote dweight / dbias itself
  // One finalize launch for every partial (blockIdx.y: dweight, dbias).
  const Variant& v = k.spec().v;  // derived once, with the kernel (no derivation on the per-call path)
  launch_finalize(*fin, t.workspace, v.has_w ? t.dweight : t.dbias, t.dbias, g.finalize, s);
}

void launch_finalize(const LoadedKernel& fin, void* partial, void* out0, void* out1, const FinalizeGeometry& f,
                     CUstream s) {
  CUdeviceptr part = reinterpret_cast<CUdeviceptr>(partial);
  CUdeviceptr o0 = reinterpret_cast<CUdeviceptr>(out0), o1 = reinterpret_cast<CUdeviceptr>(out1);
  int p = static_cast<int>(f.programs), n = static_cast<int>(f.N), vec = f.vec;
  void* fargs[] = {&part, &o0, &o1, &p, &n, &vec};
  fin.launch(f.tiles, f.threads, s, fargs, static_cast<unsigned>(f.partials));
}

ShardGeometry shard_geometry(const ShardedNormDesc& d, int sm_count, std::initializer_list<ShardOperand> operands) {
  ShardGeometry g;
  int widest = dtype_size(d.x_dtype);
  for (DType t : {d.y_dtype, d.weight_dtype}) widest = std::max(widest, dtype_size(t));
  // 16-byte accesses where N and every operand allow them, narrower ones else.
  for (int vec = 16 / widest; vec >= 1; vec /= 2) {
    bool ok = d.N % vec == 0;
    for (const ShardOperand& o : operands)
      ok = ok && reinterpret_cast<std::uintptr_t>(o.ptr) % (static_cast<std::uintptr_t>(vec) * dtype_size(o.t)) == 0;
    if (ok) {
      g.vec = vec;
      break;
    }
  }
  // About four chunks a thread (their loads in flight at once), whole warps:
  // a row's sums reduce through warp shuffles and one shared-memory step.
  const std::int64_t chunks = d.N / g.vec;
  g.threads = 64;
  while (g.threads < 1024 && g.threads * 4 < chunks) g.threads *= 2;
  // Row kernels: as many blocks as an SM holds of them at once (2048
  // threads), each looping over rows.
  const std::int64_t resident = static_cast<std::int64_t>(std::max(1, sm_count)) * std::max(1, 2048 / g.threads);
  g.grid = static_cast<unsigned>(std::min<std::int64_t>(d.M, resident));
  g.programs = shard_programs(d, sm_count);
  g.finalize = finalize_geometry(g.programs, d.N, shard_partials(d), sm_count);
  return g;
}

std::int64_t shard_programs(const ShardedNormDesc& d, int sm_count) {
  // Two a SM: enough rows in flight, and partial rows (the workspace) that
  // do not depend on pointer alignment or block size.
  return std::min<std::int64_t>(d.M, 2LL * std::max(1, sm_count));
}

std::size_t shard_workspace_bytes(const ShardedNormDesc& d, int sm_count) {
  return static_cast<std::size_t>(shard_programs(d, sm_count)) * static_cast<std::size_t>(d.N) * shard_partials(d) * 4;
}

}  // namespace normjit::detail
