// The normjit command-line tool, run as a separate process with a private
// cache directory: help and version, bad command lines, compile and the cache
// commands, doctor, and the no-GPU exit code of tune and bench.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/config_grid.hpp"
#include "device/driver.hpp"
#include "normjit/version.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

using namespace normjit_test;  // shared helpers (test_util.hpp)

namespace {

struct CliResult {
  int exit_code = -1;  ///< 128 + signal when it was killed
  std::string output;  ///< stdout and stderr, interleaved
};

// Runs the CLI with `args` and the user cache in `cache_dir`; NORMJIT_TUNE is
// cleared so the caller's environment cannot change the outcome.
CliResult run_cli(const fs::path& cache_dir, const std::string& args) {
  const std::string cmd = fmt::format("env -u NORMJIT_TUNE NORMJIT_CACHE_DIR='{}' '{}' {} 2>&1", cache_dir.string(),
                                      NORMJIT_CLI_PATH, args);
  CliResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A CLI run in a fresh cache directory of its own.
class Cli {
 public:
  Cli() : dir_(make_temp_dir("cli")) {}
  CliResult operator()(const std::string& args) const { return run_cli(*dir_, args); }
  const fs::path& cache_dir() const { return *dir_; }

 private:
  std::shared_ptr<const fs::path> dir_;
};

// Runs `args`, which must fail with `exit_code` and print every one of `parts`.
void check_fails(const Cli& cli, const std::string& args, int exit_code, std::initializer_list<const char*> parts) {
  const CliResult r = cli(args);
  CAPTURE(args);
  CAPTURE(r.output);
  CHECK(r.exit_code == exit_code);
  for (const char* p : parts) CHECK_MESSAGE(contains(r.output, p), "output lacks '" << p << "'");
}

std::size_t count_cubins(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) n += e.path().extension() == ".cubin";
  return n;
}

// The number in "<prefix><number>" in `text`, or -1.
long number_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  return at == std::string::npos ? -1 : std::strtol(text.c_str() + at + prefix.size(), nullptr, 10);
}

}  // namespace

TEST_CASE("cli: --help lists the subcommands; --version prints the version") {
  const Cli cli;
  const CliResult help = cli("--help");
  CHECK(help.exit_code == 0);
  for (const std::string sub : {"tune", "bench", "compile", "cache", "doctor"}) {
    CAPTURE(sub);
    CHECK(std::regex_search(help.output, std::regex(fmt::format(R"(\n\s+{}\s)", sub))));
  }
  const CliResult version = cli("--version");
  CHECK(version.exit_code == 0);
  CHECK(version.output == std::string("normjit ") + NORMJIT_VERSION_STRING + "\n");
}

TEST_CASE("cli: invalid values exit 2 naming what is wrong") {
  const Cli cli;
  check_fails(cli, "tune --shape rms:bf17:8x8", 2, {"bf17"});
  check_fails(cli, "bench --shape rms:bf16:8x0", 2, {"N = 0"});
  check_fails(cli, "compile --shape gn:bf16:8x8", 2, {"gn:bf16:8x8"});
  check_fails(cli, "compile --shape ln:bf16:8x8:res:heads=2", 2, {"residual = true needs 2-D rows"});
  check_fails(cli, "cache show --file /dev/null", 2, {"/dev/null", "not a readable tuned cache"});
  CHECK(count_cubins(cli.cache_dir() / "kernels") == 0);
}

