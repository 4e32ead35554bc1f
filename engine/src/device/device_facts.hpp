// What the config model reads of a GPU (its facts), from published
// per-architecture limits and the driver's attributes (device/driver.hpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "normjit/normjit.hpp"

namespace normjit::detail {

/// The largest thread-block cluster of an architecture (sm_XY as XY, e.g.
/// 90): kMaxCluster from Hopper on, 1 (no clusters) before.
inline int max_cluster_of_arch(int sm) { return sm >= 90 ? kMaxCluster : 1; }
/// The XY of an NVRTC arch name "sm_XY" (or "sm_XYa"), e.g. 90.
inline int sm_of_arch(const std::string& arch) {
  return std::atoi(arch.c_str() + (arch.rfind("sm_", 0) == 0 ? 3 : 0));
}

/// What the config model reads of a GPU: published per-architecture limits
/// and what the driver reports. `of` fills the per-SM limits of an
/// architecture (used where only the tuned-cache file's fingerprint is
/// known); the engine overwrites them with the driver's attributes.
struct DeviceFacts {
  int sm_count = 0;
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
  int regs_per_sm = 65536;
  std::int64_t smem_per_sm = 233472;  ///< shared memory of an SM (bytes)
  /// An SM's unified L1 data cache and shared memory (bytes): what L1 keeps
  /// beside the shared memory in use.
  std::int64_t l1_smem_per_sm = 262144;
  std::int64_t l2_bytes = 0;
  double memory_gbps = 0;  ///< DRAM bandwidth: 2 * memory clock * bus width (GB/s = bytes/ns)
  double sm_clock_ghz = 1.8;  ///< SM clock (the driver's; 1.8 where unknown)
  int max_cluster = 1;     ///< largest thread-block cluster a config may use (1: none)
  /// `memory_gbps` 0 (a tuned-cache file written before it was recorded):
  /// 25 GB/s per SM, an H100's ratio.
  static DeviceFacts of(int cc_major, int cc_minor, int sm_count, std::int64_t l2_bytes, double memory_gbps);
};

}  // namespace normjit::detail
