// normjit: run-time compiled RMSNorm and LayerNorm kernels for NVIDIA GPUs.
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
// LayerNorm: Ba et al. 2016, "Layer Normalization".
//   y[i, j] = (x[i, j] - mean[i]) * rstd[i] * weight[j] + bias[j],
//   rstd[i] = 1 / sqrt(mean_j((x[i, j] - mean[i])^2) + eps), in fp32.
// Variants: fused residual add, zero-centred weight, no weight / bias, mixed
// dtypes, casting modes, 3-D strided rows (see NormDesc).
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
/// bf16 = bfloat16 (8-bit exponent, 7-bit mantissa). E4M3 and E5M2 are the
/// OCP FP8 formats (v1.0; E4M3 "fn": no infinities, largest finite 448;
/// E5M2: largest finite 57344), for quantized y and FP8 x. E8M0 is the
/// MX shared-exponent scale (2^(code - 127), 0xff NaN); only scales use it.
enum class DType : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4, E8M0 = 5 };

/// "fp32", "fp16", "bf16", "e4m3", "e5m2" or "e8m0".
const char* dtype_name(DType t);
/// Size of one element in bytes (4, 2 or 1).
int dtype_size(DType t);
/// E4M3 or E5M2.
inline bool is_fp8(DType t) { return t == DType::E4M3 || t == DType::E5M2; }
/// The largest finite value of an FP8 dtype (448 or 57344).
float fp8_max(DType t);
/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16"/"half", "bf16"/"bfloat16",
/// "e4m3"/"fp8_e4m3"/"float8_e4m3fn", "e5m2"/"fp8_e5m2"/"float8_e5m2".
/// Throws Error(InvalidArgument) naming `what` and the text otherwise.
DType parse_dtype(const std::string& text, const char* what = "dtype");

/// How a quantized (FP8) y is scaled. One convention everywhere: scales
/// are dequantization scales, x ~= q * scale, and q = saturate(round(y / scale))
/// (round to nearest even, saturated to the finite range, NaN kept), with y
/// the fp32 output of the norm (with CastMode::Llama, y rounded to x's dtype
/// first: what the unfused Llama forward would store), fmax =
/// fp8_max(y_dtype) and smin = scale_min, or kMinScale when scale_min is 0:
///   TensorStatic: the caller's scale (y_scale, [1] fp32, an input); with
///                 store_amax, amax = max |y| is written too (delayed
///                 scaling: TransformerEngine's next scale comes from it).
///   Tensor:       current scaling: amax = max |y| over the whole output
///                 (written to `amax`), scale = max(amax / fmax, smin)
///                 ([1] fp32). Two launches: the first finds amax (reading x
///                 once), the second recomputes y and quantizes.
///   Token:        per row: scale[i] = max(amax_i / fmax, smin), capped
///                 at scale_ub when scale_ub > 0 ([M] fp32).
///   Group:        per 1 x G group of a row (G = quant_group: 16, 32, 64 or
///                 128): scale[i, g] = max(amax_ig / fmax, smin), capped
///                 at scale_ub when scale_ub > 0, then rounded up to a
///                 power of two with scale_ue8m0 ([M, N / G]
///                 fp32, row-major; scale_col_major: [N / G, M] with row
///                 stride scale_stride, the layout DeepGEMM-style GEMMs read).
///   MX:           OCP MX v1.0 MXFP8: 1 x 32 groups with a shared exponent
///                 e = clamp(floor(log2(amax_ig)) - emax, -127, 127) (emax = 8
///                 for E4M3, 15 for E5M2; an all-zero group gets -127),
///                 scale = 2^e stored as E8M0 (uint8 e + 127, [M, N / 32]).
/// smin guards all-zero groups (their q is 0). vLLM's fused quant norms use
/// smin = 1 / (fmax * 512), and cap amax (not the scale) at their scale_ub:
/// min(amax, ub) / fmax = min(amax / fmax, ub / fmax) exactly, so their ub
/// is scale_ub = ub / fmax here.
enum class QuantScaling : std::uint8_t { None = 0, TensorStatic = 1, Tensor = 2, Token = 3, Group = 4, MX = 5 };
/// The smallest scale a computed scale may have: 2^-126 (the smallest normal
/// fp32), so 1 / scale is finite.
inline constexpr float kMinScale = 0x1p-126f;
/// "none", "tensor-static", "tensor", "token", "group", "mx32".
const char* quant_scaling_name(QuantScaling q);

