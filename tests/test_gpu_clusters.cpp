// Rows split over a thread-block cluster (sm_90+) against the float64
// reference: RMSNorm and LayerNorm, forward and backward, every dtype, N
// from 16K to 256K (odd N included), M = 1, 3 and 1000 (160 instead of 1000
// for N > 65536, to keep the float64 reference quick), each cluster size the
// grid offers and a staged config of each; outputs poisoned first, so an
// element no CTA wrote fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "check.hpp"
#include "config_grid.hpp"
#include "gpu_harness.hpp"
#include "ops.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::test;
using normjit_test::make_temp_dir;

namespace {

// The configs to run for `d`: the heuristic's, and the simplest of each
// cluster size, and the last staged cluster config (all of them for small
// M; the largest and the staged one for large M).
std::vector<LaunchConfig> cluster_configs(Op op, const NormDesc& d, int max_cluster) {
  std::map<int, LaunchConfig> first;
  const auto grid = candidate_grid(op, d, max_cluster);
  for (const auto& c : grid)
    if (c.cluster > 1 && !first.count(c.cluster)) first.emplace(c.cluster, c);
  // The largest staged cluster config too (staged rows have their own path).
  for (auto it = grid.rbegin(); it != grid.rend(); ++it)
    if (it->cluster > 1 && it->stages > 0) {
      first.emplace(100, *it);
      break;
    }
  std::vector<LaunchConfig> out = {heuristic_config(op, d, max_cluster)};
  int largest = 0;
  for (const auto& [cl, c] : first)
    if (cl < 100) largest = cl;
  for (const auto& [cl, c] : first)
    if ((d.M <= 3 || cl == 100 || cl == largest) && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  return out;
}

}  // namespace

GPU_TEST_CASE("clusters: wide rows split over a cluster match float64 (RMSNorm, LayerNorm, every dtype)") {
  const DeviceInfo dev = device_info(current_device());
  if (dev.max_cluster < 2) {
    MESSAGE("skipped: " << dev.name << " launches no thread-block clusters (sm_90+ only)");
    return;
  }
  const auto kdir = make_temp_dir("cluster-kernels");
  KernelCache jit(kdir->string());
  int runs = 0, clustered = 0;
  for (std::int64_t N : {16384, 20000, 65536, 100003, 262144})
    for (std::int64_t M : {std::int64_t{1}, std::int64_t{3}, N > 65536 ? std::int64_t{160} : std::int64_t{1000}})
      for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (NormKind norm : {NormKind::RMSNorm, NormKind::LayerNorm}) {
          NormDesc d = normjit_test::make_desc(M, N, t, t);
          d.norm = norm;
          if (norm == NormKind::LayerNorm) {
            d.has_bias = true;
            d.eps = 1e-5f;
          }
          for (Op op : {Op::Forward, Op::Backward}) {
            const std::uint64_t seed = fresh_seed();
            CAPTURE(d.str());
            CAPTURE(op_name(op));
            CAPTURE(seed);
            const auto configs = cluster_configs(op, d, dev.max_cluster);
            Scratch s(op, d, seed);
            const HostTensors ref = reference_outputs(op, d, s);
            auto fin = jit.get(finalize_spec(d), dev.arch());
            for (const auto& cfg : configs) {
              CAPTURE(cfg.str());
              auto k = jit.get(make_spec(op, d, cfg), dev.arch());
              if (k->local_bytes > 0 || k->blocks_per_sm < 1) continue;  // the tuner prunes these too
              s.poison();
              if (op == Op::Forward) {
                launch_forward(*k, d, s.forward_tensors(), dev.sm_count, nullptr);
              } else {
                const Geometry g = backward_geometry(*k, d, cfg, dev.sm_count);
                s.workspace = DeviceBuffer(std::max<std::size_t>(16, backward_workspace_bytes(g, d)));
                launch_backward(*k, *fin, d, s.backward_tensors(), g, nullptr);
              }
              for (const auto& c : compare_outputs(s, ref)) {
                CAPTURE(c.name);
                CHECK(c.err <= c.tol);
              }
              ++runs;
              clustered += cfg.cluster > 1;
            }
          }
        }
  MESSAGE(runs << " launches checked, " << clustered << " of them on clusters");
  CHECK(clustered > 100);
}
