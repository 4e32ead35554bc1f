// The lookup chain of one device's tuned configs (memory, user file, shipped
// files), the entries' match rule, and a config's resolution from the caches.
#include "tuning/tuned_cache.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "compile/specialization.hpp"
#include "config/config_grid.hpp"
#include "core/shape_spec.hpp"

namespace normjit::detail {

namespace fs = std::filesystem;

TunedCache::TunedCache(std::string user_dir, std::vector<std::string> shipped_dirs, DeviceFingerprint device,
                       CacheMetadata metadata, WarnFn warn, EntryCheck check)
    : user_dir_(std::move(user_dir)),
      shipped_dirs_(std::move(shipped_dirs)),
      device_(std::move(device)),
      metadata_(std::move(metadata)),
      warn_(warn ? std::move(warn) : WarnFn(default_warn)),
      check_(check ? std::move(check) : EntryCheck(entry_staleness)),
      shipped_(shipped_dirs_.size()) {}

std::string TunedCache::user_file() const { return (fs::path(user_dir_) / (device_.slug() + ".json")).string(); }

std::map<std::string, TunedEntry> TunedCache::load_matching(const std::string& path) {
  auto file = read_tuned_cache_file(path, warn_);
  if (!file) return {};
  if (file->device.key() != device_.key()) {
    warn_(fmt::format("tuned cache {} is for device '{}', not '{}'; ignoring it", path, file->device.key(),
                      device_.key()));
    return {};
  }
  std::map<std::string, TunedEntry> usable;
  std::size_t stale = 0;
  std::string first;
  for (auto& [key, e] : file->entries) {
    const std::string why = check_(key, e);
    if (why.empty()) {
      usable.emplace(key, std::move(e));
    } else if (stale++ == 0) {
      first = fmt::format("{}: {}", key, why);
    }
  }
  if (stale)
    warn_(fmt::format("tuned cache {}: {} of {} entries are stale (their kernels changed since tuning) and are "
                      "skipped until re-tuned; first: {}",
                      path, stale, file->entries.size(), first));
  return usable;
}

std::string entry_staleness(const std::string& key, const TunedEntry& entry) {
  try {
    const Op op = shape_key_op(key);
    const NormDesc d = parse_shape_spec(entry.shape).desc;
    if (shape_key(op, d) != key)
      return fmt::format("its shape '{}' gives the key {}", entry.shape, shape_key(op, d));
    if (!config_valid(op, d, entry.winner, nullptr, kMaxCluster))
      return fmt::format("winner {} is no longer a valid config", entry.winner.str());
    if (tuned_kernel_hash(op, d, entry.winner) != entry.kernel_hash)
      return fmt::format("kernel {} changed (source hash {}, tuned as {})", make_spec(op, d, entry.winner).name(),
                         tuned_kernel_hash(op, d, entry.winner), entry.kernel_hash.empty() ? "none" : entry.kernel_hash);
  } catch (const Error& e) {
    return e.message();
  }
  return {};
}

std::optional<TunedEntry> TunedCache::lookup(const std::string& key, ConfigSource* source) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto find = [&](const std::map<std::string, TunedEntry>& m, ConfigSource from) -> const TunedEntry* {
    const auto it = m.find(key);
    if (it == m.end()) return nullptr;
    if (source) *source = from;
    return &it->second;
  };
  if (const TunedEntry* e = find(memory_, ConfigSource::Memory)) return *e;
  if (!user_) user_ = load_matching(user_file());
  if (const TunedEntry* e = find(*user_, ConfigSource::UserCache)) return *e;
  for (std::size_t i = 0; i < shipped_dirs_.size(); ++i) {
    if (!shipped_[i]) shipped_[i] = load_matching((fs::path(shipped_dirs_[i]) / (device_.slug() + ".json")).string());
    if (const TunedEntry* e = find(*shipped_[i], ConfigSource::ShippedCache)) return *e;
  }
  return std::nullopt;
}

void TunedCache::store(const std::string& key, const TunedEntry& entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory_[key] = entry;
    if (user_) (*user_)[key] = entry;
  }
  // Outside mu_: the merge does I/O and may wait for the file lock, which
  // also serialises concurrent stores.
  merge_into_tuned_cache_file(user_file(), device_, metadata_, {{key, entry}});
}

ConfigExplanation config_from_caches(TunedCache& cache, Op op, const NormDesc& d, const DeviceFacts& dev,
                                     TunePolicy policy, bool skip_exact) {
  return config_from_caches(cache, op, d, shape_key(op, d), dev, policy, skip_exact);
}

ConfigExplanation config_from_caches(TunedCache& cache, Op op, const NormDesc& d, const std::string& key,
                                     const DeviceFacts& dev, TunePolicy policy, bool skip_exact) {
  const int mc = dev.max_cluster;
  ConfigExplanation x;
  x.shape_key = key;
  auto take = [&](const TunedEntry& e, ConfigSource s, const std::string& from) {
    x.config = e.winner;
    x.source = s;
    x.from_key = from;
    x.from_file = config_source_name(s);
    x.entry_us = e.winner_us;
    x.candidates = e.candidates;
  };
  if (!skip_exact && policy != TunePolicy::Always) {
    ConfigSource s{};
    if (auto e = cache.lookup(x.shape_key, &s); e && config_valid(op, d, e->winner, nullptr, mc)) {
      take(*e, s, x.shape_key);
      x.reason = fmt::format("tuned for this shape key ({}, {:.2f} us)", x.from_file, e->winner_us);
      return x;
    }
  }
  // No neighbour's config: another shape's winner, within noise of its
  // rivals there, was measured to lose to the model here (issue 19).
  x.config = heuristic_config(op, d, dev);
  x.source = ConfigSource::Heuristic;
  x.reason = "no tuned entry for this shape; the config model's (predicted fastest from the device's facts)";
  return x;
}

}  // namespace normjit::detail
