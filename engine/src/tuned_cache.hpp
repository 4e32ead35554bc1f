// The tuned-config cache: JSON files of autotune winners, one file per device.
//
// File: <dir>/<device slug>.json, where <dir> is "<user cache>/tuned" or a
// shipped directory (autotune_cache/, or one the user adds).
//   {
//     "schema_version": 2,
//     "device":   {"key": ..., "name": ..., "compute_capability": "9.0",
//                  "sm_count": 132, "l2_bytes": 52428800},
//     "metadata": {"engine_version": "0.1.0", "kernel_source_hash": "<32 hex>",
//                  "nvrtc_version": "13.0", "driver_version": 13000},
//     "entries":  {"<shape key>": {"shape": "rms:bf16:8192x4096",
//                  "kernel_hash": "<32 hex>", "winner": "v8.t512.r1", "winner_us": 12.3,
//                  "tuned_at": "2026-11-21T06:00:00Z",
//                  "candidates": [{"config": "v8.t256.r1", "median_us": 13.0},
//                                 {"config": "v4.t64.r1", "median_us": -1,
//                                  "rejected": "mismatch ..."}]}}
//   }
// What must match for a file's entries to be used (anything else is recorded
// only): schema_version and device.key for the file; for each entry, its
// kernel_hash must equal the source hash of the kernel it describes (the
// winner's specialisation of `shape`: KernelSpec::source_hash), so an edit to
// one template leaves the entries of the other kernels valid. A file that
// does not parse, is truncated or has another schema gives one warning per
// process and is ignored; the next store rebuilds it. Stale entries are
// skipped (one warning per file, with their count) until re-tuned. Writes are atomic (temp file, fsync, rename, fsync of the
// directory) and merged under an advisory lock (<file>.lock) with a timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

inline constexpr int kTunedCacheSchemaVersion = 2;

struct DeviceFacts;

/// Identifies a GPU model and its configuration for tuned configs.
struct DeviceFingerprint {
  std::string name;        ///< "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::int64_t l2_bytes = 0;
  /// DRAM bandwidth (GB/s), recorded for the config model; not part of the
  /// key (0: not recorded).
  double memory_gbps = 0;
  /// "NVIDIA H100 80GB HBM3|cc9.0|132sm|50MiB": compared on load.
  std::string key() const;
  /// File-name form: "nvidia-h100-80gb-hbm3.cc90.132sm.50mib".
  std::string slug() const;
  /// What the config model knows of this device (DeviceFacts::of).
  DeviceFacts facts() const;
};

/// Versions recorded with (and partly checked against) every file.
struct CacheMetadata {
  std::string engine_version;
  std::string kernel_source_hash;
  std::string nvrtc_version;  ///< "13.0", or "" when NVRTC was not loaded
  int driver_version = 0;     ///< cuDriverGetVersion, 0 when unknown
};

/// Bucket of M used in shape keys: the smallest power of two >= M, capped at
/// 65536 (all larger M share one bucket); 0 for M == 0.
std::int64_t m_bucket(std::int64_t M);

/// "rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=8192": the variant's tags
/// (Variant::tags: norm, direction, dtypes, flags), N and the M bucket. The
/// same string is the JSON key.
std::string shape_key(Op op, const NormDesc& desc);

struct TunedEntry {
  std::string shape;        ///< shape_spec of the tuned descriptor (its variant, N and M)
  std::string kernel_hash;  ///< tuned_kernel_hash of the winner when tuned
  LaunchConfig winner;
  double winner_us = 0;
  std::string tuned_at;  ///< ISO 8601 UTC
  std::vector<CandidateTiming> candidates;
};

/// Why the entry stored under `key` no longer describes the current kernel
/// sources ("" when it does): its shape does not give `key`, or the winner's
/// kernel now has another source hash (tuned_kernel_hash).
std::string entry_staleness(const std::string& key, const TunedEntry& entry);

/// Op of a shape key ("rms_fwd:..." is Forward); throws Error(InvalidArgument)
/// for a key of neither direction.
Op shape_key_op(const std::string& key);

/// Called with a warning line (no trailing newline). Default: stderr.
using WarnFn = std::function<void(const std::string&)>;

/// What a cache file holds, as read from disk.
struct TunedCacheFile {
  std::string path;
  DeviceFingerprint device;
  CacheMetadata metadata;
  std::map<std::string, TunedEntry> entries;
};

/// Reads one file. Returns nullopt (and calls warn once with the path and the
/// reason) when it is missing (no warning then), unreadable, not JSON,
/// truncated, of another schema, or lacks a required field.
std::optional<TunedCacheFile> read_tuned_cache_file(const std::string& path, const WarnFn& warn);

/// Every *.json file in `dir` that parses (others are skipped with a warning).
std::vector<TunedCacheFile> list_tuned_cache_files(const std::string& dir, const WarnFn& warn);

/// Merges `entries` into the file at `path` under its lock: entries already in
/// a valid file with the same device key are kept unless overwritten;
/// anything else in it is dropped. Atomic. Throws
/// Error(Cache) when the lock is not taken within `lock_timeout_ms` or the
/// write fails; the old file is then untouched.
void merge_into_tuned_cache_file(const std::string& path, const DeviceFingerprint& device,
                                 const CacheMetadata& metadata,
                                 const std::map<std::string, TunedEntry>& entries,
                                 int lock_timeout_ms = 10000);

/// Removes the entries under `keys` from the file at `path` under its lock
/// (atomic); returns how many it held. Throws Error(Cache) when the file
/// cannot be read or written.
std::size_t remove_from_tuned_cache_file(const std::string& path, const std::set<std::string>& keys,
                                         int lock_timeout_ms = 10000);

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
  // Caller holds mu_: reads every file not read yet.
  void load_all();

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

/// How a config is resolved from tuned caches (Engine::explain): an exact
/// entry (unless `skip_exact` or policy Always), else the config model's
/// (heuristic_config). Never tunes.
ConfigExplanation explain_config(TunedCache& cache, Op op, const NormDesc& d, const DeviceFacts& dev, TunePolicy policy,
                                 bool skip_exact);

/// Now as ISO 8601 UTC ("2026-11-21T06:00:00Z"): TunedEntry::tuned_at.
std::string utc_now();

/// The default warning sink: "normjit: warning: <text>" on stderr.
void default_warn(const std::string& text);

}  // namespace normjit::detail
