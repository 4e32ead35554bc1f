// Norms sharded across ranks, on one GPU: the ranks' shards are column
// slices of one row set, their partial sums added on the host in place of
// the all-reduce (NCCL's part, tested by tests/python/test_sharded.py on
// two GPUs). Forward and backward of the shards together must match the
// float64 reference of the unsharded norm, every element.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "gpu_harness.hpp"
#include "normjit/normjit.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::detail;
using namespace normjit::test;

namespace {

Engine& engine() {
  static Engine e(suite_engine_options("sharded"));
  return e;
}

// Columns [c0, c0 + n) of `full` (rows x N_total) into `shard` (rows x n).
void slice_columns(const Tensor& full, Tensor& shard, std::int64_t c0) {
  for (std::int64_t r = 0; r < full.rows; ++r)
    for (std::int64_t j = 0; j < shard.n; ++j)
      store_as(shard.t, shard.host.data(), r * shard.ld + j, full.at(r, c0 + j));
  shard.upload();
}

// Adds every shard's [M, 2] float64 partial sums on the host (the
// all-reduce) and uploads the sum into each shard's buffer.
void all_reduce(std::vector<DeviceBuffer>& stats, std::int64_t M) {
  std::vector<double> sum(2 * M, 0.0), part(2 * M);
  NJ_CU(cuCtxSynchronize());
  for (auto& s : stats) {
    NJ_CU(cuMemcpyDtoH(part.data(), s.get(), 16 * M));
    for (std::int64_t i = 0; i < 2 * M; ++i) sum[i] += part[i];
  }
  for (auto& s : stats) NJ_CU(cuMemcpyHtoD(s.get(), sum.data(), 16 * M));
}

struct Case {
  NormKind norm;
  std::int64_t M;
  std::vector<std::int64_t> widths;  // a shard's N each
  DType x, y, w;
  bool has_weight = true, has_bias = false;
  float offset = 0.f, mean = 0.f;  // x's mean: LayerNorm's stability at large means
};

constexpr float kEps = 1e-5f;

// Shard `r` of case `c` (its width, the whole hidden size).
ShardedNormDesc shard_of(const Case& c, std::size_t r) {
  ShardedNormDesc d;
  d.norm = c.norm;
  d.M = c.M;
  d.N = c.widths[r];
  d.N_total = std::accumulate(c.widths.begin(), c.widths.end(), std::int64_t{0});
  d.x_dtype = c.x;
  d.y_dtype = c.y;
  d.weight_dtype = c.w;
  d.has_weight = c.has_weight;
  d.has_bias = c.has_bias;
  d.weight_offset = c.offset;
  d.eps = kEps;
  return d;
}

void check_case(const Case& c) {
  const std::int64_t N_total = std::accumulate(c.widths.begin(), c.widths.end(), std::int64_t{0});
  const std::int64_t M = c.M;
  NormDesc full;  // the unsharded norm, for the reference
  full.norm = c.norm;
  full.M = M;
  full.N = N_total;
  full.x_dtype = c.x;
  full.y_dtype = c.y;
  full.weight_dtype = c.w;
  full.has_weight = c.has_weight;
  full.has_bias = c.has_bias;
  full.weight_offset = c.offset;
  full.eps = kEps;
  full.store_rstd = true;
  full.store_mean = c.norm == NormKind::LayerNorm;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(full.str());
  CAPTURE(c.widths.size());
  CAPTURE(c.mean);
  CAPTURE(seed);
  Random rng(seed);
  Tensor x(c.x, M, N_total, N_total), w(c.w, 1, N_total, N_total), b(c.w, 1, N_total, N_total),
      dy(c.y, M, N_total, N_total);
  x.fill_random(rng, c.mean - 3.f, c.mean + 3.f);
  w.fill_random(rng, -2.f, 2.f);
  b.fill_random(rng, -1.f, 1.f);
  dy.fill_random(rng, -1.f, 1.f);

  const std::size_t R = c.widths.size();
  std::vector<ShardedNormDesc> ds(R);
  std::vector<Tensor> xs, ws, bs, dys, ys, dxs, dws, dbs;
  std::vector<Tensor> mean, rstd;
  std::vector<DeviceBuffer> stats, ws_buf;
  std::int64_t c0 = 0;
  for (std::size_t r = 0; r < R; ++r) {
    const std::int64_t n = c.widths[r];
    ShardedNormDesc& d = ds[r];
    d = shard_of(c, r);
    xs.emplace_back(c.x, M, n, n);
    ws.emplace_back(c.w, 1, n, n);
    bs.emplace_back(c.w, 1, n, n);
    dys.emplace_back(c.y, M, n, n);
    slice_columns(x, xs.back(), c0);
    slice_columns(w, ws.back(), c0);
    slice_columns(b, bs.back(), c0);
    slice_columns(dy, dys.back(), c0);
    ys.emplace_back(c.y, M, n, n);
    dxs.emplace_back(c.x, M, n, n);
    dws.emplace_back(c.w, 1, n, n);
    dbs.emplace_back(c.w, 1, n, n);
    mean.emplace_back(DType::F32, 1, M, M);
    rstd.emplace_back(DType::F32, 1, M, M);
    for (Tensor* t : {&ys.back(), &dxs.back(), &dws.back(), &dbs.back(), &mean.back(), &rstd.back()}) t->poison();
    stats.emplace_back(16 * M);
    ws_buf.emplace_back(std::max<std::size_t>(engine().sharded_backward_workspace_size(d), 16));
    c0 += n;
  }
  auto opt = [](bool has, const Tensor& t) { return has ? t.ptr() : nullptr; };
  for (std::size_t r = 0; r < R; ++r)
    engine().sharded_stats(ds[r], xs[r].ptr(), static_cast<double*>(stats[r].ptr()), nullptr);
  all_reduce(stats, M);
  for (std::size_t r = 0; r < R; ++r)
    engine().sharded_apply(ds[r], xs[r].ptr(), opt(c.has_weight, ws[r]), opt(c.has_bias, bs[r]),
                           static_cast<const double*>(stats[r].ptr()), ys[r].ptr(), static_cast<float*>(mean[r].ptr()),
                           static_cast<float*>(rstd[r].ptr()), nullptr);
  for (std::size_t r = 0; r < R; ++r)
    engine().sharded_backward_stats(ds[r], dys[r].ptr(), xs[r].ptr(), opt(c.has_weight, ws[r]),
                                    static_cast<const float*>(mean[r].ptr()), static_cast<const float*>(rstd[r].ptr()),
                                    static_cast<double*>(stats[r].ptr()), nullptr);
  all_reduce(stats, M);
  for (std::size_t r = 0; r < R; ++r)
    engine().sharded_backward_apply(ds[r], dys[r].ptr(), xs[r].ptr(), opt(c.has_weight, ws[r]),
                                    static_cast<const float*>(mean[r].ptr()), static_cast<const float*>(rstd[r].ptr()),
                                    static_cast<const double*>(stats[r].ptr()), dxs[r].ptr(), opt(c.has_weight, dws[r]),
                                    opt(c.has_bias, dbs[r]), ws_buf[r].ptr(), ws_buf[r].bytes(), nullptr);

  // The shards put together, against the unsharded float64 norm.
  HostTensors in{{"x", host_rows(c.x, x.host.data(), M, N_total, N_total)},
                 {"weight", host_rows(c.w, w.host.data(), 1, N_total, N_total)},
                 {"bias", host_rows(c.w, b.host.data(), 1, N_total, N_total)}};
  const HostTensors fwd = forward_reference(full, in);
  std::vector<float> y(M * N_total), dx(M * N_total), dw(N_total), db(N_total);
  c0 = 0;
  for (std::size_t r = 0; r < R; ++r) {
    for (Tensor* t : {&ys[r], &dxs[r], &dws[r], &dbs[r], &mean[r], &rstd[r]}) t->download();
    const std::int64_t n = c.widths[r];
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        y[i * N_total + c0 + j] = ys[r].at(i, j);
        dx[i * N_total + c0 + j] = dxs[r].at(i, j);
      }
    for (std::int64_t j = 0; j < n; ++j) {
      dw[c0 + j] = dws[r].at(0, j);
      db[c0 + j] = dbs[r].at(0, j);
    }
    // Every shard computes the same statistics from the same sums.
    CHECK(relative_error(rstd[r].values(), fwd.at("rstd")) <= 1e-5);
    if (c.norm == NormKind::LayerNorm) CHECK(relative_error(mean[r].values(), fwd.at("mean")) <= 1e-5);
    c0 += n;
  }
  CHECK(relative_error(y, fwd.at("y")) <= tolerance(c.y));
  // The backward's reference from the rstd (and mean) the forward stored.
  HostTensors bin = in;
  bin["dy"] = host_rows(c.y, dy.host.data(), M, N_total, N_total);
  // (one values() each: begin and end of two temporaries are no range)
  const std::vector<float> rstd0 = rstd[0].values(), mean0 = mean[0].values();
  bin["rstd"] = std::vector<double>(rstd0.begin(), rstd0.end());
  if (c.norm == NormKind::LayerNorm) bin["mean"] = std::vector<double>(mean0.begin(), mean0.end());
  const HostTensors bwd = backward_reference(full, bin);
  CHECK(scaled_error(dx, bwd.at("dx"), bwd.at("dx_scale")) <= tolerance(c.x));
  if (c.has_weight) CHECK(relative_error(dw, bwd.at("dweight")) <= tolerance(c.w));
  if (c.has_bias) CHECK(relative_error(db, bwd.at("dbias")) <= tolerance(c.w));
}

