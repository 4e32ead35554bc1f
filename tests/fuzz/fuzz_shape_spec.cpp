// libFuzzer target: the shape-spec parser. An input parses or throws
// normjit::Error (any other exception escapes and is reported as a crash); an
// accepted spec round-trips through shape_spec and has a valid heuristic config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config_grid.hpp"
#include "fuzz_common.hpp"
#include "core/shape_spec.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::detail;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  normjit_fuzz::write_seeds({"rms:bf16:8192x4096", "ln:fp16:4096x4096:nb", "rms:bf16:32768x128:heads=32:x_stride=6144",
                             "rms:bf16:8x4096:res=fp32:ro=bf16:fp32sum:dres", "rms:bf16:64x4096:off=1:cast=gemma",
                             "ln:fp32:1x7:nw:nb:eps=1e-3", "rms:bf16:1024x7168:quant=e4m3/group128:colmajor",
                             "ln:bf16:512x4096:x=e4m3/group16:quant=e4m3/tensor:transpose",
                             "rms:bf16:64x4096:quant=e5m2/token:ub=0.00001:yhp=fp32", "rms:bf16:16x128:norstd:grad=fp32"});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  NormDesc d;
  try {
    d = parse_shape_spec(text).desc;
  } catch (const Error& e) {
    if (e.message().empty()) __builtin_trap();
    return 0;
  }
  const std::string canon = shape_spec(d);
  const NormDesc again = parse_shape_spec(canon).desc;  // an Error escapes: a finding
  if (shape_spec(again) != canon || shape_key(Op::Forward, again) != shape_key(Op::Forward, d)) __builtin_trap();
  if (!config_valid(Op::Forward, d, heuristic_config(Op::Forward, d, kMaxCluster), nullptr, kMaxCluster))
    __builtin_trap();
  return 0;
}
