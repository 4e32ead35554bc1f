#include "tuning/autotune.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "config/config_grid.hpp"
#include "core/host_dtype.hpp"
#include "device/kernel_clock.hpp"
#include "runtime/ops.hpp"
#include "core/variant.hpp"
#include "core/parallel.hpp"

namespace normjit::detail {

std::mutex& gpu_mutex() { return gpu_mutex(current_device()); }

std::mutex& gpu_mutex(CUdevice device) {
  // One a device, never freed: tuners of different GPUs time at once.
  static std::mutex map_mu;
  static std::map<CUdevice, std::unique_ptr<std::mutex>> mutexes;
  std::lock_guard<std::mutex> lk(map_mu);
  auto& m = mutexes[device];
  if (!m) m = std::make_unique<std::mutex>();
  return *m;
}

namespace {
// NVRTC compiles running at once, across every tuner of the process: all
// cores but two, so the thread timing kernels is never starved (a timing
// thread descheduled between the L2 flush and the launch would time the gap).
class CompileSlots {
 public:
  CompileSlots() : free_(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 2)) {}
  void acquire() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};
CompileSlots& compile_slots() {
  static CompileSlots s;
  return s;
}
}  // namespace

int pick_winner(const std::vector<CandidateTiming>& candidates, double tie) {
  double best = -1;
  for (const auto& c : candidates)
    if (c.median_us > 0 && (best < 0 || c.median_us < best)) best = c.median_us;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].median_us > 0 && candidates[i].median_us <= best * tie) return static_cast<int>(i);
  return -1;
}

namespace {

// Candidate outputs against the reference config's: a few roundings apart at
// most (reduction order differs between configs); NaN (poison) never passes.
std::string mismatch(const std::vector<float>& got, const std::vector<float>& ref, DType t, const std::string& what) {
  double ss = 0;
  for (float r : ref) ss += static_cast<double>(r) * r;
  double scale = std::sqrt(ss / std::max<std::size_t>(1, ref.size()));
  // A row's mean sums values of magnitude ~1 (input_range) to something near
  // 0: its rounding error is relative to the values, not to the mean (a few
  // rows of means ~5e-4 rejected correct configs).
  if (what == "mean") scale = std::max(scale, 1.0);
  const double rtol = t == DType::F32 ? 1e-4 : 4 * unit_roundoff(t);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= rtol * (std::fabs(ref[i]) + scale)))
      return fmt::format("{}[{}] = {} but the reference config gives {}", what, i, got[i], ref[i]);
  }
  return {};
}

// Configs one step apart: one of vec, threads_per_row, rows_per_pid, cluster
// doubled or halved, or two of them moved in opposite directions (the same
// block or the same per-thread share), or one of stages, programs_per_sm,
// two_pass changed with the rest equal.
bool one_step(const LaunchConfig& a, const LaunchConfig& b) {
  auto lg = [](int v) {
    int l = 0;
    while ((1 << l) < v) ++l;
    return l;
  };
  const int dv = lg(a.vec) - lg(b.vec), dt = lg(a.threads_per_row) - lg(b.threads_per_row),
            dr = lg(a.rows_per_pid) - lg(b.rows_per_pid), dc = lg(a.cluster) - lg(b.cluster);
  const int moved = (dv != 0) + (dt != 0) + (dr != 0) + (dc != 0);
  const int dist = std::abs(dv) + std::abs(dt) + std::abs(dr) + std::abs(dc);
  const int other = (a.stages != b.stages) + (a.programs_per_sm != b.programs_per_sm) + (a.two_pass != b.two_pass);
  if (other == 0) return moved == 1 ? dist == 1 : moved == 2 && dist == 2 && dv + dt + dr + dc == 0;
  return other == 1 && moved == 0;
}

// One tuning run: the candidate grid and what is known of each candidate.
class Tuner {
 public:
  Tuner(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit, const ProgressFn& progress,
        const TuneOptions& o)
      : op_(op), d_(desc), dev_(dev), jit_(jit), progress_(progress), o_(o),
        grid_(candidate_grid(op, desc, dev.max_cluster)), kernels_(grid_.size()), state_(grid_.size()) {
    // Each candidate is timed as a launch of this M runs it (its weight
    // staged where the engine would stage it), and stored as the grid's config.
    for (const auto& c : grid_) launch_.push_back(staged_for_launch(op, desc, c, dev.facts()));
    std::lock_guard<std::mutex> gpu(gpu_mutex());
    res_.shape_key = shape_key(op, desc);
    for (const auto& c : grid_) res_.candidates.push_back({c, -1, ""});
    if (o.scratch) {
      scratch_ = o.scratch;
    } else {
      own_ = std::make_unique<Scratch>(op, desc, 0x5eed0000u + static_cast<std::uint64_t>(desc.N));
      scratch_ = own_.get();
    }
    for (const auto& t : scratch_->specs)
      if (t.output) outs_.push_back(&t);
    if (op == Op::Backward) fin_ = jit.get(finalize_spec(desc), dev.arch());
  }

