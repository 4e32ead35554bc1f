// The whole path of a call, resolved once. A forward or backward call with a
// descriptor the engine has not seen (or new pointer alignments) goes:
//
//   NormDesc::validate             bad input throws here, before anything runs
//   require_forward / _backward    each tensor the descriptor needs is non-null
//   shape_key                      the tuned-cache key (once; the plan keeps it)
//   resolve_config                 memory, user cache, shipped caches, tuning
//                                  (policy permitting), else the config model
//   fit_alignment                  vectors narrowed to what the pointers allow
//   make_spec -> KernelCache::get  NVRTC (or the cubin cache), module load
//   launch_geometry                grid, block, programs; backward workspace
//   layout                         every tensor's strides in the kernel's args
//
// and stores the outcome as a Plan under a PlanKey (every descriptor field,
// and each pointer's alignment class and nullness). Every later call with the
// same key is a hash lookup and a launch: no strings, no allocation, no
// compile-time derivation.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "config/config_grid.hpp"
#include "compile/jit.hpp"
#include "norm_args.cuh"
#include "normjit/normjit.hpp"

namespace normjit::detail {

/// What selects a plan: the op, every NormDesc field, and per tensor pointer
/// its alignment class (0..4: log2 of its alignment up to 16 bytes; 7: null).
/// Alignment matters because the config's vectors are narrowed to it.
struct PlanKey {
  static constexpr int kWords = 46;
  std::array<std::int64_t, kWords> w{};
  bool operator==(const PlanKey& o) const { return w == o.w; }
};
struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const;
};

/// Alignment word of `n` <= 13 pointers: each one's address modulo 16, or null.
std::int64_t alignment_classes(const void* const* ptrs, int n);
/// Marks a backward key that sizes the workspace (no pointers seen).
inline constexpr std::int64_t kSizingOnly = -1;

PlanKey plan_key(Op op, const NormDesc& desc, std::int64_t alignment);
PlanKey plan_key(const NormDesc& desc, const ForwardTensors& t);
PlanKey plan_key(const NormDesc& desc, const BackwardTensors& t);

/// A resolved call. Immutable once built; shared by every call with its key.
struct Plan {
  Op op = Op::Forward;
  NormDesc desc;
  std::string shape_key;       ///< the tuned-cache key (readers, explain)
  ConfigSource source = ConfigSource::Heuristic;
  LaunchConfig resolved;       ///< the config the caches / tuner / heuristic chose
  LaunchConfig config;         ///< resolved, fitted to the pointers' alignment
  std::shared_ptr<const LoadedKernel> kernel;    ///< null for a sizing-only plan
  std::shared_ptr<const LoadedKernel> finalize;  ///< backward with > 1 program
  Geometry geometry;           ///< from `resolved` (backward: independent of alignment)
  unsigned resident = 0;       ///< forward, per-tensor current scaling: amax pass grid
  int qt_cols = 0;             ///< forward, store_y_t: transpose_columns
  std::size_t workspace_bytes = 0;  ///< backward: partial dweight / dbias rows
  nj::NormArgs layout{};       ///< strides, M, eps; pointers filled per call

  /// The launches of this plan on `s` (tensors as the descriptor needs them;
  /// the key guaranteed which are non-null).
  void forward(const ForwardTensors& t, CUstream s) const;
  void backward(const BackwardTensors& t, CUstream s) const;
};

}  // namespace normjit::detail