/// The normalisation a descriptor asks for.
///   RMSNorm (Zhang & Sennrich 2019): y = x * rstd * w',
///     rstd = 1 / sqrt(mean(x^2) + eps).
///   LayerNorm (Ba et al. 2016): y = (x - mean) * rstd * w' + bias,
///     rstd = 1 / sqrt(mean((x - mean)^2) + eps).
/// w' = weight + weight_offset (1 without a weight); statistics in fp32.
enum class NormKind : std::uint8_t { RMSNorm = 0, LayerNorm = 1 };
/// "rms" or "ln" (shape specs, cache keys, messages).
const char* norm_kind_name(NormKind k);

/// Direction of a kernel: forward (y from x) or backward (dx, dweight, dbias from dy).
enum class Op : std::uint8_t { Forward = 0, Backward = 1 };
/// "fwd" or "bwd".
const char* op_name(Op op);

/// Where rounding happens in the forward, matching common model code. The
/// backward computes in fp32 in every mode. With xhat = (x - mean) * rstd
/// (mean = 0 for RMSNorm) and w' = weight + weight_offset:
///   Default: y = round_y(xhat * w' + bias), all in fp32, rounded once; equals
///            torch.nn.functional.rms_norm / layer_norm on CUDA.
///   Llama:   y = round_y(round_x(xhat) * w' + bias): rstd in fp32, the
///            normalised row rounded to x's dtype before the weight
///            (Hugging Face LlamaRMSNorm: weight * hidden.to(input_dtype)).
///   Gemma:   y = round_y(xhat * (weight_offset + weight) + bias), everything in
///            fp32 and cast at the end (Hugging Face Gemma3RMSNorm). The same
///            numbers as Default: normjit's default already computes in fp32;
///            the name lets model code map one to one.
enum class CastMode : std::uint8_t { Default = 0, Llama = 1, Gemma = 2 };
const char* cast_mode_name(CastMode m);                                   ///< "default", "llama", "gemma"
CastMode parse_cast_mode(const std::string& text, const char* what = "cast_mode");

/// Fused residual add, h = x + residual: which h is normalised (and written
/// to residual_out).
///   ResidualDtype (default): h rounded to residual_dtype, as the unfused
///     `hidden = hidden + residual` of Hugging Face and vLLM's
///     fused_add_rms_norm compute it; y is then the norm of exactly the h
///     the next layer reads.
///   Fp32: the fp32 sum is normalised unrounded (residual_out still holds it
///     rounded to residual_out_dtype).
enum class ResidualRounding : std::uint8_t { ResidualDtype = 0, Fp32 = 1 };
const char* residual_rounding_name(ResidualRounding r);  ///< "residual", "fp32"

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

