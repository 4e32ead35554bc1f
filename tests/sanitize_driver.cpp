// normjit_sanitize: a small driver for compute-sanitizer (tools/sanitize.sh).
// Each case is one shape spec (core/shape_spec.hpp) of the sample below: narrow,
// usual, wide and odd rows, 64-bit offsets, odd strides, 3-D heads and every
// feature switch (residual, LayerNorm bias, weight offset, cast modes, no
// weight / bias, FP8 outputs and inputs). A case runs, for each of its ops,
// the configs of its autotune grid (all of them, or with --quick one of each
// kind: cluster, two-pass, staged, several rows per program, ...) through
// KernelCache + launch_forward / launch_backward, and then the Engine's own
// call, each on fresh output and workspace buffers, and compares every
// output with the float64 reference.
//
//   normjit_sanitize --list [--quick]            case names, one a line (no GPU needed)
//   normjit_sanitize --check                     every case's spec parses and has a grid (no GPU needed)
//   normjit_sanitize --case NAME [options]       one case
//   normjit_sanitize --all [options]             every case (of --quick's sample)
//   normjit_sanitize --probe [options]           one small launch (can a sanitizer attach?)
// options: --quick, --no-poison (leave outputs uninitialised, for initcheck),
//          --cache-dir DIR (compiled kernels; shared between runs, default a temp dir),
//          --max-cluster C (skip configs of larger clusters: synccheck fails on
//          clusters of 16 that run in waves, a kernel with no normjit code included;
//          tools/repro/cluster_st_async.cu)
// Exit codes: 0 ok, 1 a mismatch or an error, 2 bad usage, 77 no GPU.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tuning/autotune.hpp"
#include "core/parallel.hpp"
#include "tuning/check.hpp"
#include "config/config_grid.hpp"
#include "device/driver.hpp"
#include "compile/jit.hpp"
#include "runtime/ops.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"
#include "core/tensors.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

