#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <unistd.h>  // isatty

#include <fmt/format.h>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "device/driver.hpp"
#include "compile/jit.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "runtime/ops.hpp"
#include "runtime/plan.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"
#include "core/trace.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/parallel.hpp"
#include "api/options.hpp"
#include "api/tensor_rules.hpp"

namespace normjit {

using namespace detail;

struct Engine::Impl {
  EngineOptions opt;
  std::string root;
  KernelCache jit;

  struct DeviceState {
    DeviceInfo info;
    std::shared_ptr<TunedCache> tuned;  // one per device kind (tuned_by_kind)
    std::map<std::string, LaunchConfig> resolved;  // shape key -> config, this engine
    std::unordered_map<PlanKey, std::shared_ptr<const Plan>, PlanKeyHash> plans;  // see plan.hpp
  };
  // Plans of one device: every (descriptor, alignment) a process calls, up to
  // this many; then they are dropped and rebuilt (a serving engine sees at
  // most a few thousand token counts).
  static constexpr std::size_t kMaxPlans = 8192;
  std::mutex mu;
  std::map<CUdevice, std::unique_ptr<DeviceState>> devices;
  std::map<std::string, std::shared_ptr<TunedCache>> tuned_by_kind;  // DeviceFingerprint::key()
  // Set once a device's state exists: until then no plan does, and a call
  // need not ask the driver for its device (bad input needs no GPU).
  std::atomic<bool> any_device{false};

  explicit Impl(EngineOptions o)
      : opt(std::move(o)),
        root(opt.cache_dir.empty() ? default_cache_dir() : opt.cache_dir),
        jit(!opt.disk_kernel_cache        ? std::string()
            : opt.kernel_dir.empty() ? root + "/kernels"
                                     : opt.kernel_dir) {}

  std::vector<std::string> shipped_dirs() const {
    std::vector<std::string> d = opt.shipped_cache_dirs;
    if (opt.builtin_shipped_caches)
      for (const char* builtin : {NORMJIT_SOURCE_CACHE_DIR, NORMJIT_INSTALL_CACHE_DIR})
        if (std::filesystem::is_directory(builtin)) d.push_back(builtin);
    return d;
  }

  // Caller holds mu. A device's state lives as long as the engine (threads
  // keep references to it while tuning without mu).
  DeviceState& state() { return state(current_device()); }
  DeviceState& state(CUdevice dev) {
    auto& st = devices[dev];
    if (!st) {
      st = std::make_unique<DeviceState>();
      st->info = device_info(dev);
      DeviceFingerprint fp{st->info.name, st->info.cc_major, st->info.cc_minor, st->info.sm_count, st->info.l2_bytes,
                           st->info.memory_gbps};
      // Devices of one kind share one tuned cache (one file): an entry
      // tuned on either serves both.
      auto& shared = tuned_by_kind[fp.key()];
      if (!shared) {
        int driver = 0;
        cu().cuDriverGetVersion(&driver);
        CacheMetadata md{NORMJIT_VERSION_STRING, kernel_source_hash(), nvrtc_version_or_empty(), driver};
        shared = std::make_shared<TunedCache>(root + "/tuned", shipped_dirs(), fp, md);
      }
      st->tuned = shared;
      any_device = true;
    }
    return *st;
  }