/// Shape, dtypes and variant of one normalisation call (forward and its
/// backward share one descriptor).
///
/// Rows: M rows of N elements, the last dimension contiguous. A 2-D tensor
/// [M, N] has row r at r * stride. A 3-D tensor [M / heads, heads, N] (tokens
/// x heads x head_dim, e.g. QK-norm on a view into a fused QKV projection)
/// has row r = t * heads + h at t * stride + h * head_stride; one weight is
/// shared by every head. Strides are in elements and may exceed 2^31; 0
/// means contiguous (stride = heads * head_stride, head_stride = N).
///
/// Fused residual add (`residual`): h = x + residual (rounded as
/// `residual_rounding` says) is normalised and, with `store_residual_out`,
/// written to residual_out. Its backward reads h as its `x` (dtype
/// residual_out_dtype, stride residual_out_stride) and writes dx = dL/dh,
/// which is the gradient of both x and residual.
struct NormDesc {
  NormKind norm = NormKind::RMSNorm;
  std::int64_t M = 0;          ///< rows (tokens, or tokens * heads); M = 0 is a no-op
  std::int64_t N = 0;          ///< hidden size (or head_dim), 1 <= N <= 262144
  std::int64_t heads = 1;      ///< rows per token of a 3-D tensor; divides M; 1 = 2-D
  std::int64_t x_stride = 0;   ///< token stride of x (forward and backward input)
  std::int64_t y_stride = 0;   ///< token stride of y (forward output)
  std::int64_t dy_stride = 0;  ///< token stride of dy (backward input, dtype y_dtype)
  std::int64_t dx_stride = 0;  ///< token stride of dx (backward output, dtype x_dtype)
  std::int64_t x_head_stride = 0, y_head_stride = 0, dy_head_stride = 0, dx_head_stride = 0;  ///< 3-D only
  std::int64_t residual_stride = 0;      ///< row stride of residual (2-D only)
  std::int64_t residual_out_stride = 0;  ///< row stride of residual_out (h)
  std::int64_t dresidual_stride = 0;     ///< row stride of dresidual (backward)
  DType x_dtype = DType::BF16;             ///< x and dx
  DType y_dtype = DType::BF16;             ///< y and dy
  DType weight_dtype = DType::BF16;        ///< weight, bias, dweight and dbias
  DType residual_dtype = DType::BF16;      ///< residual input
  DType residual_out_dtype = DType::BF16;  ///< residual_out (h) and dresidual
  float eps = 1e-6f;             ///< added to the variance; finite, >= 0 (LayerNorm usually 1e-5)
  bool has_weight = true;        ///< false: elementwise_affine = False (w' = 1)
  bool has_bias = false;         ///< LayerNorm only: add bias (beta)
  float weight_offset = 0.f;     ///< w' = weight + weight_offset; 1 for Gemma's zero-centred weight
  bool residual = false;         ///< fused residual add (2-D only)
  bool store_residual_out = false;  ///< forward writes h to residual_out
  ResidualRounding residual_rounding = ResidualRounding::ResidualDtype;
  bool has_dresidual = false;    ///< backward adds dresidual (the gradient reaching residual_out) into dx
  CastMode cast_mode = CastMode::Default;
  bool store_rstd = true;        ///< forward writes rstd (fp32, length M)
  bool store_mean = true;        ///< LayerNorm forward writes mean (fp32, length M)
  // FP8 (see DType and QuantScaling). A quantized y: y_dtype E4M3 or E5M2 and
  // quant != None. An FP8 x: x_dtype E4M3 or E5M2 with one fp32 scale per
  // 1 x x_group elements (x = q * x_scale[i, j / x_group], COAT-style).
  QuantScaling quant = QuantScaling::None;  ///< how an FP8 y is scaled; None for fp32/fp16/bf16 y
  int quant_group = 128;          ///< Group: G, 16, 32, 64 or 128, divides N (MX: always 32)
  bool scale_ue8m0 = false;       ///< Group: scales rounded up to powers of two (UE8M0 values, kept in fp32)
  bool scale_col_major = false;   ///< Group: scales [N / G, M] instead of [M, N / G]
  std::int64_t scale_stride = 0;  ///< Group, column-major: elements between the scale rows of two groups (0: M; else >= M)
  float scale_ub = 0.f;           ///< Token, Group: upper bound on a row's or group's scale (0: none)
  float scale_min = 0.f;          ///< Tensor, Token, Group: least computed scale, smin (0: kMinScale)
  bool store_amax = false;        ///< TensorStatic: also write amax = max |y| of this call ([1] fp32; delayed scaling)
  bool store_y_hp = false;        ///< quantized y: also write y unquantized to y_hp (y's strides, y_hp_dtype)
  DType y_hp_dtype = DType::BF16; ///< y_hp: fp32, fp16 or bf16
  bool store_y_t = false;         ///< TensorStatic / Tensor: also write q transposed, [N, M] (row stride M), y_dtype
  int x_group = 16;               ///< FP8 x: QB, elements per x scale: 16, 32 or 128, divides N
  DType grad_dtype = DType::BF16; ///< backward with an FP8 x or y: dtype of dy and dx (fp32, fp16, bf16)

