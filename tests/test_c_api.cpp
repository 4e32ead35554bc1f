// The C ABI (normjit.h): versions, status names, *_init defaults against the
// C++ defaults, argument checks, per-thread error messages. No GPU needed; the
// calls that do need one must fail with a status and a message, not crash.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "normjit/normjit.h"
#include "normjit/normjit.hpp"
#include "test_util.hpp"

using normjit_test::contains;

namespace {

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string last_error() { return normjit_last_error_message(); }

// `status` must be NORMJIT_INVALID_ARGUMENT and the thread's message must hold `part`.
void check_invalid(int status, const std::string& part) {
  CHECK_MESSAGE(status == NORMJIT_INVALID_ARGUMENT, "status " << normjit_status_name(status) << ": " << last_error());
  CHECK_MESSAGE(contains(last_error(), part), "'" << last_error() << "' lacks '" << part << "'");
}

normjit_norm_desc valid_desc() {
  normjit_norm_desc d;
  REQUIRE(normjit_norm_desc_init(&d) == NORMJIT_SUCCESS);
  d.M = 8;
  d.N = 64;
  return d;
}

// An engine whose caches live in a fresh temporary directory.
struct TestEngine {
  std::shared_ptr<const std::filesystem::path> dir = normjit_test::make_temp_dir("capi");
  normjit_engine engine = nullptr;
  TestEngine() {
    normjit_engine_options o;
    REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
    const std::string d = dir->string();
    o.cache_dir = d.c_str();
    REQUIRE_MESSAGE(normjit_engine_create(&o, &engine) == NORMJIT_SUCCESS, last_error());
    REQUIRE(engine != nullptr);
  }
  ~TestEngine() { normjit_engine_destroy(engine); }
};

}  // namespace

TEST_CASE("c_api: versions") {
  CHECK(NORMJIT_C_API_VERSION == 2);  // 2: the FP8 fields
  CHECK(normjit_api_version() == NORMJIT_C_API_VERSION);
  CHECK(std::string(normjit_version_string()) == NORMJIT_VERSION_STRING);
}

TEST_CASE("c_api: status names, one per ErrorKind, and config source names") {
  const std::pair<int, const char*> names[] = {
      {NORMJIT_SUCCESS, "NORMJIT_SUCCESS"},
      {NORMJIT_INVALID_ARGUMENT, "NORMJIT_INVALID_ARGUMENT"},
      {NORMJIT_LIBRARY_NOT_FOUND, "NORMJIT_LIBRARY_NOT_FOUND"},
      {NORMJIT_NO_DEVICE, "NORMJIT_NO_DEVICE"},
      {NORMJIT_DRIVER, "NORMJIT_DRIVER"},
      {NORMJIT_COMPILE, "NORMJIT_COMPILE"},
      {NORMJIT_CACHE, "NORMJIT_CACHE"},
      {NORMJIT_TUNING, "NORMJIT_TUNING"},
      {NORMJIT_INTERNAL, "NORMJIT_INTERNAL"},
  };
  for (int i = 0; i < 9; ++i) {
    CHECK(names[i].first == i);  // dense, in header order
    CHECK(std::string(normjit_status_name(names[i].first)) == names[i].second);
  }
  CHECK(std::string(normjit_status_name(9)) == "NORMJIT_UNKNOWN_STATUS");
  CHECK(std::string(normjit_status_name(-1)) == "NORMJIT_UNKNOWN_STATUS");
  for (int s = 0; s <= 5; ++s)
    CHECK(std::string(normjit_config_source_name(s)) ==
          normjit::config_source_name(static_cast<normjit::ConfigSource>(s)));
  CHECK(std::string(normjit_config_source_name(5)) == "neighbour");
  CHECK(std::string(normjit_config_source_name(6)) == "unknown");
}

