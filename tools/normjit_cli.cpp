// normjit: tune, benchmark, precompile and inspect normjit kernels.
//
//   normjit tune    --model config.json | --shape rms:bf16:8192x4096 ...
//   normjit bench   --model config.json | --shape ... [--json out.json]
//   normjit compile --arch sm_90 --model config.json | --shape ...
//   normjit cache   list | show | clear
//   normjit doctor
//
// Exit codes: 0 ok, 1 error, 2 bad command line, 3 no GPU (for tune/bench).
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune.hpp"
#include "check.hpp"
#include "driver.hpp"
#include "host_dtype.hpp"
#include "kernel_sources.hpp"
#include "nvrtc.hpp"
#include "reference.hpp"
#include "shapes.hpp"
#include "specialization.hpp"
#include "tensors.hpp"
#include "tuned_cache.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

namespace {

constexpr int kExitNoGpu = 3;

struct ShapeOptions {
  std::string model;
  std::vector<std::string> shapes;
  std::vector<std::int64_t> tokens = default_token_counts();
  std::string op = "both";
};

void add_shape_options(CLI::App* app, ShapeOptions& o) {
  auto* model = app->add_option("--model", o.model, "Hugging Face config.json: its norm shapes (hidden_size RMSNorm or n_embd LayerNorm; head_dim QK-norm)")
                    ->check(CLI::ExistingFile);
  app->add_option("--shape", o.shapes,
                  "A shape, <rms|ln>:<dtype>:<M>x<N>[:<option>]..., e.g. rms:bf16:8192x4096, ln:fp16:4096x4096, "
                  "rms:bf16:8192x4096:res (fused residual add), rms:bf16:32768x128:heads=32:x_stride=6144 (QK-norm on "
                  "a QKV view); options w= y= res[=] fp32sum dres nw nb off= cast= eps= heads= x_stride= (repeatable)");
  app->add_option("--tokens", o.tokens, "Token counts for --model")->delimiter(',')->needs(model);
  app->add_option("--op", o.op, "Which kernels")->check(CLI::IsMember({"fwd", "bwd", "both"}));
}

std::vector<NamedShape> resolve_shapes(const ShapeOptions& o) {
  std::vector<NamedShape> out;
  if (!o.model.empty()) out = shapes_from_model_config(o.model, o.tokens);
  for (const auto& s : o.shapes) out.push_back(parse_shape_spec(s));
  if (out.empty()) throw CLI::ValidationError("--model or --shape", "give at least one --model or --shape");
  return out;
}

std::vector<Op> ops_of(const std::string& op) {
  if (op == "fwd") return {Op::Forward};
  if (op == "bwd") return {Op::Backward};
  return {Op::Forward, Op::Backward};
}

// Tuning and benchmarks need a GPU: say plainly what is missing.
bool require_gpu(const char* what) {
  std::string why;
  if (gpu_available(&why)) return true;
  fmt::print(stderr, "normjit: {} needs an NVIDIA GPU, and none can be used here: {}\n", what, why);
  return false;
}

std::string fmt_bytes(double b) {
  return b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : b >= 1e6 ? fmt::format("{:.1f} MB", b / 1e6) : fmt::format("{:.0f} KB", b / 1e3);
}

// ---- tune -------------------------------------------------------------------

int cmd_tune(Engine& engine, const ShapeOptions& so) {
  const auto shapes = resolve_shapes(so);
  if (!require_gpu("tuning")) return kExitNoGpu;
  const auto ops = ops_of(so.op);
  const int total = static_cast<int>(shapes.size() * ops.size());
  int i = 0;
  for (const auto& s : shapes)
    for (Op op : ops) {
      ++i;
      fmt::print("[{}/{}] {} {} {}\n", i, total, op_label(op, s.desc.norm), s.name, s.desc.str());
      std::fflush(stdout);
      const TuneResult r = engine.tune(op, s.desc);
      int passed = 0;
      for (const auto& c : r.candidates) passed += c.median_us > 0;
      fmt::print("        winner {} {:.2f} us ({} of {} candidates passed)\n", r.winner.str(), r.winner_us, passed,
                 r.candidates.size());
    }
  fmt::print("tuned configs stored in {}/tuned\n", engine.cache_dir());
  return 0;
}

// ---- bench ------------------------------------------------------------------

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

int cmd_bench(Engine& engine, const ShapeOptions& so, const std::string& json_path, int reps, bool check) {
  const auto shapes = resolve_shapes(so);
  if (!require_gpu("benchmarking")) return kExitNoGpu;
  const DeviceInfo dev = device_info(current_device());
  const DeviceBuffer flush = make_flush_buffer(dev);
  std::vector<BenchRow> rows;
  for (const auto& s : shapes)
    for (Op op : ops_of(so.op)) rows.push_back(bench_one(engine, flush, op, s, reps, check));
  int driver = 0;
  cu().cuDriverGetVersion(&driver);
  fmt::print("\nGPU: {} ({}, {} SMs, L2 {} MiB), driver {}, NVRTC {}; median of {} runs, L2 flushed before each\n",
             dev.name, dev.arch(), dev.sm_count, dev.l2_bytes >> 20, driver, nvrtc().version, reps);
  fmt::print("SOL% = time of a device copy moving the same bytes / kernel time\n\n");
  fmt::print("{:<7} {:<14} {:<32} {:<15} {:<13} {:>10} {:>9} {:>9} {:>6} {:>9} {}\n", "op", "name", "shape", "config",
             "from", "bytes", "us", "GB/s", "SOL%", "copy us", check ? "check (rel err / tol)" : "");
  bool all_ok = true;
  for (const auto& r : rows) {
    const bool ok = !check || r.err <= r.tol;
    all_ok = all_ok && ok;
    fmt::print("{:<7} {:<14} {:<32} {:<15} {:<13} {:>10} {:>9.2f} {:>9.1f} {:>5.1f}% {:>9.2f} {}\n", r.op, r.name, r.shape,
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

// ---- compile ----------------------------------------------------------------

int cmd_compile(Engine& engine, const ShapeOptions& so, const std::string& arch) {
  const auto shapes = resolve_shapes(so);
  nvrtc();  // fail early, with the paths tried, when NVRTC is missing
  int total = 0;
  std::vector<std::string> failures;
  for (const auto& s : shapes)
    for (Op op : ops_of(so.op)) {
      const int n = engine.precompile(op, s.desc, arch, &failures);
      fmt::print("{} {:<14} {:<32} {} variants for {}\n", op_label(op, s.desc.norm), s.name, s.desc.str(), n, arch);
      total += n;
    }
  fmt::print("{} kernel variants compiled or found in {}/kernels\n", total, engine.cache_dir());
  for (const auto& f : failures) fmt::print(stderr, "normjit: {}\n", f);
  return failures.empty() ? 0 : 1;
}

// ---- cache ------------------------------------------------------------------

void print_file_summary(const TunedCacheFile& f) {
  const bool current = f.metadata.kernel_source_hash == kernel_source_hash();
  fmt::print("{}\n  device {}\n  {} entries, engine {}, NVRTC {}, kernels {}\n", f.path, f.device.key(), f.entries.size(),
             f.metadata.engine_version, f.metadata.nvrtc_version,
             current ? "current" : "stale (tuned for other kernel sources; ignored)");
}

int cmd_cache_list(Engine& engine) {
  const std::string user = engine.cache_dir() + "/tuned";
  fmt::print("user cache: {}\n", user);
  for (const auto& f : list_tuned_cache_files(user, default_warn)) print_file_summary(f);
  for (const auto& dir : engine.shipped_cache_dirs()) {
    fmt::print("shipped cache: {}\n", dir);
    for (const auto& f : list_tuned_cache_files(dir, default_warn)) print_file_summary(f);
  }
  std::size_t cubins = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(engine.cache_dir() + "/kernels", ec)) cubins += e.path().extension() == ".cubin";
  fmt::print("compiled kernels: {} in {}/kernels\n", cubins, engine.cache_dir());
  return 0;
}

int cmd_cache_show(Engine& engine, std::string file) {
  std::vector<TunedCacheFile> files;
  if (!file.empty()) {
    auto f = read_tuned_cache_file(file, default_warn);
    if (!f) throw Error(ErrorKind::InvalidArgument, fmt::format("--file '{}' is not a readable tuned cache", file));
    files.push_back(*f);
  } else {
    files = list_tuned_cache_files(engine.cache_dir() + "/tuned", default_warn);
  }
  for (const auto& f : files) {
    print_file_summary(f);
    for (const auto& [key, e] : f.entries) {
      int passed = 0;
      for (const auto& c : e.candidates) passed += c.median_us > 0;
      fmt::print("  {:<52} {:<15} {:>9.2f} us  {}/{} candidates  {}\n", key, e.winner.str(), e.winner_us, passed,
                 e.candidates.size(), e.tuned_at);
    }
  }
  return 0;
}

int cmd_cache_clear(Engine& engine) {
  std::size_t n = 0;
  std::error_code ec;
  for (const char* sub : {"tuned", "kernels"})
    for (const auto& e : fs::directory_iterator(fs::path(engine.cache_dir()) / sub, ec))
      if (e.is_regular_file()) n += fs::remove(e.path(), ec);
  fmt::print("removed {} files from {} (shipped caches are left alone)\n", n, engine.cache_dir());
  return 0;
}

// ---- doctor -----------------------------------------------------------------

int cmd_doctor(Engine& engine) {
  bool ok = true;
  fmt::print("normjit {}\n", NORMJIT_VERSION_STRING);
  fmt::print("kernel sources: {} ({} files, hash {})\n", kernel_sources_origin(), kernel_sources().size(), kernel_source_hash());
  try {
    const auto& n = nvrtc();
    fmt::print("NVRTC: {} ({})\n", n.version, n.path);
  } catch (const Error& e) {
    ok = false;
    fmt::print("NVRTC: MISSING: {}\n", e.message());
  }
  std::string why;
  if (gpu_available(&why)) {
    int driver = 0, count = 0;
    cu().cuDriverGetVersion(&driver);
    cu().cuDeviceGetCount(&count);
    fmt::print("driver: CUDA {}.{}; {} device(s)\n", driver / 1000, driver % 1000 / 10, count);
    for (int i = 0; i < count; ++i) {
      CUdevice dev = 0;
      NJ_CU(cuDeviceGet(&dev, i));
      const DeviceInfo d = device_info(dev);
      DeviceFingerprint fp{d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes};
      fmt::print("  [{}] {} ({}, {} SMs, L2 {} MiB); tuned-cache file {}.json\n", i, d.name, d.arch(), d.sm_count,
                 d.l2_bytes >> 20, fp.slug());
    }
  } else {
    ok = false;
    fmt::print("driver/GPU: MISSING: {}\n", why);
    fmt::print("  (kernels can still be compiled: normjit compile --arch sm_90 ...)\n");
  }
  fmt::print("user cache: {}\n", engine.cache_dir());
  fmt::print("tune policy: {}\n", tune_policy_name(engine.options().tune_policy));
  for (const auto& d : engine.shipped_cache_dirs()) fmt::print("shipped cache: {}\n", d);
  fmt::print("{}\n", ok ? "everything needed to run kernels is present" : "some parts are missing (see above)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"normjit: run-time compiled RMSNorm and LayerNorm kernels (NVRTC + CUDA Driver API): tune, benchmark, precompile"};
  app.set_version_flag("--version", std::string("normjit ") + NORMJIT_VERSION_STRING);
  app.require_subcommand(1);
  bool verbose = false;
  std::string cache_dir;
  app.add_flag("-v,--verbose", verbose, "Show tuning progress per candidate");
  app.add_option("--cache-dir", cache_dir, "User cache directory (default $NORMJIT_CACHE_DIR, $XDG_CACHE_HOME/normjit)");

  ShapeOptions tune_o, bench_o, compile_o;
  auto* tune = app.add_subcommand("tune", "Autotune shapes on this GPU and store the winners in the user cache");
  add_shape_options(tune, tune_o);

  auto* bench = app.add_subcommand("bench", "Time shapes with their current configs: us, GB/s, SOL% against a device copy");
  add_shape_options(bench, bench_o);
  std::string json_path;
  int reps = 50;
  bool no_check = false;
  bench->add_option("--json", json_path, "Also write the results as JSON");
  bench->add_option("--reps", reps, "Timed repetitions (median)")->check(CLI::Range(10, 100000));
  bench->add_flag("--no-check", no_check, "Skip the float64 CPU reference check");

  auto* compile = app.add_subcommand("compile", "Compile every grid variant into the kernel cache (NVRTC only, no GPU)");
  add_shape_options(compile, compile_o);
  std::string arch = "sm_90";
  compile->add_option("--arch", arch, "Target architecture, e.g. sm_90")->check(CLI::Validator(
      [](std::string& s) { return s.size() >= 5 && s.rfind("sm_", 0) == 0 && s.find_first_not_of("0123456789a", 3) == std::string::npos ? std::string() : "expected sm_<digits>, e.g. sm_90"; },
      "sm_XY"));

  auto* cache = app.add_subcommand("cache", "Inspect or clear the tuned-config and kernel caches");
  cache->require_subcommand(1);
  auto* cache_list = cache->add_subcommand("list", "List tuned-cache files (user and shipped) and compiled kernels");
  auto* cache_show = cache->add_subcommand("show", "Show the entries of tuned-cache files");
  std::string show_file;
  cache_show->add_option("--file", show_file, "A tuned-cache file (default: every file of the user cache)");
  auto* cache_clear = cache->add_subcommand("clear", "Remove the user cache's tuned configs and compiled kernels");

  auto* doctor = app.add_subcommand("doctor", "Report driver, NVRTC, devices, cache paths and what is missing");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, version or the error
    return rc == 0 ? 0 : 2;      // one exit code for every bad command line
  }

  try {
    EngineOptions opt = EngineOptions::from_env();
    if (!cache_dir.empty()) opt.cache_dir = cache_dir;
    opt.verbose = verbose || tune->parsed();  // tuning always shows its progress
    Engine engine(opt);
    if (tune->parsed()) return cmd_tune(engine, tune_o);
    if (bench->parsed()) return cmd_bench(engine, bench_o, json_path, reps, !no_check);
    if (compile->parsed()) return cmd_compile(engine, compile_o, arch);
    if (cache_list->parsed()) return cmd_cache_list(engine);
    if (cache_show->parsed()) return cmd_cache_show(engine, show_file);
    if (cache_clear->parsed()) return cmd_cache_clear(engine);
    if (doctor->parsed()) return cmd_doctor(engine);
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return e.kind() == ErrorKind::InvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "normjit: {}\n", e.what());
    return 1;
  }
  return 0;
}