  /// Throws Error(InvalidArgument) naming the first bad field and its value.
  void validate() const;
  /// "rms 8192x4096 x=bf16 y=bf16 w=bf16" plus the variant's flags.
  std::string str() const;
  /// Element offsets between consecutive heads and tokens (0 resolved).
  std::int64_t x_hs() const { return x_head_stride ? x_head_stride : N; }
  std::int64_t y_hs() const { return y_head_stride ? y_head_stride : N; }
  std::int64_t dy_hs() const { return dy_head_stride ? dy_head_stride : N; }
  std::int64_t dx_hs() const { return dx_head_stride ? dx_head_stride : N; }
  std::int64_t x_ld() const { return x_stride ? x_stride : heads * x_hs(); }
  std::int64_t y_ld() const { return y_stride ? y_stride : heads * y_hs(); }
  std::int64_t dy_ld() const { return dy_stride ? dy_stride : heads * dy_hs(); }
  std::int64_t dx_ld() const { return dx_stride ? dx_stride : heads * dx_hs(); }
  std::int64_t residual_ld() const { return residual_stride ? residual_stride : N; }
  std::int64_t residual_out_ld() const { return residual_out_stride ? residual_out_stride : N; }
  std::int64_t dresidual_ld() const { return dresidual_stride ? dresidual_stride : N; }
  /// The dtype of the tensor the norm reads: h with a residual, else x.
  DType normed_dtype() const { return residual ? residual_out_dtype : x_dtype; }
  /// The backward's dy and dx dtypes: y's and x's, or grad_dtype for FP8 ones.
  DType dy_dtype() const { return is_fp8(y_dtype) ? grad_dtype : y_dtype; }
  DType dx_dtype() const { return is_fp8(x_dtype) ? grad_dtype : x_dtype; }
  /// Columns of the scale tensor of a Group / MX quantized y (N / G), of an FP8 x (N / x_group).
  std::int64_t quant_groups() const { return N / (quant == QuantScaling::MX ? 32 : quant_group); }
  std::int64_t x_groups() const { return N / x_group; }
  /// Row stride of column-major group scales.
  std::int64_t scale_ld() const { return scale_stride ? scale_stride : M; }
};

/// Device tensors of a forward call. Which must be non-null follows the
/// descriptor: x, y always; residual with `residual`; residual_out with
/// `store_residual_out`; weight with has_weight; bias with has_bias; mean
/// (LayerNorm) with store_mean; rstd with store_rstd.
struct ForwardTensors {
  const void* x = nullptr;         ///< [M, N] rows, x_dtype
  const void* residual = nullptr;  ///< [M, N], residual_dtype
  const void* weight = nullptr;    ///< [N], weight_dtype
  const void* bias = nullptr;      ///< [N], weight_dtype
  void* y = nullptr;               ///< [M, N] rows, y_dtype
  void* residual_out = nullptr;    ///< [M, N], residual_out_dtype: h = x + residual
  float* mean = nullptr;           ///< [M] fp32
  float* rstd = nullptr;           ///< [M] fp32
  const float* x_scale = nullptr;  ///< FP8 x: [M, N / x_group] fp32, row-major
  /// Quantized y: its scales (QuantScaling): TensorStatic reads it ([1]
  /// fp32); the others write it: Tensor [1], Token [M], Group [M, N / G]
  /// (or [N / G, scale_ld()] column-major) fp32; MX [M, N / 32] E8M0 bytes.
  void* y_scale = nullptr;
  float* amax = nullptr;           ///< Tensor: [1] fp32, max |y| of this call (delayed-scaling history)
  void* y_hp = nullptr;            ///< store_y_hp: [M, N] rows (y's strides), y_hp_dtype
  void* y_t = nullptr;             ///< store_y_t: [N, M] y_dtype, q transposed
};

/// Alignment of a backward workspace in bytes (InvalidArgument otherwise).
inline constexpr std::size_t kWorkspaceAlignment = 32;

/// Device tensors of a backward call. dy, x, rstd, dx always; weight,
/// dweight with has_weight; dbias with has_bias; mean for LayerNorm;
/// dresidual with has_dresidual; workspace when backward_workspace_size > 0.
struct BackwardTensors {
  const void* dy = nullptr;         ///< [M, N] rows, dy_dtype() (y_dtype, or grad_dtype for an FP8 y)
  const void* x = nullptr;          ///< the normalised input: x, or h = residual_out with a residual
  const void* weight = nullptr;     ///< [N], weight_dtype
  const float* mean = nullptr;      ///< [M] fp32 from the forward (LayerNorm)
  const float* rstd = nullptr;      ///< [M] fp32 from the forward
  const void* dresidual = nullptr;  ///< [M, N] residual_out_dtype: gradient reaching residual_out
  const float* x_scale = nullptr;   ///< FP8 x: [M, N / x_group] fp32, as in the forward
  void* dx = nullptr;               ///< [M, N] rows, dx_dtype() (x_dtype, or grad_dtype for an FP8 x): dL/dx (= dL/dresidual with a residual)
  void* dweight = nullptr;          ///< [N], weight_dtype, overwritten
  void* dbias = nullptr;            ///< [N], weight_dtype, overwritten
  void* workspace = nullptr;        ///< backward_workspace_size(desc) bytes, kWorkspaceAlignment-byte aligned
  std::size_t workspace_bytes = 0;
};

