# The CUDA ops (cpp/cuda): libopbridge_cuda.so, a library of its own beside opbridge._C that opbridge loads only
# under a CUDA build of torch, so CPU-only installs never touch it. Included from cpp/torch once the torch layer is
# known (OpbridgeTorch.cmake).
#
# OPBRIDGE_BUILD_CUDA: AUTO (default) builds it where a CUDA compiler (nvcc) is found and the torch layer is the
# stable ABI; ON requires it; OFF skips it. OPBRIDGE_CUDA_ARCHITECTURES: the GPUs it has machine code for (sm_80
# A100, sm_90 H100/H200) plus PTX of the last one, which newer GPUs compile when they load it. The CUDA runtime is
# linked statically: the library needs only the NVIDIA driver (one for CUDA >= the toolkit's major release, which
# opbridge checks before loading it: python/opbridge/_extension.py), and loads (reporting "no driver" when used) on
# a machine without one. The environment variable OPBRIDGE_BUILD_CUDA gives the default (the release builds set it
# per torch target).
#
# OPBRIDGE_PREBUILT_CUDA: install that already built libopbridge_cuda.so instead of building it, as
# OPBRIDGE_PREBUILT_OPS does for the ops (`nox -s wheels` builds it once for every Python's wheel), with
# OPBRIDGE_PREBUILT_CUDA_RUNTIME the CUDA release it was built with (major.minor) and OPBRIDGE_CUDA_ARCHITECTURES
# its architectures.
include_guard(GLOBAL)

set(_cuda_default AUTO)
if(DEFINED ENV{OPBRIDGE_BUILD_CUDA} AND NOT "$ENV{OPBRIDGE_BUILD_CUDA}" STREQUAL "")
  set(_cuda_default "$ENV{OPBRIDGE_BUILD_CUDA}")
endif()
set(OPBRIDGE_BUILD_CUDA ${_cuda_default} CACHE STRING "Build the CUDA ops (libopbridge_cuda.so): AUTO, ON or OFF")
set(OPBRIDGE_PREBUILT_CUDA "" CACHE FILEPATH "an already built libopbridge_cuda.so to install instead of building it")
set(OPBRIDGE_PREBUILT_CUDA_RUNTIME "" CACHE STRING "the CUDA release (major.minor) OPBRIDGE_PREBUILT_CUDA was built with")
set_property(CACHE OPBRIDGE_BUILD_CUDA PROPERTY STRINGS AUTO ON OFF)
set(OPBRIDGE_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA architectures of libopbridge_cuda.so")
set(OPBRIDGE_CUDA_BUILT OFF)

string(TOUPPER "${OPBRIDGE_BUILD_CUDA}" _cuda_mode)
if(NOT _cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "opbridge: OPBRIDGE_BUILD_CUDA must be AUTO, ON or OFF, got '${OPBRIDGE_BUILD_CUDA}'")
endif()
if(OPBRIDGE_PREBUILT_CUDA)
  if(NOT EXISTS "${OPBRIDGE_PREBUILT_CUDA}" OR NOT OPBRIDGE_PREBUILT_CUDA_RUNTIME MATCHES "^[0-9]+\\.[0-9]+$")
    message(FATAL_ERROR "opbridge: OPBRIDGE_PREBUILT_CUDA=${OPBRIDGE_PREBUILT_CUDA} must exist and "
                        "OPBRIDGE_PREBUILT_CUDA_RUNTIME (${OPBRIDGE_PREBUILT_CUDA_RUNTIME}) give its CUDA release, e.g. 13.0")
  endif()
  install(FILES "${OPBRIDGE_PREBUILT_CUDA}" DESTINATION opbridge RENAME libopbridge_cuda.so)
  set(CMAKE_CUDA_ARCHITECTURES "${OPBRIDGE_CUDA_ARCHITECTURES}")
  set(OPBRIDGE_CUDA_RUNTIME "${OPBRIDGE_PREBUILT_CUDA_RUNTIME}")
  set(OPBRIDGE_CUDA_BUILT ON)
elseif(NOT _cuda_mode STREQUAL "OFF")
  if(NOT OPBRIDGE_TORCH_LAYER STREQUAL "STABLE")
    set(_cuda_skip "the CUDA ops are written on the stable-ABI torch layer (torch >= ${OPBRIDGE_TORCH_STABLE_FLOOR})")
  else()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${OPBRIDGE_CUDA_ARCHITECTURES}")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      set(_cuda_skip "no CUDA compiler (nvcc) found; set CMAKE_CUDA_COMPILER or put nvcc on PATH")
    endif()
  endif()
  if(_cuda_skip)
    if(_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "opbridge: OPBRIDGE_BUILD_CUDA=ON, but ${_cuda_skip}")
    endif()
    message(STATUS "opbridge: not building the CUDA ops: ${_cuda_skip}")
  else()
    enable_language(CUDA)
    add_subdirectory("${PROJECT_SOURCE_DIR}/cpp/cuda" "${CMAKE_CURRENT_BINARY_DIR}/cuda")
    set(OPBRIDGE_CUDA_BUILT ON)
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" OPBRIDGE_CUDA_RUNTIME "${CMAKE_CUDA_COMPILER_VERSION}")
    message(STATUS "opbridge: building the CUDA ops for ${CMAKE_CUDA_ARCHITECTURES} "
                   "(nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  endif()
endif()
