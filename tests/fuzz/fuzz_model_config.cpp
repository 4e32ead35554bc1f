// libFuzzer target: the model-config reader. The first byte picks the token
// counts, the rest is the config.json; it gives valid shapes or throws
// normjit::Error naming the file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "models/model_norms.hpp"

using namespace normjit;
using namespace normjit::detail;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::vector<std::string> seeds;
  if (const char* dir = std::getenv("NORMJIT_FUZZ_MODELS_DIR"))
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      seeds.push_back(std::string(1, '\0') + ss.str());
    }
  seeds.push_back(std::string(1, '\0') +
                  R"({"model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                      "head_dim": 128, "torch_dtype": "bfloat16"})");
  normjit_fuzz::write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::vector<std::vector<std::int64_t>> tokens = {
      {1, 1024, 8192}, {1}, {0}, {INT64_MAX}, {3, std::int64_t{1} << 40}, {}, {-1}, {65536}};
  const std::string path = normjit_fuzz::scratch_dir() + "/config.json";
  normjit_fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    for (const auto& s : shapes_from_model_config(path, tokens[data[0] % tokens.size()])) {
      s.desc.validate();  // an Error escapes: an accepted shape must be valid
      parse_shape_spec(shape_spec(s.desc));
    }
  } catch (const Error& e) {
    if (e.message().find(path) == std::string::npos && e.message().find("--tokens") == std::string::npos)
      __builtin_trap();
  }
  return 0;
}