/// How a kernel is launched. Every field is part of the kernel's
/// specialisation. The product threads_per_row * rows_per_pid is the block
/// size; a row is covered in chunks of `vec` elements.
/// The largest thread-block cluster a config may ask for: 16 CTAs, Hopper's
/// non-portable maximum (8 is the portable one).
inline constexpr int kMaxCluster = 16;

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
  /// CTAs of a thread-block cluster that share one row (sm_90+): each holds
  /// N / cluster columns in registers, and the row statistics are combined
  /// through distributed shared memory, so a wide row is read once. 1: no
  /// cluster. threads_per_row counts the threads of one CTA.
  int cluster = 1;
  /// Backward only, with cluster > 1 (decode rows): the grid is one cluster,
  /// whose CTAs split every row's columns and take the rows in batches
  /// through shared memory (one exchange of row sums a batch); having seen
  /// every row, each CTA writes its columns of dweight / dbias, so no second
  /// (finalize) launch follows.
  bool dw_cluster = false;

  int threads() const { return threads_per_row * rows_per_pid; }
  /// CTAs that share one row: the cluster.
  int row_split() const { return cluster < 1 ? 1 : cluster; }
  /// "v8.t512.r1", "v8.t1024.r1.2p", "v8.t256.r1.s2.p2", "v8.t512.r1.c8", "v8.t1024.r1.c8.dc"; parse() reads the same form.
  std::string str() const;
  static LaunchConfig parse(const std::string& text);
  bool operator==(const LaunchConfig& o) const {
    return vec == o.vec && threads_per_row == o.threads_per_row &&
           rows_per_pid == o.rows_per_pid && two_pass == o.two_pass && programs_per_sm == o.programs_per_sm &&
           stages == o.stages && cluster == o.cluster && dw_cluster == o.dw_cluster;
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
  /// Also search the built-in autotune_cache/ directories (source tree and
  /// install prefix). false: only `shipped_cache_dirs` (e.g. to see what a
  /// GPU without a shipped cache of its own gets).
  bool builtin_shipped_caches = true;
  /// Keep compiled kernels (cubin) on disk between processes.
  bool disk_kernel_cache = true;
  /// Directory of the compiled kernels. Empty: <cache_dir>/kernels. Several
  /// engines (or processes) with their own tuned caches may share one.
  std::string kernel_dir;
  /// Print progress of tuning to stderr.
  bool verbose = false;

  /// Options from the environment (NORMJIT_TUNE, NORMJIT_CACHE_DIR,
  /// NORMJIT_SHIPPED_CACHE_PATH as a ':'-separated list,
  /// NORMJIT_BUILTIN_CACHES=0 for builtin_shipped_caches = false).
  static EngineOptions from_env();
};

/// Where a launch config came from.
/// Memory: resolved before in this Engine; UserCache / ShippedCache: an exact
/// tuned entry; Tuned: tuned by this call; Heuristic: the config model's
/// (predicted fastest from the device's facts: SM count, threads and
/// registers per SM, memory bandwidth, clusters). Neighbour is no longer
/// produced (another shape's tuned winner; kept so the C ABI's values stay).
enum class ConfigSource { Memory, UserCache, ShippedCache, Tuned, Heuristic, Neighbour };
const char* config_source_name(ConfigSource s);
/// Whether a config from `s` was tuned for its shape before this call
/// (Memory, UserCache, ShippedCache): a cache hit, which tuning skips.
bool is_cache_hit(ConfigSource s);

/// One candidate's timing in a tuning run.
struct CandidateTiming {
  LaunchConfig config;
  double median_us = 0;  ///< < 0: rejected (see `rejected`)
  std::string rejected;  ///< why it could not win: compile error, mismatch, ...
};

/// Result of tuning one shape.
/// The winner is the config model's own config unless the fastest candidate
/// beat it by more than 2% in alternating repeated timings (model_us and
/// the winner's time then come from those rounds), so a tuned entry never
/// makes a shape slower than no entry.
struct TuneResult {
  std::string shape_key;
  LaunchConfig winner;
  double winner_us = 0;  ///< microseconds
  std::vector<CandidateTiming> candidates;
  LaunchConfig model;     ///< the config model's config for the shape
  double model_us = -1;   ///< its time in the alternating rounds (-1: not timed: it was the winner or failed)
};

