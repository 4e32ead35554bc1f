// What a compiled kernel executes, read from its cubin (an ELF file).
#pragma once

#include <string>

namespace normjit::detail {

/// The machine code and resources of kernel `kernel` in `cubin`: the bytes
/// of its .text section, that section's flags and info word (the register
/// count lives there) and the size of its static shared memory. Two kernels
/// with equal fingerprints run the same instructions with the same
/// registers and shared memory, so their timings are interchangeable.
/// Throws Error(InvalidArgument) when `cubin` is not a 64-bit ELF file or
/// holds no such kernel.
std::string machine_code_fingerprint(const std::string& cubin, const std::string& kernel);

}  // namespace normjit::detail
