// Work spread over the host's cores (compiles of a grid, a cache migration).
#pragma once

#include <functional>

namespace normjit::detail {

/// Runs `fn(i)` for i in [0, n) on up to hardware_concurrency threads;
/// rethrows the first exception after all finished.
void parallel_for(int n, const std::function<void(int)>& fn);

}  // namespace normjit::detail