/// What Engine::explain found.
struct ConfigExplanation {
  LaunchConfig config;
  ConfigSource source = ConfigSource::Heuristic;
  std::string shape_key;  ///< the descriptor's tuned-cache key
  std::string from_key;   ///< key of the entry used; empty for the config model
  std::string from_file;  ///< "user cache" or "shipped cache"
  std::string reason;     ///< one sentence on why this config
  double entry_us = 0;    ///< the entry's tuned time, microseconds (0: none)
  std::vector<CandidateTiming> candidates;  ///< the entry's candidates, when known
};

/// A norm over a hidden dimension sharded across ranks (tensor / sequence
/// parallelism: each rank holds N of the N_total columns of every row, and a
/// row's statistics need every rank's columns). The engine's part is four
/// kernels; the caller sums their per-row partial sums across ranks
/// (torch.distributed's all_reduce, NCCL: normjit.torch.sharded_rms_norm
/// and sharded_layer_norm do it), so the collective is the caller's:
///   forward:  sharded_stats -> all-reduce stats -> sharded_apply
///   backward: sharded_backward_stats -> all-reduce stats -> sharded_backward_apply
/// stats is [M, 2] float64, row i = (sum_j x[i, j], sum_j x[i, j]^2) in the
/// forward and (sum_j g[i, j], sum_j g[i, j] * xhat[i, j]) in the backward,
/// g = dy * w'; summed over ranks it gives the unsharded norm's mean, rstd
/// and backward exactly as NormDesc's formulas (RMSNorm: Zhang & Sennrich
/// 2019; LayerNorm: Ba et al. 2016), with means over N_total. float64 sums
/// keep LayerNorm's variance E[x^2] - mean^2 accurate at large means (1e-8
/// of a unit variance at a mean of 1e4). Rows are dense: x, y, dy and dx
/// are [M, N] with row stride N; weight and bias are this rank's [N] slice,
/// and dweight / dbias this rank's slice of the gradient (no reduction
/// across ranks: each holds its own).
struct ShardedNormDesc {
  NormKind norm = NormKind::RMSNorm;
  std::int64_t M = 0;        ///< rows (tokens), >= 0
  std::int64_t N = 0;        ///< this rank's columns, in [1, 262144]
  std::int64_t N_total = 0;  ///< the whole hidden size (every rank's N summed), in [N, 2^40]
  DType x_dtype = DType::BF16;       ///< x, and dx
  DType y_dtype = DType::BF16;       ///< y, and dy
  DType weight_dtype = DType::BF16;  ///< weight, bias, dweight, dbias
  bool has_weight = true;
  bool has_bias = false;      ///< LayerNorm only
  float eps = 1e-6f;          ///< added to the variance (RMSNorm: mean of x^2), >= 0
  float weight_offset = 0.f;  ///< w' = weight + weight_offset (Gemma: 1); needs has_weight

  /// Throws Error(InvalidArgument) naming the field and its value.
  void validate() const;
  /// "rms 8192x2048/4096 x=bf16 y=bf16 w=bf16" (M x N / N_total).
  std::string str() const;
};

