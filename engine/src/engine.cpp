#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "autotune.hpp"
#include "config_grid.hpp"
#include "driver.hpp"
#include "jit.hpp"
#include "kernel_sources.hpp"
#include "nvrtc.hpp"
#include "ops.hpp"
#include "tuned_cache.hpp"

namespace normjit {

using namespace detail;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// One place for the default cache location.
std::string default_cache_dir() {
  if (auto d = env("NORMJIT_CACHE_DIR"); !d.empty()) return d;
  if (auto x = env("XDG_CACHE_HOME"); !x.empty()) return x + "/normjit";
  if (auto h = env("HOME"); !h.empty()) return h + "/.cache/normjit";
  return (std::filesystem::temp_directory_path() / "normjit-cache").string();
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void require(bool ok, const char* what, Op op, const NormDesc& d) {
  if (!ok) throw Error(ErrorKind::InvalidArgument, fmt::format("{} = null: a device pointer is required", what), op_name(op), d.str());
}

}  // namespace

EngineOptions EngineOptions::from_env() {
  EngineOptions o;
  if (auto t = env("NORMJIT_TUNE"); !t.empty()) {
    try {
      o.tune_policy = parse_tune_policy(t);
    } catch (const Error&) {
      throw Error(ErrorKind::InvalidArgument, fmt::format("NORMJIT_TUNE = '{}' is not one of never, first, always", t));
    }
  }
  o.cache_dir = env("NORMJIT_CACHE_DIR");
  std::string path = env("NORMJIT_SHIPPED_CACHE_PATH");
  for (std::size_t a = 0; !path.empty() && a <= path.size();) {
    std::size_t b = path.find(':', a);
    if (b == std::string::npos) b = path.size();
    if (b > a) o.shipped_cache_dirs.push_back(path.substr(a, b - a));
    a = b + 1;
  }
  return o;
}

struct Engine::Impl {
  EngineOptions opt;
  std::string root;
  KernelCache jit;

  struct DeviceState {
    DeviceInfo info;
    std::unique_ptr<TunedCache> tuned;
    std::map<std::string, LaunchConfig> resolved;  // shape key -> config, this engine
  };
  std::mutex mu;
  std::map<CUdevice, std::unique_ptr<DeviceState>> devices;

  explicit Impl(EngineOptions o)
      : opt(std::move(o)),
        root(opt.cache_dir.empty() ? default_cache_dir() : opt.cache_dir),
        jit(opt.disk_kernel_cache ? root + "/kernels" : std::string()) {}

  std::vector<std::string> shipped_dirs() const {
    std::vector<std::string> d = opt.shipped_cache_dirs;
    for (const char* builtin : {NORMJIT_SOURCE_CACHE_DIR, NORMJIT_INSTALL_CACHE_DIR})
      if (std::filesystem::is_directory(builtin)) d.push_back(builtin);
    return d;
  }

  // Caller holds mu.
  DeviceState& state() {
    const CUdevice dev = current_device();
    auto& st = devices[dev];
    if (!st) {
      st = std::make_unique<DeviceState>();
      st->info = device_info(dev);
      DeviceFingerprint fp{st->info.name, st->info.cc_major, st->info.cc_minor, st->info.sm_count, st->info.l2_bytes};
      int driver = 0;
      cu().cuDriverGetVersion(&driver);
      CacheMetadata md{NORMJIT_VERSION_STRING, kernel_source_hash(), nvrtc_version_or_empty(), driver};
      st->tuned = std::make_unique<TunedCache>(root + "/tuned", shipped_dirs(), fp, md);
    }
    return *st;
  }

  TuneResult tune_and_store(DeviceState& st, Op op, const NormDesc& d) {
    ProgressFn progress;
    if (opt.verbose)
      progress = [&](int done, int total, const std::string& text) {
        std::fprintf(stderr, "\rnormjit: tuning %s %s [%d/%d] %-40s", op_name(op), d.str().c_str(), done, total,
                     text.c_str());
        if (done == total) std::fprintf(stderr, "\n");
      };
    TuneResult r = autotune(op, d, st.info, jit, progress);
    st.tuned->store(r.shape_key, TunedEntry{r.winner, r.winner_us, utc_now(), r.candidates});
    st.resolved[r.shape_key] = r.winner;
    return r;
  }

  /// What a call needs to launch: the resolved config and the device's facts.
  struct Launch {
    LaunchConfig cfg;
    std::string arch;
    int sm_count = 0;
  };
  Launch prepare(Op op, const NormDesc& d);
  /// Rethrows `e` (being handled) with op, shape and config attached.
  [[noreturn]] static void attach_context(const Error& e, Op op, const NormDesc& d, const LaunchConfig& cfg);

