// Helpers shared by the CPU test files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "normjit/normjit.hpp"

namespace normjit_test {

bool contains(const std::string& text, const std::string& part);

/// x and y of dtype `xy`, weight of `w`, contiguous.
normjit::NormDesc make_desc(std::int64_t M, std::int64_t N, normjit::DType xy = normjit::DType::BF16,
                            normjit::DType w = normjit::DType::BF16);

/// A fresh empty directory; removed with its contents when the last copy of
/// the pointer goes.
std::shared_ptr<const std::filesystem::path> make_temp_dir(const std::string& tag);

/// Writes `text` to `path`, replacing the file.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace normjit_test
