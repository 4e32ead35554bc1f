// Host time of one engine call, against the driver launch it ends in.
//
//   normjit_bench_host [--calls 200] [--batches 50] [--shape rms:bf16:1x4096 ...]
//
// For each shape: the first call (plan built: config resolved, kernel loaded
// from the disk cache or compiled), then batches of back-to-back calls of
// Engine::forward / Engine::backward (a plan hit: key, lookup, launch) and of
// the bare launch of the same kernel (launch_forward / launch_backward on an
// already loaded kernel). Each batch is timed on the host clock without a
// synchronisation inside it (queues stay far from full: 200 launches), the
// stream drained between batches; medians are printed, and "engine" is the
// difference: what the engine adds to a launch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "device/driver.hpp"
#include "compile/jit.hpp"
#include "normjit/normjit.hpp"
#include "runtime/ops.hpp"
#include "core/shape_spec.hpp"
#include "tuning/autotune.hpp"

using namespace normjit;
using namespace normjit::detail;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double per_call_ns(F&& call, int calls, int batches, CUstream s) {
  std::vector<double> t;
  for (int b = 0; b < batches; ++b) {
    NJ_CU(cuStreamSynchronize(s));
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto t1 = Clock::now();
    t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  NJ_CU(cuStreamSynchronize(s));
  return median(t);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Host time of engine calls against bare kernel launches"};
  int calls = 200, batches = 50;
  std::vector<std::string> specs = {"rms:bf16:1x4096", "rms:bf16:32x8192", "rms:bf16:4096x256",
                                    "ln:bf16:4096x256", "rms:bf16:1x4096:res"};
  app.add_option("--calls", calls, "calls per timed batch")->check(CLI::Range(1, 1000));
  app.add_option("--batches", batches, "timed batches (the median is printed)")->check(CLI::Range(1, 100000));
  app.add_option("--shape", specs, "shape specs (as normjit tune --shape)");
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!gpu_available(&why)) {
    std::fprintf(stderr, "normjit_bench_host: needs a GPU: %s\n", why.c_str());
    return 3;
  }
  try {
    Engine engine;
    const DeviceInfo dev = device_info(current_device());
    KernelCache jit(engine.cache_dir() + "/kernels");
    CUstream s = nullptr;
    fmt::print("# {} ({} SMs); ns per call, median of {} batches of {} calls\n", dev.name, dev.sm_count, batches, calls);
    fmt::print("| shape | op | first call (us) | Engine call (ns) | bare launch (ns) | engine adds (ns) |\n");
    fmt::print("|---|---|---:|---:|---:|---:|\n");
    for (const auto& spec : specs) {
      const NormDesc d = parse_shape_spec(spec).desc;
      for (Op op : {Op::Forward, Op::Backward}) {
        Scratch sc(op, d, 0xb0570000u + static_cast<std::uint64_t>(d.N));
        if (op == Op::Backward)
          sc.workspace = DeviceBuffer(std::max<std::size_t>(16, engine.backward_workspace_size(d)));
        const ForwardTensors ft = sc.forward_tensors();
        const BackwardTensors bt = sc.backward_tensors();
        const auto t0 = Clock::now();
        auto engine_call = [&] {
          if (op == Op::Forward) engine.forward(d, ft, s);
          else engine.backward(d, bt, s);
        };
        engine_call();
        NJ_CU(cuStreamSynchronize(s));
        const double first_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        const double e_ns = per_call_ns(engine_call, calls, batches, s);
        // The same kernel, launched without the engine.
        const LaunchConfig cfg = engine.config_for(op, d);
        auto k = jit.get(make_spec(op, d, cfg), dev.arch());
        double l_ns = 0;
        if (op == Op::Forward) {
          l_ns = per_call_ns([&] { launch_forward(*k, d, ft, dev.sm_count, s); }, calls, batches, s);
        } else {
          auto fin = jit.get(finalize_spec(d), dev.arch());
          const Geometry g = backward_geometry(*k, d, cfg, dev.sm_count);
          l_ns = per_call_ns([&] { launch_backward(*k, *fin, d, bt, g, s); }, calls, batches, s);
        }
        fmt::print("| {} | {} | {:.1f} | {:.0f} | {:.0f} | {:.0f} |\n", spec, op == Op::Forward ? "fwd" : "bwd", first_us,
                   e_ns, l_ns, e_ns - l_ns);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "normjit_bench_host: %s\n", e.what());
    return 1;
  }
  return 0;
}
