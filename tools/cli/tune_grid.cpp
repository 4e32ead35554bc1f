// normjit tune --grid: tunes every shape of a grid file by local search, on several worker threads.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "grid.hpp"
#include "device/driver.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "compile/specialization.hpp"
#include "tuning/tuned_cache.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace normjit::cli {

namespace {

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
  // `device`: one device of the run's kind (its facts; every device of the
  // kind takes groups from this run).
  GridRun(Engine& engine, const tools::Grid& g, double limit_s, CUdevice device)
      : grid(g),
        max_seconds(limit_s),
        dev(device_info(device)),
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
// take turns on their GPU through gpu_mutex()). `ordinal`: the device this
// worker tunes on (-1: the current one).
void grid_worker(GridRun& run, int ordinal) {
  if (ordinal >= 0)
    use_device(ordinal);
  else
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

}  // namespace

// Tunes every shape of a grid file by local search, sharing compiled
// kernels, checks and buffers across the M values of one variant and N, and
// merging into the user cache every 30 s. Entries already current in the
// user cache are skipped, so a stopped run resumes.
int cmd_tune_grid(Engine& engine, const std::string& grid_path, bool list, double max_seconds, int workers,
                  const std::vector<int>& devices) {
  const tools::Grid grid = tools::read_grid(grid_path);
  if (list) return list_grid(grid);
  if (!require_gpu("tuning")) return kExitNoGpu;
  // One run a device kind (its file, its queue of groups); `workers` threads
  // a device. Without --devices: the current device.
  std::vector<std::pair<std::unique_ptr<GridRun>, std::vector<int>>> runs;
  if (devices.empty()) {
    runs.emplace_back(std::make_unique<GridRun>(engine, grid, max_seconds, current_device()), std::vector<int>{-1});
  } else {
    check_devices(devices);
    for (int d : devices) {
      const CUdevice dev = use_device(d);
      const DeviceInfo info = device_info(dev);
      const std::string key = DeviceFingerprint{info.name,     info.cc_major, info.cc_minor, info.sm_count,
                                                info.l2_bytes, info.memory_gbps}
                                  .key();
      auto it = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.first->fp.key() == key; });
      if (it == runs.end()) {
        runs.emplace_back(std::make_unique<GridRun>(engine, grid, max_seconds, dev), std::vector<int>{});
        it = std::prev(runs.end());
      }
      it->second.push_back(d);
    }
  }
  std::vector<std::thread> pool;
  for (auto& [run, ordinals] : runs)
    for (int d : ordinals)
      for (int w = 0; w < workers; ++w) pool.emplace_back([r = run.get(), d] { grid_worker(*r, d); });
  for (auto& t : pool) t.join();
  int failed = 0;
  for (auto& [run, ordinals] : runs) {
    run->flush_pending();
    fmt::print("grid {}: {} tuned, {} already current, {} groups failed, {:.0f} s{}; stored in {}\n", grid_path,
               run->tuned, run->skipped, run->failed, run->elapsed(),
               run->stopped ? " (stopped at --max-seconds; run again to resume)" : "", run->file);
    failed += static_cast<int>(run->failed);
  }
  return failed ? 1 : 0;
}

}  // namespace normjit::cli
