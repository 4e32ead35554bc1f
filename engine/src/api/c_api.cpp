// The C ABI (normjit.h) over normjit::Engine. Every entry point catches
// everything: normjit::Error maps to its kind's status, any other exception to
// NORMJIT_INTERNAL, and the message is kept per thread.
#include "normjit/normjit.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "normjit/normjit.hpp"

struct normjit_engine_s {
  explicit normjit_engine_s(normjit::EngineOptions o) : engine(std::move(o)) {}
  normjit::Engine engine;
};

// The C enums are the C++ enums' values: conversions are plain casts.
static_assert(NORMJIT_FP32 == static_cast<int>(normjit::DType::F32) &&
              NORMJIT_FP16 == static_cast<int>(normjit::DType::F16) &&
              NORMJIT_BF16 == static_cast<int>(normjit::DType::BF16));
static_assert(NORMJIT_NORM_RMS == static_cast<int>(normjit::NormKind::RMSNorm) &&
              NORMJIT_NORM_LAYER == static_cast<int>(normjit::NormKind::LayerNorm));
static_assert(NORMJIT_CAST_DEFAULT == static_cast<int>(normjit::CastMode::Default) &&
              NORMJIT_CAST_LLAMA == static_cast<int>(normjit::CastMode::Llama) &&
              NORMJIT_CAST_GEMMA == static_cast<int>(normjit::CastMode::Gemma));
static_assert(NORMJIT_RESIDUAL_ROUND_RESIDUAL_DTYPE == static_cast<int>(normjit::ResidualRounding::ResidualDtype) &&
              NORMJIT_RESIDUAL_ROUND_FP32 == static_cast<int>(normjit::ResidualRounding::Fp32));
static_assert(NORMJIT_OP_FORWARD == static_cast<int>(normjit::Op::Forward) &&
              NORMJIT_OP_BACKWARD == static_cast<int>(normjit::Op::Backward));
static_assert(NORMJIT_SOURCE_MEMORY == static_cast<int>(normjit::ConfigSource::Memory) &&
              NORMJIT_SOURCE_USER_CACHE == static_cast<int>(normjit::ConfigSource::UserCache) &&
              NORMJIT_SOURCE_SHIPPED_CACHE == static_cast<int>(normjit::ConfigSource::ShippedCache) &&
              NORMJIT_SOURCE_TUNED == static_cast<int>(normjit::ConfigSource::Tuned) &&
              NORMJIT_SOURCE_HEURISTIC == static_cast<int>(normjit::ConfigSource::Heuristic) &&
              NORMJIT_SOURCE_NEIGHBOUR == static_cast<int>(normjit::ConfigSource::Neighbour));

