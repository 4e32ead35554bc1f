// Helpers shared by the CPU test files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit_test {

bool contains(const std::string& text, const std::string& part);

/// x and y of dtype `xy`, weight of `w`, contiguous.
normjit::NormDesc make_desc(std::int64_t M, std::int64_t N, normjit::DType xy = normjit::DType::BF16,
                            normjit::DType w = normjit::DType::BF16);

/// A named descriptor of one norm-family variant.
struct Variant {
  std::string name;
  normjit::NormDesc desc;
};

/// The norm-family variants on an M x N shape with x (and y, weight,
/// residual) of dtype `t`, generated from a list of feature switches: RMSNorm
/// and LayerNorm, each with no weight / no bias / weight offset / casting
/// modes / fused residual add (incl. fp32 sum and mixed dtypes) / dresidual /
/// 3-D strided rows (when `heads` divides M). Every variant validates.
std::vector<Variant> norm_variants(std::int64_t M, std::int64_t N, normjit::DType t, std::int64_t heads = 4);

/// A fresh empty directory; removed with its contents when the last copy of
/// the pointer goes.
std::shared_ptr<const std::filesystem::path> make_temp_dir(const std::string& tag);

/// Writes `text` to `path`, replacing the file.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace normjit_test
