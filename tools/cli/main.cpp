// normjit: tune, benchmark, precompile and inspect normjit kernels.
//
//   normjit tune    --model config.json [--tokens 1,1024,8192] [--list] [--retune] | --shape rms:bf16:8192x4096 ...
//                   [--vs-untuned --json out.json]
//   normjit tune    --grid autotune_cache/grid/grid.json [--list] [--max-seconds S]
//   normjit explain --shape rms:bf16:8192x4096 ...
//   normjit bench   --model config.json | --shape ... [--json out.json]
//   normjit compile --arch sm_90 --model config.json | --shape ...
//   normjit cache   list | show | clear
//   normjit doctor
//
// Exit codes: 0 ok, 1 error, 2 bad command line, 3 no GPU (for tune/bench).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tuning/autotune.hpp"
#include "device/kernel_clock.hpp"
#include "tuning/cache_migrate.hpp"
#include "config/config_model.hpp"
#include "config/config_grid.hpp"
#include "grid.hpp"
#include "tuning/check.hpp"
#include "device/driver.hpp"
#include "core/host_dtype.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "runtime/ops.hpp"
#include "core/trace.hpp"
#include "core/reference.hpp"
#include "models/model_norms.hpp"
#include "compile/specialization.hpp"
#include "core/tensors.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"

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
  auto* model = app->add_option("--model", o.model, "Hugging Face config.json: every norm its forward and backward call (hidden, fused residual add, QK-norm, MLA, FP8; see tune --list)")
                    ->check(CLI::ExistingFile);
  app->add_option("--shape", o.shapes,
                  "A shape, <rms|ln>:<dtype>:<M>x<N>[:<option>]..., e.g. rms:bf16:8192x4096, ln:fp16:4096x4096, "
                  "rms:bf16:8192x4096:res (fused residual add), rms:bf16:32768x128:heads=32:x_stride=6144 (QK-norm on "
                  "a QKV view); options w= y= res[=] fp32sum dres nw nb off= cast= eps= heads= x_stride= (repeatable)");
  app->add_option("--tokens", o.tokens, "Token counts for --model, e.g. 1,1024,8192 (the default)")->delimiter(',')->needs(model);
  app->add_option("--op", o.op, "Which kernels")->check(CLI::IsMember({"fwd", "bwd", "both"}));
}

std::vector<Op> ops_of(const std::string& op) {
  if (op == "fwd") return {Op::Forward};
  if (op == "bwd") return {Op::Backward};
  return {Op::Forward, Op::Backward};
}

// A shape and the ops to run on it: --op's for a --shape; for a --model
// shape, those of --op that the model calls (hidden_res and hidden_fp8 are
// forward only).
struct Work {
  NamedShape shape;
  std::vector<Op> ops;
  const ModelNorm* norm = nullptr;  // the model's norm, for --model shapes
};

struct Resolved {
  std::optional<ModelNorms> model;
  std::vector<Work> work;
};

Resolved resolve_shapes(const ShapeOptions& o) {
  Resolved r;
  const auto wanted = ops_of(o.op);
  if (!o.model.empty()) {
    r.model = model_norms(o.model, o.tokens);
    for (const auto& n : r.model->norms) {
      std::vector<Op> ops;
      for (Op op : n.ops)
        if (std::find(wanted.begin(), wanted.end(), op) != wanted.end()) ops.push_back(op);
      if (!ops.empty()) r.work.push_back({n.shape, ops, &n});
    }
  }
  for (const auto& s : o.shapes) r.work.push_back({parse_shape_spec(s), wanted, nullptr});
  if (r.work.empty()) {
    if (!o.model.empty()) throw CLI::ValidationError("--op", fmt::format("--model '{}' calls no {} norm", o.model, o.op));
    throw CLI::ValidationError("--model or --shape", "give at least one --model or --shape");
  }
  return r;
}

std::string ops_label(const std::vector<Op>& ops) {
  std::string s;
  for (Op op : ops) s += (s.empty() ? "" : "+") + std::string(op_name(op));
  return s;
}

