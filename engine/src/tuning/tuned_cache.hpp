// The tuned configs of one device: the lookup chain over its cache files
// (cache_file.hpp) and a config's resolution from them.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "device/device_facts.hpp"
#include "normjit/normjit.hpp"
#include "tuning/cache_file.hpp"

namespace normjit::detail {

/// Why the entry stored under `key` no longer describes the current kernel
/// sources ("" when it does): its shape does not give `key`, or the winner's
/// kernel now has another source hash (tuned_kernel_hash).
std::string entry_staleness(const std::string& key, const TunedEntry& entry);

/// Reason an entry may not be used ("" = usable); see entry_staleness.
using EntryCheck = std::function<std::string(const std::string& key, const TunedEntry&)>;

/// The lookup chain for one device: memory, user cache, shipped caches.
/// Thread-safe.
class TunedCache {
 public:
  /// `check` filters the entries read from files (default: entry_staleness).
  TunedCache(std::string user_dir, std::vector<std::string> shipped_dirs,
             DeviceFingerprint device, CacheMetadata metadata, WarnFn warn = {}, EntryCheck check = {});

  /// Looks `key` up in memory, then the user file, then each shipped dir in
  /// order. Files are read once per process (lazily). Entries whose file
  /// fails the match rule are never returned.
  std::optional<TunedEntry> lookup(const std::string& key, ConfigSource* source = nullptr);

  /// Stores in memory and merges into the user file (atomic, locked).
  void store(const std::string& key, const TunedEntry& entry);

  /// <user_dir>/<slug>.json
  std::string user_file() const;
  const DeviceFingerprint& device() const { return device_; }
  const CacheMetadata& metadata() const { return metadata_; }

 private:
  // Entries of `path` that pass the match rule (empty if none); warns once.
  std::map<std::string, TunedEntry> load_matching(const std::string& path);

  std::string user_dir_;
  std::vector<std::string> shipped_dirs_;
  DeviceFingerprint device_;
  CacheMetadata metadata_;
  WarnFn warn_;
  EntryCheck check_;
  std::mutex mu_;
  std::map<std::string, TunedEntry> memory_;
  std::optional<std::map<std::string, TunedEntry>> user_;
  std::vector<std::optional<std::map<std::string, TunedEntry>>> shipped_;
};

/// The config of `op` on `d` from the tuned caches (what Engine::explain
/// reports): an exact entry under `key` (shape_key of op and d) unless
/// `skip_exact` or policy Always, else the config model's (heuristic_config).
/// Never tunes.
ConfigExplanation config_from_caches(TunedCache& cache, Op op, const NormDesc& d, const std::string& key,
                                     const DeviceFacts& dev, TunePolicy policy, bool skip_exact);
/// The same with the key derived here.
ConfigExplanation config_from_caches(TunedCache& cache, Op op, const NormDesc& d, const DeviceFacts& dev,
                                     TunePolicy policy, bool skip_exact);

}  // namespace normjit::detail
