// The norm family on the GPU against the float64 reference: LayerNorm,
// fused residual add, weight offset, no weight / bias, casting modes, mixed
// dtypes and 3-D strided rows, forward and backward; a large-mean LayerNorm;
// every autotune candidate of LayerNorm and fused-add shapes; determinism.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tuning/check.hpp"
#include "config/config_grid.hpp"
#include "gpu_harness.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::test;

namespace {

Engine& variant_engine(TunePolicy policy = TunePolicy::Never) {
  current_device();  // scratch buffers are allocated before any engine call: make the context current
  static Engine never(suite_engine_options("variants-never", TunePolicy::Never)),
      first(suite_engine_options("variants-first", TunePolicy::OnFirstUse));
  return policy == TunePolicy::Never ? never : first;
}

// Runs `op` on fresh random scratch tensors (outputs poisoned: a value the
// kernel did not write is NaN and fails its check) and checks every output.
void check_op(Engine& e, Op op, const NormDesc& d, std::uint64_t seed) {
  Scratch s(op, d, seed);
  if (op == Op::Backward) {
    const std::size_t ws = e.backward_workspace_size(d);
    if (ws) s.workspace = DeviceBuffer(ws);
  }
  s.poison();
  if (op == Op::Forward) e.forward(d, s.forward_tensors(), nullptr);
  else e.backward(d, s.backward_tensors(), nullptr);
  for (const auto& c : check_outputs(op, d, s)) {
    CAPTURE(c.name);
    CHECK(c.err <= c.tol);
  }
}

}  // namespace

GPU_TEST_CASE("variants: forward and backward of every variant against float64" * doctest::test_suite("quick")) {
  struct Shape {
    std::int64_t M, N;
    DType t;
  };
  // Narrow rows (several per program), odd N (partial chunks), usual rows,
  // shared-memory dweight rows, and two-pass rows.
  const Shape shapes[] = {{8, 64, DType::BF16},  {7, 1000, DType::F16},  {256, 4096, DType::BF16},
                          {64, 4096, DType::F32}, {40, 12288, DType::BF16}, {8, 65536, DType::F16},
                          {1, 128, DType::F32}};
  std::vector<Call> calls;
  for (const auto& sh : shapes)
    for (const auto& v : normjit_test::norm_variants(sh.M, sh.N, sh.t, sh.M % 4 == 0 ? 4 : 1))
      for (Op op : {Op::Forward, Op::Backward}) calls.push_back({op, v.desc});
  precompile_calls(variant_engine(), calls);
  for (const auto& sh : shapes)
    for (const auto& v : normjit_test::norm_variants(sh.M, sh.N, sh.t, sh.M % 4 == 0 ? 4 : 1)) {
      const std::uint64_t seed = fresh_seed();
      CAPTURE(v.name);
      CAPTURE(v.desc.str());
      CAPTURE(seed);
      for (Op op : {Op::Forward, Op::Backward}) {
        CAPTURE(op_name(op));
        check_op(variant_engine(), op, v.desc, seed);
      }
    }
}

GPU_TEST_CASE("variants: LayerNorm statistics are stable for a large mean (1e4, std 1)" * doctest::test_suite("quick")) {
  for (std::int64_t N : {1000, 4096, 65536}) {  // register rows and two-pass rows
    NormDesc d = normjit_test::make_desc(16, N, DType::F32, DType::F32);
    d.norm = NormKind::LayerNorm;
    d.has_bias = true;
    d.eps = 1e-5f;
    CAPTURE(d.str());
    Scratch s(Op::Forward, d, fresh_seed());
    Random rng(fresh_seed());
    std::vector<float> x(static_cast<std::size_t>(d.M * d.N));
    // Uniform on [-sqrt(3), sqrt(3)] has std 1.
    for (auto& v : x) v = 1e4f + rng.uniform(-1.7320508f, 1.7320508f);
    NJ_CU(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(s.ptr("x")), x.data(), x.size() * 4));
    s.poison();
    variant_engine().forward(d, s.forward_tensors(), nullptr);
    for (const auto& c : check_outputs(Op::Forward, d, s)) {
      CAPTURE(c.name);
      CHECK(c.err <= c.tol);
    }
    // rstd near 1 (std 1), not the 0.01 or NaN a cancelled variance gives.
    for (float r : s.download("rstd")) CHECK(std::fabs(r - 1.f) < 0.1f);
  }
}

GPU_TEST_CASE("variants: every autotune candidate of LayerNorm and fused add + RMSNorm matches the reference") {
  // M of a few hundred rows: every ROWS_PER_PID of the grid, a persistent
  // backward that loops, and checks of under 1M elements a candidate.
  NormDesc ln = normjit_test::make_desc(260, 4096, DType::F16, DType::F16);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  NormDesc add = normjit_test::make_desc(260, 2048, DType::BF16, DType::BF16);
  add.residual = add.store_residual_out = add.has_dresidual = true;
  NormDesc ln_narrow = normjit_test::make_desc(1030, 256, DType::F16, DType::F16);
  ln_narrow.norm = NormKind::LayerNorm;
  ln_narrow.has_bias = true;
  for (const NormDesc& d : {ln, add, ln_narrow})
    for (Op op : {Op::Forward, Op::Backward}) {
      CAPTURE(d.str());
      CAPTURE(op_name(op));
      const TuneResult r = variant_engine(TunePolicy::OnFirstUse).tune(op, d);
      int timed = 0;
      for (const auto& c : r.candidates) {
        CAPTURE(c.config.str());
        // Compile-time rejections (spills) are fine; a wrong result is not.
        CHECK_FALSE(normjit_test::contains(c.rejected, "reference config"));
        timed += c.median_us > 0;
      }
      CHECK(timed > 1);
      // The winner (now resolved from memory) against float64.
      check_op(variant_engine(TunePolicy::OnFirstUse), op, d, fresh_seed());
    }
}