TEST_CASE("cli: bad command lines exit 2 with a message") {
  const Cli cli;
  struct Case {
    const char* args;
    const char* message;
  };
  const Case cases[] = {
      {"", "subcommand"},
      {"tune", "--model or --shape"},
      {"compile --arch sm90x --shape rms:bf16:8x128", "sm_<digits>"},
      {"tune --model /nonexistent.json", "/nonexistent.json"},
      {"compile --shape rms:bf16:8x128 --op xyz", "xyz"},
      {"tune --tokens 1 --shape rms:bf16:8x8", "--model"},
      {"cache", "subcommand"},
      {"frobnicate", "subcommand"},
      {"tune --devices 0,x --shape rms:bf16:8x8", "--devices: Value x not in range 0 to 1023"},
      {"tune --devices -1 --shape rms:bf16:8x8", "--devices: Value -1 not in range 0 to 1023"},
  };
  for (const auto& c : cases) check_fails(cli, c.args, 2, {c.message});
  CHECK(count_cubins(cli.cache_dir() / "kernels") == 0);
}

TEST_CASE("cli: compile fills the kernel cache; cache list counts it; cache clear empties it") {
  const Cli cli;
  const fs::path kernels = cli.cache_dir() / "kernels";
  // The grid's kernels, and the staged variants of the forward's.
  long variants = 0, staged = 0;
  for (const LaunchConfig& c : candidate_grid(Op::Forward, make_desc(64, 128))) {
    ++variants;
    staged += staged_variant(Op::Forward, make_desc(64, 128), c).has_value();
  }
  REQUIRE(variants > 0);
  CHECK(staged > 0);
  variants += staged;

  const CliResult compiled = cli("compile --arch sm_90 --shape rms:bf16:64x128 --op fwd");
  CAPTURE(compiled.output);
  REQUIRE(compiled.exit_code == 0);
  CHECK(contains(compiled.output, fmt::format("{} variants for sm_90", variants)));
  const std::string summary = fmt::format("{} kernel variants compiled or found in {}", variants, kernels.string());
  CHECK(contains(compiled.output, summary));
  CHECK(count_cubins(kernels) == static_cast<std::size_t>(variants));

  // Compiling again finds every variant on disk and adds nothing.
  CHECK(cli("compile --arch sm_90 --shape rms:bf16:64x128 --op fwd").exit_code == 0);
  CHECK(count_cubins(kernels) == static_cast<std::size_t>(variants));

  const CliResult listed = cli("cache list");
  CAPTURE(listed.output);
  CHECK(listed.exit_code == 0);
  CHECK(number_after(listed.output, "compiled kernels: ") == variants);
  CHECK(contains(listed.output, (cli.cache_dir() / "tuned").string()));

  const CliResult cleared = cli("cache clear");
  CAPTURE(cleared.output);
  CHECK(cleared.exit_code == 0);
  CHECK(number_after(cleared.output, "removed ") == variants);
  CHECK(count_cubins(kernels) == 0);
  CHECK(number_after(cli("cache list").output, "compiled kernels: ") == 0);
}

TEST_CASE("cli: compile --dump writes one config's generated source and cubin, and nothing into the kernel cache") {
  const Cli cli;
  const NormDesc d = make_desc(64, 128);
  const LaunchConfig cfg = candidate_grid(Op::Forward, d).back();
  const KernelSpec spec = make_spec(Op::Forward, d, cfg);
  const fs::path dir = cli.cache_dir() / "dump";
  const CliResult r = cli(fmt::format("compile --shape rms:bf16:64x128 --op fwd --config {} --dump '{}'", cfg.str(),
                                      dir.string()));
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  std::ifstream cu(dir / (spec.name() + ".cu")), cubin(dir / (spec.name() + ".cubin"), std::ios::binary);
  const std::string src{std::istreambuf_iterator<char>(cu), {}}, bin{std::istreambuf_iterator<char>(cubin), {}};
  CHECK(src == spec.source());
  REQUIRE(bin.size() > 4);
  CHECK(bin.compare(0, 4, "\x7f" "ELF") == 0);
  CHECK(contains(r.output, spec.name() + ".cubin"));
  CHECK(count_cubins(cli.cache_dir() / "kernels") == 0);

  // A config the grid rules out is named with the rule; --dump needs --config.
  const fs::path none = cli.cache_dir() / "none";
  check_fails(cli,
              fmt::format("compile --shape rms:bf16:64x128 --op fwd --config v8.t1024.r1.c16 --dump '{}'", none.string()),
              2, {"--config 'v8.t1024.r1.c16'", "rms_fwd"});
  check_fails(cli, fmt::format("compile --shape rms:bf16:64x128 --dump '{}'", none.string()), 2,
              {"--dump requires --config"});
  CHECK(!fs::exists(none));
}