class Engine {
 public:
  /// An engine with the options of the environment (EngineOptions::from_env).
  Engine();
  explicit Engine(EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Forward of desc.norm (see NormDesc and ForwardTensors). Asynchronous on
  /// `stream` (0 = legacy default). Throws Error(InvalidArgument) for a bad
  /// descriptor or a missing pointer before anything runs,
  /// Error(Driver/Compile/LibraryNotFound) when the kernel cannot run.
  void forward(const NormDesc& desc, const ForwardTensors& t, CUstream stream);

  /// Bytes of device workspace backward() needs for `desc` on the current
  /// device: fp32 partial dweight (and dbias) rows of the persistent grid,
  /// programs x N each; 0 when M == 0 or there is neither weight nor bias.
  std::size_t backward_workspace_size(const NormDesc& desc);

  /// Backward of desc.norm: dx, and dweight / dbias summed over rows.
  /// Deterministic: the same inputs and config give bitwise the same outputs.
  /// With desc.has_dresidual, dresidual is added into dx.
  ///   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat)),            g = dy * w'
  ///   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
  ///   dweight = sum_rows dy * xhat, dbias = sum_rows dy.
  void backward(const NormDesc& desc, const BackwardTensors& t, CUstream stream);

  /// RMSNorm forward (desc.norm must be RMSNorm): forward() with x, weight, y, rstd.
  void rms_norm_forward(const NormDesc& desc, const void* x, const void* weight, void* y,
                        float* rstd, CUstream stream);
  /// backward_workspace_size() for an RMSNorm descriptor.
  std::size_t rms_norm_backward_workspace_size(const NormDesc& desc);
  /// RMSNorm backward: backward() with dy, x, weight, rstd, dx, dweight, workspace.
  void rms_norm_backward(const NormDesc& desc, const void* dy, const void* x,
                         const void* weight, const float* rstd, void* dx, void* dweight,
                         void* workspace, std::size_t workspace_bytes, CUstream stream);

  /// Sharded norms (see ShardedNormDesc); each asynchronous on `stream`,
  /// pointers 16-byte aligned for the widest loads (any alignment of the
  /// element type works, slower). stats: [M, 2] float64, written.
  void sharded_stats(const ShardedNormDesc& desc, const void* x, double* stats, CUstream stream);
  /// y from x and the stats summed over every rank; mean (LayerNorm) and rstd
  /// ([M] fp32, each may be null) for the backward.
  void sharded_apply(const ShardedNormDesc& desc, const void* x, const void* weight, const void* bias,
                     const double* stats, void* y, float* mean, float* rstd, CUstream stream);
  /// The backward's partial sums ([M, 2] float64, written) from dy, x, weight
  /// and the forward's mean (LayerNorm; null for RMSNorm) and rstd.
  void sharded_backward_stats(const ShardedNormDesc& desc, const void* dy, const void* x, const void* weight,
                              const float* mean, const float* rstd, double* stats, CUstream stream);
  /// Bytes of workspace sharded_backward_apply needs on the current device
  /// (fp32 partial dweight / dbias rows); 0 when M == 0 or there is neither.
  std::size_t sharded_backward_workspace_size(const ShardedNormDesc& desc);
  /// dx from the backward's stats summed over every rank, and this rank's
  /// dweight / dbias (null where the desc has none), deterministically.
  void sharded_backward_apply(const ShardedNormDesc& desc, const void* dy, const void* x, const void* weight,
                              const float* mean, const float* rstd, const double* stats, void* dx, void* dweight,
                              void* dbias, void* workspace, std::size_t workspace_bytes, CUstream stream);

  /// Autotunes `op` for `desc` on scratch buffers of the same shape (needs a
  /// GPU), stores the winner in the user cache and returns every candidate
  /// timed. A refinement of the config model's config: a local search from
  /// it (one step at a time while a neighbour is > 1% faster), or with
  /// `whole_grid` every candidate; either way the model's config stays the
  /// winner unless beaten by > 2% (TuneResult).
  TuneResult tune(Op op, const NormDesc& desc, bool whole_grid = false);

  /// The config a call with `desc` would use now, and where it came from.
  LaunchConfig config_for(Op op, const NormDesc& desc, ConfigSource* source = nullptr);

  /// How the config of `op` on `desc` is resolved, step by step: an exact
  /// tuned entry (user cache, then shipped caches, skipping stale ones),
  /// else the config model's (ConfigSource::Heuristic). Never tunes.
  /// `skip_exact` ignores exact entries: what a shape would get were it not
  /// tuned (the config model's own pick, to compare with a tuning run). Needs
  /// a GPU (the device's fingerprint selects the cache files).
  ConfigExplanation explain(Op op, const NormDesc& desc, bool skip_exact = false);

  /// Compiles every candidate of `op`'s grid for `desc` for `arch` ("sm_90")
  /// into the on-disk kernel cache, and each forward candidate's staged
  /// variant (LaunchConfig::stages 1, what launches of few rows run), so
  /// that no launch compiles; needs NVRTC but no GPU. Returns the number
  /// of variants compiled or found; failures are reported through `failures`.
  int precompile(Op op, const NormDesc& desc, const std::string& arch,
                 std::vector<std::string>* failures = nullptr);

  const EngineOptions& options() const;
  /// The user cache directory in use (tuned configs in tuned/, cubins in kernels/).
  std::string cache_dir() const;
  /// Shipped tuned-cache directories searched after the user cache, in order.
  std::vector<std::string> shipped_cache_dirs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace normjit