TEST_CASE("c_api: normjit_norm_desc_init equals NormDesc{}") {
  normjit_norm_desc c;
  std::memset(&c, 0xab, sizeof c);
  REQUIRE(normjit_norm_desc_init(&c) == NORMJIT_SUCCESS);
  CHECK(last_error().empty());
  const normjit::NormDesc d;
  CHECK(c.struct_size == sizeof(normjit_norm_desc));
  CHECK(c.norm == static_cast<int>(d.norm));
  CHECK(c.M == d.M);
  CHECK(c.N == d.N);
  CHECK(c.heads == d.heads);
  CHECK(c.x_stride == d.x_stride);
  CHECK(c.y_stride == d.y_stride);
  CHECK(c.dy_stride == d.dy_stride);
  CHECK(c.dx_stride == d.dx_stride);
  CHECK(c.x_head_stride == d.x_head_stride);
  CHECK(c.y_head_stride == d.y_head_stride);
  CHECK(c.dy_head_stride == d.dy_head_stride);
  CHECK(c.dx_head_stride == d.dx_head_stride);
  CHECK(c.residual_stride == d.residual_stride);
  CHECK(c.residual_out_stride == d.residual_out_stride);
  CHECK(c.dresidual_stride == d.dresidual_stride);
  CHECK(c.x_dtype == static_cast<int>(d.x_dtype));
  CHECK(c.y_dtype == static_cast<int>(d.y_dtype));
  CHECK(c.weight_dtype == static_cast<int>(d.weight_dtype));
  CHECK(c.residual_dtype == static_cast<int>(d.residual_dtype));
  CHECK(c.residual_out_dtype == static_cast<int>(d.residual_out_dtype));
  CHECK(c.eps == d.eps);
  CHECK(c.has_weight == static_cast<int>(d.has_weight));
  CHECK(c.has_bias == static_cast<int>(d.has_bias));
  CHECK(c.weight_offset == d.weight_offset);
  CHECK(c.residual == static_cast<int>(d.residual));
  CHECK(c.store_residual_out == static_cast<int>(d.store_residual_out));
  CHECK(c.residual_rounding == static_cast<int>(d.residual_rounding));
  CHECK(c.has_dresidual == static_cast<int>(d.has_dresidual));
  CHECK(c.cast_mode == static_cast<int>(d.cast_mode));
  CHECK(c.store_rstd == static_cast<int>(d.store_rstd));
  CHECK(c.store_mean == static_cast<int>(d.store_mean));
  CHECK(c.quant == static_cast<int>(d.quant));
  CHECK(c.quant_group == d.quant_group);
  CHECK(c.scale_ue8m0 == static_cast<int>(d.scale_ue8m0));
  CHECK(c.scale_col_major == static_cast<int>(d.scale_col_major));
  CHECK(c.scale_stride == d.scale_stride);
  CHECK(c.scale_ub == d.scale_ub);
  CHECK(c.store_y_hp == static_cast<int>(d.store_y_hp));
  CHECK(c.y_hp_dtype == static_cast<int>(d.y_hp_dtype));
  CHECK(c.store_y_t == static_cast<int>(d.store_y_t));
  CHECK(c.x_group == d.x_group);
  CHECK(c.grad_dtype == static_cast<int>(d.grad_dtype));
}

TEST_CASE("c_api: tensor *_init give null pointers") {
  normjit_forward_tensors f;
  std::memset(&f, 0xab, sizeof f);
  REQUIRE(normjit_forward_tensors_init(&f) == NORMJIT_SUCCESS);
  const normjit::ForwardTensors cf;
  CHECK(f.struct_size == sizeof(normjit_forward_tensors));
  CHECK(f.x == cf.x);
  CHECK(f.residual == cf.residual);
  CHECK(f.weight == cf.weight);
  CHECK(f.bias == cf.bias);
  CHECK(f.y == cf.y);
  CHECK(f.residual_out == cf.residual_out);
  CHECK(f.mean == nullptr);
  CHECK(f.rstd == nullptr);

  normjit_backward_tensors b;
  std::memset(&b, 0xab, sizeof b);
  REQUIRE(normjit_backward_tensors_init(&b) == NORMJIT_SUCCESS);
  const normjit::BackwardTensors cb;
  CHECK(b.struct_size == sizeof(normjit_backward_tensors));
  CHECK(b.dy == cb.dy);
  CHECK(b.x == cb.x);
  CHECK(b.weight == cb.weight);
  CHECK(b.mean == nullptr);
  CHECK(b.rstd == nullptr);
  CHECK(b.dresidual == cb.dresidual);
  CHECK(b.dx == cb.dx);
  CHECK(b.dweight == cb.dweight);
  CHECK(b.dbias == cb.dbias);
  CHECK(b.workspace == cb.workspace);
  CHECK(b.workspace_bytes == cb.workspace_bytes);

  check_invalid(normjit_forward_tensors_init(nullptr), "tensors = NULL");
  check_invalid(normjit_backward_tensors_init(nullptr), "tensors = NULL");
  check_invalid(normjit_norm_desc_init(nullptr), "desc = NULL");
  check_invalid(normjit_engine_options_init(nullptr), "options = NULL");
}