TEST_CASE("cli: --trace and $NORMJIT_TRACE write a Chrome trace of compiles and cubin-cache reads") {
  Cli cli;
  const fs::path file = cli.cache_dir() / "trace.json";
  auto events_of = [&](const std::string& from) {
    std::ifstream in(file);
    REQUIRE(in);
    const nlohmann::json doc = nlohmann::json::parse(in);  // throws (fails) on a damaged file
    REQUIRE(doc.contains("traceEvents"));
    REQUIRE(doc["traceEvents"].is_array());
    int compiles = 0;
    for (const auto& e : doc["traceEvents"]) {
      // The Trace Event Format's required fields, as viewers read them.
      for (const char* k : {"name", "ph", "ts", "pid", "tid", "cat"}) CHECK_MESSAGE(e.contains(k), "event lacks " << k);
      CHECK(e["ts"].is_number());
      if (e["ph"] == "X") CHECK(e["dur"].get<double>() >= 0);
      if (e["cat"] == "compile") {
        CHECK(e["args"]["arch"] == "sm_90");
        compiles += e["args"]["from"] == from;
      }
    }
    return compiles;
  };
  const CliResult first = cli(fmt::format("--trace '{}' compile --arch sm_90 --shape rms:bf16:64x128 --op fwd", file.string()));
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  CHECK(events_of("nvrtc") > 0);
  // Again, through the environment: now every kernel comes from the cubin cache.
  ::setenv("NORMJIT_TRACE", file.string().c_str(), 1);  // the child inherits it
  const CliResult again = cli("compile --arch sm_90 --shape rms:bf16:64x128 --op fwd");
  ::unsetenv("NORMJIT_TRACE");
  REQUIRE_MESSAGE(again.exit_code == 0, again.output);
  CHECK(events_of("cubin cache") > 0);
  CHECK(events_of("nvrtc") == 0);
}

TEST_CASE("cli: NORMJIT_OFFLINE=1 never compiles: a kernel missing from the cache is an error naming it") {
  Cli cli;
  const std::string args = "compile --arch sm_90 --shape rms:bf16:64x128 --op fwd";
  ::setenv("NORMJIT_OFFLINE", "1", 1);
  const CliResult offline = cli(args);
  ::unsetenv("NORMJIT_OFFLINE");
  CAPTURE(offline.output);
  CHECK(offline.exit_code != 0);
  CHECK(contains(offline.output, "NORMJIT_OFFLINE=1: kernel rms_fwd"));
  CHECK(contains(offline.output, "is not in the kernel cache"));
  CHECK(count_cubins(cli.cache_dir() / "kernels") == 0);  // nothing was compiled
  REQUIRE(cli(args).exit_code == 0);                       // compiled ahead ...
  ::setenv("NORMJIT_OFFLINE", "1", 1);
  const CliResult cached = cli(args);                      // ... then served offline
  ::unsetenv("NORMJIT_OFFLINE");
  CAPTURE(cached.output);
  CHECK(cached.exit_code == 0);
}

