# libnormjit_torch.so: PyTorch custom operators (tools/python/csrc) over the C
# ABI. Built against the torch that `python3` imports (headers and libraries
# from its package folder); a wheel built for one torch needs that torch. The
# Python package falls back to its ctypes path when this library is absent or
# does not load.
find_package(Python3 COMPONENTS Interpreter)
set(_nj_torch_found FALSE)
if(Python3_Interpreter_FOUND AND TARGET normjit_c)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
    OUTPUT_VARIABLE _nj_torch_info RESULT_VARIABLE _nj_torch_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_nj_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _nj_torch_info "${_nj_torch_info}")
    list(GET _nj_torch_info 0 NORMJIT_TORCH_DIR)
    list(GET _nj_torch_info 1 _nj_torch_abi)
    list(GET _nj_torch_info 2 NORMJIT_TORCH_VERSION)
    set(_nj_torch_found TRUE)
  endif()
endif()
if(NOT _nj_torch_found)
  message(STATUS "normjit: torch not importable by python3: libnormjit_torch.so is not built (ctypes fallback)")
  return()
endif()
message(STATUS "normjit: building libnormjit_torch.so against torch ${NORMJIT_TORCH_VERSION} (${NORMJIT_TORCH_DIR})")
add_library(normjit_torch SHARED tools/python/csrc/torch_ops.cpp)
target_include_directories(normjit_torch PRIVATE engine/include ${NORMJIT_TORCH_DIR}/include
                           ${NORMJIT_TORCH_DIR}/include/torch/csrc/api/include ${NORMJIT_CUDA_INCLUDE_DIR})
target_compile_definitions(normjit_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${_nj_torch_abi} TORCH_API_INCLUDE_EXTENSION_H)
target_compile_options(normjit_torch PRIVATE -Wno-unused-parameter)
target_link_directories(normjit_torch PRIVATE ${NORMJIT_TORCH_DIR}/lib)
# torch's own libraries are loaded by `import torch` before this one: they are
# found by soname then, so no RPATH into a build machine's site-packages.
target_link_libraries(normjit_torch PRIVATE normjit_c c10 c10_cuda torch_cpu torch)
set_target_properties(normjit_torch PROPERTIES OUTPUT_NAME normjit_torch BUILD_RPATH "$ORIGIN" INSTALL_RPATH "$ORIGIN"
                      CXX_VISIBILITY_PRESET hidden)