namespace {

using normjit::Error;
using normjit::ErrorKind;

thread_local std::string t_last_error;

Error invalid(std::string message) { return Error(ErrorKind::InvalidArgument, std::move(message)); }

int status_of(ErrorKind k) {
  switch (k) {
    case ErrorKind::InvalidArgument: return NORMJIT_INVALID_ARGUMENT;
    case ErrorKind::LibraryNotFound: return NORMJIT_LIBRARY_NOT_FOUND;
    case ErrorKind::NoDevice: return NORMJIT_NO_DEVICE;
    case ErrorKind::Driver: return NORMJIT_DRIVER;
    case ErrorKind::Compile: return NORMJIT_COMPILE;
    case ErrorKind::Cache: return NORMJIT_CACHE;
    case ErrorKind::Tuning: return NORMJIT_TUNING;
  }
  return NORMJIT_INTERNAL;
}

// Runs `body`, records the outcome for normjit_last_error_message and returns
// the status. Nothing escapes: not even a failure to store the message.
template <class F>
int guarded(const char* function, F&& body) noexcept {
  int status = NORMJIT_INTERNAL;
  try {
    try {
      body();
      t_last_error.clear();
      return NORMJIT_SUCCESS;
    } catch (const Error& e) {
      status = status_of(e.kind());
      t_last_error = e.what();
    } catch (const std::bad_alloc&) {
      status = NORMJIT_INTERNAL;
      t_last_error = fmt::format("normjit: {}: out of host memory", function);
    } catch (const std::exception& e) {
      status = NORMJIT_INTERNAL;
      t_last_error = fmt::format("normjit: {}: internal error: {}", function, e.what());
    } catch (...) {
      status = NORMJIT_INTERNAL;
      t_last_error = fmt::format("normjit: {}: internal error (unknown exception)", function);
    }
  } catch (...) {
    // The message itself could not be stored; the status still says what failed.
  }
  return status;
}

template <class T>
void require_non_null(const T* p, const char* what) {
  if (!p) throw invalid(fmt::format("{} = NULL: a pointer is required", what));
}

void require_engine(normjit_engine e) {
  if (!e) throw invalid("engine = NULL: create one with normjit_engine_create");
}

// A struct of a size this library does not know is rejected: it may come
// from a newer header whose fields would be ignored, or be uninitialised.
void require_struct_size(std::uint32_t got, std::size_t known, const char* what, const char* type,
                         const char* init) {
  if (got != known)
    throw invalid(fmt::format("{}->struct_size = {} is not a size this library knows ({} is {} bytes in C API "
                              "version {}); fill it with {}()",
                              what, got, type, known, NORMJIT_C_API_VERSION, init));
}

// normjit_norm_desc's sizes: now, and before scale_min and store_amax joined it (offsetof
// rounded up to the struct's alignment).
constexpr std::size_t kDescSize = sizeof(normjit_norm_desc);
constexpr std::size_t kDescSizeV2 =
    (offsetof(normjit_norm_desc, scale_min) + alignof(normjit_norm_desc) - 1) / alignof(normjit_norm_desc) *
    alignof(normjit_norm_desc);
static_assert(kDescSizeV2 < kDescSize, "scale_min must be the last field of normjit_norm_desc");

bool to_bool(std::int32_t v, const char* field) {
  if (v != 0 && v != 1) throw invalid(fmt::format("desc->{} = {} must be 0 or 1", field, v));
  return v == 1;
}

normjit::DType to_dtype(std::int32_t v, const char* field) {
  if (v < NORMJIT_FP32 || v > NORMJIT_E5M2)
    throw invalid(fmt::format("desc->{} = {} is not a dtype (0 fp32, 1 fp16, 2 bf16, 3 e4m3, 4 e5m2)", field, v));
  return static_cast<normjit::DType>(v);
}

normjit::Op to_op(std::int32_t v) {
  if (v != NORMJIT_OP_FORWARD && v != NORMJIT_OP_BACKWARD)
    throw invalid(fmt::format("op = {} is not NORMJIT_OP_FORWARD (0) or NORMJIT_OP_BACKWARD (1)", v));
  return static_cast<normjit::Op>(v);
}

normjit::NormDesc to_cpp(const normjit_norm_desc* c) {
  require_non_null(c, "desc");
  // The struct of a header before scale_min is accepted: it reads scale_min = 0.
  if (c->struct_size != kDescSizeV2)
    require_struct_size(c->struct_size, kDescSize, "desc", "normjit_norm_desc", "normjit_norm_desc_init");
  normjit::NormDesc d;
  if (c->norm != NORMJIT_NORM_RMS && c->norm != NORMJIT_NORM_LAYER)
    throw invalid(fmt::format("desc->norm = {} is not NORMJIT_NORM_RMS (0) or NORMJIT_NORM_LAYER (1)", c->norm));
  d.norm = static_cast<normjit::NormKind>(c->norm);
  d.M = c->M;
  d.N = c->N;
  d.heads = c->heads;
  d.x_stride = c->x_stride;
  d.y_stride = c->y_stride;
  d.dy_stride = c->dy_stride;
  d.dx_stride = c->dx_stride;
  d.x_head_stride = c->x_head_stride;
  d.y_head_stride = c->y_head_stride;
  d.dy_head_stride = c->dy_head_stride;
  d.dx_head_stride = c->dx_head_stride;
  d.residual_stride = c->residual_stride;
  d.residual_out_stride = c->residual_out_stride;
  d.dresidual_stride = c->dresidual_stride;
  d.x_dtype = to_dtype(c->x_dtype, "x_dtype");
  d.y_dtype = to_dtype(c->y_dtype, "y_dtype");
  d.weight_dtype = to_dtype(c->weight_dtype, "weight_dtype");
  d.residual_dtype = to_dtype(c->residual_dtype, "residual_dtype");
  d.residual_out_dtype = to_dtype(c->residual_out_dtype, "residual_out_dtype");
  d.eps = c->eps;
  d.has_weight = to_bool(c->has_weight, "has_weight");
  d.has_bias = to_bool(c->has_bias, "has_bias");
  d.weight_offset = c->weight_offset;
  d.residual = to_bool(c->residual, "residual");
  d.store_residual_out = to_bool(c->store_residual_out, "store_residual_out");
  if (c->residual_rounding != NORMJIT_RESIDUAL_ROUND_RESIDUAL_DTYPE && c->residual_rounding != NORMJIT_RESIDUAL_ROUND_FP32)
    throw invalid(fmt::format("desc->residual_rounding = {} is not 0 (residual dtype) or 1 (fp32)",
                              c->residual_rounding));
  d.residual_rounding = static_cast<normjit::ResidualRounding>(c->residual_rounding);
  d.has_dresidual = to_bool(c->has_dresidual, "has_dresidual");
  if (c->cast_mode < NORMJIT_CAST_DEFAULT || c->cast_mode > NORMJIT_CAST_GEMMA)
    throw invalid(fmt::format("desc->cast_mode = {} is not 0 (default), 1 (llama) or 2 (gemma)", c->cast_mode));
  d.cast_mode = static_cast<normjit::CastMode>(c->cast_mode);
  d.store_rstd = to_bool(c->store_rstd, "store_rstd");
  d.store_mean = to_bool(c->store_mean, "store_mean");
  if (c->quant < NORMJIT_QUANT_NONE || c->quant > NORMJIT_QUANT_MX)
    throw invalid(fmt::format("desc->quant = {} is not an enum normjit_quant (0 none .. 5 mx)", c->quant));
  d.quant = static_cast<normjit::QuantScaling>(c->quant);
  d.quant_group = c->quant_group;
  d.scale_ue8m0 = to_bool(c->scale_ue8m0, "scale_ue8m0");
  d.scale_col_major = to_bool(c->scale_col_major, "scale_col_major");
  d.scale_stride = c->scale_stride;
  d.scale_ub = c->scale_ub;
  d.store_y_hp = to_bool(c->store_y_hp, "store_y_hp");
  d.y_hp_dtype = to_dtype(c->y_hp_dtype, "y_hp_dtype");
  d.store_y_t = to_bool(c->store_y_t, "store_y_t");
  d.x_group = c->x_group;
  d.grad_dtype = to_dtype(c->grad_dtype, "grad_dtype");
  if (c->struct_size >= kDescSize) {
    d.scale_min = c->scale_min;
    d.store_amax = to_bool(c->store_amax, "store_amax");
  }
  // Named errors for the shape before any engine work (no GPU needed).
  d.validate();
  return d;
}

normjit::ForwardTensors to_cpp(const normjit_forward_tensors* c) {
  require_non_null(c, "tensors");
  require_struct_size(c->struct_size, sizeof(normjit_forward_tensors), "tensors", "normjit_forward_tensors",
                      "normjit_forward_tensors_init");
  normjit::ForwardTensors t;
  t.x = c->x;
  t.residual = c->residual;
  t.weight = c->weight;
  t.bias = c->bias;
  t.y = c->y;
  t.residual_out = c->residual_out;
  t.mean = static_cast<float*>(c->mean);
  t.rstd = static_cast<float*>(c->rstd);
  t.x_scale = static_cast<const float*>(c->x_scale);
  t.y_scale = c->y_scale;
  t.amax = static_cast<float*>(c->amax);
  t.y_hp = c->y_hp;
  t.y_t = c->y_t;
  return t;
}

normjit::BackwardTensors to_cpp(const normjit_backward_tensors* c) {
  require_non_null(c, "tensors");
  require_struct_size(c->struct_size, sizeof(normjit_backward_tensors), "tensors", "normjit_backward_tensors",
                      "normjit_backward_tensors_init");
  normjit::BackwardTensors t;
  t.dy = c->dy;
  t.x = c->x;
  t.weight = c->weight;
  t.mean = static_cast<const float*>(c->mean);
  t.rstd = static_cast<const float*>(c->rstd);
  t.dresidual = c->dresidual;
  t.dx = c->dx;
  t.dweight = c->dweight;
  t.dbias = c->dbias;
  t.workspace = c->workspace;
  t.workspace_bytes = c->workspace_bytes;
  t.x_scale = static_cast<const float*>(c->x_scale);
  return t;
}

// Checks that `text` fits, then copies it with its NUL: a too-small buffer
// is bad input and nothing is written.
void check_fits(const std::string& text, const char* buf, std::size_t len, const char* what) {
  require_non_null(buf, what);
  if (text.size() + 1 > len)
    throw invalid(fmt::format("{} is too small: len = {}, {} bytes are needed (with the terminating NUL)", what, len,
                              text.size() + 1));
}
void copy_out(const std::string& text, char* buf) { std::memcpy(buf, text.c_str(), text.size() + 1); }

CUstream to_stream(void* s) { return reinterpret_cast<CUstream>(s); }

std::int32_t c_tune_policy(normjit::TunePolicy p) {
  switch (p) {
    case normjit::TunePolicy::Never: return NORMJIT_TUNE_NEVER;
    case normjit::TunePolicy::OnFirstUse: return NORMJIT_TUNE_FIRST;
    case normjit::TunePolicy::Always: return NORMJIT_TUNE_ALWAYS;
  }
  return NORMJIT_TUNE_NEVER;
}


normjit::ShardedNormDesc to_cpp(const normjit_sharded_desc* c) {
  require_non_null(c, "desc");
  require_struct_size(c->struct_size, sizeof(normjit_sharded_desc), "desc", "normjit_sharded_desc",
                      "normjit_sharded_desc_init");
  if (c->norm != NORMJIT_NORM_RMS && c->norm != NORMJIT_NORM_LAYER)
    throw invalid(fmt::format("desc->norm = {} is not NORMJIT_NORM_RMS (0) or NORMJIT_NORM_LAYER (1)", c->norm));
  normjit::ShardedNormDesc d;
  d.norm = static_cast<normjit::NormKind>(c->norm);
  d.M = c->M;
  d.N = c->N;
  d.N_total = c->N_total;
  d.x_dtype = to_dtype(c->x_dtype, "x_dtype");
  d.y_dtype = to_dtype(c->y_dtype, "y_dtype");
  d.weight_dtype = to_dtype(c->weight_dtype, "weight_dtype");
  d.has_weight = to_bool(c->has_weight, "has_weight");
  d.has_bias = to_bool(c->has_bias, "has_bias");
  d.eps = c->eps;
  d.weight_offset = c->weight_offset;
  return d;
}

}  // namespace