  // Caller holds mu through `lk`, released while the shape is tuned (the
  // compiles and timings of one device need not stop another device's
  // calls, nor this one's other shapes) and held again to store the result.
  TuneResult tune_and_store(std::unique_lock<std::mutex>& lk, DeviceState& st, Op op, const NormDesc& d,
                            bool whole_grid = false) {
    ProgressFn progress;
    // A line redrawn in place: on a terminal only (in a log, and with several
    // devices tuning at once, the redraws would run together).
    if (opt.verbose && isatty(fileno(stderr)))
      progress = [&](int done, int total, const std::string& text) {
        std::fprintf(stderr, "\rnormjit: tuning %s %s [%d/%d] %-40s", op_label(op, d.norm).c_str(), d.str().c_str(), done, total,
                     text.c_str());
        if (done == total) std::fprintf(stderr, "\n");
      };
    trace::Span span("tune", op_label(op, d.norm) + " " + d.str());
    TuneOptions to;
    to.local = !whole_grid;
    lk.unlock();
    TuneResult r;
    try {
      r = autotune(op, d, st.info, jit, progress, to);
    } catch (...) {
      lk.lock();
      throw;
    }
    lk.lock();
    if (trace::enabled()) {
      span.args = {{"winner", r.winner.str()}, {"winner_us", fmt::format("{:.2f}", r.winner_us)},
                   {"candidates", std::to_string(r.candidates.size())}};
      for (const auto& c : r.candidates)
        trace::instant("tune", "candidate " + c.config.str(),
                       {{"us", fmt::format("{:.2f}", c.median_us)}, {"rejected", c.rejected}});
    }
    st.tuned->store(r.shape_key, TunedEntry{shape_spec(d), tuned_kernel_hash(op, d, r.winner), r.winner, r.winner_us,
                                            utc_now(), r.candidates});
    st.resolved[r.shape_key] = r.winner;
    st.plans.clear();  // they hold the configs resolved before
    return r;
  }

  std::shared_ptr<const Plan> find_plan(const PlanKey& k) {
    // No device state yet: no plans either, and no reason to open the
    // driver before the descriptor is checked (bad input needs no GPU).
    if (!any_device) return nullptr;
    const CUdevice dev = current_device();  // driver calls, outside the lock
    std::lock_guard<std::mutex> lk(mu);
    const auto st = devices.find(dev);
    if (st == devices.end()) return nullptr;
    const auto it = st->second->plans.find(k);
    return it == st->second->plans.end() ? nullptr : it->second;
  }
  void store_plan(const PlanKey& k, std::shared_ptr<const Plan> p) {
    std::lock_guard<std::mutex> lk(mu);
    auto& plans = state().plans;
    if (plans.size() >= kMaxPlans) plans.clear();
    plans.emplace(k, std::move(p));
  }

  /// What a call needs to launch: the resolved config and the device's facts.
  struct Launch {
    LaunchConfig cfg;
    std::string arch;
    int sm_count = 0;
    DeviceFacts facts;
    ConfigSource source = ConfigSource::Heuristic;
    std::string shape_key;  ///< shape_key(op, d): derived once a plan
  };
  Launch prepare(Op op, const NormDesc& d);
  Launch begin_plan(Plan& p, Op op, const NormDesc& d);
  std::shared_ptr<const Plan> forward_plan(const NormDesc& d, const ForwardTensors& u);
  std::shared_ptr<const Plan> backward_plan(const NormDesc& d, const BackwardTensors* u);
  /// A sharded call's kernels and geometry (see Engine::sharded_*).
  struct ShardLaunch {
    std::shared_ptr<const LoadedKernel> k, fin;
    ShardGeometry g;
  };
  ShardLaunch shard_launch(const ShardedNormDesc& d, std::initializer_list<ShardOperand> operands,
                           bool finalize = false);
  /// Rethrows `e` (being handled) with op, shape and config attached.
  [[noreturn]] static void attach_context(const Error& e, Op op, const NormDesc& d, const LaunchConfig& cfg);