  ~Tuner() {
    // Frees device memory (which may synchronise the device): not while
    // another tuner times.
    std::lock_guard<std::mutex> gpu(gpu_mutex());
    own_.reset();
    flush_ = DeviceBuffer();
    ws_ = DeviceBuffer();
    kernels_.clear();
    fin_.reset();
  }
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  int size() const { return static_cast<int>(grid_.size()); }
  int index_of(const LaunchConfig& c) const {
    return static_cast<int>(std::find(grid_.begin(), grid_.end(), c) - grid_.begin());
  }
  const LaunchConfig& config(int i) const { return grid_[i]; }
  double time_of(int i) const { return res_.candidates[i].median_us; }
  bool usable(int i) const { return state_[i] == Timed; }

  // Compiles, loads, checks and times the candidates `idx` not seen yet.
  void evaluate(const std::vector<int>& idx) {
    std::vector<int> todo;
    for (int i : idx)
      if (i >= 0 && i < size() && state_[i] == Unseen && std::find(todo.begin(), todo.end(), i) == todo.end())
        todo.push_back(i);
    if (todo.empty()) return;
    compile(todo);  // CPU only: other tuners may time meanwhile
    std::lock_guard<std::mutex> gpu(gpu_mutex());
    for (int i : todo) load(i);
    if (!ref_) make_reference();
    for (int i : todo) {
      auto& ct = res_.candidates[i];
      if (!ct.rejected.empty()) continue;
      check(i);
      if (!ct.rejected.empty()) {
        state_[i] = Rejected;
        continue;
      }
      ct.median_us = median_us([&](CUstream st) { run(i, st); }, flush(), o_.reps);
      state_[i] = Timed;
      report(fmt::format("timed {} {:.2f} us", ct.config.str(), ct.median_us));
    }
  }

  TuneResult finish() {
    // Configs never evaluated (local search) are left out of the record.
    TuneResult r = res_;
    r.candidates.clear();
    for (int i = 0; i < size(); ++i)
      if (state_[i] != Unseen) r.candidates.push_back(res_.candidates[i]);
    const int w = pick_winner(r.candidates);
    if (w < 0) throw Error(ErrorKind::Tuning, "no candidate passed", op_label(op_, d_.norm), d_.str());
    r.winner = r.candidates[w].config;
    r.winner_us = r.candidates[w].median_us;
    against_model(r);
    return r;
  }

  // The winner must beat the model's config by more than 2% in alternating
  // rounds (a drift in clocks reaches both alike; one lucky median does not
  // decide), else the model's config wins: tuning never stores a config
  // that is no faster than what the shape gets without an entry.
  void against_model(TuneResult& r) {
    r.model = heuristic_config(op_, d_, dev_.facts());
    const int w = index_of(r.winner);
    int m = index_of(r.model);
    if (m == w) return;
    evaluate({m});
    if (m == size() || !usable(m)) return;  // the model's config failed here: the winner stands
    std::lock_guard<std::mutex> gpu(gpu_mutex());
    std::vector<double> tw, tm;
    for (int round = 0; round < kModelRounds; ++round) {
      tw.push_back(median_us([&](CUstream st) { run(w, st); }, flush(), o_.reps));
      tm.push_back(median_us([&](CUstream st) { run(m, st); }, flush(), o_.reps));
    }
    std::sort(tw.begin(), tw.end());
    std::sort(tm.begin(), tm.end());
    r.model_us = tm[tm.size() / 2];
    if (tw[tw.size() / 2] * kModelMargin < r.model_us) {
      r.winner_us = tw[tw.size() / 2];
    } else {
      r.winner = r.model;
      r.winner_us = r.model_us;
    }
    // The record holds the model's config with its time (the entry's table).
    for (auto& c : r.candidates)
      if (c.config == r.model) c.median_us = r.model_us;
    if (std::none_of(r.candidates.begin(), r.candidates.end(), [&](const CandidateTiming& c) { return c.config == r.model; }))
      r.candidates.push_back({r.model, r.model_us, ""});
  }
  static constexpr int kModelRounds = 5;
  static constexpr double kModelMargin = 1.02;

