// libFuzzer target: a tuned-cache file (the user file, the shipped file of
// this device or another device's, by the first byte) read by TunedCache's
// lookups, neighbour search and explanation: nothing may throw; a store
// (every eighth input) heals a damaged user file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "core/shape_spec.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

namespace {
const DeviceFingerprint kDev{"NVIDIA H100 80GB HBM3", 9, 0, 132, 50 * 1024 * 1024};
const CacheMetadata kMeta{"0.1.0", "0123456789abcdef0123456789abcdef", "13.0", 13000};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Seeds: slices of the shipped file of this device (a few entries each).
  std::vector<std::string> seeds;
  if (const char* dir = std::getenv("NORMJIT_FUZZ_SHIPPED_DIR")) {
    std::ifstream in(std::string(dir) + "/" + kDev.slug() + ".json", std::ios::binary);
    if (in) {
      const nlohmann::json j = nlohmann::json::parse(in);
      auto it = j["entries"].begin();
      for (int s = 0; s < 4 && it != j["entries"].end(); ++s) {
        nlohmann::json part = j;
        part["entries"] = nlohmann::json::object();
        for (int k = 0; k < 3 && it != j["entries"].end(); ++k, ++it) part["entries"][it.key()] = it.value();
        seeds.push_back(std::string(1, static_cast<char>(s)) + part.dump(1));
      }
    }
  }
  normjit_fuzz::write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string root = normjit_fuzz::scratch_dir();
  const std::string user = root + "/user", shipped = root + "/shipped";
  fs::remove_all(user);
  fs::remove_all(shipped);
  fs::create_directories(user);
  fs::create_directories(shipped);
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int where = data[0] % 3;
  const std::string target = where == 0   ? user + "/" + kDev.slug() + ".json"
                             : where == 1 ? shipped + "/" + kDev.slug() + ".json"
                                          : shipped + "/nvidia-a100-sxm4-80gb.cc80.108sm.40mib.json";
  normjit_fuzz::write_file(target, text);
  TunedCache cache(user, {shipped}, kDev, kMeta, [](const std::string&) {});
  const NormDesc d = parse_shape_spec("rms:bf16:1024x4096").desc;
  for (const std::string& key : {shape_key(Op::Forward, d), std::string("ln_bwd:x=fp16:y=fp16:w=fp16:bias:N=77:M<=2")}) {
    cache.lookup(key);
  }
  const DeviceFacts facts = kDev.facts();
  config_from_caches(cache, Op::Forward, d, facts, TunePolicy::Never, false);
  config_from_caches(cache, Op::Backward, d, facts, TunePolicy::Never, true);
  if (data[0] % 8 == 0) {
    TunedEntry e;
    e.shape = shape_spec(d);
    e.winner = LaunchConfig::parse("v8.t512.r1");
    cache.store(shape_key(Op::Forward, d), e);
    const auto f = read_tuned_cache_file(cache.user_file(), [](const std::string&) {});
    if (!f || !f->entries.count(shape_key(Op::Forward, d))) __builtin_trap();
  }
  return 0;
}