  // Caller holds mu. Memory, then caches (unless policy Always), then tuning
  // (policy permitting), then a neighbour or the heuristic.
  // `key`: shape_key(op, d), derived once by the caller.
  LaunchConfig resolve_config(std::unique_lock<std::mutex>& lk, DeviceState& st, Op op, const NormDesc& d,
                              const std::string& key, ConfigSource* src) {
    ConfigSource s = ConfigSource::Memory;
    LaunchConfig cfg;
    // A key names rows of N, not their strides: a config resolved for rows
    // that start on vector boundaries may not hold rows that peel (padded
    // or odd strides: config_grid.hpp's peeled), and is resolved again.
    const auto it = st.resolved.find(key);
    if (it != st.resolved.end() && config_valid(op, d, it->second, nullptr, st.info.facts().max_cluster)) {
      cfg = it->second;
    } else {
      ConfigExplanation x = config_from_caches(*st.tuned, op, d, key, st.info.facts(), opt.tune_policy, false);
      if (is_cache_hit(x.source) || opt.tune_policy == TunePolicy::Never) {
        cfg = x.config;
        s = x.source;
      } else {
        if (offline_mode())
          throw Error(ErrorKind::Cache,
                      fmt::format("NORMJIT_OFFLINE=1: {} has no tuned entry in the caches and tuning is off (tune "
                                  "policy '{}'): ship a tuned cache holding it, or use NORMJIT_TUNE=never",
                                  key, opt.tune_policy == TunePolicy::Always ? "always" : "first"),
                      op_label(op, d.norm), d.str());
        cfg = tune_and_store(lk, st, op, d).winner;
        s = ConfigSource::Tuned;
      }
      st.resolved[key] = cfg;
    }
    if (trace::enabled())
      trace::instant("config", std::string(is_cache_hit(s) ? "cache hit " : "cache miss ") + key,
                     {{"source", config_source_name(s)}, {"config", cfg.str()}});
    if (src) *src = s;
    return cfg;
  }
};

Engine::Engine() : Engine(EngineOptions::from_env()) {}
Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Engine::~Engine() = default;

const EngineOptions& Engine::options() const { return impl_->opt; }
std::string Engine::cache_dir() const { return impl_->root; }
std::vector<std::string> Engine::shipped_cache_dirs() const { return impl_->shipped_dirs(); }

LaunchConfig Engine::config_for(Op op, const NormDesc& d, ConfigSource* source) {
  d.validate();
  std::unique_lock<std::mutex> lk(impl_->mu);
  return impl_->resolve_config(lk, impl_->state(), op, d, shape_key(op, d), source);
}

ConfigExplanation Engine::explain(Op op, const NormDesc& d, bool skip_exact) {
  d.validate();
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto& st = impl_->state();
  return config_from_caches(*st.tuned, op, d, st.info.facts(), impl_->opt.tune_policy, skip_exact);
}

TuneResult Engine::tune(Op op, const NormDesc& d, bool whole_grid) {
  d.validate();
  if (offline_mode())
    throw Error(ErrorKind::Cache, "NORMJIT_OFFLINE=1: tuning is off", op_label(op, d.norm), d.str());
  if (d.M == 0) throw Error(ErrorKind::InvalidArgument, "M = 0: nothing to tune", op_label(op, d.norm), d.str());
  std::unique_lock<std::mutex> lk(impl_->mu);
  return impl_->tune_and_store(lk, impl_->state(), op, d, whole_grid);
}

Engine::Impl::Launch Engine::Impl::prepare(Op op, const NormDesc& d) {
  std::unique_lock<std::mutex> lk(mu);
  auto& st = state();
  Launch l;
  l.shape_key = shape_key(op, d);
  l.cfg = resolve_config(lk, st, op, d, l.shape_key, &l.source);
  l.arch = st.info.arch();
  l.sm_count = st.info.sm_count;
  l.facts = st.info.facts();
  return l;
}

void Engine::Impl::attach_context(const Error& e, Op op, const NormDesc& d, const LaunchConfig& cfg) {
  if (dynamic_cast<const CompileError*>(&e) || !e.op().empty()) throw;
  throw Error(e.kind(), e.message(), op_label(op, d.norm), d.str(), cfg.str(), e.where());
}


// See plan.hpp for the path this resolves once. The config, from the caches,
// tuning or the heuristic, and what it came from.
Engine::Impl::Launch Engine::Impl::begin_plan(Plan& p, Op op, const NormDesc& d) {
  p.op = op;
  p.desc = d;
  const Launch l = prepare(op, d);
  p.resolved = p.config = l.cfg;
  p.source = l.source;
  p.shape_key = l.shape_key;
  return l;
}

namespace {
// A launch's trace arguments: the shape and the geometry its kernel got
// (programs, CTAs, the CTAs an SM holds and the clusters the driver counts
// co-resident: what a config's speed turns on).
std::map<std::string, std::string> launch_args(const NormDesc& d, const Plan& p) {
  return {{"shape", d.str()},
          {"programs", std::to_string(p.geometry.programs)},
          {"grid", std::to_string(p.geometry.grid)},
          {"block", std::to_string(p.geometry.block)},
          {"blocks_per_sm", std::to_string(p.kernel ? p.kernel->blocks_per_sm : 0)},
          {"max_clusters", std::to_string(p.kernel ? p.kernel->max_clusters : 0)}};
}
}  // namespace

std::shared_ptr<const Plan> Engine::Impl::forward_plan(const NormDesc& d, const ForwardTensors& u) {
  constexpr Op op = Op::Forward;
  trace::Span span("plan", "forward " + d.str());
  auto p = std::make_shared<Plan>();
  try {
    const Launch l = begin_plan(*p, op, d);
    p->config = staged_for_launch(op, d, fit_forward_alignment(l.cfg, d, u), l.facts);
    p->kernel = jit.get(make_spec(op, d, p->config), l.arch);
    p->geometry = launch_geometry(op, d, p->config, l.sm_count, p->kernel->blocks_per_sm, p->kernel->max_clusters);
    p->resident = amax_grid(*p->kernel, p->geometry, l.sm_count);
    p->qt_cols = transpose_columns(d, l.sm_count);
    p->layout = row_layout(d, false);
  } catch (const Error& e) {
    attach_context(e, op, d, p->config);
  }
  return p;
}

// u = null: a sizing-only plan (backward_workspace_size: no pointers yet).
std::shared_ptr<const Plan> Engine::Impl::backward_plan(const NormDesc& d, const BackwardTensors* u) {
  constexpr Op op = Op::Backward;
  trace::Span span("plan", std::string(u ? "backward " : "backward sizing ") + d.str());
  auto p = std::make_shared<Plan>();
  try {
    const Launch l = begin_plan(*p, op, d);
    // The grid (and so the workspace) comes from the resolved config, the
    // kernel from the one that fits the pointers' alignment.
    p->geometry = backward_geometry(*jit.get(make_spec(op, d, l.cfg), l.arch), d, l.cfg, l.sm_count);
    p->workspace_bytes = make_variant(op, d).partials() ? backward_workspace_bytes(p->geometry, d) : 0;
    if (!u) return p;
    p->config = fit_backward_alignment(l.cfg, d, *u);
    p->kernel = jit.get(make_spec(op, d, p->config), l.arch);
    p->finalize = jit.get(finalize_spec(d), l.arch);
    p->layout = row_layout(d, true);
  } catch (const Error& e) {
    attach_context(e, op, d, p->config);
  }
  return p;
}

void Engine::forward(const NormDesc& d, const ForwardTensors& t, CUstream stream) {
  // A key seen before names a descriptor that validated and pointers that
  // met its requirements: straight to the launch.
  const PlanKey key = plan_key(d, t);
  std::shared_ptr<const Plan> p = impl_->find_plan(key);
  if (!p) {
    d.validate();
    if (d.M == 0) return;
    require_forward(d, t);
    p = impl_->forward_plan(d, used_tensors(d, t));
    impl_->store_plan(key, p);
  }
  if (trace::enabled()) trace::instant("launch", "forward " + p->config.str(), launch_args(d, *p));
  try {
    p->forward(used_tensors(d, t), stream);
  } catch (const Error& e) {
    impl_->attach_context(e, Op::Forward, d, p->config);
  }
}

std::size_t Engine::backward_workspace_size(const NormDesc& d) {
  const PlanKey key = plan_key(Op::Backward, d, kSizingOnly);
  std::shared_ptr<const Plan> p = impl_->find_plan(key);
  if (!p) {
    d.validate();
    if (d.M == 0 || make_variant(Op::Backward, d).partials() == 0) return 0;
    p = impl_->backward_plan(d, nullptr);
    impl_->store_plan(key, p);
  }
  return p->workspace_bytes;
}

void Engine::backward(const NormDesc& d, const BackwardTensors& t, CUstream stream) {
  constexpr Op op = Op::Backward;
  const PlanKey key = plan_key(d, t);
  std::shared_ptr<const Plan> p = impl_->find_plan(key);
  if (!p) {
    d.validate();
    if (d.M == 0) return;
    require_backward(d, t);
    const BackwardTensors u = used_tensors(d, t);
    p = impl_->backward_plan(d, &u);
    impl_->store_plan(key, p);
  }
  if (t.workspace_bytes < p->workspace_bytes)
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("workspace_bytes = {} is too small: {} needed (backward_workspace_size)", t.workspace_bytes,
                            p->workspace_bytes),
                op_label(op, d.norm), d.str(), p->config.str());
  if (trace::enabled()) trace::instant("launch", "backward " + p->config.str(), launch_args(d, *p));
  try {
    p->backward(used_tensors(d, t), stream);
  } catch (const Error& e) {
    impl_->attach_context(e, op, d, p->config);
  }
}

