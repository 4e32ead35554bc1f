// Rows split over a thread-block cluster (sm_90+) against the float64
// reference: RMSNorm and LayerNorm, forward and backward, every dtype, N
// from 16K to 256K (odd N included). Decode rows (M = 1, 3) run every
// cluster size the grid offers; more rows (M = 37, more than the clusters of
// the largest size resident at once, so the persistent backward loops) run
// the largest size, a staged and a two-pass config. Outputs poisoned first, so an
// element no CTA wrote fails. Dtypes and norms rotate over the N: each
// pairing once, not the full product (the code paths, not the volume).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

#include "tuning/check.hpp"
#include "config/config_grid.hpp"
#include "gpu_harness.hpp"
#include "runtime/ops.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::test;

namespace {

// The configs to run for `d`: the heuristic's, the simplest of each cluster
// size and the last staged cluster config (`every_size`), or the largest
// size's and the staged one.
std::vector<LaunchConfig> cluster_configs(Op op, const NormDesc& d, int max_cluster, bool every_size) {
  std::map<int, LaunchConfig> first;
  const auto grid = candidate_grid(op, d, max_cluster);
  for (const auto& c : grid)  // (a grid of one cluster has its own case)
    if (c.cluster > 1 && !c.dw_cluster && !first.count(c.cluster)) first.emplace(c.cluster, c);
  // The largest staged and two-pass cluster configs too (their own paths).
  for (auto it = grid.rbegin(); it != grid.rend(); ++it)
    if (it->cluster > 1 && it->stages > 0) {
      first.emplace(100, *it);
      break;
    }
  for (auto it = grid.rbegin(); it != grid.rend(); ++it)
    if (it->cluster > 1 && it->two_pass) {
      first.emplace(200, *it);
      break;
    }
  std::vector<LaunchConfig> out = {heuristic_config(op, d, normjit_test::test_facts(max_cluster))};
  int largest = 0;
  for (const auto& [cl, c] : first)
    if (cl < 100) largest = cl;
  for (const auto& [cl, c] : first)
    if ((every_size || cl >= 100 || cl == largest) && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  return out;
}

struct ClusterRun {
  NormDesc desc;
  Op op;
  std::vector<LaunchConfig> configs;
};

// The shapes of one case: N over 16K..256K, M from `rows`, dtype and norm
// rotating.
std::vector<ClusterRun> cluster_runs(const std::vector<std::int64_t>& rows, bool every_size, int max_cluster) {
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  std::vector<ClusterRun> runs;
  int k = 0;
  for (std::int64_t N : {16384, 20000, 65536, 100003, 262144})
    for (NormKind norm : {NormKind::RMSNorm, NormKind::LayerNorm}) {
      const DType t = dtypes[k % 3];
      const std::int64_t M = rows[k % rows.size()];
      ++k;
      NormDesc d = normjit_test::make_desc(M, N, t, t);
      d.norm = norm;
      if (norm == NormKind::LayerNorm) {
        d.has_bias = true;
        d.eps = 1e-5f;
      }
      for (Op op : {Op::Forward, Op::Backward}) runs.push_back({d, op, cluster_configs(op, d, max_cluster, every_size)});
    }
  return runs;
}

// Cluster sizes (100: a staged, 200: a two-pass cluster config, 300 + size:
// a grid of one cluster) launched, and those of
// configs the device could not launch (pruned as the tuner prunes them).
struct Launched {
  std::set<int> ran, pruned;
};

// Runs every config of `runs` against float64.
Launched check_cluster_runs(const std::vector<ClusterRun>& runs) {
  const DeviceInfo dev = device_info(current_device());
  KernelCache jit(suite_kernel_dir());
  {
    std::vector<KernelSpec> specs;
    for (const auto& r : runs) {
      for (const auto& cfg : r.configs) specs.push_back(make_spec(r.op, r.desc, cfg));
      if (r.op == Op::Backward) specs.push_back(finalize_spec(r.desc));
    }
    compile_all(specs);
  }
  Launched launched;
  for (const auto& r : runs) {
    const NormDesc& d = r.desc;
    const std::uint64_t seed = fresh_seed();
    CAPTURE(d.str());
    CAPTURE(op_name(r.op));
    CAPTURE(seed);
    Scratch s(r.op, d, seed);
    const Reference ref = reference_outputs(r.op, d, s);
    for (const auto& cfg : r.configs) {
      CAPTURE(cfg.str());
      const int size = cfg.cluster == 1 ? 1
                       : cfg.dw_cluster ? 300 + cfg.cluster
                       : cfg.stages > 0 ? 100
                       : cfg.two_pass   ? 200
                                        : cfg.cluster;
      if (!launch_candidate(jit, dev, r.op, d, cfg, s)) {
        launched.pruned.insert(size);
        continue;
      }
      for (const auto& c : compare_outputs(s, ref)) {
        CAPTURE(c.name);
        CHECK(c.err <= c.tol);
      }
      launched.ran.insert(size);
    }
  }
  return launched;
}

bool clusters_available() {
  const DeviceInfo dev = device_info(current_device());
  if (dev.max_cluster >= 2) return true;
  MESSAGE("skipped: " << dev.name << " launches no thread-block clusters (sm_90+ only)");
  return false;
}

}  // namespace

GPU_TEST_CASE("clusters: decode rows over every cluster size match float64 (RMSNorm, LayerNorm, every dtype)" *
              doctest::test_suite("quick")) {
  if (!clusters_available()) return;
  const int max_cluster = device_info(current_device()).max_cluster;
  const auto runs = cluster_runs({1, 3}, true, max_cluster);
  const Launched launched = check_cluster_runs(runs);
  // Every cluster size some grid of these shapes offers, a staged and a
  // two-pass one, ran (or could not launch on this device at all).
  std::set<int> offered = {100, 200};
  for (const auto& r : runs)
    for (const auto& c : candidate_grid(r.op, r.desc, max_cluster))
      if (c.cluster > 1 && !c.dw_cluster) offered.insert(c.cluster);
  std::string sizes;
  for (int c : launched.ran) sizes += " " + std::to_string(c);
  MESSAGE("cluster sizes launched (100: staged, 200: two-pass):" << sizes);
  for (int c : offered) {
    CAPTURE(c);
    CHECK((launched.ran.count(c) || launched.pruned.count(c)));
    if (!launched.ran.count(c)) MESSAGE("cluster size " << c << ": no config of it could launch here");
  }
}

GPU_TEST_CASE("clusters: more rows than resident clusters match float64 (the largest size, staged, two-pass)") {
  if (!clusters_available()) return;
  const int max_cluster = device_info(current_device()).max_cluster;
  const Launched launched = check_cluster_runs(cluster_runs({37}, false, max_cluster));
  CHECK(launched.ran.count(100) == 1);
  CHECK(launched.ran.count(200) == 1);  // LayerNorm fp32 rows of 262144 stream twice
  CHECK(launched.ran.size() >= 3);
}

GPU_TEST_CASE("clusters: decode backward whose grid is one cluster (dw_cluster) sums dweight and dbias exactly" *
              doctest::test_suite("quick")) {
  if (!clusters_available()) return;
  const int max_cluster = device_info(current_device()).max_cluster;
  // Rows in one batch and in several (M = 37 of wide fp32 slices), slices
  // past N in the last CTAs (N = 1000, and 8190 in vectors of 2), weight
  // and bias, bias only.
  const DType dtypes[] = {DType::BF16, DType::F32, DType::F16};
  std::vector<ClusterRun> runs;
  int k = 0;
  for (std::int64_t M : {2, 3, 8, 37})
    for (std::int64_t N : {1000, 4096, 8190}) {
      const DType t = dtypes[k % 3];
      NormDesc d = normjit_test::make_desc(M, N, t, t);
      if (k % 2) {
        d.norm = NormKind::LayerNorm;
        d.has_bias = true;
        d.has_weight = k % 4 != 3;
        d.eps = 1e-5f;
      }
      ++k;
      // The first dw_cluster config of each cluster size, and the last of the grid.
      std::vector<LaunchConfig> cfgs;
      std::set<int> sizes;
      LaunchConfig last;
      for (const auto& c : candidate_grid(Op::Backward, d, max_cluster))
        if (c.dw_cluster) {
          if (sizes.insert(c.cluster).second) cfgs.push_back(c);
          last = c;
        }
      REQUIRE_MESSAGE(!cfgs.empty(), d.str());
      if (std::find(cfgs.begin(), cfgs.end(), last) == cfgs.end()) cfgs.push_back(last);
      runs.push_back({d, Op::Backward, cfgs});
    }
  const Launched launched = check_cluster_runs(runs);
  CHECK(launched.ran.size() >= 3);  // clusters of 2, 4, 8 at least
}