 private:
  enum State { Unseen, Rejected, Timed };

  void report(const std::string& text) {
    if (progress_) progress_(++done_, size(), text);
  }

  const DeviceBuffer& flush() {
    if (!flush_.bytes()) flush_ = make_flush_buffer(dev_);
    return flush_;
  }

  void compile(const std::vector<int>& todo) {
    // Configs differing only in launch parameters share a cubin: compile
    // each spec once, then hand its binary to every config of it.
    std::map<std::string, int> first;
    std::vector<int> unique;
    for (int i : todo)
      if (first.emplace(make_spec(op_, d_, launch_[i]).name(), i).second) unique.push_back(i);
    std::vector<std::string> errors(unique.size());
    binaries_.resize(grid_.size());
    parallel_for(static_cast<int>(unique.size()), [&](int t) {
      const int i = unique[t];
      compile_slots().acquire();
      try {
        binaries_[i] = compile_spec(make_spec(op_, d_, launch_[i]), dev_.arch(), jit_.kernel_dir());
      } catch (const Error& e) {
        errors[t] = e.message();
      }
      compile_slots().release();
    });
    std::map<int, std::string> error_of;
    for (std::size_t t = 0; t < unique.size(); ++t) error_of[unique[t]] = errors[t];
    for (int i : todo) {
      const int f = first.at(make_spec(op_, d_, launch_[i]).name());
      if (!error_of[f].empty()) res_.candidates[i].rejected = error_of[f];
      else if (f != i) binaries_[i] = binaries_[f];
    }
  }

  // Loads and prunes on what the compiler decided: spills, registers.
  void load(int i) {
    auto& ct = res_.candidates[i];
    if (ct.rejected.empty()) {
      try {
        const KernelBinary* bin = binaries_[i].cubin.empty() ? nullptr : &binaries_[i];
        kernels_[i] = jit_.get(make_spec(op_, d_, launch_[i]), dev_.arch(), bin);
        const auto& k = *kernels_[i];
        if (k.local_bytes > 0)
          ct.rejected = fmt::format("spills: {} bytes of local memory per thread", k.local_bytes);
        else if (k.blocks_per_sm < 1 || k.max_threads < grid_[i].threads())
          ct.rejected = fmt::format("cannot launch: {} registers x {} threads", k.num_regs, grid_[i].threads());
      } catch (const Error& e) {
        ct.rejected = e.message();
      }
    }
    binaries_[i] = KernelBinary{};
    if (!ct.rejected.empty()) {
      kernels_[i].reset();
      state_[i] = Rejected;
    }
  }

  void ensure_workspace(const LoadedKernel& k, const LaunchConfig& c) {
    if (op_ != Op::Backward) return;
    const std::size_t need = backward_workspace_bytes(backward_geometry(k, d_, c, dev_.sm_count), d_);
    if (need > ws_.bytes()) ws_ = DeviceBuffer(std::max(need, ws_.bytes() * 2));
  }

  void run(int i, CUstream st) {
    const LoadedKernel& k = *kernels_[i];
    if (op_ == Op::Forward) {
      launch_forward(k, d_, scratch_->forward_tensors(), dev_.sm_count, st);
    } else {
      ensure_workspace(k, grid_[i]);
      BackwardTensors bt = scratch_->backward_tensors();
      bt.workspace = ws_.bytes() ? ws_.ptr() : nullptr;
      bt.workspace_bytes = ws_.bytes();
      launch_backward(k, *fin_, d_, bt, backward_geometry(k, d_, grid_[i], dev_.sm_count), st);
    }
  }

  // Rows are independent, so the first rows (and every vector, dweight
  // included, which sums all rows) tell a wrong config from a right one.
  std::vector<std::vector<float>> outputs(int i) {
    scratch_->poison();
    run(i, nullptr);
    const std::int64_t rows =
        std::min<std::int64_t>(d_.M, std::clamp<std::int64_t>(o_.check_elements / std::max<std::int64_t>(1, d_.N), 8, 4096));
    std::vector<std::vector<float>> o;
    for (const TensorSpec* t : outs_) {
      // Per-row values (rstd, mean, per-token scales) are one row of M
      // values: their first `rows`. Tensors with a column per row of the
      // input (the transpose, column-major scales): as many of their rows as
      // the element budget allows.
      const bool per_row = t->rows == 1 && t->cols == d_.M;
      const bool by_column = t->rows > 1 && t->cols == d_.M && t->rows != d_.M;
      const std::int64_t n = per_row ? 1
                             : by_column
                                 ? std::clamp<std::int64_t>(o_.check_elements / std::max<std::int64_t>(1, d_.M), 1, t->rows)
                                 : rows;
      o.push_back(scratch_->download(t->name, n));
      if (per_row) o.back().resize(static_cast<std::size_t>(rows));
    }
    return o;
  }