namespace {

struct Case {
  const char* name;
  const char* spec;
  bool fwd = true, bwd = true;
  bool quick = false;                        // in --quick's sample
  std::function<void(NormDesc&)> tweak = {};  // fields a spec cannot set
};

constexpr bool Q = true;  // in the quick sample

std::vector<Case> all_cases() {
  // 2^30 + 64 elements between rows: row 2 starts past element 2^31.
  const char* k64 = "rms:bf16:3x4096:x_stride=1073741888";
  return {
      {"rms-n64", "rms:bf16:256x64", true, true, Q},
      {"rms-n4096", "rms:bf16:64x4096:w=fp32", true, true, Q},
      {"rms-n65536", "rms:bf16:4x65536", true, true, Q},
      {"rms-n262144", "rms:fp32:2x262144", true, true},
      {"rms-odd2881", "rms:fp16:16x2881", true, true, Q},
      {"rms-odd-strides", "rms:bf16:16x1000", true, true, Q,
       [](NormDesc& d) {  // strides no vector divides: the engine lowers vec
         d.x_stride = d.dx_stride = d.N + 1;
         d.y_stride = d.dy_stride = d.N + 3;
       }},
      {"rms-64bit-offsets", k64, true, true, Q},
      {"rms-res", "rms:bf16:32x4096:res:dres", true, true, Q},
      {"rms-res-mixed", "rms:bf16:32x1000:res=fp16:ro=fp32:fp32sum:y=fp32", true, true},
      {"rms-gemma-off", "rms:bf16:32x4096:off=1:cast=gemma", true, true, Q},
      {"rms-llama-nw", "rms:fp16:32x4096:cast=llama:nw", true, true},
      {"rms-qk-3d", "rms:bf16:128x128:heads=32:x_stride=12288", true, true, Q},
      {"ln-n4096", "ln:bf16:64x4096", true, true, Q},
      {"ln-odd-nb", "ln:fp16:16x2881:nb", true, true},
      {"ln-n65536", "ln:bf16:4x65536", true, true, Q},
      {"ln-res-off-llama", "ln:bf16:32x4096:res:off=1:cast=llama", true, true},
      {"ln-nw-nb", "ln:fp32:32x1024:nw:nb", true, true},
      {"ln-qk-3d", "ln:bf16:128x128:heads=32:x_stride=12288", true, true},
      {"fp8-tensor", "rms:bf16:32x4096:quant=e4m3/tensor:yhp:transpose", true, false, Q},
      {"fp8-static", "rms:bf16:32x4096:quant=e5m2/tensor-static", true, false},
      {"fp8-token", "ln:bf16:32x4096:quant=e5m2/token:ub=0.004", true, false},
      {"fp8-group", "rms:bf16:32x7168:quant=e4m3/group128:colmajor", true, false, Q},
      {"fp8-group-res", "rms:bf16:32x4096:quant=e4m3/group32:res:yhp", true, false},
      {"fp8-mx", "ln:bf16:32x4096:quant=e4m3/mx32", true, false, Q},
      {"fp8-group-wide", "rms:bf16:2x131072:quant=e4m3/group128:ue8m0", true, false},
      {"fp8-x", "rms:bf16:32x4096:x=e4m3/group16", true, true, Q},
      {"fp8-x-quant", "ln:bf16:32x4096:x=e5m2/group32:quant=e4m3/group128:ue8m0", true, true},
  };
}

NormDesc desc_of(const Case& c) {
  NormDesc d = parse_shape_spec(c.spec).desc;
  if (c.tweak) {
    c.tweak(d);
    d.validate();
  }
  return d;
}

std::vector<Op> ops_of(const Case& c) {
  std::vector<Op> v;
  if (c.fwd) v.push_back(Op::Forward);
  if (c.bwd) v.push_back(Op::Backward);
  return v;
}

// The configs to run: the heuristic's first, then the whole grid, or with
// `quick` the first config of each kind (and the grid's last, its most
// complex).
std::vector<LaunchConfig> configs_for(Op op, const NormDesc& d, const DeviceFacts& facts, bool quick) {
  const int max_cluster = facts.max_cluster;
  const auto grid = candidate_grid(op, d, max_cluster);
  std::vector<LaunchConfig> out = {heuristic_config(op, d, facts)};
  auto add = [&](const LaunchConfig& c) {
    for (const auto& o : out)
      if (o == c) return;
    out.push_back(c);
  };
  if (!quick) {
    for (const auto& c : grid) add(c);
    return out;
  }
  std::set<std::vector<int>> kinds;
  for (const auto& c : grid) {
    const std::vector<int> kind = {c.cluster > 8 ? 2 : c.cluster > 1 ? 1 : 0, c.two_pass, c.stages > 0,
                                   c.rows_per_pid > 1, c.programs_per_sm > 0, c.vec == 1};
    if (kinds.insert(kind).second) add(c);
  }
  if (!grid.empty()) add(grid.back());
  return out;
}

struct Options {
  bool quick = false, poison = true;
  std::string cache_dir;
  int max_cluster = 0;  // 0: the device's
};

// Fills the elements of `t`'s allocation that lie between its rows (which no
// kernel writes, and which Scratch::download copies to the host with the
// rows: initcheck would report that copy).
void fill_gaps(const DeviceBuffer& b, const TensorSpec& t) {
  if (t.rows <= 1 || (t.heads == 1 && t.ld == t.cols)) return;
  std::vector<std::int64_t> starts;
  for (std::int64_t r = 0; r < t.rows; ++r) starts.push_back(t.offset(r));
  std::sort(starts.begin(), starts.end());
  const std::int64_t es = dtype_size(t.dtype);
  for (std::size_t i = 0; i + 1 < starts.size(); ++i)
    if (const std::int64_t gap = starts[i + 1] - (starts[i] + t.cols); gap > 0)
      NJ_CU(cuMemsetD8Async(b.get() + (starts[i] + t.cols) * es, 0xff, gap * es, nullptr));
}

// Fresh (uninitialised) buffers for every output of `s`, poisoned unless
// `poison` is off: an output element no kernel wrote fails the check, and
// with initcheck (no poison) a kernel reading one is reported.
void fresh_outputs(Scratch& s, bool poison) {
  for (const auto& t : s.specs)
    if (t.output) {
      DeviceBuffer& b = s.buf[t.name];
      b = DeviceBuffer(std::max<std::size_t>(16, static_cast<std::size_t>(t.span()) * dtype_size(t.dtype)));
      if (poison) NJ_CU(cuMemsetD8Async(b.get(), 0xff, b.bytes(), nullptr));
      else fill_gaps(b, t);
    }
}

// Compares the outputs with the reference; prints and counts mismatches.
int compare(const Scratch& s, const Reference& ref, const std::string& what) {
  int bad = 0;
  for (const auto& c : compare_outputs(s, ref))
    if (!c.ok()) {
      ++bad;
      fmt::print("MISMATCH {}: {} error {:.3g} > tolerance {:.3g}\n", what, c.name, c.err, c.tol);
    }
  return bad;
}

Engine& engine(const Options& o) {
  static Engine e([&] {
    EngineOptions eo;
    eo.tune_policy = TunePolicy::Never;
    eo.cache_dir = o.cache_dir + "/engine";
    return eo;
  }());
  return e;
}

// Runs one case; returns the number of mismatches (errors propagate).
int run_case(const Case& c, const Options& o, const DeviceInfo& dev, KernelCache& jit) {
  const NormDesc d = desc_of(c);
  int bad = 0;
  DeviceFacts facts = dev.facts();
  facts.max_cluster = o.max_cluster > 0 ? std::min(o.max_cluster, dev.max_cluster) : dev.max_cluster;
  for (Op op : ops_of(c)) {
    const auto cfgs = configs_for(op, d, facts, o.quick);
    // Compiled in parallel into the disk cache first (a plain run fills it
    // for the sanitizer runs that follow).
    std::vector<KernelSpec> specs;
    for (const auto& cfg : cfgs) specs.push_back(make_spec(op, d, cfg));
    if (op == Op::Backward) specs.push_back(finalize_spec(d));
    parallel_for(static_cast<int>(specs.size()),
                 [&](int i) { compile_spec(specs[i], dev.arch(), jit.kernel_dir()); });

    Scratch s(op, d, 0x5a417e00u + static_cast<std::uint64_t>(d.N));
    const Reference ref = reference_outputs(op, d, s);
    const auto fin = op == Op::Backward ? jit.get(finalize_spec(d), dev.arch()) : nullptr;
    int ran = 0, skipped = 0;
    for (const auto& cfg : cfgs) {
      auto k = jit.get(make_spec(op, d, cfg), dev.arch());
      if (k->local_bytes > 0 || k->blocks_per_sm < 1) {  // the tuner prunes these too
        ++skipped;
        continue;
      }
      fresh_outputs(s, o.poison);
      // Printed before the launch: a run the sanitizer ends names its config.
      fmt::print("launch {} {} {}\n", c.name, op_name(op), cfg.str());
      std::fflush(stdout);
      if (op == Op::Forward) {
        launch_forward(*k, d, s.forward_tensors(), dev.sm_count, nullptr);
      } else {
        const Geometry g = backward_geometry(*k, d, cfg, dev.sm_count);
        s.workspace = DeviceBuffer(backward_workspace_bytes(g, d));  // uninitialised: the kernels write it first
        launch_backward(*k, *fin, d, s.backward_tensors(), g, nullptr);
      }
      NJ_CU(cuCtxSynchronize());
      bad += compare(s, ref, fmt::format("{} {} {}", c.name, op_name(op), cfg.str()));
      ++ran;
    }
    // The engine's own path: its config (tuned cache or heuristic) and its
    // alignment fitting (unless its config's cluster is past --max-cluster).
    const bool engine_ran = engine(o).config_for(op, d).cluster <= facts.max_cluster;
    if (engine_ran) {
      fresh_outputs(s, o.poison);
      fmt::print("launch {} {} engine\n", c.name, op_name(op));
      std::fflush(stdout);
      if (op == Op::Forward) {
        engine(o).forward(d, s.forward_tensors(), nullptr);
      } else {
        s.workspace = DeviceBuffer(engine(o).backward_workspace_size(d));
        engine(o).backward(d, s.backward_tensors(), nullptr);
      }
      NJ_CU(cuCtxSynchronize());
      bad += compare(s, ref, fmt::format("{} {} engine", c.name, op_name(op)));
    }
    fmt::print("{} {} {}: {} configs of {} ran ({}), {} not launchable{}\n", c.name, op_name(op), d.str(), ran,
               candidate_grid(op, d, dev.max_cluster).size(), engine_ran ? "+ the engine's call" : "not the engine's call",
               skipped, facts.max_cluster < dev.max_cluster ? fmt::format(", clusters of at most {}", facts.max_cluster) : "");
    std::fflush(stdout);
  }
  return bad;
}

int usage() {
  std::fprintf(stderr,
               "usage: normjit_sanitize --list|--check|--all|--probe|--case NAME [--quick] [--no-poison] "
               "[--cache-dir DIR] [--max-cluster C]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string mode, name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") o.quick = true;
    else if (a == "--no-poison") o.poison = false;
    else if (a == "--cache-dir" && i + 1 < argc) o.cache_dir = argv[++i];
    else if (a == "--max-cluster" && i + 1 < argc) {
      o.max_cluster = std::atoi(argv[++i]);
      if (o.max_cluster < 1) {
        std::fprintf(stderr, "normjit_sanitize: --max-cluster %s is not a cluster size >= 1\n", argv[i]);
        return 2;
      }
    }
    else if (a == "--case" && i + 1 < argc) mode = "case", name = argv[++i];
    else if (a == "--list" || a == "--check" || a == "--all" || a == "--probe") mode = a.substr(2);
    else return usage();
  }
  if (mode.empty()) return usage();
  const auto cases = all_cases();
  try {
    if (mode == "list") {
      for (const auto& c : cases)
        if (c.quick || !o.quick) std::printf("%s\n", c.name);
      return 0;
    }
    if (mode == "check") {  // CPU only: specs parse, grids are not empty, names unique
      // No device here: an H100's facts (132 SMs, 3352 GB/s) choose the model's configs.
      const DeviceFacts h100 = DeviceFacts::of(9, 0, 132, std::int64_t{50} << 20, 3352);
      std::set<std::string> names;
      for (const auto& c : cases) {
        if (!names.insert(c.name).second) throw Error(ErrorKind::InvalidArgument, fmt::format("case {} twice", c.name));
        const NormDesc d = desc_of(c);
        for (Op op : ops_of(c))
          for (bool quick : {true, false})
            if (configs_for(op, d, h100, quick).empty())
              throw Error(ErrorKind::InvalidArgument, fmt::format("case {}: no config", c.name));
        std::printf("%-18s %-55s fwd %3zu configs (quick %zu)", c.name, c.spec,
                    c.fwd ? configs_for(Op::Forward, d, h100, false).size() : 0,
                    c.fwd ? configs_for(Op::Forward, d, h100, true).size() : 0);
        if (c.bwd)
          std::printf(", bwd %3zu (quick %zu)", configs_for(Op::Backward, d, h100, false).size(),
                      configs_for(Op::Backward, d, h100, true).size());
        std::printf("\n");
      }
      std::printf("%zu cases, %zu in the quick sample\n", cases.size(),
                  static_cast<std::size_t>(std::count_if(cases.begin(), cases.end(), [](const Case& c) { return c.quick; })));
      return 0;
    }
    std::string why;
    if (!gpu_available(&why)) {
      std::printf("SKIPPED: normjit_sanitize needs an NVIDIA GPU: %s\n", why.c_str());
      return 77;
    }
    std::shared_ptr<void> cleanup;
    if (o.cache_dir.empty()) {
      o.cache_dir = (fs::temp_directory_path() / fmt::format("normjit-sanitize-{}", ::getpid())).string();
      cleanup.reset(static_cast<void*>(nullptr), [dir = o.cache_dir](void*) {
        std::error_code ec;
        fs::remove_all(dir, ec);
      });
    }
    const DeviceInfo dev = device_info(current_device());
    KernelCache jit(o.cache_dir + "/kernels");
    if (mode == "probe") {  // one allocation, one launch, one copy back
      const NormDesc d = parse_shape_spec("rms:bf16:8x64").desc;
      Scratch s(Op::Forward, d, 1);
      auto k = jit.get(make_spec(Op::Forward, d, heuristic_config(Op::Forward, d, dev.facts())), dev.arch());
      launch_forward(*k, d, s.forward_tensors(), dev.sm_count, nullptr);
      s.download("y");
      std::printf("probe ok on %s (%s)\n", dev.name.c_str(), dev.arch().c_str());
      return 0;
    }
    int bad = 0, ran = 0;
    for (const auto& c : cases) {
      if (mode == "case" ? name != c.name : (o.quick && !c.quick)) continue;
      bad += run_case(c, o, dev, jit);
      ++ran;
    }
    if (ran == 0) {
      std::fprintf(stderr, "normjit_sanitize: no case named '%s' (see --list)\n", name.c_str());
      return 2;
    }
    std::printf("%d case(s), %d mismatch(es)\n", ran, bad);
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "normjit_sanitize: %s\n", e.what());
    return 1;
  }
}
