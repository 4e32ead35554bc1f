// Helpers shared by the CPU test files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config_grid.hpp"
#include "normjit/normjit.hpp"

namespace normjit_test {

/// An H100's facts (132 SMs, 50 MiB L2, 3352 GB/s) with clusters up to `max_cluster`:
/// the device the config model is asked about in tests without a GPU.
inline normjit::detail::DeviceFacts test_facts(int max_cluster = normjit::kMaxCluster) {
  auto f = normjit::detail::DeviceFacts::of(9, 0, 132, std::int64_t{50} << 20, 3352);
  f.max_cluster = max_cluster;
  return f;
}

bool contains(const std::string& text, const std::string& part);

/// `f` must throw normjit::Error(InvalidArgument) whose what() holds every one of `parts`.
void check_invalid(const std::function<void()>& f, const std::vector<std::string>& parts);

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

/// The FP8 variants on an M x N shape (N a multiple of 128) with 16-bit
/// dtype `t`: every quantized-output granularity (per-tensor static and
/// current, per-token with and without an upper bound, per-token-group of
/// 16..128 with fp32 / UE8M0 and row- / column-major scales, MXFP8) in E4M3
/// and E5M2, with y_hp and the transposed output, and FP8 inputs with group
/// scales (alone and with a quantized output), for RMSNorm and LayerNorm,
/// some with the fused residual add. Every variant validates.
std::vector<Variant> fp8_variants(std::int64_t M, std::int64_t N, normjit::DType t);

/// A fresh empty directory; removed with its contents when the last copy of
/// the pointer goes.
std::shared_ptr<const std::filesystem::path> make_temp_dir(const std::string& tag);

/// Writes `text` to `path`, replacing the file.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace normjit_test