  // The reference: the start of the search (heuristic or given), or, when the
  // compiler rejected it, the simplest candidate that survived.
  void make_reference() {
    int r = index_of(o_.start ? *o_.start : heuristic_config(op_, d_, dev_.facts()));
    if (r < size() && state_[r] == Unseen) {
      compile({r});
      load(r);
    }
    if (r == size() || !kernels_[r]) {
      for (r = 0; r < size(); ++r) {
        if (state_[r] == Unseen) {
          compile({r});
          load(r);
        }
        if (kernels_[r]) break;
      }
    }
    if (r == size())
      throw Error(ErrorKind::Tuning, "no candidate compiled and fits the device", op_label(op_, d_.norm), d_.str());
    ref_ = std::make_unique<std::vector<std::vector<float>>>(outputs(r));
    ref_i_ = r;
  }

  void check(int i) {
    auto& ct = res_.candidates[i];
    const std::string name = make_spec(op_, d_, launch_[i]).name() + fmt::format(".p{}", grid_[i].programs_per_sm);
    if (o_.checked && o_.checked->count(name)) return;
    if (i != ref_i_) {
      const auto got = outputs(i);
      for (std::size_t j = 0; j < ref_->size() && ct.rejected.empty(); ++j)
        ct.rejected = mismatch(got[j], (*ref_)[j], outs_[j]->dtype, outs_[j]->name);
    }
    if (ct.rejected.empty() && o_.checked) o_.checked->insert(name);
  }

  Op op_;
  const NormDesc& d_;
  const DeviceInfo& dev_;
  KernelCache& jit_;
  ProgressFn progress_;
  TuneOptions o_;
  std::vector<LaunchConfig> grid_;
  std::vector<LaunchConfig> launch_;  // what a launch of d_.M runs of each (staged_for_launch)
  std::vector<KernelBinary> binaries_;
  std::vector<std::shared_ptr<const LoadedKernel>> kernels_;
  std::vector<State> state_;
  std::shared_ptr<const LoadedKernel> fin_;
  std::unique_ptr<Scratch> own_;
  const Scratch* scratch_ = nullptr;
  std::vector<const TensorSpec*> outs_;
  DeviceBuffer flush_, ws_;
  std::unique_ptr<std::vector<std::vector<float>>> ref_;
  int ref_i_ = -1;
  TuneResult res_;
  int done_ = 0;
};

}  // namespace

TuneResult autotune(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit,
                    const ProgressFn& progress, const TuneOptions& opt) {
  Tuner t(op, desc, dev, jit, progress, opt);
  if (!opt.local) {
    std::vector<int> all(t.size());
    for (int i = 0; i < t.size(); ++i) all[i] = i;
    t.evaluate(all);
    return t.finish();
  }
  // Local search: from the start, move to the fastest one-step neighbour
  // while it beats the current config by more than 1%.
  int cur = t.index_of(opt.start ? *opt.start : heuristic_config(op, desc, dev.facts()));
  std::vector<int> first = {cur, t.index_of(heuristic_config(op, desc, dev.facts()))};
  t.evaluate(first);
  if (cur == t.size() || !t.usable(cur)) cur = first[1] < t.size() && t.usable(first[1]) ? first[1] : -1;
  if (cur < 0) {
    // Neither start survived: fall back to the whole grid.
    std::vector<int> all(t.size());
    for (int i = 0; i < t.size(); ++i) all[i] = i;
    t.evaluate(all);
    return t.finish();
  }
  for (int step = 0; step < 12; ++step) {
    std::vector<int> near;
    for (int i = 0; i < t.size(); ++i)
      if (one_step(t.config(cur), t.config(i))) near.push_back(i);
    t.evaluate(near);
    int best = cur;
    for (int i : near)
      if (t.usable(i) && t.time_of(i) < t.time_of(best)) best = i;
    if (best == cur || t.time_of(best) > t.time_of(cur) * 0.99) break;
    cur = best;
  }
  return t.finish();
}

}  // namespace normjit::detail