  // Caller holds mu. Memory, then caches (unless policy Always), then tuning
  // (policy permitting), then the heuristic.
  LaunchConfig resolve(DeviceState& st, Op op, const NormDesc& d, ConfigSource* src) {
    const std::string key = shape_key(op, d);
    ConfigSource s = ConfigSource::Memory;
    LaunchConfig cfg;
    if (auto it = st.resolved.find(key); it != st.resolved.end()) {
      cfg = it->second;
    } else {
      std::optional<TunedEntry> e;
      if (opt.tune_policy != TunePolicy::Always) e = st.tuned->lookup(key, &s);
      if (e && config_valid(op, d, e->winner)) {
        cfg = e->winner;
      } else if (opt.tune_policy != TunePolicy::Never) {
        cfg = tune_and_store(st, op, d).winner;
        s = ConfigSource::Tuned;
      } else {
        cfg = heuristic_config(op, d);
        s = ConfigSource::Heuristic;
      }
      st.resolved[key] = cfg;
    }
    if (src) *src = s;
    return cfg;
  }
};

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Engine::~Engine() = default;

const EngineOptions& Engine::options() const { return impl_->opt; }
std::string Engine::cache_dir() const { return impl_->root; }
std::vector<std::string> Engine::shipped_cache_dirs() const { return impl_->shipped_dirs(); }

LaunchConfig Engine::config_for(Op op, const NormDesc& d, ConfigSource* source) {
  d.validate();
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->resolve(impl_->state(), op, d, source);
}

TuneResult Engine::tune(Op op, const NormDesc& d) {
  d.validate();
  if (d.M == 0) throw Error(ErrorKind::InvalidArgument, "M = 0: nothing to tune", op_name(op), d.str());
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->tune_and_store(impl_->state(), op, d);
}

namespace {
// A null device pointer is bad input: name it before anything runs.
void require_all(Op op, const NormDesc& d, std::initializer_list<std::pair<const void*, const char*>> ptrs) {
  for (auto [p, name] : ptrs) require(p, name, op, d);
}
}  // namespace

Engine::Impl::Launch Engine::Impl::prepare(Op op, const NormDesc& d) {
  std::lock_guard<std::mutex> lk(mu);
  auto& st = state();
  return {resolve(st, op, d, nullptr), st.info.arch(), st.info.sm_count};
}

void Engine::Impl::attach_context(const Error& e, Op op, const NormDesc& d, const LaunchConfig& cfg) {
  if (dynamic_cast<const CompileError*>(&e) || !e.op().empty()) throw;
  throw Error(e.kind(), e.message(), op_name(op), d.str(), cfg.str(), e.where());
}

void Engine::rms_norm_forward(const NormDesc& d, const void* x, const void* weight, void* y, float* rstd,
                              CUstream stream) {
  constexpr Op op = Op::RmsForward;
  d.validate();
  if (d.M == 0) return;
  require_all(op, d, {{x, "x"}, {weight, "weight"}, {y, "y"}});
  if (d.store_rstd) require(rstd, "rstd", op, d);
  Impl::Launch l;
  try {
    l = impl_->prepare(op, d);
    l.cfg = fit_alignment(l.cfg, d, {{x, d.x_dtype}, {weight, d.weight_dtype}, {y, d.y_dtype}}, {d.x_ld(), d.y_ld()});
    auto k = impl_->jit.get(make_spec(op, d, l.cfg), l.arch);
    auto p = [](const void* v) { return reinterpret_cast<CUdeviceptr>(v); };
    launch_forward(*k, d, {p(x), p(weight), p(y), p(d.store_rstd ? rstd : nullptr)}, l.sm_count, stream);
  } catch (const Error& e) {
    impl_->attach_context(e, op, d, l.cfg);
  }
}

std::size_t Engine::rms_norm_backward_workspace_size(const NormDesc& d) {
  d.validate();
  if (d.M == 0) return 0;
  // The workspace is one partial row per program of the persistent grid.
  const Impl::Launch l = impl_->prepare(Op::RmsBackward, d);
  auto k = impl_->jit.get(make_spec(Op::RmsBackward, d, l.cfg), l.arch);
  return backward_workspace_bytes(backward_geometry(*k, d, l.cfg, l.sm_count), d);
}

void Engine::rms_norm_backward(const NormDesc& d, const void* dy, const void* x, const void* weight,
                               const float* rstd, void* dx, void* dweight, void* workspace,
                               std::size_t workspace_bytes, CUstream stream) {
  constexpr Op op = Op::RmsBackward;
  d.validate();
  if (d.M == 0) return;
  require_all(op, d, {{dy, "dy"}, {x, "x"}, {weight, "weight"}, {rstd, "rstd"}, {dx, "dx"}, {dweight, "dweight"},
                      {workspace, "workspace"}});
  Impl::Launch l;
  try {
    l = impl_->prepare(op, d);
    // The grid comes from the resolved config, the kernel from the one that
    // fits the pointers' alignment.
    const Geometry g = backward_geometry(*impl_->jit.get(make_spec(op, d, l.cfg), l.arch), d, l.cfg, l.sm_count);
    l.cfg = fit_alignment(l.cfg, d, {{dy, d.y_dtype}, {x, d.x_dtype}, {weight, d.weight_dtype}, {dx, d.x_dtype}},
                          {d.dy_ld(), d.x_ld(), d.dx_ld()});
    auto k = impl_->jit.get(make_spec(op, d, l.cfg), l.arch);
    auto fin = impl_->jit.get(finalize_spec(d), l.arch);
    const std::size_t need = backward_workspace_bytes(g, d);
    if (workspace_bytes < need)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("workspace_bytes = {} is too small: {} needed (rms_norm_backward_workspace_size)",
                              workspace_bytes, need));
    auto p = [](const void* v) { return reinterpret_cast<CUdeviceptr>(v); };
    launch_backward(*k, *fin, d, {p(dy), p(x), p(weight), p(rstd), p(dx), p(dweight), p(workspace)}, g, stream);
  } catch (const Error& e) {
    impl_->attach_context(e, op, d, l.cfg);
  }
}

int Engine::precompile(Op op, const NormDesc& d, const std::string& arch, std::vector<std::string>* failures) {
  d.validate();
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 5)
    throw Error(ErrorKind::InvalidArgument, fmt::format("arch = '{}' is not of the form sm_XY (e.g. sm_90)", arch));
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;  // configs differing only in launch parameters share a cubin
  for (const auto& c : candidate_grid(op, d))
    if (KernelSpec s = make_spec(op, d, c); seen.insert(s.name()).second) specs.push_back(s);
  if (op == Op::RmsBackward) specs.push_back(finalize_spec(d));
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