TEST_CASE("cli: FP8 shapes compile and explain without a GPU; bad FP8 specs exit 2") {
  Cli cli;
  const char* spec = "rms:bf16:4096x7168:quant=e4m3/group128:colmajor";
  const long variants =
      static_cast<long>(candidate_grid(Op::Forward, parse_shape_spec(spec).desc).size());
  REQUIRE(variants > 0);
  auto r = cli(fmt::format("compile --arch sm_89 --shape {} --op fwd", spec));
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, fmt::format("{} variants for sm_89", variants)));
  // No FP8 entry ships: the heuristic config, under the FP8 variant's key.
  r = cli(fmt::format("explain --device nvidia-h200.cc90.132sm.60mib --op fwd --shape {}", spec));
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, ":q=group128:colmajor"));
  CHECK(contains(r.output, "source:  heuristic"));
  r = cli("compile --arch sm_90 --shape rms:bf16:64x1000:quant=e4m3/group128");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "quant_group = 128 does not divide N = 1000"));
}

TEST_CASE("cli: cache show rejects a damaged tuned-cache file without crashing") {
  const Cli cli;
  const fs::path garbage = cli.cache_dir() / "garbage.json";
  write_text_file(garbage, "{\"this is\": not JSON");
  check_fails(cli, fmt::format("cache show --file '{}'", garbage.string()), 2,
              {garbage.string().c_str(), "not a readable tuned cache"});
  check_fails(cli, "cache show --file /nonexistent/tuned.json", 2, {"/nonexistent/tuned.json"});
  // With no files in the user cache there is nothing to show, and that is fine.
  CHECK(cli("cache show").exit_code == 0);
}

TEST_CASE("cli: doctor reports NVRTC, the cache directory and what is missing") {
  const Cli cli;
  const CliResult r = cli("doctor");
  CAPTURE(r.output);
  CHECK(contains(r.output, std::string("normjit ") + NORMJIT_VERSION_STRING));
  CHECK(contains(r.output, "NVRTC: "));
  CHECK_FALSE(contains(r.output, "NVRTC: MISSING"));  // the tests compile with NVRTC, so it is here
  CHECK(contains(r.output, "user cache: " + cli.cache_dir().string()));
  std::string why;
  const bool gpu = gpu_available(&why);
  CHECK(r.exit_code == (gpu ? 0 : 1));
  if (!gpu) CHECK(contains(r.output, "driver/GPU: MISSING: " + why));
}

TEST_CASE("cli: tune and bench without a GPU exit 3 and say why") {
  std::string why;
  if (gpu_available(&why)) {
    MESSAGE("a GPU is available: the no-GPU exit code is not tested here");
    return;
  }
  CHECK((contains(why, "libcuda.so.1") || contains(why, "no CUDA device")));
  const Cli cli;
  check_fails(cli, "tune --shape rms:bf16:8x4096", 3, {"tuning needs an NVIDIA GPU", why.c_str()});
  check_fails(cli, "tune --devices 0,1 --shape rms:bf16:8x4096", 3, {"tuning needs an NVIDIA GPU", why.c_str()});
  check_fails(cli, "tune --devices 0,1 --grid " NORMJIT_SHIPPED_CACHE_DIR "/grid/grid.json", 3,
              {"tuning needs an NVIDIA GPU", why.c_str()});
  check_fails(cli, "bench --shape rms:bf16:8x4096 --op fwd", 3, {"benchmarking needs an NVIDIA GPU", why.c_str()});
  // Shapes are checked first: a bad one is still a bad command line.
  check_fails(cli, "tune --shape rms:bf16:8x0", 2, {"N = 0"});
}