// tune --list: the shapes, their ops and, for a model, the config keys each
// came from. Needs no GPU.
int cmd_list(const ShapeOptions& so, const Resolved& r) {
  if (r.model) {
    fmt::print("{}: model_type {}: {}; tokens {}\n", so.model, r.model->model_type, r.model->summary,
               fmt::join(so.tokens, ", "));
    std::size_t kw = 0;
    for (const auto& k : r.model->kinds) kw = std::max(kw, k.first.size());
    for (const auto& [kind, modules] : r.model->kinds) fmt::print("  {:<{}}  {}\n", kind, kw, modules);
  }
  std::size_t nw = 0, sw = 0, ow = 0, fwd = 0, bwd = 0;
  for (const auto& w : r.work) {
    nw = std::max(nw, w.shape.name.size());
    sw = std::max(sw, full_shape_spec(w.shape.desc).size());
    ow = std::max(ow, ops_label(w.ops).size());
  }
  for (const auto& w : r.work) {
    std::string line = fmt::format("{:<{}}  {:<{}}  {:<{}}", w.shape.name, nw, ops_label(w.ops), ow,
                                   full_shape_spec(w.shape.desc), sw);
    if (w.norm) {
      line += fmt::format("  <- {}", fmt::join(w.norm->keys, ", "));
      if (!w.norm->also.empty()) line += fmt::format("  (also {})", fmt::join(w.norm->also, ", "));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
    for (Op op : w.ops) ++(op == Op::Forward ? fwd : bwd);
  }
  fmt::print("{} shapes, {} kernels ({} fwd, {} bwd)\n", r.work.size(), fwd + bwd, fwd, bwd);
  return 0;
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

// Fastest first; rejected candidates (no time) last, in their order.
void sort_by_time(std::vector<CandidateTiming>& c) {
  std::stable_sort(c.begin(), c.end(), [](const CandidateTiming& a, const CandidateTiming& b) {
    return (a.median_us > 0 ? a.median_us : 1e30) < (b.median_us > 0 ? b.median_us : 1e30);
  });
}

// Medians of each config on `d`, timed in rounds that alternate between the
// configs (so a drift in clocks or temperature reaches both alike).
std::vector<double> time_configs(Op op, const NormDesc& d, const std::vector<LaunchConfig>& cfgs, KernelCache& jit,
                                 int rounds = 5, int reps = 15) {
  const DeviceInfo dev = device_info(current_device());
  const DeviceBuffer flush = make_flush_buffer(dev);
  Scratch s(op, d, 0x71e0000u + d.N);
  std::vector<std::shared_ptr<const LoadedKernel>> ks;
  // Each as a launch of d.M runs it (staged where the engine stages it).
  for (const auto& c : cfgs) ks.push_back(jit.get(make_spec(op, d, staged_for_launch(op, d, c, dev.facts())), dev.arch()));
  const auto fin = op == Op::Backward ? jit.get(finalize_spec(d), dev.arch()) : nullptr;
  std::size_t ws = 0;
  for (std::size_t i = 0; i < cfgs.size(); ++i)
    if (op == Op::Backward) ws = std::max(ws, backward_workspace_bytes(backward_geometry(*ks[i], d, cfgs[i], dev.sm_count), d));
  if (ws) s.workspace = DeviceBuffer(ws);
  std::vector<std::vector<double>> t(cfgs.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < cfgs.size(); ++i)
      t[i].push_back(median_us(
          [&](CUstream st) {
            if (op == Op::Forward)
              launch_forward(*ks[i], d, s.forward_tensors(), dev.sm_count, st);
            else
              launch_backward(*ks[i], *fin, d, s.backward_tensors(), backward_geometry(*ks[i], d, cfgs[i], dev.sm_count), st);
          },
          flush, reps));
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// Counts and results of one `normjit tune` run (not --grid).
struct TuneTally {
  nlohmann::json rows = nlohmann::json::array();  // --vs-untuned's comparisons
  std::map<std::string, std::string> tuned_here;  // cache key -> the shape tuned for it in this run
  int tuned = 0, skipped = 0, failed = 0;
};

// Whether `op` on `w` needs no tuning: its cache key was tuned earlier in this
// run or, for a --model shape unless `force` (--retune or --vs-untuned), it
// has a current tuned entry. Prints why and counts it when skipped.
bool skip_cached(Engine& engine, const Work& w, Op op, const std::string& key, bool force, TuneTally& t) {
  if (auto it = t.tuned_here.find(key); it != t.tuned_here.end()) {
    fmt::print("        skipped (cached): same cache key as {}, tuned in this run\n", it->second);
    ++t.skipped;
    return true;
  }
  if (w.norm && !force) {
    const ConfigExplanation x = engine.explain(op, w.shape.desc);
    if (is_cache_hit(x.source)) {
      fmt::print("        skipped (cached): {} {} {:.2f} us in the {} (--retune tunes it again)\n", key,
                 x.config.str(), x.entry_us, config_source_name(x.source));
      ++t.skipped;
      return true;
    }
  }
  return false;
}

void print_tuned(const TuneResult& r, double secs) {
  int passed = 0;
  for (const auto& c : r.candidates) passed += c.median_us > 0;
  fmt::print("        tuned: winner {} {:.2f} us ({} of {} candidates passed, {:.1f} s){}\n", r.winner.str(),
             r.winner_us, passed, r.candidates.size(), secs,
             r.winner == r.model ? " = the config model's"
             : r.model_us > 0    ? fmt::format("; the model's {} {:.2f} us", r.model.str(), r.model_us)
                                 : "");
}

// Every candidate's tuned time: lets a new rule be scored offline.
nlohmann::json candidate_times(const TuneResult& r) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : r.candidates)
    if (c.median_us > 0) a.push_back({c.config.str(), c.median_us});
  return a;
}

// --vs-untuned: times the untuned config against the fastest candidate of the
// whole grid, prints the ratio and returns it as a JSON row.
nlohmann::json compare_untuned(Op op, const NamedShape& s, const TuneResult& r, const ConfigExplanation& untuned,
                               double secs, KernelCache& jit) {
  // Against the fastest candidate of the whole grid (before the model's
  // config is preferred within 2%): the model's gap, not the rule's.
  const int best = pick_winner(r.candidates);
  const LaunchConfig fastest = best >= 0 ? r.candidates[best].config : r.winner;
  const auto t = time_configs(op, s.desc, {fastest, untuned.config}, jit);
  fmt::print("        untuned: {} {} {:.2f} us vs tuned {:.2f} us: {:.3f}x\n", config_source_name(untuned.source),
             untuned.config.str(), t[1], t[0], t[1] / t[0]);
  return {{"shape", s.name}, {"op", op_label(op, s.desc.norm)}, {"key", r.shape_key},
          {"tuned", fastest.str()}, {"tuned_us", t[0]}, {"untuned", untuned.config.str()},
          {"untuned_source", config_source_name(untuned.source)}, {"untuned_from", untuned.from_key},
          {"untuned_us", t[1]}, {"ratio", t[1] / t[0]}, {"tune_seconds", secs},
          {"candidates", r.candidates.size()}, {"all", candidate_times(r)}};
}

// Tunes `op` on `s` and prints the winner (and, with --vs-untuned, the
// comparison); a failure is printed and counted.
void tune_one(Engine& engine, Op op, const NamedShape& s, const std::string& key, bool vs_untuned, bool whole_grid,
              KernelCache& jit, TuneTally& t) {
  try {
    // What the shape would run were it not tuned: resolved before tuning it.
    const ConfigExplanation untuned = engine.explain(op, s.desc, /*skip_exact=*/true);
    const auto t0 = std::chrono::steady_clock::now();
    const TuneResult r = engine.tune(op, s.desc, whole_grid || vs_untuned);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    print_tuned(r, secs);
    ++t.tuned;
    t.tuned_here.emplace(key, s.name);
    if (vs_untuned) t.rows.push_back(compare_untuned(op, s, r, untuned, secs, jit));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidArgument) throw;  // a bad shape: a bad command line
    // A failure of one shape (no candidate passed, a driver error) does
    // not stop the others; the exit code reports it.
    fmt::print("        FAILED: {}\n", e.what());
    ++t.failed;
  }
}

