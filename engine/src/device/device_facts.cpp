#include "device/device_facts.hpp"

namespace normjit::detail {

DeviceFacts DeviceFacts::of(int cc_major, int cc_minor, int sm_count, std::int64_t l2_bytes, double memory_gbps) {
  DeviceFacts f;
  f.sm_count = sm_count;
  f.l2_bytes = l2_bytes;
  f.memory_gbps = memory_gbps > 0 ? memory_gbps : 25.0 * sm_count;
  const int sm = cc_major * 10 + cc_minor;
  // CUDA C Programming Guide, "Technical Specifications per Compute Capability".
  if (sm == 86 || sm == 87 || sm == 89 || sm >= 120) f.max_threads_per_sm = 1536;
  if (sm == 86 || sm == 87) f.max_blocks_per_sm = 16;
  if (sm == 89) f.max_blocks_per_sm = 24;
  if (sm == 80 || sm == 87) f.smem_per_sm = 167936;
  if (sm == 86 || sm == 89 || sm >= 120) f.smem_per_sm = 102400;
  // Tuning guides of Ampere, Ada and Hopper: 192 KB on sm_80 and sm_87,
  // 128 KB on sm_86, sm_89 and sm_120, 256 KB on sm_90 and sm_100.
  if (sm == 80 || sm == 87) f.l1_smem_per_sm = 196608;
  if (sm == 86 || sm == 89 || sm >= 120) f.l1_smem_per_sm = 131072;
  f.max_cluster = max_cluster_of_arch(sm);
  return f;
}

}  // namespace normjit::detail