extern "C" {

uint32_t normjit_api_version(void) { return NORMJIT_C_API_VERSION; }

const char* normjit_version_string(void) { return NORMJIT_VERSION_STRING; }

const char* normjit_status_name(int status) {
  switch (status) {
    case NORMJIT_SUCCESS: return "NORMJIT_SUCCESS";
    case NORMJIT_INVALID_ARGUMENT: return "NORMJIT_INVALID_ARGUMENT";
    case NORMJIT_LIBRARY_NOT_FOUND: return "NORMJIT_LIBRARY_NOT_FOUND";
    case NORMJIT_NO_DEVICE: return "NORMJIT_NO_DEVICE";
    case NORMJIT_DRIVER: return "NORMJIT_DRIVER";
    case NORMJIT_COMPILE: return "NORMJIT_COMPILE";
    case NORMJIT_CACHE: return "NORMJIT_CACHE";
    case NORMJIT_TUNING: return "NORMJIT_TUNING";
    case NORMJIT_INTERNAL: return "NORMJIT_INTERNAL";
    default: return "NORMJIT_UNKNOWN_STATUS";
  }
}

const char* normjit_config_source_name(int source) {
  if (source < NORMJIT_SOURCE_MEMORY || source > NORMJIT_SOURCE_NEIGHBOUR) return "unknown";
  return normjit::config_source_name(static_cast<normjit::ConfigSource>(source));
}

const char* normjit_last_error_message(void) { return t_last_error.c_str(); }

int normjit_engine_options_init(normjit_engine_options* options) {
  return guarded("normjit_engine_options_init", [&] {
    require_non_null(options, "options");
    normjit_engine_options o{};
    o.struct_size = sizeof(normjit_engine_options);
    normjit::EngineOptions defaults;
    std::string bad_env;  // from_env's message when NORMJIT_TUNE is not a policy
    try {
      defaults = normjit::EngineOptions::from_env();
    } catch (const Error& e) {
      bad_env = e.message();
    }
    o.tune_policy = c_tune_policy(defaults.tune_policy);
    o.cache_dir = nullptr;           // the engine's own lookup: $NORMJIT_CACHE_DIR, XDG, ~/.cache
    o.shipped_cache_path = nullptr;  // $NORMJIT_SHIPPED_CACHE_PATH
    o.disk_kernel_cache = defaults.disk_kernel_cache ? 1 : 0;
    o.verbose = defaults.verbose ? 1 : 0;
    *options = o;  // filled even when NORMJIT_TUNE is bad, as documented
    if (!bad_env.empty()) throw invalid(bad_env);
  });
}

int normjit_norm_desc_init(normjit_norm_desc* desc) {
  return guarded("normjit_norm_desc_init", [&] {
    require_non_null(desc, "desc");
    const normjit::NormDesc d;
    normjit_norm_desc c{};
    c.struct_size = sizeof(normjit_norm_desc);
    c.norm = static_cast<std::int32_t>(d.norm);
    c.M = d.M;
    c.N = d.N;
    c.heads = d.heads;
    c.x_stride = d.x_stride;
    c.y_stride = d.y_stride;
    c.dy_stride = d.dy_stride;
    c.dx_stride = d.dx_stride;
    c.x_head_stride = d.x_head_stride;
    c.y_head_stride = d.y_head_stride;
    c.dy_head_stride = d.dy_head_stride;
    c.dx_head_stride = d.dx_head_stride;
    c.residual_stride = d.residual_stride;
    c.residual_out_stride = d.residual_out_stride;
    c.dresidual_stride = d.dresidual_stride;
    c.x_dtype = static_cast<std::int32_t>(d.x_dtype);
    c.y_dtype = static_cast<std::int32_t>(d.y_dtype);
    c.weight_dtype = static_cast<std::int32_t>(d.weight_dtype);
    c.residual_dtype = static_cast<std::int32_t>(d.residual_dtype);
    c.residual_out_dtype = static_cast<std::int32_t>(d.residual_out_dtype);
    c.eps = d.eps;
    c.has_weight = d.has_weight;
    c.has_bias = d.has_bias;
    c.weight_offset = d.weight_offset;
    c.residual = d.residual;
    c.store_residual_out = d.store_residual_out;
    c.residual_rounding = static_cast<std::int32_t>(d.residual_rounding);
    c.has_dresidual = d.has_dresidual;
    c.cast_mode = static_cast<std::int32_t>(d.cast_mode);
    c.store_rstd = d.store_rstd;
    c.store_mean = d.store_mean;
    c.quant = static_cast<std::int32_t>(d.quant);
    c.quant_group = d.quant_group;
    c.scale_ue8m0 = d.scale_ue8m0;
    c.scale_col_major = d.scale_col_major;
    c.scale_stride = d.scale_stride;
    c.scale_ub = d.scale_ub;
    c.store_y_hp = d.store_y_hp;
    c.y_hp_dtype = static_cast<std::int32_t>(d.y_hp_dtype);
    c.store_y_t = d.store_y_t;
    c.x_group = d.x_group;
    c.grad_dtype = static_cast<std::int32_t>(d.grad_dtype);
    c.scale_min = d.scale_min;
    c.store_amax = d.store_amax;
    *desc = c;
  });
}

int normjit_forward_tensors_init(normjit_forward_tensors* tensors) {
  return guarded("normjit_forward_tensors_init", [&] {
    require_non_null(tensors, "tensors");
    normjit_forward_tensors t{};
    t.struct_size = sizeof(normjit_forward_tensors);
    *tensors = t;
  });
}

int normjit_backward_tensors_init(normjit_backward_tensors* tensors) {
  return guarded("normjit_backward_tensors_init", [&] {
    require_non_null(tensors, "tensors");
    normjit_backward_tensors t{};
    t.struct_size = sizeof(normjit_backward_tensors);
    *tensors = t;
  });
}

int normjit_engine_create(const normjit_engine_options* options, normjit_engine* out) {
  return guarded("normjit_engine_create", [&] {
    require_non_null(out, "out");
    normjit::EngineOptions o;
    if (!options) {
      o = normjit::EngineOptions::from_env();
    } else {
      require_struct_size(options->struct_size, sizeof(normjit_engine_options), "options", "normjit_engine_options",
                          "normjit_engine_options_init");
      switch (options->tune_policy) {
        case NORMJIT_TUNE_NEVER: o.tune_policy = normjit::TunePolicy::Never; break;
        case NORMJIT_TUNE_FIRST: o.tune_policy = normjit::TunePolicy::OnFirstUse; break;
        case NORMJIT_TUNE_ALWAYS: o.tune_policy = normjit::TunePolicy::Always; break;
        default:
          throw invalid(fmt::format("options->tune_policy = {} is not 0 (never), 1 (first) or 2 (always)",
                                    options->tune_policy));
      }
      if (options->disk_kernel_cache != 0 && options->disk_kernel_cache != 1)
        throw invalid(fmt::format("options->disk_kernel_cache = {} must be 0 or 1", options->disk_kernel_cache));
      if (options->verbose != 0 && options->verbose != 1)
        throw invalid(fmt::format("options->verbose = {} must be 0 or 1", options->verbose));
      if (options->cache_dir) o.cache_dir = options->cache_dir;
      if (options->shipped_cache_path) {
        o.shipped_cache_dirs.clear();
        const std::string path = options->shipped_cache_path;
        std::size_t a = 0;
        while (a <= path.size()) {
          std::size_t b = path.find(':', a);
          if (b == std::string::npos) b = path.size();
          if (b > a) o.shipped_cache_dirs.push_back(path.substr(a, b - a));
          a = b + 1;
        }
      } else {
        o.shipped_cache_dirs = normjit::EngineOptions::from_env().shipped_cache_dirs;
      }
      // The struct has no field for it: the environment decides, as for NULL options.
      o.builtin_shipped_caches = normjit::EngineOptions::from_env().builtin_shipped_caches;
      o.disk_kernel_cache = options->disk_kernel_cache == 1;
      o.verbose = options->verbose == 1;
    }
    *out = new normjit_engine_s(std::move(o));
  });
}

void normjit_engine_destroy(normjit_engine engine) {
  guarded("normjit_engine_destroy", [&] { delete engine; });
}

int normjit_forward(normjit_engine engine, const normjit_norm_desc* desc, const normjit_forward_tensors* tensors,
                    void* stream) {
  return guarded("normjit_forward", [&] {
    require_engine(engine);
    const normjit::NormDesc d = to_cpp(desc);
    const normjit::ForwardTensors t = to_cpp(tensors);
    engine->engine.forward(d, t, to_stream(stream));
  });
}

int normjit_backward_workspace_size(normjit_engine engine, const normjit_norm_desc* desc, size_t* bytes) {
  return guarded("normjit_backward_workspace_size", [&] {
    require_engine(engine);
    require_non_null(bytes, "bytes");
    const normjit::NormDesc d = to_cpp(desc);
    *bytes = engine->engine.backward_workspace_size(d);
  });
}

int normjit_backward(normjit_engine engine, const normjit_norm_desc* desc, const normjit_backward_tensors* tensors,
                     void* stream) {
  return guarded("normjit_backward", [&] {
    require_engine(engine);
    const normjit::NormDesc d = to_cpp(desc);
    const normjit::BackwardTensors t = to_cpp(tensors);
    engine->engine.backward(d, t, to_stream(stream));
  });
}

int normjit_config_for(normjit_engine engine, int32_t op, const normjit_norm_desc* desc, char* buf, size_t len,
                       int32_t* source) {
  return guarded("normjit_config_for", [&] {
    require_engine(engine);
    const normjit::Op o = to_op(op);
    const normjit::NormDesc d = to_cpp(desc);
    require_non_null(buf, "buf");
    normjit::ConfigSource s = normjit::ConfigSource::Heuristic;
    const std::string text = engine->engine.config_for(o, d, &s).str();
    check_fits(text, buf, len, "buf");
    copy_out(text, buf);
    if (source) *source = static_cast<std::int32_t>(s);
  });
}

int normjit_tune(normjit_engine engine, int32_t op, const normjit_norm_desc* desc, char* winner, size_t len,
                 double* winner_us) {
  return guarded("normjit_tune", [&] {
    require_engine(engine);
    const normjit::Op o = to_op(op);
    const normjit::NormDesc d = to_cpp(desc);
    require_non_null(winner, "winner");
    const normjit::TuneResult r = engine->engine.tune(o, d);
    const std::string text = r.winner.str();
    check_fits(text, winner, len, "winner");
    copy_out(text, winner);
    if (winner_us) *winner_us = r.winner_us;
  });
}

int normjit_engine_cache_dir(normjit_engine engine, char* buf, size_t len) {
  return guarded("normjit_engine_cache_dir", [&] {
    require_engine(engine);
    const std::string dir = engine->engine.cache_dir();
    check_fits(dir, buf, len, "buf");
    copy_out(dir, buf);
  });
}

int normjit_sharded_desc_init(normjit_sharded_desc* desc) {
  return guarded("normjit_sharded_desc_init", [&] {
    require_non_null(desc, "desc");
    const normjit::ShardedNormDesc d;
    normjit_sharded_desc c{};
    c.struct_size = sizeof(normjit_sharded_desc);
    c.norm = static_cast<std::int32_t>(d.norm);
    c.M = d.M;
    c.N = d.N;
    c.N_total = d.N_total;
    c.x_dtype = static_cast<std::int32_t>(d.x_dtype);
    c.y_dtype = static_cast<std::int32_t>(d.y_dtype);
    c.weight_dtype = static_cast<std::int32_t>(d.weight_dtype);
    c.has_weight = d.has_weight;
    c.has_bias = d.has_bias;
    c.eps = d.eps;
    c.weight_offset = d.weight_offset;
    *desc = c;
  });
}

int normjit_sharded_stats(normjit_engine engine, const normjit_sharded_desc* desc, const void* x, double* stats,
                          void* stream) {
  return guarded("normjit_sharded_stats", [&] {
    require_engine(engine);
    engine->engine.sharded_stats(to_cpp(desc), x, stats, to_stream(stream));
  });
}

int normjit_sharded_apply(normjit_engine engine, const normjit_sharded_desc* desc, const void* x, const void* weight,
                          const void* bias, const double* stats, void* y, float* mean, float* rstd, void* stream) {
  return guarded("normjit_sharded_apply", [&] {
    require_engine(engine);
    engine->engine.sharded_apply(to_cpp(desc), x, weight, bias, stats, y, mean, rstd, to_stream(stream));
  });
}

int normjit_sharded_backward_stats(normjit_engine engine, const normjit_sharded_desc* desc, const void* dy,
                                   const void* x, const void* weight, const float* mean, const float* rstd,
                                   double* stats, void* stream) {
  return guarded("normjit_sharded_backward_stats", [&] {
    require_engine(engine);
    engine->engine.sharded_backward_stats(to_cpp(desc), dy, x, weight, mean, rstd, stats, to_stream(stream));
  });
}

int normjit_sharded_backward_workspace_size(normjit_engine engine, const normjit_sharded_desc* desc, size_t* bytes) {
  return guarded("normjit_sharded_backward_workspace_size", [&] {
    require_engine(engine);
    require_non_null(bytes, "bytes");
    const normjit::ShardedNormDesc d = to_cpp(desc);
    *bytes = engine->engine.sharded_backward_workspace_size(d);
  });
}

int normjit_sharded_backward_apply(normjit_engine engine, const normjit_sharded_desc* desc, const void* dy,
                                   const void* x, const void* weight, const float* mean, const float* rstd,
                                   const double* stats, void* dx, void* dweight, void* dbias, void* workspace,
                                   size_t workspace_bytes, void* stream) {
  return guarded("normjit_sharded_backward_apply", [&] {
    require_engine(engine);
    engine->engine.sharded_backward_apply(to_cpp(desc), dy, x, weight, mean, rstd, stats, dx, dweight, dbias, workspace,
                                          workspace_bytes, to_stream(stream));
  });
}

}  // extern "C"