void write_tune_json(const std::string& json_path, const nlohmann::json& rows) {
  const DeviceInfo dev = device_info(current_device());
  nlohmann::json j = {{"gpu", dev.name}, {"sm_count", dev.sm_count}, {"timing", timing_method()}, {"rows", rows}};
  std::ofstream(json_path) << j.dump(1) << "\n";
  fmt::print("wrote {}\n", json_path);
}

// Tunes each shape and op. A --model's shapes are a pre-warm: those with a
// current tuned entry for this device and kernel source (user or shipped
// cache, or tuned earlier in this run under the same cache key) are skipped
// unless --retune or --vs-untuned; --shape's are always tuned.
int cmd_tune(Engine& engine, const ShapeOptions& so, bool vs_untuned, const std::string& json_path, bool retune,
             bool list, bool whole_grid) {
  const Resolved res = resolve_shapes(so);
  if (list) return cmd_list(so, res);
  if (!require_gpu("tuning")) return kExitNoGpu;
  int total = 0;
  for (const auto& w : res.work) total += static_cast<int>(w.ops.size());
  KernelCache jit(engine.cache_dir() + "/kernels");
  TuneTally t;
  int i = 0;
  for (const auto& w : res.work)
    for (Op op : w.ops) {
      const NamedShape& s = w.shape;
      ++i;
      fmt::print("[{}/{}] {} {} {}\n", i, total, op_label(op, s.desc.norm), s.name, s.desc.str());
      std::fflush(stdout);
      const std::string key = shape_key(op, s.desc);
      if (skip_cached(engine, w, op, key, retune || vs_untuned, t)) continue;
      tune_one(engine, op, s, key, vs_untuned, whole_grid, jit, t);
    }
  fmt::print("tune: {} tuned, {} skipped (cached), {} failed; tuned configs stored in {}/tuned\n", t.tuned, t.skipped,
             t.failed, engine.cache_dir());
  if (!json_path.empty()) write_tune_json(json_path, t.rows);
  return t.failed ? 1 : 0;
}

