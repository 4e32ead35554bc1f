// The tensors an op reads and writes, with their dtypes and layouts: one
// place that the tuner's scratch buffers, the benchmark's byte count and the
// tests' checks all follow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

struct TensorSpec {
  std::string name;  ///< "x", "residual", "weight", "y", "rstd", "dx", "dweight", ...
  bool output = false;
  DType dtype = DType::F32;
  std::int64_t rows = 1, heads = 1;  ///< rows = M for row tensors, 1 for [N] and [M] vectors
  std::int64_t ld = 0, hs = 0;       ///< token and head strides (elements)
  std::int64_t cols = 0;             ///< elements a row: N, or M for mean / rstd

  /// Offset of element 0 of row r: (r / heads) * ld + (r % heads) * hs.
  std::int64_t offset(std::int64_t r) const { return (r / heads) * ld + (r % heads) * hs; }
  /// Elements spanned from the first to the last element (the allocation).
  std::int64_t span() const;
  /// Bytes the op moves for it: rows * cols elements.
  double traffic_bytes() const { return static_cast<double>(rows) * cols * dtype_size(dtype); }
};

/// Every tensor `op` touches for `desc` (inputs first, then outputs).
std::vector<TensorSpec> op_tensors(Op op, const NormDesc& desc);

/// The bytes `op` must move at least: every touched element once.
double traffic_bytes(Op op, const NormDesc& desc);

}  // namespace normjit::detail