namespace {
void require_rms(const NormDesc& d, const char* fn) {
  if (d.norm != NormKind::RMSNorm)
    throw Error(ErrorKind::InvalidArgument, fmt::format("{}: desc.norm = {} (use forward/backward for LayerNorm)", fn,
                                                        norm_kind_name(d.norm)));
}
}  // namespace

void Engine::rms_norm_forward(const NormDesc& d, const void* x, const void* weight, void* y, float* rstd,
                              CUstream stream) {
  require_rms(d, "rms_norm_forward");
  ForwardTensors t;
  t.x = x;
  t.weight = weight;
  t.y = y;
  t.rstd = rstd;
  forward(d, t, stream);
}

std::size_t Engine::rms_norm_backward_workspace_size(const NormDesc& d) {
  require_rms(d, "rms_norm_backward_workspace_size");
  return backward_workspace_size(d);
}

void Engine::rms_norm_backward(const NormDesc& d, const void* dy, const void* x, const void* weight,
                               const float* rstd, void* dx, void* dweight, void* workspace,
                               std::size_t workspace_bytes, CUstream stream) {
  require_rms(d, "rms_norm_backward");
  BackwardTensors t;
  t.dy = dy;
  t.x = x;
  t.weight = weight;
  t.rstd = rstd;
  t.dx = dx;
  t.dweight = dweight;
  t.workspace = workspace;
  t.workspace_bytes = workspace_bytes;
  backward(d, t, stream);
}

