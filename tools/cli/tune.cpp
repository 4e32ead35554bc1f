// normjit tune (without --grid): tunes --model and --shape shapes, --list, --vs-untuned.
#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tuning/autotune.hpp"
#include "device/kernel_clock.hpp"
#include "config/config_grid.hpp"
#include "device/driver.hpp"
#include "runtime/ops.hpp"
#include "compile/specialization.hpp"
#include "core/variant.hpp"
#include "tuning/cache_file.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace normjit::cli {

namespace {

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

// Medians of each config on `d`, timed in rounds that alternate between the
// configs (so a drift in clocks or temperature reaches both alike).
std::vector<double> time_configs(Op op, const NormDesc& d, const std::vector<LaunchConfig>& cfgs, KernelCache& jit,
                                 int rounds = 5, int reps = 15) {
  // The device alone from the first allocation to the last free, as a
  // tuner times (workers of `tune` time one at a time a device).
  std::lock_guard<std::mutex> gpu(gpu_mutex());
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
  std::mutex mu;  // devices of one kind tune from one tally (tune --devices)
  nlohmann::json rows = nlohmann::json::array();  // --vs-untuned's comparisons
  std::map<std::string, std::string> tuned_here;  // cache key -> the shape tuned for it in this run
  int tuned = 0, skipped = 0, failed = 0;
};

// Whether `op` on `w` needs no tuning: its cache key was tuned earlier in this
// run (or is being tuned by another worker) or, for a --model shape unless
// `force` (--retune or --vs-untuned), it has a current tuned entry. Prints
// why and counts it when skipped; otherwise claims the key for this item.
bool skip_cached(Engine& engine, const Work& w, Op op, const std::string& key, bool force, TuneTally& t,
                 std::string& out) {
  auto tuned_in_run = [&] {
    auto it = t.tuned_here.find(key);
    if (it == t.tuned_here.end()) return false;
    fmt::format_to(std::back_inserter(out), "        skipped (cached): same cache key as {}, tuned in this run\n",
                   it->second);
    ++t.skipped;
    return true;
  };
  {
    std::lock_guard<std::mutex> lk(t.mu);
    if (tuned_in_run()) return true;
  }
  if (w.norm && !force) {
    const ConfigExplanation x = engine.explain(op, w.shape.desc);
    if (is_cache_hit(x.source)) {
      fmt::format_to(std::back_inserter(out), "        skipped (cached): {} {} {:.2f} us in the {} (--retune tunes it again)\n",
                     key, x.config.str(), x.entry_us, config_source_name(x.source));
      std::lock_guard<std::mutex> lk(t.mu);
      ++t.skipped;
      return true;
    }
  }
  std::lock_guard<std::mutex> lk(t.mu);
  if (tuned_in_run()) return true;  // claimed by another worker meanwhile
  t.tuned_here.emplace(key, w.shape.name);
  return false;
}

void print_tuned(const TuneResult& r, double secs, std::string& out) {
  int passed = 0;
  for (const auto& c : r.candidates) passed += c.median_us > 0;
  fmt::format_to(std::back_inserter(out), "        tuned: winner {} {:.2f} us ({} of {} candidates passed, {:.1f} s){}\n", r.winner.str(),
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
                               double secs, KernelCache& jit, std::string& out) {
  // Against the fastest candidate of the whole grid (before the model's
  // config is preferred within 2%): the model's gap, not the rule's.
  const int best = pick_winner(r.candidates);
  const LaunchConfig fastest = best >= 0 ? r.candidates[best].config : r.winner;
  const auto t = time_configs(op, s.desc, {fastest, untuned.config}, jit);
  fmt::format_to(std::back_inserter(out), "        untuned: {} {} {:.2f} us vs tuned {:.2f} us: {:.3f}x\n",
                 config_source_name(untuned.source), untuned.config.str(), t[1], t[0], t[1] / t[0]);
  return {{"shape", s.name}, {"op", op_label(op, s.desc.norm)}, {"key", r.shape_key},
          {"tuned", fastest.str()}, {"tuned_us", t[0]}, {"untuned", untuned.config.str()},
          {"untuned_source", config_source_name(untuned.source)}, {"untuned_from", untuned.from_key},
          {"untuned_us", t[1]}, {"ratio", t[1] / t[0]}, {"tune_seconds", secs},
          {"candidates", r.candidates.size()}, {"all", candidate_times(r)}};
}

// Tunes `op` on `s` and appends the winner (and, with --vs-untuned, the
// comparison) to `out`; a failure is reported and counted.
void tune_one(Engine& engine, Op op, const NamedShape& s, const std::string& key, bool vs_untuned, bool whole_grid,
              KernelCache& jit, TuneTally& t, std::string& out) {
  try {
    // What the shape would run were it not tuned: resolved before tuning it.
    const ConfigExplanation untuned = engine.explain(op, s.desc, /*skip_exact=*/true);
    const auto t0 = std::chrono::steady_clock::now();
    const TuneResult r = engine.tune(op, s.desc, whole_grid || vs_untuned);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    print_tuned(r, secs, out);
    nlohmann::json row;
    if (vs_untuned) {
      row = compare_untuned(op, s, r, untuned, secs, jit, out);
      const DeviceInfo dev = device_info(current_device());
      row["gpu"] = dev.name;
      row["device"] = static_cast<int>(dev.device);
    }
    std::lock_guard<std::mutex> lk(t.mu);
    ++t.tuned;
    if (vs_untuned) t.rows.push_back(std::move(row));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidArgument) throw;  // a bad shape: a bad command line
    // A failure of one shape (no candidate passed, a driver error) does
    // not stop the others; the exit code reports it.
    fmt::format_to(std::back_inserter(out), "        FAILED: {}\n", e.what());
    std::lock_guard<std::mutex> lk(t.mu);
    ++t.failed;
    t.tuned_here.erase(key);  // unclaimed: a later item of this key tunes it
  }
}

// One shape and op of a run: its place in the run's order.
struct TuneItem {
  const Work* work;
  Op op;
  int index;
};

std::vector<TuneItem> tune_items(const Resolved& res) {
  std::vector<TuneItem> items;
  for (const auto& w : res.work)
    for (Op op : w.ops) items.push_back({&w, op, static_cast<int>(items.size()) + 1});
  return items;
}

// Tunes (or skips) one item on the current context's device; returns what
// it has to say, headed by `tag` (the device, with --devices).
std::string run_item(Engine& engine, const TuneItem& it, int total, const std::string& tag, bool vs_untuned,
                     bool retune, bool whole_grid, KernelCache& jit, TuneTally& t) {
  const NamedShape& s = it.work->shape;
  std::string out = fmt::format("[{}/{}]{} {} {} {}\n", it.index, total, tag, op_label(it.op, s.desc.norm), s.name,
                                s.desc.str());
  const std::string key = shape_key(it.op, s.desc);
  if (!skip_cached(engine, *it.work, it.op, key, retune || vs_untuned, t, out))
    tune_one(engine, it.op, s, key, vs_untuned, whole_grid, jit, t, out);
  return out;
}

// `workers` threads a device; devices of one kind (one tuned-cache file)
// take the run's items from one queue, so each item is tuned once a kind,
// and every kind tunes every item. A device's workers overlap one item's
// compiles with another's timing, which holds the device alone
// (autotune.cpp's gpu_mutex). Entries reach the kind's file through its
// lock, merged (tuned_cache.cpp): none is lost when two workers store at
// once.
int tune_on_devices(Engine& engine, const std::vector<int>& devices, int workers, const std::vector<TuneItem>& items,
                    bool vs_untuned, bool retune, bool whole_grid, KernelCache& jit, nlohmann::json& rows) {
  struct Kind {
    std::string name;
    std::vector<int> devices;
    std::atomic<std::size_t> next{0};
    TuneTally tally;
  };
  std::map<std::string, std::unique_ptr<Kind>> kinds;  // by DeviceFingerprint::key()
  for (int d : devices) {
    const DeviceInfo info = device_info(use_device(d));
    const DeviceFingerprint fp{info.name,     info.cc_major, info.cc_minor, info.sm_count, info.l2_bytes,
                               info.memory_gbps};
    auto& k = kinds[fp.key()];
    if (!k) {
      k = std::make_unique<Kind>();
      k->name = fp.slug();
    }
    k->devices.push_back(d);
  }
  for (const auto& [key, k] : kinds)
    fmt::print("devices {} ({}): {} items, one tuned-cache file\n", fmt::join(k->devices, ","), k->name, items.size());
  std::mutex print_mu;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(devices.size() * workers);
  std::size_t slot = 0;
  for (auto& [key, k] : kinds)
    for (int d : k->devices)
      for (int w = 0; w < workers; ++w)
        threads.emplace_back([&, d, kind = k.get(), err = &errors[slot++]] {
          try {
            use_device(d);
            const std::string tag = devices.size() > 1 ? fmt::format(" cuda:{}", d) : std::string();
            for (std::size_t i; (i = kind->next++) < items.size();) {
              const std::string out = run_item(engine, items[i], static_cast<int>(items.size()), tag, vs_untuned, retune,
                                               whole_grid, jit, kind->tally);
              std::lock_guard<std::mutex> lk(print_mu);
              fmt::print("{}", out);
              std::fflush(stdout);
            }
          } catch (const std::exception& e) {
            *err = fmt::format("cuda:{}: {}", d, e.what());
          }
        });
  for (auto& th : threads) th.join();
  int failed = 0;
  for (const auto& e : errors)
    if (!e.empty()) {
      fmt::print(stderr, "normjit: tune: {}\n", e);
      ++failed;
    }
  for (auto& [key, k] : kinds) {
    fmt::print("tune {}: {} tuned, {} skipped (cached), {} failed\n", k->name, k->tally.tuned, k->tally.skipped,
               k->tally.failed);
    failed += k->tally.failed;
    for (auto& r : k->tally.rows) rows.push_back(std::move(r));
  }
  return failed;
}

void write_tune_json(const std::string& json_path, const nlohmann::json& rows) {
  const DeviceInfo dev = device_info(current_device());
  nlohmann::json j = {{"gpu", dev.name}, {"sm_count", dev.sm_count}, {"timing", timing_method()}, {"rows", rows}};
  std::ofstream(json_path) << j.dump(1) << "\n";
  fmt::print("wrote {}\n", json_path);
}

}  // namespace

