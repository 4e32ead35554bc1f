// The config model: the launch config of a shape from the device's facts,
// with no tuned entry. Every config of the candidate grid gets a predicted
// time from a small latency / bandwidth model of the GPU; the fastest wins
// (ties: the simpler config).
//
// Forward (one program per ROWS_PER_PID rows): a program's row slice is in
// flight at once (each thread issues its k vector loads, then reduces), so
// a program costs about one memory latency plus its reductions; the SMs
// overlap as many programs as occupancy (threads, registers, cluster
// packing) allows, and the bytes in flight bound the bandwidth an SM draws:
//   time = rounds * max(t_program, bytes of a round / bandwidth of the SMs in use)
// Backward (persistent programs, rows streamed): the same per row of a
// program, plus the dweight partial rows and the finalize launch.
//
// The model's constants (ModelParams) are effective latencies in ns, fitted
// by tools/fit_config_model.cpp on full-grid timings of random shapes
// (autotune_cache/model/*.json: every candidate of each shape timed on an
// H100 and an H200); the device's facts (SM count, threads and registers
// per SM, memory bandwidth, clusters) are the model's inputs, so a GPU
// nobody tuned gets configs from its own facts.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "config/config_grid.hpp"

namespace normjit::detail {

/// Constants of the model for one op (ns unless stated; see config_model.cpp).
/// `v` prices every launch, except, where `one_wave` is set, the forward
/// launches whose CTAs are all resident at once (decode rows): those wait on
/// one memory latency with every load in flight (staged kernels,
/// staged_for_launch), not on a chain of loads, so their constants can be
/// fitted apart, on timings of launches as the engine runs them
/// (autotune_cache/model/launched/; normjit_fit_model --launched). Unset in
/// the shipped fit: constants fitted on one GPU's launches did not improve
/// the other GPU's picks (docs/design.md).
struct ModelParams {
  static constexpr int kCount = 17;
  std::array<double, kCount> v{};
  std::optional<std::array<double, kCount>> one_wave;
  static const char* name(int i);
};

/// The fitted constants of `op` (forward or backward).
const ModelParams& fitted_params(Op op);

/// Predicted time (ns) of `op` on `desc` under `cfg`; cfg must be valid.
double predicted_ns(Op op, const NormDesc& desc, const LaunchConfig& cfg, const DeviceFacts& dev,
                    const ModelParams& p);
struct Variant;
/// The same with `desc`'s variant (make_variant) given.
double predicted_ns(Op op, const NormDesc& desc, const Variant& v, const LaunchConfig& cfg, const DeviceFacts& dev,
                    const ModelParams& p);

/// Index of the config of `grid` (sorted simplest first) with the least
/// predicted time; a later config must be faster to win.
std::size_t fastest_of(Op op, const NormDesc& desc, const std::vector<LaunchConfig>& grid, const DeviceFacts& dev,
                       const ModelParams& p);

/// The grid config with the least predicted time (ties: simplicity_key).
LaunchConfig model_config(Op op, const NormDesc& desc, const DeviceFacts& dev, const ModelParams& p);

}  // namespace normjit::detail