int Engine::precompile(Op op, const NormDesc& d, const std::string& arch, std::vector<std::string>* failures) {
  d.validate();
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 5)
    throw Error(ErrorKind::InvalidArgument, fmt::format("arch = '{}' is not of the form sm_XY (e.g. sm_90)", arch));
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;  // configs differing only in launch parameters share a cubin
  const int max_cluster = max_cluster_of_arch(sm_of_arch(arch));
  auto add = [&](const LaunchConfig& c) {
    if (KernelSpec s = make_spec(op, d, c); seen.insert(s.name()).second) specs.push_back(s);
  };
  for (const auto& c : candidate_grid(op, d, max_cluster)) {
    add(c);
    if (const auto staged = staged_variant(op, d, c, max_cluster)) add(*staged);
  }
  if (op == Op::Backward) specs.push_back(finalize_spec(d));
  std::atomic<int> ok{0};
  std::mutex mu;
  parallel_for(static_cast<int>(specs.size()), [&](int i) {
    try {
      compile_spec(specs[i], arch, impl_->jit.kernel_dir());
      ++ok;
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lk(mu);
      if (failures) failures->push_back(specs[i].name() + ": " + e.what());
    }
  });
  return ok;
}

}  // namespace normjit

// ---- sharded norms (sharded.cuh; ShardedNormDesc) --------------------------

