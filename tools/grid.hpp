// The tuning grid of the shipped caches (autotune_cache/grid/grid.json): which
// shapes `normjit tune --grid` tunes, in which order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::tools {

/// One variant and N of the grid: its M values share compiled kernels,
/// checks and scratch buffers when tuned.
struct GridGroup {
  Op op = Op::Forward;
  std::string spec_head;  ///< "<norm>:<dtype>:"
  std::string options;    ///< ":res" or ""
  std::int64_t N = 0;
  std::vector<std::int64_t> Ms;  ///< ascending
  /// The shape spec for one M: "<norm>:<dtype>:<M>x<N><options>".
  std::string spec(std::int64_t M) const;
};

struct Grid {
  std::vector<std::int64_t> N;  ///< ascending, unique
  std::vector<GridGroup> groups;  ///< in tuning order
  std::size_t entries() const;
};

/// Reads and expands a grid file. The log grid has `count` values from `min`
/// to `max`, each rounded to a multiple of `multiple`; N_odd adds `count`
/// odd values from `min` to `max` (log-spaced); model sizes are added.
/// Each N gets the M values whose M * N fits max_elements, plus the largest
/// power of two that fits when a listed M does not. Groups come coarse N
/// first (a stopped run still covers the range) and dtypes in the file's
/// order. Throws normjit::Error(InvalidArgument) naming the file and field.
Grid read_grid(const std::string& path);

}  // namespace normjit::tools
