// normjit: tune, benchmark, precompile and inspect normjit kernels.
//
//   normjit tune    --model config.json [--tokens 1,1024,8192] [--list] [--retune] | --shape rms:bf16:8192x4096 ...
//                   [--vs-untuned --json out.json]
//                   [--devices 0,1,...]
//   normjit tune    --grid autotune_cache/grid/grid.json [--list] [--max-seconds S]
//   normjit explain --shape rms:bf16:8192x4096 ...
//   normjit bench   --model config.json | --shape ... [--json out.json]
//   normjit compile --arch sm_90 --model config.json | --shape ...
//   normjit cache   list | show | clear
//   normjit doctor
//
// Exit codes: 0 ok, 1 error, 2 bad command line, 3 no GPU (for tune/bench).
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "device/kernel_clock.hpp"
#include "core/trace.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;
using namespace normjit::cli;

namespace {

// The options before the subcommand.
struct GlobalArgs {
  bool verbose = false;
  std::string cache_dir;
  std::string trace_file;
};

void add_global_options(CLI::App& app, GlobalArgs& a) {
  app.add_flag("-v,--verbose", a.verbose, "Show tuning progress per candidate");
  app.add_option("--cache-dir", a.cache_dir,
                 "User cache directory (default $NORMJIT_CACHE_DIR, $XDG_CACHE_HOME/normjit)");
  app.add_option("--trace", a.trace_file,
                 "Write a Chrome trace (Trace Event Format JSON) of compiles, cache hits and misses, tuning and "
                 "launches to this file at exit (as $NORMJIT_TRACE)");
}

struct TuneArgs {
  CLI::App* cmd = nullptr;
  ShapeOptions shapes;
  bool vs_untuned = false, list = false, whole_grid = false, retune = false;
  std::string json, grid;
  double max_seconds = 1e9;
  int workers = 4;
  std::vector<int> devices;
};

void add_tune_command(CLI::App& app, TuneArgs& a) {
  auto* tune = app.add_subcommand("tune", "Autotune shapes on this GPU and store the winners in the user cache");
  a.cmd = tune;
  add_shape_options(tune, a.shapes);
  tune->add_flag("--vs-untuned", a.vs_untuned,
                 "Also time the config the shape gets untuned (the config model's) against the fastest candidate of the "
                 "whole grid, in alternating rounds (implies --whole-grid)");
  tune->add_flag("--whole-grid", a.whole_grid,
                 "Time every candidate (default: a local search from the config model's config)");
  tune->add_option("--json", a.json, "With --vs-untuned: write the comparison as JSON");
  tune->add_option("--grid", a.grid, "Tune every shape of a grid file (autotune_cache/grid/grid.json) by local search")
      ->check(CLI::ExistingFile);
  tune->add_option("--workers", a.workers,
                   "Shapes tuned at once a GPU (compiles overlap timing; timing is serial on a GPU)")
      ->check(CLI::Range(1, 64));
  tune->add_flag("--list", a.list,
                 "Print the shapes (with --model: each norm, its ops and the config keys it came from; with --grid: "
                 "the grid's shapes) and stop; no GPU needed");
  tune->add_flag("--retune", a.retune,
                 "With --model: tune every shape, also those with a current tuned entry for this GPU (skipped otherwise)");
  tune->add_option("--max-seconds", a.max_seconds, "With --grid: stop starting new shapes after this long")
      ->check(CLI::PositiveNumber);
  tune->add_option("--devices", a.devices,
                   "Tune on these GPUs (ordinals, e.g. 0,1,2,3) in parallel (--workers threads each): "
                   "GPUs of one kind share the shapes and one tuned-cache file, each kind tunes them all (default: the "
                   "current GPU)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023));
}

struct ExplainArgs {
  CLI::App* cmd = nullptr;
  ShapeOptions shapes;
  std::string device;
};

void add_explain_command(CLI::App& app, ExplainArgs& a) {
  auto* explain = app.add_subcommand(
      "explain", "Print the config each shape resolves to, where it comes from (tuned, shipped, neighbour, heuristic) and why");
  a.cmd = explain;
  add_shape_options(explain, a.shapes);
  explain->add_option("--device", a.device,
                      "Explain for this device without a GPU: a tuned-cache file's name without .json, e.g. "
                      "nvidia-h100-80gb-hbm3.cc90.132sm.50mib");
}

struct BenchArgs {
  CLI::App* cmd = nullptr;
  ShapeOptions shapes;
  std::string json;
  int reps = 50;
  bool no_check = false;
};

void add_bench_command(CLI::App& app, BenchArgs& a) {
  auto* bench = app.add_subcommand("bench", "Time shapes with their current configs: us, GB/s, SOL% against a device copy");
  a.cmd = bench;
  add_shape_options(bench, a.shapes);
  bench->add_option("--json", a.json, "Also write the results as JSON");
  bench->add_option("--reps", a.reps, "Timed repetitions (median)")->check(CLI::Range(10, 100000));
  bench->add_flag("--no-check", a.no_check, "Skip the float64 CPU reference check");
}

struct CompileArgs {
  CLI::App* cmd = nullptr;
  ShapeOptions shapes;
  std::string arch = "sm_90";
  std::string config, dump_dir;
};

void add_compile_command(CLI::App& app, CompileArgs& a) {
  auto* compile = app.add_subcommand("compile", "Compile every grid variant into the kernel cache (NVRTC only, no GPU)");
  a.cmd = compile;
  add_shape_options(compile, a.shapes);
  auto* dump = compile->add_option(
      "--dump", a.dump_dir,
      "Instead, write the kernel of --config for each shape and op into this directory: its generated source "
      "(<kernel>.cu) and cubin (<kernel>.cubin), for cuobjdump -sass");
  compile->add_option("--config", a.config, "The launch config --dump writes, e.g. v8.t256.r1.c8 (see explain)")
      ->needs(dump);
  dump->needs("--config");
  compile->add_option("--arch", a.arch, "Target architecture, e.g. sm_90")->check(CLI::Validator(
      [](std::string& s) { return s.size() >= 5 && s.rfind("sm_", 0) == 0 && s.find_first_not_of("0123456789a", 3) == std::string::npos ? std::string() : "expected sm_<digits>, e.g. sm_90"; },
      "sm_XY"));
}

struct CacheArgs {
  CLI::App *list = nullptr, *show = nullptr, *clear = nullptr, *migrate = nullptr, *prune = nullptr;
  std::string show_file;
  std::string old_kernels, migrate_arch = "sm_90";
  std::vector<std::string> migrate_files;
  bool migrate_dry = false;
  std::vector<std::string> prune_files;
  bool prune_dry = false;
};

void add_cache_command(CLI::App& app, CacheArgs& a) {
  auto* cache = app.add_subcommand("cache", "Inspect or clear the tuned-config and kernel caches");
  cache->require_subcommand(1);
  a.list = cache->add_subcommand("list", "List tuned-cache files (user and shipped) and compiled kernels");
  a.show = cache->add_subcommand("show", "Show the entries of tuned-cache files");
  a.show->add_option("--file", a.show_file, "A tuned-cache file (default: every file of the user cache)");
  a.clear = cache->add_subcommand("clear", "Remove the user cache's tuned configs and compiled kernels");
  a.migrate = cache->add_subcommand(
      "migrate", "Renew tuned entries whose kernels compile to the same machine code from the current templates "
                 "as from the templates they were tuned with (NVRTC only, no GPU)");
  a.migrate->add_option("--old-kernels", a.old_kernels,
                         "Directory of the kernels_src/*.cuh the entries were tuned with")
      ->required()->check(CLI::ExistingDirectory);
  a.migrate->add_option("--arch", a.migrate_arch, "Architecture to compare the machine code for");
  a.migrate->add_flag("--dry-run", a.migrate_dry, "Report only; write nothing");
  a.migrate->add_option("files", a.migrate_files, "Tuned-cache files")->required()->check(CLI::ExistingFile);
  a.prune = cache->add_subcommand(
      "prune", "Drop the entries whose winner is no faster than the config model's config by > 2% (their own timings)");
  a.prune->add_flag("--dry-run", a.prune_dry, "Report only; write nothing");
  a.prune->add_option("files", a.prune_files, "Tuned-cache files")->required()->check(CLI::ExistingFile);
}

// Every subcommand's options, bound to the CLI::App.
struct CliArgs {
  GlobalArgs global;
  TuneArgs tune;
  ExplainArgs explain;
  BenchArgs bench;
  CompileArgs compile;
  CacheArgs cache;
  CLI::App* doctor = nullptr;
};

EngineOptions engine_options(const CliArgs& a) {
  EngineOptions opt = EngineOptions::from_env();
  if (!a.global.cache_dir.empty()) opt.cache_dir = a.global.cache_dir;
  opt.verbose = a.global.verbose || a.tune.cmd->parsed();  // tuning always shows its progress
  // tune decides itself what to tune; explain() then reports exact cached
  // entries whatever $NORMJIT_TUNE says (Always would hide them).
  if (a.tune.cmd->parsed()) opt.tune_policy = TunePolicy::Never;
  return opt;
}

// Runs the subcommand that was given.
int dispatch(Engine& engine, const CliArgs& a) {
  const TuneArgs& t = a.tune;
  const CacheArgs& c = a.cache;
  if (t.cmd->parsed() && !t.grid.empty())
    return cmd_tune_grid(engine, t.grid, t.list, t.max_seconds, t.workers, t.devices);
  if (t.cmd->parsed())
    return cmd_tune(engine, t.shapes, t.vs_untuned, t.json, t.retune, t.list, t.whole_grid, t.devices, t.workers);
  if (a.explain.cmd->parsed()) return cmd_explain(engine, a.explain.shapes, a.explain.device);
  if (a.bench.cmd->parsed()) return cmd_bench(engine, a.bench.shapes, a.bench.json, a.bench.reps, !a.bench.no_check);
  if (a.compile.cmd->parsed() && !a.compile.dump_dir.empty())
    return cmd_compile_dump(a.compile.shapes, a.compile.config, a.compile.arch, a.compile.dump_dir);
  if (a.compile.cmd->parsed()) return cmd_compile(engine, a.compile.shapes, a.compile.arch);
  if (c.list->parsed()) return cmd_cache_list(engine);
  if (c.show->parsed()) return cmd_cache_show(engine, c.show_file);
  if (c.clear->parsed()) return cmd_cache_clear(engine);
  if (c.migrate->parsed()) return cmd_cache_migrate(c.old_kernels, c.migrate_arch, c.migrate_files, !c.migrate_dry);
  if (c.prune->parsed()) return cmd_cache_prune(c.prune_files, !c.prune_dry);
  if (a.doctor->parsed()) return cmd_doctor(engine);
  return 0;
}

// Runs the parsed command line; errors become the exit codes 1 and 2.
int run_command(CLI::App& app, const CliArgs& a) {
  if (!a.global.trace_file.empty()) detail::trace::open(a.global.trace_file);
  try {
    Engine engine(engine_options(a));
    return dispatch(engine, a);
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
}

}  // namespace

int main(int argc, char** argv) {
  KernelClock::prefer_cupti();  // tune and bench time kernels as profilers do (kernel_clock.hpp)
  CLI::App app{"normjit: run-time compiled RMSNorm and LayerNorm kernels (NVRTC + CUDA Driver API): tune, benchmark, precompile"};
  app.set_version_flag("--version", std::string("normjit ") + NORMJIT_VERSION_STRING);
  app.require_subcommand(1);
  CliArgs a;
  add_global_options(app, a.global);
  add_tune_command(app, a.tune);
  add_explain_command(app, a.explain);
  add_bench_command(app, a.bench);
  add_compile_command(app, a.compile);
  add_cache_command(app, a.cache);
  a.doctor = app.add_subcommand("doctor", "Report driver, NVRTC, devices, cache paths and what is missing");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, version or the error
    return rc == 0 ? 0 : 2;      // one exit code for every bad command line
  }
  return run_command(app, a);
}