// tune --grid --list: the grid's shapes. Needs no GPU.
int list_grid(const tools::Grid& grid) {
  for (const auto& g : grid.groups)
    for (auto m : g.Ms) fmt::print("{} {}\n", g.op == Op::Forward ? "fwd" : "bwd", g.spec(m));
  fmt::print("{} N values, {} groups, {} entries\n", grid.N.size(), grid.groups.size(), grid.entries());
  return 0;
}

// The metadata the tuned entries of this run are stored with.
CacheMetadata current_metadata() {
  int driver = 0;
  cu().cuDriverGetVersion(&driver);
  return {NORMJIT_VERSION_STRING, kernel_source_hash(), nvrtc().version, driver};
}

// The entries of tuned-cache `file` that are current (not stale), when the
// file is this device's.
std::map<std::string, TunedEntry> current_entries(const std::string& file, const DeviceFingerprint& fp) {
  std::map<std::string, TunedEntry> done;
  if (auto f = read_tuned_cache_file(file, default_warn); f && f->device.key() == fp.key())
    for (auto& [k, e] : f->entries)
      if (entry_staleness(k, e).empty()) done.emplace(k, std::move(e));
  return done;
}

// One `tune --grid` run: what its worker threads share.
struct GridRun {
  GridRun(Engine& engine, const tools::Grid& g, double limit_s)
      : grid(g),
        max_seconds(limit_s),
        dev(device_info(current_device())),
        fp{dev.name, dev.cc_major, dev.cc_minor, dev.sm_count, dev.l2_bytes, dev.memory_gbps},
        md(current_metadata()),
        file(engine.cache_dir() + "/tuned/" + fp.slug() + ".json"),
        done(current_entries(file, fp)),
        last_merge(elapsed()),
        jit(engine.cache_dir() + "/kernels") {}

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }

  // Merges the entries tuned since the last merge into the user cache.
  void flush_pending() {
    if (pending.empty()) return;
    merge_into_tuned_cache_file(file, fp, md, pending, 60000);
    pending.clear();
    last_merge = elapsed();
  }

  const tools::Grid& grid;
  const double max_seconds;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  const DeviceInfo dev;
  const DeviceFingerprint fp;
  const CacheMetadata md;
  const std::string file;
  const std::map<std::string, TunedEntry> done;  // current before this run
  std::map<std::string, TunedEntry> pending;     // tuned, not merged yet
  double last_merge;
  KernelCache jit;
  std::size_t tuned = 0, skipped = 0, failed = 0, idx = 0;
  bool stopped = false;
  std::mutex mu;  // guards the counters, pending, printing and merging
  std::atomic<std::size_t> next{0};
};

// The M values of group `g` (its shape `big` but for M) with no current entry.
std::vector<std::int64_t> pending_Ms(const tools::GridGroup& g, const NormDesc& big,
                                     const std::map<std::string, TunedEntry>& done) {
  std::vector<std::int64_t> todo;
  for (auto m : g.Ms) {
    NormDesc d = big;
    d.M = m;
    if (!done.count(shape_key(g.op, d))) todo.push_back(m);
  }
  return todo;
}

