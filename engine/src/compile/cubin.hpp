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

/// What a thread of the cubin's kernel takes (the most of its kernels'), read
/// from the .nv.info sections: registers (EIATTR_REGCOUNT) and its stack
/// frame in bytes (EIATTR_FRAME_SIZE: > 0 when registers spill to local
/// memory). -1 where the file has no such record or is no 64-bit ELF.
/// Never throws.
struct CubinResources {
  int regs = -1, frame_bytes = -1;
};
CubinResources cubin_resources(const std::string& cubin);

/// Why `cubin` cannot be a compiled kernel `kernel` ("" when it can be): it
/// must be a 64-bit little-endian CUDA ELF file (EM_CUDA) whose program
/// headers, segments, section headers and sections all lie inside it, with
/// the kernel's .text section. Never throws. The kernel cache checks a cubin
/// read from disk with it, so a truncated or damaged file is recompiled
/// instead of reaching the driver (damage inside the machine code itself
/// passes: no checksum is stored).
std::string cubin_problem(const std::string& cubin, const std::string& kernel);

}  // namespace normjit::detail