TEST_CASE("c_api: normjit_engine_options_init equals EngineOptions::from_env()") {
  auto check_equal = [] {
    normjit_engine_options o;
    REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
    const auto e = normjit::EngineOptions::from_env();
    CHECK(o.struct_size == sizeof(normjit_engine_options));
    CHECK(o.tune_policy == static_cast<int>(e.tune_policy));
    CHECK(o.cache_dir == nullptr);           // the engine resolves $NORMJIT_CACHE_DIR itself
    CHECK(o.shipped_cache_path == nullptr);  // $NORMJIT_SHIPPED_CACHE_PATH at create
    CHECK(o.disk_kernel_cache == static_cast<int>(e.disk_kernel_cache));
    CHECK(o.verbose == static_cast<int>(e.verbose));
    return o.tune_policy;
  };
  {
    ScopedEnv tune("NORMJIT_TUNE", std::nullopt);
    CHECK(check_equal() == NORMJIT_TUNE_NEVER);
  }
  {
    ScopedEnv tune("NORMJIT_TUNE", "first");
    CHECK(check_equal() == NORMJIT_TUNE_FIRST);
  }
  {
    ScopedEnv tune("NORMJIT_TUNE", "always");
    CHECK(check_equal() == NORMJIT_TUNE_ALWAYS);
  }
  {
    ScopedEnv tune("NORMJIT_TUNE", "sometimes");
    normjit_engine_options o;
    std::memset(&o, 0, sizeof o);
    check_invalid(normjit_engine_options_init(&o), "NORMJIT_TUNE = 'sometimes'");
    CHECK(o.struct_size == sizeof(normjit_engine_options));  // filled all the same
    CHECK(o.tune_policy == NORMJIT_TUNE_NEVER);
    normjit_engine e = nullptr;
    check_invalid(normjit_engine_create(nullptr, &e), "NORMJIT_TUNE = 'sometimes'");
    CHECK(e == nullptr);
  }
}

TEST_CASE("c_api: engine create needs no GPU; options reach the engine") {
  auto dir = normjit_test::make_temp_dir("capi-create");
  normjit_engine_options o;
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  const std::string d = dir->string();
  o.cache_dir = d.c_str();
  o.shipped_cache_path = "";
  normjit_engine e = nullptr;
  REQUIRE_MESSAGE(normjit_engine_create(&o, &e) == NORMJIT_SUCCESS, last_error());
  REQUIRE(e != nullptr);
  CHECK(last_error().empty());

  char buf[4096];
  REQUIRE(normjit_engine_cache_dir(e, buf, sizeof buf) == NORMJIT_SUCCESS);
  CHECK(std::string(buf) == d);

  // A buffer one byte short: the size needed is named and nothing is written.
  std::memset(buf, 'z', sizeof buf);
  check_invalid(normjit_engine_cache_dir(e, buf, d.size()), std::to_string(d.size() + 1) + " bytes are needed");
  CHECK(buf[0] == 'z');
  check_invalid(normjit_engine_cache_dir(e, nullptr, 100), "buf = NULL");
  normjit_engine_destroy(e);
  normjit_engine_destroy(nullptr);  // ignored

  normjit_engine e2 = nullptr;
  REQUIRE_MESSAGE(normjit_engine_create(nullptr, &e2) == NORMJIT_SUCCESS, last_error());
  REQUIRE(normjit_engine_cache_dir(e2, buf, sizeof buf) == NORMJIT_SUCCESS);
  CHECK(std::string(buf) == normjit::Engine(normjit::EngineOptions::from_env()).cache_dir());
  normjit_engine_destroy(e2);
}

TEST_CASE("c_api: bad options are named") {
  normjit_engine e = nullptr;
  normjit_engine_options o;
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  check_invalid(normjit_engine_create(&o, nullptr), "out = NULL");
  o.struct_size = 7;
  check_invalid(normjit_engine_create(&o, &e), "options->struct_size = 7");
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  o.tune_policy = 3;
  check_invalid(normjit_engine_create(&o, &e), "options->tune_policy = 3");
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  o.verbose = 2;
  check_invalid(normjit_engine_create(&o, &e), "options->verbose = 2");
  CHECK(e == nullptr);
}

