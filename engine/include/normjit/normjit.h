/* normjit C API: a stable C ABI over the C++ engine (normjit.hpp).
 *
 * RMSNorm and LayerNorm for NVIDIA GPUs, compiled at run time with NVRTC and
 * launched through the CUDA Driver API (libcuda and libnvrtc are opened with
 * dlopen, so this library loads on a machine without a GPU).
 *
 *   RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"):
 *     y = x * rstd * w' (+ bias),  rstd = 1 / sqrt(mean(x^2) + eps)
 *   LayerNorm (Ba et al. 2016, "Layer Normalization"):
 *     y = (x - mean) * rstd * w' + bias,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
 *   w' = weight + weight_offset (1 without a weight); statistics in fp32.
 *
 * Conventions
 *  - C99; no C++ type crosses this header. Link libnormjit_c.so, which needs
 *    only libc, libm and libdl (libstdc++ is linked into it statically) and
 *    exports nothing but the normjit_* functions below.
 *  - Every function returning int returns a normjit_status. On failure nothing
 *    is written to any output (pointer or buffer) and
 *    normjit_last_error_message() holds the full message on the calling thread;
 *    a successful call clears it to "". No function lets an exception escape.
 *  - Structs that may grow in later versions start with `uint32_t
 *    struct_size`. Fill them with the matching *_init() function, which sets
 *    struct_size and every default, then change the fields you need. A
 *    struct_size this library does not know is rejected with
 *    NORMJIT_INVALID_ARGUMENT.
 *  - Tensor pointers are device addresses in the CUDA context current on the
 *    calling thread (the primary context of device 0 is used when none is).
 *    `stream` is a CUstream (NULL = the legacy default stream); launches are
 *    asynchronous on it.
 *  - Booleans are int32_t and must be 0 or 1.
 */
#ifndef NORMJIT_NORMJIT_H
#define NORMJIT_NORMJIT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define NORMJIT_C_EXPORT __attribute__((visibility("default")))
#else
#define NORMJIT_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this C ABI; bumped only on an incompatible change. */
#define NORMJIT_C_API_VERSION 2

/** Status codes: NORMJIT_SUCCESS, one per normjit::ErrorKind, then INTERNAL. */
enum normjit_status {
  NORMJIT_SUCCESS = 0,
  NORMJIT_INVALID_ARGUMENT = 1,  /**< a descriptor field, pointer, option or buffer is not acceptable */
  NORMJIT_LIBRARY_NOT_FOUND = 2, /**< libcuda.so.1 or libnvrtc could not be opened, or a symbol is missing */
  NORMJIT_NO_DEVICE = 3,         /**< the driver loaded but reports no usable GPU */
  NORMJIT_DRIVER = 4,            /**< a CUDA Driver API call failed */
  NORMJIT_COMPILE = 5,           /**< NVRTC rejected a kernel */
  NORMJIT_CACHE = 6,             /**< a cache file could not be read, locked or written */
  NORMJIT_TUNING = 7,            /**< no autotune candidate compiled or matched the reference */
  NORMJIT_INTERNAL = 8           /**< any other failure (out of host memory, ...) */
};

/** normjit_norm_desc.norm */
enum normjit_norm_kind { NORMJIT_NORM_RMS = 0, NORMJIT_NORM_LAYER = 1 };
/** Element types: fp32 = IEEE binary32, fp16 = IEEE binary16, bf16 = bfloat16;
 *  E4M3 / E5M2: OCP FP8 (x and y only; see normjit.hpp, DType). */
enum normjit_dtype { NORMJIT_FP32 = 0, NORMJIT_FP16 = 1, NORMJIT_BF16 = 2, NORMJIT_E4M3 = 3, NORMJIT_E5M2 = 4 };
/** normjit_norm_desc.quant: how an FP8 y is scaled. Scales dequantize:
 *  y ~= q * scale (see normjit.hpp, QuantScaling, for each formula). */