TEST_CASE("cli: the binary needs only libc, libm and libdl at load time (no libcuda, no libnvrtc)") {
  // readelf lists the DT_NEEDED entries: what the loader must find before main.
  FILE* pipe = ::popen(fmt::format("readelf -d '{}' 2>&1", NORMJIT_CLI_PATH).c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  REQUIRE(::pclose(pipe) == 0);
  CAPTURE(out);
  int needed = 0;
  for (std::size_t at = 0; (at = out.find("(NEEDED)", at)) != std::string::npos; ++at) {
    const auto open = out.find('[', at), close = out.find(']', open);
    const std::string lib = out.substr(open + 1, close - open - 1);
    ++needed;
    CHECK_MESSAGE((lib.rfind("libc.so", 0) == 0 || lib.rfind("libm.so", 0) == 0 || lib.rfind("libdl.so", 0) == 0 ||
                   lib.rfind("libpthread.so", 0) == 0 || lib.rfind("libstdc++.so", 0) == 0 ||
                   lib.rfind("libgcc_s.so", 0) == 0 || lib.rfind("ld-linux", 0) == 0),
                  "unexpected load-time dependency " << lib);
    CHECK_MESSAGE(lib.find("cuda") == std::string::npos, lib);
    CHECK_MESSAGE(lib.find("nvrtc") == std::string::npos, lib);
  }
  CHECK(needed >= 1);
}

TEST_CASE("cli: tune --grid --list expands the shipped grid without a GPU") {
  Cli cli;
  const auto r = cli("tune --grid " NORMJIT_SHIPPED_CACHE_DIR "/grid/grid.json --list");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  const std::regex summary(R"((\d+) N values, (\d+) groups, (\d+) entries)");
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, summary));
  CHECK(std::stoi(m[1]) >= 40 + 12);  // the log grid and the odd N, plus model sizes
  CHECK(std::stoi(m[3]) > 1000);
  // Model sizes and the extremes are in; every line is a shape spec.
  for (const char* s : {"fwd rms:bf16:1x64\n", "fwd rms:bf16:1x7168\n", "fwd rms:bf16:1x2880\n", "fwd rms:bf16:1x262144\n",
                        "bwd ln:fp32:1x5120\n", "fwd ln:fp16:1x4096:res\n"})
    CHECK(r.output.find(s) != std::string::npos);
  // M * N never exceeds max_elements (2^26 in the file).
  const std::regex line(R"((fwd|bwd) [a-z]+:[a-z0-9]+:(\d+)x(\d+))");
  int lines = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it, ++lines)
    CHECK(std::stoll((*it)[2]) * std::stoll((*it)[3]) <= (1LL << 26));
  CHECK(lines == std::stoi(m[3]));

  const auto bad = cli("tune --grid " NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json --list");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--grid") != std::string::npos);
  if (!gpu_available(nullptr)) CHECK(cli("tune --grid " NORMJIT_SHIPPED_CACHE_DIR "/grid/grid.json").exit_code == 3);
}

TEST_CASE("cli: explain --device says where a config comes from, without a GPU") {
  Cli cli;
  // A shape of the grid: its own shipped entry, with the candidates' times
  // (a forward one of the H200, re-tuned for the packed cluster slices: the
  // backward entries went with the kernels they were tuned for, when the
  // backward's partial rows came to be stored in vectors, and the H100's
  // cluster rows of 16-bit slices wait to be re-tuned).
  auto r = cli("explain --device nvidia-h200.cc90.132sm.60mib --op fwd --shape rms:fp16:1024x58912");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("source:  shipped cache") != std::string::npos);
  CHECK(r.output.find("candidates of that entry") != std::string::npos);
  // A width no cache holds: the config model, whatever the neighbours hold.
  r = cli("explain --device nvidia-h200.cc90.132sm.60mib --op bwd --shape rms:bf16:4096x7000");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("source:  heuristic") != std::string::npos);
  CHECK(r.output.find("from:") == std::string::npos);
  // A variant no cache holds (fp32 weight under bf16 rows): the heuristic.
  r = cli("explain --device nvidia-h200.cc90.132sm.60mib --op fwd --shape rms:bf16:4096x7000:w=fp32");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("source:  heuristic") != std::string::npos);
  // An unknown device names the argument and the devices it knows.
  r = cli("explain --device no-such-gpu --shape rms:bf16:8x64");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--device 'no-such-gpu'") != std::string::npos);
  CHECK(r.output.find("nvidia-h200.cc90.132sm.60mib") != std::string::npos);
  // Without --device it needs a GPU.
  if (!gpu_available(nullptr)) CHECK(cli("explain --shape rms:bf16:8x64").exit_code == 3);
}

