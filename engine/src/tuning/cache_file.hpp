// Tuned-cache files: JSON files of autotune winners, one file per device.
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

struct TunedEntry {
  std::string shape;        ///< shape_spec of the tuned descriptor (its variant, N and M)
  std::string kernel_hash;  ///< tuned_kernel_hash of the winner when tuned
  LaunchConfig winner;
  double winner_us = 0;
  std::string tuned_at;  ///< ISO 8601 UTC
  std::vector<CandidateTiming> candidates;
};

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

/// Now as ISO 8601 UTC ("2026-11-21T06:00:00Z"): TunedEntry::tuned_at.
std::string utc_now();

/// The default warning sink: "normjit: warning: <text>" on stderr.
void default_warn(const std::string& text);

}  // namespace normjit::detail
