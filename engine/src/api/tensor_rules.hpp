// Which tensors a descriptor needs (tensor_rules.cpp).
#pragma once

#include "normjit/normjit.hpp"

namespace normjit::detail {

/// `t` without the pointers `d` does not use (the kernel never sees them).
ForwardTensors used_tensors(const NormDesc& d, const ForwardTensors& t);
BackwardTensors used_tensors(const NormDesc& d, const BackwardTensors& t);

/// Throws Error(InvalidArgument) naming the first tensor `d` needs that is
/// null (and, backward, a workspace that is not kWorkspaceAlignment-aligned).
void require_forward(const NormDesc& d, const ForwardTensors& t);
void require_backward(const NormDesc& d, const BackwardTensors& t);

}  // namespace normjit::detail