namespace {
// Every candidate of `op` on `descs` whose rows peel (odd N), launched on
// fresh data and checked against float64; returns the kernel paths that
// ran: cluster, two-pass, rows or row, and staged or registers.
std::set<std::string> check_peeled_candidates(Op op, const std::vector<NormDesc>& descs) {
  const DeviceInfo dev = device_info(current_device());
  KernelCache jit(suite_kernel_dir());
  std::vector<std::pair<NormDesc, std::vector<LaunchConfig>>> runs;
  std::vector<KernelSpec> specs;
  for (const NormDesc& d : descs) {
    std::vector<LaunchConfig> configs;
    for (const auto& c : test_grid(op, d, dev.max_cluster))
      if (peeled(op, d, c.vec) && c.programs_per_sm == 0) {  // (programs_per_sm: a launch parameter)
        configs.push_back(c);
        specs.push_back(make_spec(op, d, c));
      }
    runs.emplace_back(d, configs);
    if (op == Op::Backward) specs.push_back(finalize_spec(d));
  }
  compile_all(specs);
  std::set<std::string> paths;
  for (const auto& [d, configs] : runs) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(d.str());
    CAPTURE(seed);
    CHECK(!configs.empty());
    Scratch s(op, d, seed);
    const Reference ref = reference_outputs(op, d, s);
    for (const auto& cfg : configs) {
      CAPTURE(cfg.str());
      if (!launch_candidate(jit, dev, op, d, cfg, s)) continue;
      for (const auto& c : compare_outputs(s, ref)) {
        CAPTURE(c.name);
        CHECK(c.err <= c.tol);
      }
      paths.insert(cfg.cluster > 1 ? "cluster" : cfg.two_pass ? "two-pass" : cfg.rows_per_pid > 1 ? "rows" : "row");
      paths.insert(cfg.stages ? "staged" : "registers");
    }
  }
  return paths;
}

// Every path in `want` ran, and a cluster's where the device has clusters.
void check_paths(const std::set<std::string>& paths, std::initializer_list<const char*> want) {
  for (const char* p : want) {
    CAPTURE(p);
    CHECK(paths.count(p));
  }
  if (device_info(current_device()).max_cluster > 1) CHECK(paths.count("cluster"));
}
}  // namespace

GPU_TEST_CASE("variants: every forward candidate of peeled rows (odd N) matches the reference") {
  // Rows that start anywhere in a vector, on every kernel path the grids
  // offer: rows in registers (one and several per program), a cluster's
  // slices, two-pass; RMSNorm and LayerNorm with a fused residual add.
  NormDesc rms = normjit_test::make_desc(37, 12345, DType::BF16, DType::BF16);
  NormDesc ln = normjit_test::make_desc(37, 4099, DType::F16, DType::F16);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  ln.residual = ln.store_residual_out = true;
  NormDesc narrow = normjit_test::make_desc(300, 77, DType::F32, DType::F32);
  NormDesc wide = normjit_test::make_desc(3, 100003, DType::BF16, DType::BF16);
  wide.norm = NormKind::LayerNorm;
  wide.has_bias = true;
  check_paths(check_peeled_candidates(Op::Forward, {rms, ln, narrow, wide}), {"row", "staged", "rows", "two-pass"});
}

GPU_TEST_CASE("variants: every backward candidate of peeled rows (odd N) matches the reference") {
  // Rows that start anywhere in a vector, on every peeled kernel path the
  // grids offer: rows in registers and through stages, one and several per
  // program, a cluster's slices; programs of many rows (their row step a
  // whole number of vectors), dresidual added, a LayerNorm's dbias.
  NormDesc rms = normjit_test::make_desc(37, 12345, DType::BF16, DType::BF16);
  NormDesc ln = normjit_test::make_desc(1000, 4099, DType::F16, DType::F16);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  ln.residual = ln.store_residual_out = ln.has_dresidual = true;
  NormDesc narrow = normjit_test::make_desc(3000, 77, DType::F32, DType::F32);
  NormDesc wide = normjit_test::make_desc(3, 100003, DType::BF16, DType::BF16);
  check_paths(check_peeled_candidates(Op::Backward, {rms, ln, narrow, wide}), {"row", "rows", "staged", "registers"});
}

GPU_TEST_CASE("variants: the LayerNorm backward is deterministic") {
  NormDesc d = normjit_test::make_desc(3000, 4096, DType::BF16, DType::BF16);
  d.norm = NormKind::LayerNorm;
  d.has_bias = true;
  Scratch s(Op::Backward, d, fresh_seed());
  s.workspace = DeviceBuffer(std::max<std::size_t>(16, variant_engine().backward_workspace_size(d)));
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    s.poison();
    variant_engine().backward(d, s.backward_tensors(), nullptr);
    std::vector<std::vector<float>> out = {s.download("dx"), s.download("dweight"), s.download("dbias")};
    if (run == 0) first = out;
    else CHECK(std::memcmp(out[1].data(), first[1].data(), out[1].size() * 4) == 0);
    if (run > 0) CHECK(std::memcmp(out[2].data(), first[2].data(), out[2].size() * 4) == 0);
  }
}