void check_devices(const std::vector<int>& devices) {
  const int n = device_count();
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= n)
      throw Error(ErrorKind::InvalidArgument, fmt::format("--devices {}: device {} does not exist; this machine has "
                                                          "{} GPU{} (0-{})",
                                                          fmt::join(devices, ","), d, n, n == 1 ? "" : "s", n - 1));
    if (!seen.insert(d).second)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("--devices {}: device {} is named twice", fmt::join(devices, ","), d));
  }
}

// Tunes each shape and op. A --model's shapes are a pre-warm: those with a
// current tuned entry for this device and kernel source (user or shipped
// cache, or tuned earlier in this run under the same cache key) are skipped
// unless --retune or --vs-untuned; --shape's are always tuned.
int cmd_tune(Engine& engine, const ShapeOptions& so, bool vs_untuned, const std::string& json_path, bool retune,
             bool list, bool whole_grid, const std::vector<int>& devices, int workers) {
  const Resolved res = resolve_shapes(so);
  if (list) return cmd_list(so, res);
  if (!require_gpu("tuning")) return kExitNoGpu;
  const std::vector<TuneItem> items = tune_items(res);
  KernelCache jit(engine.cache_dir() + "/kernels");
  nlohmann::json rows = nlohmann::json::array();
  int failed = 0;
  if (!devices.empty()) {
    check_devices(devices);
    failed = tune_on_devices(engine, devices, workers, items, vs_untuned, retune, whole_grid, jit, rows);
  } else {
    failed = tune_on_devices(engine, {static_cast<int>(current_device())}, workers, items, vs_untuned, retune,
                             whole_grid, jit, rows);
    fmt::print("tuned configs stored in {}/tuned\n", engine.cache_dir());
  }
  if (!json_path.empty()) write_tune_json(json_path, rows);
  return failed ? 1 : 0;
}

}  // namespace normjit::cli