// The specs a case's calls will load, compiled first on every core (aligned
// allocations: the geometry's widest vectors), so the calls only load cubins.
void precompile(const std::vector<Case>& cases) {
  const int sms = device_info(current_device()).sm_count;
  const void* aligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
  std::vector<KernelSpec> specs;
  for (const Case& c : cases)
    for (std::size_t r = 0; r < c.widths.size(); ++r) {
      const ShardedNormDesc d = shard_of(c, r);
      const ShardGeometry g = shard_geometry(d, sms, {{aligned, c.x}, {aligned, c.y}});
      specs.push_back(sharded_spec(d, g.vec, g.threads));
      NormDesc fd;
      fd.weight_dtype = c.w;
      specs.push_back(finalize_spec(fd));
    }
  compile_all(specs);
}

}  // namespace

GPU_TEST_CASE("sharded: shards of 2 and 3 ranks, forward and backward together match the unsharded float64 norm") {
  using K = NormKind;
  const DType bf = DType::BF16, f16 = DType::F16, f32 = DType::F32;
  std::vector<Case> cases = {
      {K::RMSNorm, 333, {2048, 2048}, bf, bf, bf},
      {K::RMSNorm, 7, {1000, 1000, 1000}, f16, f16, f32},
      {K::RMSNorm, 1, {4096, 4096}, f32, bf, f32},
      {K::RMSNorm, 64, {1536, 2560}, bf, bf, bf, true, false, 1.f},  // uneven shards, Gemma's 1 + w
      {K::RMSNorm, 19, {65536, 65536}, bf, bf, bf},                    // wide shards
      {K::RMSNorm, 9, {999, 1001}, bf, bf, bf, false},                 // odd widths, no weight
      {K::LayerNorm, 333, {2048, 2048}, bf, bf, bf, true, true},
      {K::LayerNorm, 40, {768, 768, 768}, f16, f16, f32, true, true},
      {K::LayerNorm, 5, {3000, 3000}, f32, f32, f32, false, true},  // bias without weight
      {K::LayerNorm, 65, {2048, 2048}, f32, f32, f32, true, false, 0.f, 1e4f},  // a mean of 1e4
  };
  precompile(cases);
  for (const Case& c : cases) check_case(c);
}
