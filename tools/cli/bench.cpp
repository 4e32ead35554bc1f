// normjit bench: times shapes with their current configs against a device copy and checks their outputs.
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "device/kernel_clock.hpp"
#include "tuning/check.hpp"
#include "device/driver.hpp"
#include "compile/nvrtc.hpp"
#include "core/tensors.hpp"
#include "core/variant.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace normjit::cli {

namespace {

std::string fmt_bytes(double b) {
  return b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : b >= 1e6 ? fmt::format("{:.1f} MB", b / 1e6) : fmt::format("{:.0f} KB", b / 1e3);
}

struct BenchRow {
  std::string name, op, shape, config, source;
  double us = 0, gbps = 0, copy_us = 0, sol = 0, err = 0, tol = 0;
  double bytes = 0;
};

// Runs `op` through the engine once on the scratch tensors.
void run_op(Engine& engine, Op op, const NormDesc& d, const Scratch& s, CUstream st) {
  if (op == Op::Forward) engine.forward(d, s.forward_tensors(), st);
  else engine.backward(d, s.backward_tensors(), st);
}

BenchRow bench_one(Engine& engine, const DeviceBuffer& flush, Op op, const NamedShape& s,
                   int reps, bool check) {
  const NormDesc& d = s.desc;
  BenchRow row;
  row.name = s.name;
  row.op = op_label(op, d.norm);
  row.shape = d.str();
  ConfigSource src{};
  row.config = engine.config_for(op, d, &src).str();
  row.source = config_source_name(src);
  row.bytes = traffic_bytes(op, d);
  Scratch sc(op, d, 0xbe4c0000u + d.N);
  if (op == Op::Backward) {
    const std::size_t ws = engine.backward_workspace_size(d);
    if (ws) sc.workspace = DeviceBuffer(ws);
  }
  row.us = median_us([&](CUstream st) { run_op(engine, op, d, sc, st); }, flush, reps);
  // Speed of light: a device copy that reads and writes the same bytes.
  const std::size_t half = static_cast<std::size_t>(row.bytes / 2);
  DeviceBuffer a(half), b(half);
  row.copy_us = median_us([&](CUstream st) { NJ_CU(cuMemcpyDtoDAsync(b.get(), a.get(), half, st)); }, flush, reps);
  row.gbps = row.bytes / (row.us * 1e3);
  row.sol = 100.0 * row.copy_us / row.us;
  if (check) {
    // Poisoned outputs, one run, every output against the float64 reference.
    sc.poison();
    run_op(engine, op, d, sc, nullptr);
    double worst = -1;  // the output furthest from the reference, relative to its tolerance
    for (const auto& c : check_outputs(op, d, sc))
      if (c.err / c.tol > worst) {
        worst = c.err / c.tol;
        row.err = c.err;
        row.tol = c.tol;
      }
  }
  return row;
}

}  // namespace

int cmd_bench(Engine& engine, const ShapeOptions& so, const std::string& json_path, int reps, bool check) {
  const auto shapes = resolve_shapes(so);
  if (!require_gpu("benchmarking")) return kExitNoGpu;
  const DeviceInfo dev = device_info(current_device());
  const DeviceBuffer flush = make_flush_buffer(dev);
  std::vector<BenchRow> rows;
  for (const auto& w : shapes.work)
    for (Op op : w.ops) rows.push_back(bench_one(engine, flush, op, w.shape, reps, check));
  int driver = 0;
  cu().cuDriverGetVersion(&driver);
  fmt::print("\nGPU: {} ({}, {} SMs, L2 {} MiB), driver {}, NVRTC {}; median of {} runs, L2 flushed before each; "
             "timing: {}\n",
             dev.name, dev.arch(), dev.sm_count, dev.l2_bytes >> 20, driver, nvrtc().version, reps, timing_method());
  fmt::print("SOL% = time of a device copy moving the same bytes / kernel time\n\n");
  fmt::print("{:<7} {:<16} {:<32} {:<15} {:<13} {:>10} {:>9} {:>9} {:>6} {:>9} {}\n", "op", "name", "shape", "config",
             "from", "bytes", "us", "GB/s", "SOL%", "copy us", check ? "check (rel err / tol)" : "");
  bool all_ok = true;
  for (const auto& r : rows) {
    const bool ok = !check || r.err <= r.tol;
    all_ok = all_ok && ok;
    fmt::print("{:<7} {:<16} {:<32} {:<15} {:<13} {:>10} {:>9.2f} {:>9.1f} {:>5.1f}% {:>9.2f} {}\n", r.op, r.name, r.shape,
               r.config, r.source, fmt_bytes(r.bytes), r.us, r.gbps, r.sol, r.copy_us,
               check ? fmt::format("{} {:.1e} / {:.1e}", ok ? "ok  " : "FAIL", r.err, r.tol) : "");
  }
  if (!json_path.empty()) {
    nlohmann::json j;
    j["gpu"] = {{"name", dev.name}, {"arch", dev.arch()}, {"sm_count", dev.sm_count}, {"l2_bytes", dev.l2_bytes},
                {"driver_version", driver}};
    j["nvrtc_version"] = nvrtc().version;
    j["engine_version"] = NORMJIT_VERSION_STRING;
    j["reps"] = reps;
    j["timing"] = timing_method();
    for (const auto& r : rows)
      j["rows"].push_back({{"op", r.op}, {"name", r.name}, {"shape", r.shape}, {"config", r.config},
                           {"config_source", r.source}, {"bytes", r.bytes}, {"us", r.us}, {"gbps", r.gbps},
                           {"copy_us", r.copy_us}, {"sol_pct", r.sol}, {"rel_err", r.err}, {"tolerance", r.tol}});
    std::ofstream(json_path) << j.dump(2) << "\n";
    fmt::print("\nwrote {}\n", json_path);
  }
  if (!all_ok) fmt::print(stderr, "normjit: some kernels do not match the float64 reference\n");
  return all_ok ? 0 : 1;
}

}  // namespace normjit::cli