namespace {

// The lines of `text` with runs of spaces collapsed to one (--list aligns its columns).
std::vector<std::string> squeezed_lines(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  for (char c : text) {
    if (c == '\n') {
      out.push_back(line);
      line.clear();
    } else if (!(c == ' ' && !line.empty() && line.back() == ' ')) {
      line += c;
    }
  }
  if (!line.empty()) out.push_back(line);
  return out;
}

// `tune --model <file> --list <extra>`: exit 0 without a GPU, and the shape
// lines (those after the legend, before the summary) are exactly `want`.
void check_model_list(const Cli& cli, const std::string& file, const std::vector<std::string>& want,
                      const std::string& summary, const std::string& extra = "") {
  const CliResult r = cli(fmt::format("tune --model " NORMJIT_TEST_MODELS_DIR "/{} --list {}", file, extra));
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  const auto all = squeezed_lines(r.output);
  std::vector<std::string> shapes;
  for (const auto& l : all)
    if (!l.empty() && l[0] != ' ' && contains(l, " <- ")) shapes.push_back(l);
  CHECK(shapes == want);
  REQUIRE(!all.empty());
  CHECK(all.back() == summary);
  CHECK(count_cubins(cli.cache_dir() / "kernels") == 0);  // nothing compiled
}

const std::vector<std::int64_t> kDefaultTokens = {1, 1024, 8192};

}  // namespace