namespace normjit {

namespace {
const char* shard_op(const ShardedNormDesc& d, bool backward) {
  const bool ln = d.norm == NormKind::LayerNorm;
  return backward ? (ln ? "ln_shard_bwd" : "rms_shard_bwd") : (ln ? "ln_shard_fwd" : "rms_shard_fwd");
}

// A pointer the descriptor asks for must be there.
void require_ptr(const void* p, const char* what, const char* why, const ShardedNormDesc& d, bool backward) {
  if (!p)
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} = null: a device pointer is required ({})", what, why),
                shard_op(d, backward), d.str());
}

// The pointers both backward calls read: dy, x and the forward's rstd (and
// mean, LayerNorm), and the weight where the desc has one.
void require_backward_inputs(const ShardedNormDesc& d, const void* dy, const void* x, const void* weight,
                             const float* mean, const float* rstd) {
  require_ptr(dy, "dy", "the output's gradient", d, true);
  require_ptr(x, "x", "the forward's input", d, true);
  require_ptr(rstd, "rstd", "the forward's [M] fp32 rstd", d, true);
  if (d.has_weight) require_ptr(weight, "weight", "has_weight = true", d, true);
  if (d.norm == NormKind::LayerNorm) require_ptr(mean, "mean", "LayerNorm: the forward's [M] fp32 mean", d, true);
}

void validate_shard(const ShardedNormDesc& d, bool backward) {
  try {
    d.validate();
  } catch (const Error& e) {
    throw Error(e.kind(), e.message(), shard_op(d, backward), d.str());
  }
}
}  // namespace

// The kernel module and launch geometry of a sharded call on the current
// device (compiled on first use, like the row kernels; nothing to tune),
// and with `finalize` the dweight / dbias finalize kernel.
Engine::Impl::ShardLaunch Engine::Impl::shard_launch(const ShardedNormDesc& d,
                                                     std::initializer_list<ShardOperand> operands, bool finalize) {
  std::string arch;
  int sms = 0;
  {
    std::unique_lock<std::mutex> lk(mu);
    auto& st = state();
    arch = st.info.arch();
    sms = st.info.sm_count;
  }
  ShardLaunch l;
  l.g = shard_geometry(d, sms, operands);
  l.k = jit.get(sharded_spec(d, l.g.vec, l.g.threads), arch);
  if (finalize) {
    NormDesc fd;
    fd.weight_dtype = d.weight_dtype;
    l.fin = jit.get(finalize_spec(fd), arch);
  }
  return l;
}

void Engine::sharded_stats(const ShardedNormDesc& d, const void* x, double* stats, CUstream stream) {
  validate_shard(d, false);
  if (d.M == 0) return;
  require_ptr(x, "x", "the input", d, false);
  require_ptr(stats, "stats", "[M, 2] float64 partial sums, written", d, false);
  const auto l = impl_->shard_launch(d, {{x, d.x_dtype}});
  long long M = d.M;
  void* args[] = {&x, &stats, &M};
  l.k->launch_shard(ShardKernel::Stats, l.g.grid, stream, args);
}