enum normjit_quant {
  NORMJIT_QUANT_NONE = 0,
  NORMJIT_QUANT_TENSOR_STATIC = 1, /**< the caller's scale, [1] fp32 */
  NORMJIT_QUANT_TENSOR = 2,        /**< current scaling: amax of the output, scale [1], amax [1] */
  NORMJIT_QUANT_TOKEN = 3,         /**< one scale per row, [M] fp32 */
  NORMJIT_QUANT_GROUP = 4,         /**< one per 1 x quant_group of a row, [M, N / G] fp32 (or column-major) */
  NORMJIT_QUANT_MX = 5             /**< MXFP8: 1 x 32 blocks, E8M0 exponents, [M, N / 32] uint8 */
};
/** normjit_norm_desc.cast_mode: where the forward rounds (see normjit.hpp, CastMode). */
enum normjit_cast_mode { NORMJIT_CAST_DEFAULT = 0, NORMJIT_CAST_LLAMA = 1, NORMJIT_CAST_GEMMA = 2 };
/** normjit_norm_desc.residual_rounding: which h = x + residual is normalised. */
enum normjit_residual_rounding { NORMJIT_RESIDUAL_ROUND_RESIDUAL_DTYPE = 0, NORMJIT_RESIDUAL_ROUND_FP32 = 1 };
/** Direction of a kernel (normjit_config_for, normjit_tune). */
enum normjit_op { NORMJIT_OP_FORWARD = 0, NORMJIT_OP_BACKWARD = 1 };
/** normjit_engine_options.tune_policy */
enum normjit_tune_policy { NORMJIT_TUNE_NEVER = 0, NORMJIT_TUNE_FIRST = 1, NORMJIT_TUNE_ALWAYS = 2 };
/** Where a launch config came from (normjit_config_for). */
enum normjit_config_source {
  NORMJIT_SOURCE_MEMORY = 0,
  NORMJIT_SOURCE_USER_CACHE = 1,
  NORMJIT_SOURCE_SHIPPED_CACHE = 2,
  NORMJIT_SOURCE_TUNED = 3,
  NORMJIT_SOURCE_HEURISTIC = 4,
  NORMJIT_SOURCE_NEIGHBOUR = 5 /**< no longer produced (the config model replaced tuned neighbours) */
};

/** An engine: compiled kernels, tuned configs and caches. Thread-safe. */
typedef struct normjit_engine_s* normjit_engine;

/** Options of normjit_engine_create. Fill with normjit_engine_options_init. */
typedef struct normjit_engine_options {
  uint32_t struct_size;
  /** NORMJIT_TUNE_NEVER (default; use caches, else the heuristic), _FIRST
   *  (tune a shape missing from every cache at its first call), _ALWAYS. */
  int32_t tune_policy;
  /** Root of the user cache (tuned/ and kernels/). NULL or "": $NORMJIT_CACHE_DIR,
   *  else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit. Copied by create. */
  const char* cache_dir;
  /** ':'-separated extra directories of shipped tuned caches. NULL: from
   *  $NORMJIT_SHIPPED_CACHE_PATH; "": none. Copied by create. */
  const char* shipped_cache_path;
  int32_t disk_kernel_cache; /**< keep compiled kernels (cubin) on disk; default 1 */
  int32_t verbose;           /**< print tuning progress to stderr; default 0 */
} normjit_engine_options;

/** Shape, dtypes and variant of one call; forward and backward share one.
 *  Same fields and meaning as normjit::NormDesc (normjit.hpp). Strides are in
 *  elements; 0 means contiguous. Fill with normjit_norm_desc_init. */