// Stores a grid shape's tuning result as pending and prints it.
void record_grid_result(GridRun& run, const tools::GridGroup& g, const NormDesc& d, TuneResult& r) {
  // The record keeps the eight fastest candidates and every rejection.
  sort_by_time(r.candidates);
  std::vector<CandidateTiming> keep;
  for (const auto& c : r.candidates)
    if (c.median_us <= 0 || keep.size() < 8) keep.push_back(c);
  std::lock_guard<std::mutex> lk(run.mu);
  run.pending[r.shape_key] = TunedEntry{shape_spec(d), tuned_kernel_hash(g.op, d, r.winner), r.winner, r.winner_us,
                                        utc_now(), keep};
  ++run.tuned;
  fmt::print("[{}/{} {:.0f}s] {} {} -> {} {:.2f} us ({} timed)\n", run.idx, run.grid.entries(), run.elapsed(),
             g.op == Op::Forward ? "fwd" : "bwd", g.spec(d.M), r.winner.str(), r.winner_us, r.candidates.size());
}

// Tunes the M values `todo` of group `g` by local search, each from the
// previous one's winner, sharing one scratch and the checks already passed.
void tune_grid_group(GridRun& run, const tools::GridGroup& g, const NormDesc& big,
                     const std::vector<std::int64_t>& todo) {
  std::unique_ptr<Scratch> scratch;
  try {
    {
      std::lock_guard<std::mutex> gpu(gpu_mutex());
      scratch = std::make_unique<Scratch>(g.op, big, 0x5eed0000u + static_cast<std::uint64_t>(big.N));
    }
    std::set<std::string> checked;
    std::optional<LaunchConfig> start;
    for (auto m : todo) {
      NormDesc d = big;
      d.M = m;
      TuneOptions o;
      o.local = true;
      o.reps = 10;
      o.check_elements = std::int64_t{1} << 18;
      o.checked = &checked;
      o.scratch = scratch.get();
      if (start && config_valid(g.op, d, *start, nullptr, run.dev.max_cluster)) o.start = start;
      TuneResult r = autotune(g.op, d, run.dev, run.jit, {}, o);
      start = r.winner;
      record_grid_result(run, g, d, r);
    }
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lk(run.mu);
    ++run.failed;
    fmt::print(stderr, "normjit: {} {}: {}\n", g.op == Op::Forward ? "fwd" : "bwd", g.spec(g.Ms.back()), e.what());
  }
  {
    std::lock_guard<std::mutex> gpu(gpu_mutex());
    scratch.reset();
  }
}

// Several groups at once: one compiles while another times (the tuners
// take turns on the GPU through gpu_mutex()).
void grid_worker(GridRun& run) {
  current_device();  // the primary context, current on this thread
  for (std::size_t gi; (gi = run.next++) < run.grid.groups.size();) {
    const auto& g = run.grid.groups[gi];
    if (run.elapsed() > run.max_seconds) {
      std::lock_guard<std::mutex> lk(run.mu);
      run.stopped = true;
      break;
    }
    const NormDesc big = parse_shape_spec(g.spec(g.Ms.back())).desc;
    const std::vector<std::int64_t> todo = pending_Ms(g, big, run.done);
    {
      std::lock_guard<std::mutex> lk(run.mu);
      run.skipped += g.Ms.size() - todo.size();
      run.idx += g.Ms.size();
    }
    if (todo.empty()) continue;
    tune_grid_group(run, g, big, todo);
    std::lock_guard<std::mutex> lk(run.mu);
    std::fflush(stdout);
    if (run.elapsed() - run.last_merge > 30) run.flush_pending();
  }
}

// Tunes every shape of a grid file by local search, sharing compiled
// kernels, checks and buffers across the M values of one variant and N, and
// merging into the user cache every 30 s. Entries already current in the
// user cache are skipped, so a stopped run resumes.
int cmd_tune_grid(Engine& engine, const std::string& grid_path, bool list, double max_seconds, int workers) {
  const tools::Grid grid = tools::read_grid(grid_path);
  if (list) return list_grid(grid);
  if (!require_gpu("tuning")) return kExitNoGpu;
  GridRun run(engine, grid, max_seconds);
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back([&run] { grid_worker(run); });
  for (auto& t : pool) t.join();
  run.flush_pending();
  fmt::print("grid {}: {} tuned, {} already current, {} groups failed, {:.0f} s{}; stored in {}\n", grid_path,
             run.tuned, run.skipped, run.failed, run.elapsed(),
             run.stopped ? " (stopped at --max-seconds; run again to resume)" : "", run.file);
  return run.failed ? 1 : 0;
}