void Engine::sharded_apply(const ShardedNormDesc& d, const void* x, const void* weight, const void* bias,
                           const double* stats, void* y, float* mean, float* rstd, CUstream stream) {
  validate_shard(d, false);
  if (d.M == 0) return;
  require_ptr(x, "x", "the input", d, false);
  require_ptr(stats, "stats", "every rank's partial sums, summed", d, false);
  require_ptr(y, "y", "the output", d, false);
  if (d.has_weight) require_ptr(weight, "weight", "has_weight = true", d, false);
  if (d.has_bias) require_ptr(bias, "bias", "has_bias = true", d, false);
  if (!d.has_weight) weight = nullptr;
  if (!d.has_bias) bias = nullptr;
  if (d.norm != NormKind::LayerNorm) mean = nullptr;
  const auto l = impl_->shard_launch(d, {{x, d.x_dtype}, {y, d.y_dtype}});
  long long M = d.M;
  float eps = d.eps;
  double inv_n = 1.0 / static_cast<double>(d.N_total);
  void* args[] = {&x, &weight, &bias, &stats, &y, &mean, &rstd, &M, &eps, &inv_n};
  l.k->launch_shard(ShardKernel::Apply, l.g.grid, stream, args);
}

void Engine::sharded_backward_stats(const ShardedNormDesc& d, const void* dy, const void* x, const void* weight,
                                    const float* mean, const float* rstd, double* stats, CUstream stream) {
  validate_shard(d, true);
  if (d.M == 0) return;
  require_backward_inputs(d, dy, x, weight, mean, rstd);
  require_ptr(stats, "stats", "[M, 2] float64 partial sums, written", d, true);
  if (!d.has_weight) weight = nullptr;
  const auto l = impl_->shard_launch(d, {{dy, d.y_dtype}, {x, d.x_dtype}});
  long long M = d.M;
  void* args[] = {&dy, &x, &weight, &mean, &rstd, &stats, &M};
  l.k->launch_shard(ShardKernel::BackwardStats, l.g.grid, stream, args);
}

std::size_t Engine::sharded_backward_workspace_size(const ShardedNormDesc& d) {
  validate_shard(d, true);
  if (d.M == 0 || !shard_partials(d)) return 0;  // nothing to size: no device needed
  std::unique_lock<std::mutex> lk(impl_->mu);
  return shard_workspace_bytes(d, impl_->state().info.sm_count);
}

void Engine::sharded_backward_apply(const ShardedNormDesc& d, const void* dy, const void* x, const void* weight,
                                    const float* mean, const float* rstd, const double* stats, void* dx,
                                    void* dweight, void* dbias, void* workspace, std::size_t workspace_bytes,
                                    CUstream stream) {
  validate_shard(d, true);
  if (d.M == 0) return;
  require_backward_inputs(d, dy, x, weight, mean, rstd);
  require_ptr(stats, "stats", "every rank's backward partial sums, summed", d, true);
  require_ptr(dx, "dx", "the input's gradient, written", d, true);
  if (d.has_weight) require_ptr(dweight, "dweight", "has_weight = true", d, true);
  if (d.has_bias) require_ptr(dbias, "dbias", "has_bias = true", d, true);
  const std::size_t need = sharded_backward_workspace_size(d);
  if (need && (!workspace || workspace_bytes < need))
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("workspace = {} bytes{}: sharded_backward_workspace_size gives {}", workspace_bytes,
                            workspace ? "" : " (null)", need),
                shard_op(d, true), d.str());
  if (!d.has_weight) weight = dweight = nullptr;
  if (!d.has_bias) dbias = nullptr;
  const int partials = shard_partials(d);
  const auto l = impl_->shard_launch(d, {{dy, d.y_dtype}, {x, d.x_dtype}, {dx, d.x_dtype}}, partials > 0);
  long long M = d.M;
  double inv_n = 1.0 / static_cast<double>(d.N_total);
  void* args[] = {&dy, &x, &weight, &mean, &rstd, &stats, &dx, &workspace, &M, &inv_n};
  l.k->launch_shard(ShardKernel::BackwardApply, static_cast<unsigned>(l.g.programs), stream, args);
  if (!partials) return;
  launch_finalize(*l.fin, workspace, d.has_weight ? dweight : dbias, dbias, l.g.finalize, stream);
}

}  // namespace normjit
