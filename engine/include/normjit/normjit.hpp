// normjit: run-time compiled RMSNorm kernels for NVIDIA GPUs.
//
// The public C++ API. One Engine per process is the usual pattern; it is
// thread-safe. All pointers are device addresses in the CUDA context that is
// current on the calling thread (the device's primary context is retained and
// made current when none is). Kernels are specialised per shape and dtype,
// compiled with NVRTC on first use and cached in memory and on disk.
//
// RMSNorm: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization".
//   y[i, j] = x[i, j] * rstd[i] * weight[j],
//   rstd[i] = 1 / sqrt(mean_j(x[i, j]^2) + eps), accumulated in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "normjit/version.hpp"

// Forward declaration, so this header does not need cuda.h.
typedef struct CUstream_st* CUstream;

namespace normjit {

/// Element types of tensors. fp32 = IEEE binary32, fp16 = IEEE binary16,
/// bf16 = bfloat16 (8-bit exponent, 7-bit mantissa).
enum class DType : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

/// "fp32", "fp16" or "bf16".
const char* dtype_name(DType t);
/// Size of one element in bytes (4 or 2).
int dtype_size(DType t);
/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16"/"half", "bf16"/"bfloat16".
/// Throws Error(InvalidArgument) naming `what` and the text otherwise.
DType parse_dtype(const std::string& text, const char* what = "dtype");

/// The kernels the engine runs. The string form ("rms_fwd", "rms_bwd") is
/// used in cache keys, the CLI and error messages.
enum class Op : std::uint8_t { RmsForward = 0, RmsBackward = 1 };
const char* op_name(Op op);

/// What kind of failure an Error reports.
enum class ErrorKind {
  InvalidArgument,   ///< a descriptor field, pointer or option is not acceptable
  LibraryNotFound,   ///< libcuda.so.1 or libnvrtc could not be opened, or a symbol is missing
  NoDevice,          ///< the driver loaded but reports no usable GPU
  Driver,            ///< a CUDA Driver API call failed
  Compile,           ///< NVRTC rejected a kernel (see CompileError)
  Cache,             ///< a cache file could not be read, locked or written
  Tuning,            ///< no autotune candidate compiled or matched the reference
};
const char* error_kind_name(ErrorKind k);

/// The one error family of normjit. what() is a complete, human-readable
/// message; the fields keep its parts for programs.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string op = {}, std::string shape = {},
        std::string config = {}, std::string where = {});
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }  ///< without context
  const std::string& op() const noexcept { return op_; }            ///< "rms_fwd", ... or empty
  const std::string& shape() const noexcept { return shape_; }      ///< "MxN dtypes" or empty
  const std::string& config() const noexcept { return config_; }    ///< launch config or empty
  const std::string& where() const noexcept { return where_; }      ///< "file:line" or empty

 private:
  ErrorKind kind_;
  std::string message_, op_, shape_, config_, where_;
};

/// NVRTC failed to compile a kernel. The fields are kept apart so a caller can
/// print or store the compiler log separately from the options.
class CompileError : public Error {
 public:
  CompileError(std::string message, std::string log, std::vector<std::string> options,
               std::string kernel_name, std::string arch, std::string where = {});
  const std::string& log() const noexcept { return log_; }
  const std::vector<std::string>& options() const noexcept { return options_; }
  const std::string& kernel_name() const noexcept { return kernel_name_; }
  const std::string& arch() const noexcept { return arch_; }  ///< e.g. "sm_90"

 private:
  std::string log_;
  std::vector<std::string> options_;
  std::string kernel_name_, arch_;
};

/// Shape and dtypes of one RMSNorm call. Strides are in elements between the
/// starts of consecutive rows; 0 means contiguous (= N). Rows are contiguous
/// (element stride 1).
struct NormDesc {
  std::int64_t M = 0;          ///< rows (tokens); M = 0 is a no-op
  std::int64_t N = 0;          ///< hidden size, 1 <= N <= 262144
  std::int64_t x_stride = 0;   ///< row stride of x (forward and backward input), >= N
  std::int64_t y_stride = 0;   ///< row stride of y (forward output), >= N
  std::int64_t dy_stride = 0;  ///< row stride of dy (backward input, dtype y_dtype), >= N
  std::int64_t dx_stride = 0;  ///< row stride of dx (backward output, dtype x_dtype), >= N
  DType x_dtype = DType::BF16;       ///< x and dx
  DType y_dtype = DType::BF16;       ///< y and dy
  DType weight_dtype = DType::BF16;  ///< weight and dweight
  float eps = 1e-6f;           ///< added to mean(x^2); finite, >= 0
  bool store_rstd = true;      ///< forward writes rstd (fp32, length M) when true

  /// Throws Error(InvalidArgument) naming the first bad field and its value.
  void validate() const;
  /// "8192x4096 x=bf16 y=bf16 w=bf16", used in messages.
  std::string str() const;
  std::int64_t x_ld() const { return x_stride ? x_stride : N; }
  std::int64_t y_ld() const { return y_stride ? y_stride : N; }
  std::int64_t dy_ld() const { return dy_stride ? dy_stride : N; }
  std::int64_t dx_ld() const { return dx_stride ? dx_stride : N; }
};