// Where each shape's config comes from, and the candidates' times when known.
// With --device (a tuned-cache file's device slug) no GPU is needed: the
// device's facts come from that file, and the policy is Never's.
int cmd_explain(Engine& engine, const ShapeOptions& so, const std::string& device) {
  const auto shapes = resolve_shapes(so);
  std::unique_ptr<TunedCache> offline;
  DeviceFacts facts;
  if (!device.empty()) {
    std::vector<std::string> dirs = {engine.cache_dir() + "/tuned"};
    for (const auto& d : engine.shipped_cache_dirs()) dirs.push_back(d);
    std::optional<TunedCacheFile> file;
    std::vector<std::string> known;
    for (const auto& dir : dirs) {
      for (const auto& f : list_tuned_cache_files(dir, [](const std::string&) {}))
        known.push_back(f.device.slug());
      if (!file) file = read_tuned_cache_file((fs::path(dir) / (device + ".json")).string(), default_warn);
    }
    if (!file)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("--device '{}': no tuned-cache file {}.json in the user or shipped caches (known: {})",
                              device, device, known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    offline = std::make_unique<TunedCache>(engine.cache_dir() + "/tuned", engine.shipped_cache_dirs(), file->device,
                                           file->metadata);
    facts = file->device.facts();
  } else if (!require_gpu("explain without --device (the device selects the tuned-cache files)")) {
    return kExitNoGpu;
  }
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NamedShape& s = w.shape;
      const ConfigExplanation x = offline ? config_from_caches(*offline, op, s.desc, facts, TunePolicy::Never, false)
                                          : engine.explain(op, s.desc);
      fmt::print("{} {}\n  key:     {}\n  config:  {}\n  source:  {}\n  reason:  {}\n", op_label(op, s.desc.norm),
                 s.name, x.shape_key, x.config.str(), config_source_name(x.source), x.reason);
      if (!x.from_key.empty() && x.from_key != x.shape_key) fmt::print("  from:    {}\n", x.from_key);
      if (offline) {
        // What a launch of this M runs (the engine stages weights where all CTAs are resident at once).
        const LaunchConfig run = staged_for_launch(op, s.desc, x.config, facts);
        if (run != x.config)
          fmt::print("  launch:  {} (weight and bias staged: every CTA of M = {} is resident at once)\n", run.str(),
                     s.desc.M);
      }
      if (!x.candidates.empty()) {
        fmt::print("  candidates of that entry (tuned times, us):\n");
        auto c = x.candidates;
        sort_by_time(c);
        for (const auto& t : c)
          fmt::print("    {:<20} {}\n", t.config.str(),
                     t.median_us > 0 ? fmt::format("{:9.2f}", t.median_us) : "rejected: " + t.rejected);
      }
    }
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

// ---- compile ----------------------------------------------------------------

int cmd_compile(Engine& engine, const ShapeOptions& so, const std::string& arch) {
  const auto shapes = resolve_shapes(so);
  nvrtc();  // fail early, with the paths tried, when NVRTC is missing
  int total = 0;
  std::vector<std::string> failures;
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NamedShape& s = w.shape;
      const int n = engine.precompile(op, s.desc, arch, &failures);
      fmt::print("{} {:<16} {:<32} {} variants for {}\n", op_label(op, s.desc.norm), s.name, s.desc.str(), n, arch);
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
      DeviceFingerprint fp{d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes, d.memory_gbps};
      fmt::print("  [{}] {} ({}, {} SMs, L2 {} MiB); tuned-cache file {}.json\n", i, d.name, d.arch(), d.sm_count,
                 d.l2_bytes >> 20, fp.slug());
    }
    fmt::print("timing (tune, bench): {}\n", timing_method());
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

// cache migrate: renews entries whose machine code an edit left alone.
int cmd_cache_migrate(const std::string& old_dir, const std::string& arch, const std::vector<std::string>& files,
                      bool write) {
  const SourceMap old_files = read_kernel_dir(old_dir, "--old-kernels");
  int changed = 0;
  for (const auto& f : files) {
    const MigrationReport r =
        migrate_tuned_cache_file(f, old_files, arch, write, [](const std::string& w) { fmt::print(stderr, "{}\n", w); });
    fmt::print("{}: {} entries: {} current, {} renewed (same machine code on {}), {} changed (stale: re-tune), "
               "{} from other sources{}\n",
               f, r.entries, r.current, r.migrated, arch, r.changed, r.foreign, write ? "" : " (dry run)");
    for (const auto& k : r.changed_keys) fmt::print("  changed: {}\n", k);
    changed += r.changed;
  }
  return changed > 0 ? 1 : 0;
}

// cache prune: keeps only the entries that pay, those whose winner beat the
// config model's config by more than 2% in the entry's own table. An entry
// whose table lacks the model's config is kept (nothing says it does not pay),
// unless it was tuned before its rows could peel (norm_fwd.cuh): a table of
// narrow vectors only, for a row the grid now moves in whole vectors. Stale
// entries (their kernels changed since tuning, and `cache migrate` found
// other machine code) go too: their timings describe code that is gone.
int cmd_cache_prune(const std::vector<std::string>& files, bool write) {
  for (const auto& path : files) {
    const auto file = read_tuned_cache_file(path, default_warn);
    if (!file) throw Error(ErrorKind::Cache, fmt::format("cannot read tuned cache {}", path));
    const DeviceFacts facts = file->device.facts();
    std::set<std::string> drop;
    std::size_t unknown = 0, unpeeled = 0, stale = 0;
    for (const auto& [key, e] : file->entries) {
      if (!entry_staleness(key, e).empty()) {
        drop.insert(key);
        ++stale;
        continue;
      }
      const Op op = shape_key_op(key);
      const NormDesc desc = parse_shape_spec(e.shape).desc;
      if (peeled(op, desc, max_vec(op, desc)) &&
          std::none_of(e.candidates.begin(), e.candidates.end(),
                       [&](const CandidateTiming& c) { return peeled(op, desc, c.config.vec); })) {
        drop.insert(key);
        ++unpeeled;
        continue;
      }
      const LaunchConfig model = heuristic_config(op, desc, facts);
      double model_us = e.winner == model ? e.winner_us : -1;
      for (const auto& c : e.candidates)
        if (c.config == model && c.median_us > 0) model_us = c.median_us;
      if (model_us < 0)
        ++unknown;
      else if (e.winner_us * 1.02 >= model_us)
        drop.insert(key);
    }
    if (write) remove_from_tuned_cache_file(path, drop);
    fmt::print("{}: {} entries: {} no faster than the config model's config by > 2%, {} tuned before their rows "
               "peeled and {} stale ({}), {} pay, {} without the model's config in their table (kept)\n",
               path, file->entries.size(), drop.size() - unpeeled - stale, unpeeled, stale,
               write ? "removed" : "dry run", file->entries.size() - drop.size() - unknown, unknown);
  }
  return 0;
}

// ---- command line -----------------------------------------------------------

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
                   "With --grid: shapes tuned at once (compiles overlap timing; timing is serial)")
      ->check(CLI::Range(1, 64));
  tune->add_flag("--list", a.list,
                 "Print the shapes (with --model: each norm, its ops and the config keys it came from; with --grid: "
                 "the grid's shapes) and stop; no GPU needed");
  tune->add_flag("--retune", a.retune,
                 "With --model: tune every shape, also those with a current tuned entry for this GPU (skipped otherwise)");
  tune->add_option("--max-seconds", a.max_seconds, "With --grid: stop starting new shapes after this long")
      ->check(CLI::PositiveNumber);
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
};

void add_compile_command(CLI::App& app, CompileArgs& a) {
  auto* compile = app.add_subcommand("compile", "Compile every grid variant into the kernel cache (NVRTC only, no GPU)");
  a.cmd = compile;
  add_shape_options(compile, a.shapes);
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
  if (t.cmd->parsed() && !t.grid.empty()) return cmd_tune_grid(engine, t.grid, t.list, t.max_seconds, t.workers);
  if (t.cmd->parsed()) return cmd_tune(engine, t.shapes, t.vs_untuned, t.json, t.retune, t.list, t.whole_grid);
  if (a.explain.cmd->parsed()) return cmd_explain(engine, a.explain.shapes, a.explain.device);
  if (a.bench.cmd->parsed()) return cmd_bench(engine, a.bench.shapes, a.bench.json, a.bench.reps, !a.bench.no_check);
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
