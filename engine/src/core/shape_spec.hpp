// The shape grammar: a --shape spec ("rms:bf16:4096x8192:res") and back.
// Tuned entries record their shape in it, so the runtime reads it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

/// A named norm shape ("hidden", "q_norm", ...).
struct NamedShape {
  std::string name;
  NormDesc desc;
};

/// Parses "<rms|ln>:<dtype>:<M>x<N>[:<option>]...": x, y, weight (and
/// residual) in one dtype, eps 1e-6 (rms) / 1e-5 (ln), LayerNorm with a bias.
/// Options: w=<dtype>, y=<dtype>, res[=<dtype>] (fused residual add writing
/// h), fp32sum, dres, nw (no weight), nb (no bias), off=<weight offset>,
/// cast=<default|llama|gemma>, eps=<eps>, heads=<H> (3-D rows),
/// x_stride=<token stride of x and dx>, ro=<dtype> (residual_out's dtype,
/// after res), noro (the residual sum is not written), norstd, nomean. E.g. "rms:bf16:32768x128:heads=32:x_stride=6144"
/// is QK-norm on a view into a fused QKV projection. Throws
/// Error(InvalidArgument) naming the text and what is wrong.
NamedShape parse_shape_spec(const std::string& text);

/// The spec of `desc`'s kernel variant, N and M: parse_shape_spec of it
/// gives a descriptor with the same variant (Variant::tags), N and M. Strides
/// and eps are left out (they are not compiled in).
std::string shape_spec(const NormDesc& desc);

/// Default eps of each norm, as torch's modules and most model configs have it.
float default_eps(NormKind k);

/// shape_spec(desc) with eps and a token stride of x: a --shape that gives
/// `desc` back (up to dx's stride).
std::string full_shape_spec(const NormDesc& desc);

}  // namespace normjit::detail