typedef struct normjit_norm_desc {
  uint32_t struct_size;
  int32_t norm;         /**< NORMJIT_NORM_RMS (default) or NORMJIT_NORM_LAYER */
  int64_t M;            /**< rows (tokens, or tokens * heads); 0 = no-op; default 0 */
  int64_t N;            /**< hidden size (or head_dim), 1 <= N <= 262144; default 0 */
  int64_t heads;        /**< rows per token of a 3-D [M / heads, heads, N] tensor; default 1 */
  int64_t x_stride;     /**< token stride of x */
  int64_t y_stride;     /**< token stride of y */
  int64_t dy_stride;    /**< token stride of dy */
  int64_t dx_stride;    /**< token stride of dx */
  int64_t x_head_stride;
  int64_t y_head_stride;
  int64_t dy_head_stride;
  int64_t dx_head_stride;
  int64_t residual_stride;     /**< row stride of residual */
  int64_t residual_out_stride; /**< row stride of residual_out (h) */
  int64_t dresidual_stride;    /**< row stride of dresidual */
  int32_t x_dtype;             /**< x and dx; default NORMJIT_BF16 */
  int32_t y_dtype;             /**< y and dy; default NORMJIT_BF16 */
  int32_t weight_dtype;        /**< weight, bias, dweight, dbias; default NORMJIT_BF16 */
  int32_t residual_dtype;      /**< residual input; default NORMJIT_BF16 */
  int32_t residual_out_dtype;  /**< residual_out (h) and dresidual; default NORMJIT_BF16 */
  float eps;                   /**< added to the variance; finite, >= 0; default 1e-6 */
  int32_t has_weight;          /**< default 1; 0: w' = 1 (+ weight_offset) */
  int32_t has_bias;            /**< LayerNorm only; default 0 */
  float weight_offset;         /**< w' = weight + weight_offset; default 0 */
  int32_t residual;            /**< fused residual add h = x + residual; default 0 */
  int32_t store_residual_out;  /**< forward writes h to residual_out; default 0 */
  int32_t residual_rounding;   /**< enum normjit_residual_rounding; default RESIDUAL_DTYPE */
  int32_t has_dresidual;       /**< backward adds dresidual into dx; default 0 */
  int32_t cast_mode;           /**< enum normjit_cast_mode; default NORMJIT_CAST_DEFAULT */
  int32_t store_rstd;          /**< forward writes rstd (fp32, length M); default 1 */
  int32_t store_mean;          /**< LayerNorm forward writes mean (fp32, length M); default 1 */
  /* FP8 (C API version 2). */
  int32_t quant;               /**< enum normjit_quant; NONE unless y_dtype is E4M3 / E5M2 */
  int32_t quant_group;         /**< GROUP: G = 16, 32, 64 or 128 dividing N; default 128 */
  int32_t scale_ue8m0;         /**< GROUP: scales rounded up to powers of two; default 0 */
  int32_t scale_col_major;     /**< GROUP: scales [N / G, scale_stride]; default 0 */
  int64_t scale_stride;        /**< GROUP, column-major: row stride of the scales (0: M) */
  float scale_ub;              /**< TOKEN, GROUP: upper bound on a row's or group's scale (0: none) */
  int32_t store_y_hp;          /**< also write y unquantized (y_hp, y's strides); default 0 */
  int32_t y_hp_dtype;          /**< y_hp: fp32, fp16 or bf16; default NORMJIT_BF16 */
  int32_t store_y_t;           /**< TENSOR(_STATIC): also write q transposed, [N, M]; default 0 */
  int32_t x_group;             /**< FP8 x: elements per x scale (16, 32, 128; divides N); default 16 */
  int32_t grad_dtype;          /**< dy and dx of a backward with an FP8 x or y; default NORMJIT_BF16 */
  /* C API version 2, later: a struct_size without these two fields (a
   * header before them) is still accepted and reads them as 0. */
  float scale_min;             /**< TENSOR, TOKEN, GROUP: least computed scale (0: 2^-126); vLLM's is 1 / (fmax * 512) */
  int32_t store_amax;          /**< TENSOR_STATIC: also write amax = max |y| ([1] fp32; delayed scaling); default 0 */
} normjit_norm_desc;

/** Device tensors of a forward call; which must be non-NULL follows the
 *  descriptor (as normjit::ForwardTensors). Fill with normjit_forward_tensors_init. */
typedef struct normjit_forward_tensors {
  uint32_t struct_size;
  const void* x;        /**< [M, N] rows, x_dtype */
  const void* residual; /**< [M, N], residual_dtype (desc.residual) */
  const void* weight;   /**< [N], weight_dtype (desc.has_weight) */
  const void* bias;     /**< [N], weight_dtype (desc.has_bias) */
  void* y;              /**< [M, N] rows, y_dtype */
  void* residual_out;   /**< [M, N], residual_out_dtype: h (desc.store_residual_out) */
  void* mean;           /**< [M] fp32 (LayerNorm with desc.store_mean) */
  void* rstd;           /**< [M] fp32 (desc.store_rstd) */
  const void* x_scale;  /**< FP8 x: [M, N / x_group] fp32 */
  void* y_scale;        /**< quantized y: its scales (an input for TENSOR_STATIC) */
  void* amax;           /**< TENSOR, or TENSOR_STATIC with store_amax: [1] fp32, max |y| of this call */
  void* y_hp;           /**< desc.store_y_hp: [M, N] rows, y_hp_dtype */
  void* y_t;            /**< desc.store_y_t: [N, M] y_dtype */
} normjit_forward_tensors;

/** Device tensors of a backward call (as normjit::BackwardTensors). Fill with
 *  normjit_backward_tensors_init. */