TEST_CASE("c_api: bad arguments give INVALID_ARGUMENT naming the argument and its value") {
  TestEngine te;
  normjit_norm_desc d = valid_desc();
  normjit_forward_tensors ft;
  normjit_backward_tensors bt;
  REQUIRE(normjit_forward_tensors_init(&ft) == NORMJIT_SUCCESS);
  REQUIRE(normjit_backward_tensors_init(&bt) == NORMJIT_SUCCESS);
  char buf[64];
  std::size_t bytes = 12345;

  SUBCASE("null engine") {
    check_invalid(normjit_forward(nullptr, &d, &ft, nullptr), "engine = NULL");
    check_invalid(normjit_backward(nullptr, &d, &bt, nullptr), "engine = NULL");
    check_invalid(normjit_backward_workspace_size(nullptr, &d, &bytes), "engine = NULL");
    check_invalid(normjit_config_for(nullptr, NORMJIT_OP_FORWARD, &d, buf, sizeof buf, nullptr), "engine = NULL");
    check_invalid(normjit_tune(nullptr, NORMJIT_OP_FORWARD, &d, buf, sizeof buf, nullptr), "engine = NULL");
    check_invalid(normjit_engine_cache_dir(nullptr, buf, sizeof buf), "engine = NULL");
  }
  SUBCASE("null desc, tensors, outputs") {
    check_invalid(normjit_forward(te.engine, nullptr, &ft, nullptr), "desc = NULL");
    check_invalid(normjit_backward(te.engine, nullptr, &bt, nullptr), "desc = NULL");
    check_invalid(normjit_backward_workspace_size(te.engine, nullptr, &bytes), "desc = NULL");
    check_invalid(normjit_config_for(te.engine, NORMJIT_OP_FORWARD, nullptr, buf, sizeof buf, nullptr), "desc = NULL");
    check_invalid(normjit_forward(te.engine, &d, nullptr, nullptr), "tensors = NULL");
    check_invalid(normjit_backward(te.engine, &d, nullptr, nullptr), "tensors = NULL");
    check_invalid(normjit_backward_workspace_size(te.engine, &d, nullptr), "bytes = NULL");
    check_invalid(normjit_config_for(te.engine, NORMJIT_OP_FORWARD, &d, nullptr, 16, nullptr), "buf = NULL");
    check_invalid(normjit_tune(te.engine, NORMJIT_OP_FORWARD, &d, nullptr, 16, nullptr), "winner = NULL");
  }
  SUBCASE("FP8 fields: a bad quant, an FP8 y without one, a group that does not divide N") {
    d.quant = 9;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->quant = 9");
    d.quant = NORMJIT_QUANT_NONE;
    d.y_dtype = NORMJIT_E4M3;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "y_dtype = e4m3 needs quant");
    d.quant = NORMJIT_QUANT_GROUP;
    d.quant_group = 128;  // N = 64
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "quant_group = 128 does not divide N = 64");
    d.quant = NORMJIT_QUANT_TOKEN;
    void* fake = reinterpret_cast<void*>(std::uintptr_t{1} << 20);  // never dereferenced: the check fails first
    ft.x = ft.weight = fake;
    ft.y = ft.rstd = fake;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "y_scale = null");
  }
  SUBCASE("N = 0 and M < 0, before any GPU work; nothing written") {
    d.N = 0;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "N = 0");
    check_invalid(normjit_backward_workspace_size(te.engine, &d, &bytes), "N = 0");
    CHECK(bytes == 12345);
    d = valid_desc();
    d.M = -1;
    check_invalid(normjit_backward(te.engine, &d, &bt, nullptr), "M = -1");
    std::memset(buf, 'z', sizeof buf);
    check_invalid(normjit_config_for(te.engine, NORMJIT_OP_FORWARD, &d, buf, sizeof buf, nullptr), "M = -1");
    CHECK(buf[0] == 'z');
  }
  SUBCASE("struct sizes this library does not know") {
    d.struct_size = 3;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->struct_size = 3");
    d.struct_size = sizeof(normjit_norm_desc) + 8;  // a newer header's struct
    check_invalid(normjit_backward_workspace_size(te.engine, &d, &bytes),
                  "desc->struct_size = " + std::to_string(sizeof(normjit_norm_desc) + 8));
    d = valid_desc();
    ft.struct_size = 0;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "tensors->struct_size = 0");
    bt.struct_size = 1;
    check_invalid(normjit_backward(te.engine, &d, &bt, nullptr), "tensors->struct_size = 1");
  }
  SUBCASE("enum and boolean fields out of range") {
    d.x_dtype = 7;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->x_dtype = 7");
    d = valid_desc();
    d.norm = 2;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->norm = 2");
    d = valid_desc();
    d.has_weight = 2;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->has_weight = 2");
    d = valid_desc();
    d.cast_mode = -1;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->cast_mode = -1");
    d = valid_desc();
    d.residual_rounding = 9;
    check_invalid(normjit_forward(te.engine, &d, &ft, nullptr), "desc->residual_rounding = 9");
    d = valid_desc();
    check_invalid(normjit_config_for(te.engine, 2, &d, buf, sizeof buf, nullptr), "op = 2");
    check_invalid(normjit_tune(te.engine, -1, &d, buf, sizeof buf, nullptr), "op = -1");
  }
}

