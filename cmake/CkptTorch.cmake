# Points find_package(Torch) at the LibTorch CKPT_TORCH names (see the root
# CMakeLists.txt) and checks that it can be linked with the rest of ckpt.
#
# CKPT_TORCH=pip asks CKPT_TORCH_PYTHON for torch.utils.cmake_prefix_path and
# puts it first on CMAKE_PREFIX_PATH, so every find_package(Torch) of the
# build (worker/, tools/) finds that one. Its libstdc++ ABI must be the cxx11
# one: RocksDB, spdlog, fmt, Boost and prometheus-cpp from Debian use it, and
# a pre-cxx11 LibTorch would not link with them (std::string differs).
if(CKPT_TORCH STREQUAL "pip")
  execute_process(
    COMMAND "${CKPT_TORCH_PYTHON}" -c
      "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
    OUTPUT_VARIABLE _ckpt_torch_out
    ERROR_VARIABLE _ckpt_torch_err
    RESULT_VARIABLE _ckpt_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ckpt_torch_rc EQUAL 0)
    message(FATAL_ERROR "CKPT_TORCH=pip: '${CKPT_TORCH_PYTHON} -c \"import torch\"' failed "
                        "(run scripts/setup-deps --torch pip):\n${_ckpt_torch_err}")
  endif()
  string(REPLACE "\n" ";" _ckpt_torch_out "${_ckpt_torch_out}")
  list(GET _ckpt_torch_out 0 CKPT_TORCH_PREFIX)
  list(GET _ckpt_torch_out 1 _ckpt_torch_abi)
  list(GET _ckpt_torch_out 2 CKPT_TORCH_VERSION)
  if(NOT _ckpt_torch_abi EQUAL 1)
    message(FATAL_ERROR "CKPT_TORCH=pip: torch ${CKPT_TORCH_VERSION} at ${CKPT_TORCH_PREFIX} "
                        "uses the pre-cxx11 libstdc++ ABI; ckpt's other libraries use the "
                        "cxx11 one. Install a torch wheel built with _GLIBCXX_USE_CXX11_ABI=1 "
                        "(every PyPI wheel from 2.7 on).")
  endif()
  # The torch package folder too: TorchConfig.cmake looks its libraries up
  # with find_library(... PATHS <torch>/lib), which searches the system's
  # lib folders first and would pick Debian's libtorch.so / libc10.so when
  # libtorch-dev is installed; <prefix>/lib of CMAKE_PREFIX_PATH comes before
  # them. Results cached by an earlier configure are dropped when they are not
  # this torch's.
  get_filename_component(CKPT_TORCH_ROOT "${CKPT_TORCH_PREFIX}/../.." ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${CKPT_TORCH_PREFIX}" "${CKPT_TORCH_ROOT}")
  foreach(_v TORCH_LIBRARY c10_LIBRARY C10_CUDA_LIBRARY CAFFE2_NVRTC_LIBRARY kineto_LIBRARY)
    if(DEFINED CACHE{${_v}} AND NOT "$CACHE{${_v}}" MATCHES "^${CKPT_TORCH_ROOT}/")
      unset(${_v} CACHE)
    endif()
  endforeach()
  message(STATUS "LibTorch: torch ${CKPT_TORCH_VERSION} from ${CKPT_TORCH_PYTHON} (${CKPT_TORCH_PREFIX})")
elseif(CKPT_TORCH STREQUAL "system")
  message(STATUS "LibTorch: the system's (Debian libtorch-dev)")
else()
  message(FATAL_ERROR "CKPT_TORCH must be 'system' or 'pip', not '${CKPT_TORCH}'")
endif()

if(CKPT_WITH_CUDA)
  if(NOT CKPT_TORCH STREQUAL "pip")
    message(FATAL_ERROR "CKPT_WITH_CUDA needs a LibTorch with CUDA: configure with -DCKPT_TORCH=pip")
  endif()
  # LibTorch's CMake ignores CMAKE_CUDA_ARCHITECTURES and reads
  # TORCH_CUDA_ARCH_LIST: 90 -> "9.0", "80;90" -> "8.0;9.0".
  if(CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
    set(_ckpt_arches "")
    foreach(_a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX REPLACE "^([0-9]+)([0-9])(-real|-virtual)?$" "\\1.\\2" _a "${_a}")
      list(APPEND _ckpt_arches "${_a}")
    endforeach()
    set(TORCH_CUDA_ARCH_LIST "${_ckpt_arches}")
    message(STATUS "CKPT_WITH_CUDA: TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}")
  endif()
endif()