typedef struct normjit_backward_tensors {
  uint32_t struct_size;
  const void* dy;        /**< [M, N] rows, y_dtype (grad_dtype for an FP8 y) */
  const void* x;         /**< the normalised input: x, or h (residual_out) with desc.residual */
  const void* weight;    /**< [N], weight_dtype */
  const void* mean;      /**< [M] fp32 from the forward (LayerNorm) */
  const void* rstd;      /**< [M] fp32 from the forward */
  const void* dresidual; /**< [M, N] residual_out_dtype (desc.has_dresidual) */
  void* dx;              /**< [M, N] rows, x_dtype (grad_dtype for an FP8 x): dL/dx (= dL/dresidual with a residual) */
  void* dweight;         /**< [N], weight_dtype, overwritten */
  void* dbias;           /**< [N], weight_dtype, overwritten */
  void* workspace;       /**< normjit_backward_workspace_size() bytes of device memory, 32-byte aligned */
  size_t workspace_bytes;
  const void* x_scale;   /**< FP8 x: [M, N / x_group] fp32, as in the forward */
} normjit_backward_tensors;

/** NORMJIT_C_API_VERSION of the loaded library. */
NORMJIT_C_EXPORT uint32_t normjit_api_version(void);
/** The engine's version, "MAJOR.MINOR.PATCH" (static storage). */
NORMJIT_C_EXPORT const char* normjit_version_string(void);
/** "NORMJIT_SUCCESS", "NORMJIT_INVALID_ARGUMENT", ...; "NORMJIT_UNKNOWN_STATUS"
 *  for a value outside enum normjit_status. Static storage, never NULL. */
NORMJIT_C_EXPORT const char* normjit_status_name(int status);
/** "memory", "user cache", "shipped cache", "tuned now", "heuristic"; "unknown"
 *  otherwise. Static storage. */
NORMJIT_C_EXPORT const char* normjit_config_source_name(int source);
/** The full message of the last failing call on this thread ("" after a
 *  success). Valid until the next normjit call on this thread. */
NORMJIT_C_EXPORT const char* normjit_last_error_message(void);

/** Fill defaults. The options are taken from the environment as
 *  normjit::EngineOptions::from_env does: tune_policy from $NORMJIT_TUNE
 *  ("never", "first", "always"; an unknown value gives
 *  NORMJIT_INVALID_ARGUMENT, the fields are still filled with NEVER). */
NORMJIT_C_EXPORT int normjit_engine_options_init(normjit_engine_options* options);
/** Fill the normjit::NormDesc defaults (RMSNorm, M = N = 0, bf16, eps 1e-6, ...). */
NORMJIT_C_EXPORT int normjit_norm_desc_init(normjit_norm_desc* desc);
/** All pointers NULL. */
NORMJIT_C_EXPORT int normjit_forward_tensors_init(normjit_forward_tensors* tensors);
/** All pointers NULL, workspace_bytes 0. */
NORMJIT_C_EXPORT int normjit_backward_tensors_init(normjit_backward_tensors* tensors);

/** Creates an engine (NULL options = normjit_engine_options_init's defaults).
 *  Needs no GPU: the driver and NVRTC are opened at the first kernel call.
 *  *out is set only on success; release it with normjit_engine_destroy. */
NORMJIT_C_EXPORT int normjit_engine_create(const normjit_engine_options* options, normjit_engine* out);
/** Releases an engine (NULL is ignored). Kernels it launched must have finished. */
NORMJIT_C_EXPORT void normjit_engine_destroy(normjit_engine engine);

/** Forward of desc->norm (y, and h, mean, rstd as the descriptor asks).
 *  Errors: NORMJIT_INVALID_ARGUMENT for a bad descriptor or a missing pointer
 *  (before anything runs), NORMJIT_LIBRARY_NOT_FOUND / NO_DEVICE / DRIVER /
 *  COMPILE when the kernel cannot run. */
NORMJIT_C_EXPORT int normjit_forward(normjit_engine engine, const normjit_norm_desc* desc,
                                     const normjit_forward_tensors* tensors, void* stream);
/** Bytes of device workspace normjit_backward needs for desc on the current
 *  device (fp32 partial dweight / dbias rows); 0 when M == 0 or there is
 *  neither weight nor bias. */
NORMJIT_C_EXPORT int normjit_backward_workspace_size(normjit_engine engine, const normjit_norm_desc* desc,
                                                     size_t* bytes);
/** Backward of desc->norm: dx, and dweight / dbias summed over rows
 *  (deterministic). Errors as normjit_forward. */
NORMJIT_C_EXPORT int normjit_backward(normjit_engine engine, const normjit_norm_desc* desc,
                                      const normjit_backward_tensors* tensors, void* stream);

/** The launch config a call would use now, as text ("v8.t512.r1"), into buf
 *  (len bytes with the terminating NUL; a too-small buffer gives
 *  NORMJIT_INVALID_ARGUMENT naming the size needed), and where it came from
 *  into *source (enum normjit_config_source; source may be NULL). op is
 *  NORMJIT_OP_FORWARD or NORMJIT_OP_BACKWARD. Needs a GPU. */