TEST_CASE("c_api: the error message is kept per thread and cleared on success") {
  REQUIRE(normjit_forward(nullptr, nullptr, nullptr, nullptr) == NORMJIT_INVALID_ARGUMENT);
  const std::string mine = last_error();
  CHECK(contains(mine, "engine = NULL"));

  std::string other_before, other_after;
  std::thread t([&] {
    other_before = last_error();
    normjit_norm_desc d = valid_desc();
    d.N = -5;
    std::size_t bytes = 0;
    normjit_engine e = nullptr;
    if (normjit_engine_create(nullptr, &e) == NORMJIT_SUCCESS) {
      normjit_backward_workspace_size(e, &d, &bytes);
      other_after = last_error();
      normjit_engine_destroy(e);
    }
  });
  t.join();
  CHECK(other_before.empty());                 // a fresh thread has no error
  CHECK(contains(other_after, "N = -5"));      // its own failure
  CHECK(last_error() == mine);                 // this thread's message is untouched

  normjit_norm_desc d;
  REQUIRE(normjit_norm_desc_init(&d) == NORMJIT_SUCCESS);
  CHECK(last_error().empty());                 // cleared by a success
}

TEST_CASE("c_api: config_for without a GPU fails with a status and a message") {
  TestEngine te;
  normjit_norm_desc d = valid_desc();
  char buf[64];
  std::memset(buf, 'z', sizeof buf);
  std::int32_t source = -7;
  const int st = normjit_config_for(te.engine, NORMJIT_OP_FORWARD, &d, buf, sizeof buf, &source);
  if (st == NORMJIT_SUCCESS) {
    // A machine with a GPU: a parseable config and a known source.
    CHECK(last_error().empty());
    CHECK(normjit::LaunchConfig::parse(buf).str() == buf);
    CHECK(source >= NORMJIT_SOURCE_MEMORY);
    CHECK(source <= NORMJIT_SOURCE_HEURISTIC);
    // Too small a buffer for it: the needed size is named, nothing written.
    const std::size_t need = std::strlen(buf) + 1;
    char small[2] = {'z', 'z'};
    check_invalid(normjit_config_for(te.engine, NORMJIT_OP_FORWARD, &d, small, 1, nullptr),
                  std::to_string(need) + " bytes are needed");
    CHECK(small[0] == 'z');
  } else {
    MESSAGE("no GPU here: " << normjit_status_name(st) << ": " << last_error());
    CHECK(st != NORMJIT_INVALID_ARGUMENT);
    CHECK(st != NORMJIT_INTERNAL);
    CHECK_FALSE(last_error().empty());
    CHECK(buf[0] == 'z');     // nothing written
    CHECK(source == -7);
    double us = -1;
    const int st2 = normjit_tune(te.engine, NORMJIT_OP_BACKWARD, &d, buf, sizeof buf, &us);
    CHECK(st2 != NORMJIT_SUCCESS);
    CHECK_FALSE(last_error().empty());
    CHECK(us == -1);
  }
}