TEST_CASE("cli: tune --model --list: Qwen3-8B's norms, variants and the keys they came from, without a GPU") {
  const Cli cli;
  const std::string tail = ", rms_norm_eps, torch_dtype, model_type";
  std::vector<std::string> want;
  for (auto t : kDefaultTokens) {
    want.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x4096:cast=llama:eps=1e-06 <- hidden_size{}", t, t, tail));
    want.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x4096:res=bf16:cast=llama:eps=1e-06 <- hidden_size{}", t, t, tail));
    want.push_back(fmt::format("q_norm[{}] fwd+bwd rms:bf16:{}x128:cast=llama:eps=1e-06 <- num_attention_heads, head_dim{}",
                               t, 32 * t, tail));
    want.push_back(fmt::format("k_norm[{}] fwd+bwd rms:bf16:{}x128:cast=llama:eps=1e-06 <- num_key_value_heads, head_dim{}",
                               t, 8 * t, tail));
  }
  check_model_list(cli, "qwen3-8b.config.json", want, "12 shapes, 21 kernels (12 fwd, 9 bwd)");
  // The default token counts are 1, 1024, 8192; --tokens picks others.
  check_model_list(cli, "qwen3-8b.config.json", want, "12 shapes, 21 kernels (12 fwd, 9 bwd)", "--tokens 1,1024,8192");
  check_model_list(cli, "qwen3-8b.config.json", {want[0], want[1], want[2], want[3]}, "4 shapes, 7 kernels (4 fwd, 3 bwd)",
                   "--tokens 1");
  // --op bwd keeps the shapes training calls.
  std::vector<std::string> bwd = {want[0], want[2], want[3]};
  for (auto& l : bwd) l.replace(l.find(" fwd+bwd "), 9, " bwd ");
  check_model_list(cli, "qwen3-8b.config.json", bwd, "3 shapes, 3 kernels (0 fwd, 3 bwd)", "--tokens 1 --op bwd");
  const CliResult r = cli("tune --model " NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json --list");
  CHECK(contains(r.output, "model_type qwen3: RMSNorm, Llama cast"));
  CHECK(contains(r.output, "tokens 1, 1024, 8192"));
}

TEST_CASE("cli: tune --model --list: Gemma 3, DeepSeek-V3 and GPT-2") {
  const Cli cli;
  std::vector<std::string> gemma, deepseek, gpt2;
  for (auto t : kDefaultTokens) {
    const std::string tail = ", rms_norm_eps (absent: 1e-06), torch_dtype, text_config.model_type";
    gemma.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x5376:off=1:cast=gemma:eps=1e-06 <- text_config.hidden_size{}", t, t, tail));
    gemma.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x5376:res=bf16:off=1:cast=gemma:eps=1e-06 <- text_config.hidden_size{}", t, t, tail));
    gemma.push_back(fmt::format("q_norm[{}] fwd+bwd rms:bf16:{}x128:off=1:cast=gemma:eps=1e-06 <- text_config.num_attention_heads, text_config.head_dim{}", t, 32 * t, tail));
    gemma.push_back(fmt::format("k_norm[{}] fwd+bwd rms:bf16:{}x128:off=1:cast=gemma:eps=1e-06 <- text_config.num_key_value_heads, text_config.head_dim{}", t, 16 * t, tail));

    const std::string ds = ", rms_norm_eps, torch_dtype, model_type";
    deepseek.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x7168:cast=llama:eps=1e-06 <- hidden_size{}", t, t, ds));
    deepseek.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x7168:res=bf16:cast=llama:eps=1e-06 <- hidden_size{}", t, t, ds));
    deepseek.push_back(fmt::format(
        "hidden_fp8[{}] fwd rms:bf16:{}x7168:cast=llama:norstd:quant=e4m3/group128:colmajor:eps=1e-06 <- hidden_size, "
        "quantization_config.quant_method, quantization_config.weight_block_size{}", t, t, ds));
    deepseek.push_back(fmt::format("q_a_norm[{}] fwd+bwd rms:bf16:{}x1536:cast=llama:eps=1e-06 <- q_lora_rank{}", t, t, ds));
    deepseek.push_back(fmt::format(
        "kv_a_norm[{}] fwd+bwd rms:bf16:{}x512:cast=llama:x_stride=576:eps=1e-06 <- kv_lora_rank, qk_rope_head_dim{}", t, t, ds));

    gpt2.push_back(fmt::format("hidden[{}] fwd+bwd ln:bf16:{}x768:eps=1e-05 <- n_embd, layer_norm_epsilon, torch_dtype (absent: bf16), model_type", t, t));
  }
  check_model_list(cli, "gemma-3-27b-it.config.json", gemma, "12 shapes, 21 kernels (12 fwd, 9 bwd)");
  check_model_list(cli, "deepseek-v3.config.json", deepseek, "15 shapes, 24 kernels (15 fwd, 9 bwd)");
  check_model_list(cli, "gpt2.config.json", gpt2, "3 shapes, 6 kernels (3 fwd, 3 bwd)");
  // Gemma 2/3's four norms a layer are one shape; the legend says which modules share it.
  const CliResult r = cli("tune --model " NORMJIT_TEST_MODELS_DIR "/gemma-3-27b-it.config.json --list --tokens 1");
  CHECK(contains(r.output, "pre_feedforward_layernorm, post_feedforward_layernorm (4 a layer)"));
  CHECK(contains(r.output, "model_type gemma3 (text_config: gemma3_text): RMSNorm, zero-centred weight (1 + weight), Gemma cast"));
}

TEST_CASE("cli: tune --model: an unknown architecture names the missing keys; no GPU exits 3") {
  const Cli cli;
  const fs::path bad = cli.cache_dir() / "mamba.json";
  write_text_file(bad, R"({"model_type": "mamba", "d_model": 768, "n_layer": 24})");
  check_fails(cli, fmt::format("tune --model '{}' --list", bad.string()), 2,
              {bad.string().c_str(), "no hidden size", "'hidden_size'", "'n_embd'", "model_type 'mamba'"});
  check_fails(cli, fmt::format("compile --arch sm_90 --model '{}'", bad.string()), 2, {"'hidden_size'", "'n_embd'"});
  // --list with --shape prints the shape (both ops), too.
  const CliResult s = cli("tune --shape rms:bf16:8x4096:res --list");
  CAPTURE(s.output);
  CHECK(s.exit_code == 0);
  CHECK(contains(squeezed_lines(s.output).front(), "rms:bf16:8x4096:res fwd+bwd rms:bf16:8x4096:res=bf16:eps=1e-06"));
  std::string why;
  if (gpu_available(&why)) {
    MESSAGE("a GPU is available: the no-GPU exit code is not tested here");
    return;
  }
  for (const char* extra : {"", " --retune", " --tokens 1,1024,8192"})
    check_fails(cli, fmt::format("tune --model " NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json{}", extra), 3,
                {"tuning needs an NVIDIA GPU", why.c_str()});
}

TEST_CASE("cli: cache prune keeps only entries that pay, and drops stale ones and those tuned before their rows peeled") {
  Cli cli;
  const fs::path shipped = fs::path(NORMJIT_SHIPPED_CACHE_DIR) / "nvidia-h200.cc90.132sm.60mib.json";
  std::ifstream in(shipped);
  nlohmann::json doc = nlohmann::json::parse(in);
  const DeviceFacts facts = DeviceFacts::of(9, 0, 132, std::int64_t{60} << 20, doc["device"]["memory_gbps"].get<double>());
  auto entry = [](const std::string& shape, const std::vector<std::pair<std::string, double>>& times,
                  bool current = true) {
    nlohmann::json e;
    e["shape"] = shape;
    // The current kernels' hash, or one of kernels that have changed since.
    e["kernel_hash"] = current ? tuned_kernel_hash(Op::Forward, parse_shape_spec(shape).desc,
                                                   LaunchConfig::parse(times.front().first))
                               : "0";
    e["tuned_at"] = "2026-11-24T00:00:00Z";
    e["winner"] = times.front().first;
    e["winner_us"] = times.front().second;
    for (const auto& [c, us] : times) e["candidates"].push_back({{"config", c}, {"median_us", us}});
    return e;
  };
  const std::string pays = "rms:bf16:4096x4096", ties = "rms:bf16:4096x2048", odd = "rms:bf16:4096x12345";
  auto model_of = [&](const std::string& s) {
    return heuristic_config(Op::Forward, parse_shape_spec(s).desc, facts).str();
  };
  auto other_than = [](const std::string& c) { return c == "v4.t256.r1" ? "v8.t512.r1" : "v4.t256.r1"; };
  doc["entries"] = nlohmann::json::object();
  doc["entries"]["rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=4096"] =
      entry(pays, {{other_than(model_of(pays)), 10.0}, {model_of(pays), 11.0}});   // 10% faster: kept
  doc["entries"]["rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=2048:M<=4096"] =
      entry(ties, {{other_than(model_of(ties)), 10.0}, {model_of(ties), 10.1}});   // within 2%: dropped
  doc["entries"]["rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=12345:M<=4096"] =
      entry(odd, {{"v1.t512.r1", 70.0}, {"v1.t256.r1", 80.0}});                  // 2-byte vectors only: dropped
  doc["entries"]["rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=8192"] =
      entry("rms:bf16:8192x4096", {{other_than(model_of(pays)), 10.0}, {model_of(pays), 11.0}}, false);  // stale: dropped
  const fs::path file = cli.cache_dir() / "prune.json";
  std::ofstream(file) << doc.dump();
  auto r = cli("cache prune --dry-run " + file.string());
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "4 entries: 1 no faster than the config model's config by > 2%, 1 tuned before their rows "
                           "peeled and 1 stale"));
  r = cli("cache prune " + file.string());
  REQUIRE(r.exit_code == 0);
  std::ifstream after(file);
  const nlohmann::json left = nlohmann::json::parse(after);
  CHECK(left["entries"].size() == 1);
  CHECK(left["entries"].contains("rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=4096"));
}