NORMJIT_C_EXPORT int normjit_config_for(normjit_engine engine, int32_t op, const normjit_norm_desc* desc, char* buf,
                                        size_t len, int32_t* source);
/** Autotunes op for desc on scratch buffers (needs a GPU; M >= 1), stores the
 *  winner in the user cache, writes its config text into winner (len bytes)
 *  and its median time in microseconds into *winner_us (may be NULL). */
NORMJIT_C_EXPORT int normjit_tune(normjit_engine engine, int32_t op, const normjit_norm_desc* desc, char* winner,
                                  size_t len, double* winner_us);
/** The user cache directory in use, into buf (len bytes with the NUL). */
NORMJIT_C_EXPORT int normjit_engine_cache_dir(normjit_engine engine, char* buf, size_t len);

/** A norm over a hidden dimension sharded across ranks (tensor parallelism):
 *  this rank holds N of the N_total columns of every row; x, y, dy and dx are
 *  dense [M, N] rows, weight and bias (and their gradients) this rank's [N]
 *  slice. The caller sums `stats` ([M, 2] float64) over ranks between the
 *  two calls of each direction (an all-reduce):
 *    forward:  normjit_sharded_stats -> all-reduce -> normjit_sharded_apply
 *    backward: normjit_sharded_backward_stats -> all-reduce -> normjit_sharded_backward_apply
 *  The result is the unsharded norm's (means over N_total). See
 *  normjit::ShardedNormDesc. Errors as normjit_forward. */
typedef struct normjit_sharded_desc {
  uint32_t struct_size;
  int32_t norm;          /**< NORMJIT_NORM_RMS or NORMJIT_NORM_LAYER */
  int64_t M;             /**< rows, >= 0 */
  int64_t N;             /**< this rank's columns, 1..262144 */
  int64_t N_total;       /**< every rank's N summed, >= N */
  int32_t x_dtype;       /**< x and dx: fp32, fp16 or bf16 (enum normjit_dtype) */
  int32_t y_dtype;       /**< y and dy */
  int32_t weight_dtype;  /**< weight, bias, dweight, dbias */
  int32_t has_weight;
  int32_t has_bias;      /**< LayerNorm only */
  float eps;
  float weight_offset;   /**< w' = weight + weight_offset; needs has_weight */
} normjit_sharded_desc;

/** Fills *desc with the defaults (RMSNorm, bf16, a weight, eps 1e-6) and struct_size. */
NORMJIT_C_EXPORT int normjit_sharded_desc_init(normjit_sharded_desc* desc);
/** stats[i] = (sum_j x[i, j], sum_j x[i, j]^2) over this rank's columns. */
NORMJIT_C_EXPORT int normjit_sharded_stats(normjit_engine engine, const normjit_sharded_desc* desc, const void* x,
                                           double* stats, void* stream);
/** y from x and the stats summed over ranks; mean (LayerNorm) and rstd ([M]
 *  fp32) written where not NULL; weight / bias NULL where the desc has none. */
NORMJIT_C_EXPORT int normjit_sharded_apply(normjit_engine engine, const normjit_sharded_desc* desc, const void* x,
                                           const void* weight, const void* bias, const double* stats, void* y,
                                           float* mean, float* rstd, void* stream);
/** stats[i] = (sum_j g[i, j], sum_j g[i, j] * xhat[i, j]), g = dy * w'. */
NORMJIT_C_EXPORT int normjit_sharded_backward_stats(normjit_engine engine, const normjit_sharded_desc* desc,
                                                    const void* dy, const void* x, const void* weight,
                                                    const float* mean, const float* rstd, double* stats,
                                                    void* stream);
/** Bytes of workspace normjit_sharded_backward_apply needs on the current device. */
NORMJIT_C_EXPORT int normjit_sharded_backward_workspace_size(normjit_engine engine, const normjit_sharded_desc* desc,
                                                             size_t* bytes);
/** dx from the backward stats summed over ranks; this rank's dweight / dbias. */
NORMJIT_C_EXPORT int normjit_sharded_backward_apply(normjit_engine engine, const normjit_sharded_desc* desc,
                                                    const void* dy, const void* x, const void* weight,
                                                    const float* mean, const float* rstd, const double* stats,
                                                    void* dx, void* dweight, void* dbias, void* workspace,
                                                    size_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* NORMJIT_NORMJIT_H */