/// How a kernel is launched. Every field is part of the kernel's
/// specialisation. The product threads_per_row * rows_per_pid is the block
/// size; a row is covered in chunks of `vec` elements.
struct LaunchConfig {
  int vec = 1;              ///< elements per vector load (16 bytes at most)
  int threads_per_row = 32; ///< threads that cooperate on one row (power of two)
  int rows_per_pid = 1;     ///< rows one program (CTA) handles at once: ROWS_PER_PID
  bool two_pass = false;    ///< re-read the row instead of caching it in registers (wide rows)
  /// Backward only, a launch parameter (not compiled in): programs per SM of
  /// the persistent grid; 0 = as many as fit. Fewer programs mean a smaller
  /// dweight partial buffer; more mean more rows in flight.
  int programs_per_sm = 0;
  /// Backward only: rows stream through this many shared-memory buffers
  /// filled by cp.async (0 = rows double-buffered in registers).
  int stages = 0;

  int threads() const { return threads_per_row * rows_per_pid; }
  /// "v8.t512.r1", "v8.t1024.r1.2p", "v8.t256.r1.s2.p2"; parse() reads the same form.
  std::string str() const;
  static LaunchConfig parse(const std::string& text);
  bool operator==(const LaunchConfig& o) const {
    return vec == o.vec && threads_per_row == o.threads_per_row &&
           rows_per_pid == o.rows_per_pid && two_pass == o.two_pass && programs_per_sm == o.programs_per_sm &&
           stages == o.stages;
  }
  bool operator!=(const LaunchConfig& o) const { return !(*this == o); }
};

/// When the engine autotunes a shape it has no tuned config for.
enum class TunePolicy {
  Never,       ///< use tuned caches, else the heuristic config; never tune (production)
  OnFirstUse,  ///< tune a shape missing from every cache at its first call and store the result
  Always,      ///< tune every shape once per Engine, ignoring caches, and store the result
};
const char* tune_policy_name(TunePolicy p);
TunePolicy parse_tune_policy(const std::string& text);  ///< "never", "first", "always"

struct EngineOptions {
  /// Default: $NORMJIT_TUNE if set, else Never.
  TunePolicy tune_policy = TunePolicy::Never;
  /// Root of the user cache (tuned configs and compiled kernels). Empty:
  /// $NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit.
  std::string cache_dir;
  /// More directories of shipped tuned caches, searched after the user cache
  /// and before the built-in autotune_cache/ directories.
  std::vector<std::string> shipped_cache_dirs;
  /// Keep compiled kernels (cubin) on disk between processes.
  bool disk_kernel_cache = true;
  /// Print progress of tuning to stderr.
  bool verbose = false;

  /// Options from the environment (NORMJIT_TUNE, NORMJIT_CACHE_DIR,
  /// NORMJIT_SHIPPED_CACHE_PATH as a ':'-separated list).
  static EngineOptions from_env();
};

/// Where a launch config came from.
enum class ConfigSource { Memory, UserCache, ShippedCache, Tuned, Heuristic };
const char* config_source_name(ConfigSource s);

/// One candidate's timing in a tuning run.
struct CandidateTiming {
  LaunchConfig config;
  double median_us = 0;  ///< < 0: rejected (see `rejected`)
  std::string rejected;  ///< why it could not win: compile error, mismatch, ...
};

/// Result of tuning one shape.
struct TuneResult {
  std::string shape_key;
  LaunchConfig winner;
  double winner_us = 0;
  std::vector<CandidateTiming> candidates;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = EngineOptions::from_env());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// RMSNorm forward. x: [M, x_stride] of x_dtype; weight: [N] of weight_dtype;
  /// y: [M, y_stride] of y_dtype; rstd: [M] fp32, written when desc.store_rstd
  /// (may be null otherwise). Asynchronous on `stream` (0 = legacy default).
  /// Throws Error(InvalidArgument) for a bad descriptor or null pointer,
  /// Error(Driver/Compile/LibraryNotFound) when the kernel cannot run.
  void rms_norm_forward(const NormDesc& desc, const void* x, const void* weight, void* y,
                        float* rstd, CUstream stream);

  /// Bytes of device workspace rms_norm_backward needs for `desc` on the
  /// current device (fp32 partial dweight sums, programs x N; 0 when M == 0).
  std::size_t rms_norm_backward_workspace_size(const NormDesc& desc);

  /// RMSNorm backward. dy: [M, dy_stride] of y_dtype; x: [M, x_stride] of
  /// x_dtype; weight: [N]; rstd: [M] fp32 from the forward; dx: [M, dx_stride]
  /// of x_dtype; dweight: [N] of weight_dtype (overwritten, not accumulated).
  /// workspace: at least rms_norm_backward_workspace_size(desc) bytes.
  /// Deterministic: the same inputs and config give bitwise the same outputs.
  void rms_norm_backward(const NormDesc& desc, const void* dy, const void* x,
                         const void* weight, const float* rstd, void* dx, void* dweight,
                         void* workspace, std::size_t workspace_bytes, CUstream stream);

  /// Autotunes `op` for `desc` on scratch buffers of the same shape (needs a
  /// GPU), stores the winner in the user cache and returns every candidate.
  TuneResult tune(Op op, const NormDesc& desc);

  /// The config a call with `desc` would use now, and where it came from.
  LaunchConfig config_for(Op op, const NormDesc& desc, ConfigSource* source = nullptr);

  /// Compiles every candidate of `op`'s grid for `desc` for `arch` ("sm_90")
  /// into the on-disk kernel cache; needs NVRTC but no GPU. Returns the number
  /// of variants compiled or found; failures are reported through `failures`.
  int precompile(Op op, const NormDesc& desc, const std::string& arch,
                 std::vector<std::string>* failures = nullptr);

  const EngineOptions& options() const;
  /// The user cache directory in use (tuned configs in tuned/, cubins in kernels/).
  std::string cache_dir() const;
  /// Shipped tuned-cache directories searched after the user cache, in order.
  std::vector<std::string> shipped_cache_dirs() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace normjit
