# Provides the INTERFACE target opbridge::torch for the interpreter we build for.
#
# find_package(Torch) is avoided on purpose: on torch's CUDA wheels it requires a
# full CUDA toolkit even for a CPU-only extension. Asking the target interpreter
# for torch's include and library directories works for every wheel flavour.
include_guard(GLOBAL)

find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
# The interpreter whose torch the build is against: the target one, or OPBRIDGE_TORCH_PYTHON (environment) when
# the target Python has no torch installed: the wheels of the other Pythons are built against the torch of one
# environment (torch's headers and libraries do not depend on the Python; `nox -s wheels`).
set(_torch_python "${Python_EXECUTABLE}")
if(DEFINED ENV{OPBRIDGE_TORCH_PYTHON} AND NOT "$ENV{OPBRIDGE_TORCH_PYTHON}" STREQUAL "")
  set(_torch_python "$ENV{OPBRIDGE_TORCH_PYTHON}")
endif()
execute_process(
  COMMAND "${_torch_python}" -c [=[
import torch, torch.utils.cpp_extension as ext
print(torch.__version__)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(",".join(ext.include_paths()))
print(",".join(ext.library_paths()))
]=]
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE _torch_error
  RESULT_VARIABLE _torch_result)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR
    "opbridge: cannot import torch with ${_torch_python}:\n${_torch_error}\n"
    "Install torch into that environment first, then build without build isolation: "
    "pip install --no-build-isolation .   (or configure with -DOPBRIDGE_BUILD_TORCH=OFF for the ORT library alone)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 OPBRIDGE_TORCH_VERSION)
list(GET _torch_info 1 _cxx11_abi)
set(OPBRIDGE_TORCH_CXX11_ABI ${_cxx11_abi})
list(GET _torch_info 2 _torch_includes)
list(GET _torch_info 3 _torch_libdirs)
string(REPLACE "," ";" _torch_includes "${_torch_includes}")
string(REPLACE "," ";" _torch_libdirs "${_torch_libdirs}")

# Which torch layer (cpp/torch/api.h) the ops are built on: STABLE, the LibTorch stable ABI (one build for torch
# 2.10 and every later release), or CLASSIC, ATen (a build for exactly this torch). AUTO: STABLE from torch 2.10.
# The environment variable OPBRIDGE_TORCH_ABI (stable/classic) sets it for wheel builds; the wheel's metadata
# (cmake/opbridge_metadata.py) follows the same rule.
set(_abi_default AUTO)
if(DEFINED ENV{OPBRIDGE_TORCH_ABI})
  string(TOUPPER "$ENV{OPBRIDGE_TORCH_ABI}" _abi_default)
endif()
set(OPBRIDGE_TORCH_ABI ${_abi_default} CACHE STRING "torch layer of the ops: AUTO, STABLE or CLASSIC")
set_property(CACHE OPBRIDGE_TORCH_ABI PROPERTY STRINGS AUTO STABLE CLASSIC)
set(OPBRIDGE_TORCH_STABLE_FLOOR 2.10)
if(OPBRIDGE_TORCH_ABI STREQUAL "AUTO")
  if(OPBRIDGE_TORCH_VERSION VERSION_GREATER_EQUAL OPBRIDGE_TORCH_STABLE_FLOOR)
    set(OPBRIDGE_TORCH_LAYER STABLE)
  else()
    set(OPBRIDGE_TORCH_LAYER CLASSIC)
  endif()
elseif(OPBRIDGE_TORCH_ABI MATCHES "^(STABLE|CLASSIC)$")
  set(OPBRIDGE_TORCH_LAYER ${OPBRIDGE_TORCH_ABI})
else()
  message(FATAL_ERROR "opbridge: OPBRIDGE_TORCH_ABI must be AUTO, STABLE or CLASSIC, got '${OPBRIDGE_TORCH_ABI}'")
endif()
if(OPBRIDGE_TORCH_LAYER STREQUAL "STABLE" AND OPBRIDGE_TORCH_VERSION VERSION_LESS OPBRIDGE_TORCH_STABLE_FLOOR)
  message(FATAL_ERROR "opbridge: the stable-ABI build needs torch >= ${OPBRIDGE_TORCH_STABLE_FLOOR} to build against, "
                      "found ${OPBRIDGE_TORCH_VERSION}; build CLASSIC for this torch (OPBRIDGE_TORCH_ABI=classic)")
endif()
message(STATUS "opbridge: building against torch ${OPBRIDGE_TORCH_VERSION} (${_torch_python}), "
               "torch layer ${OPBRIDGE_TORCH_LAYER}")

# The stable build needs only libtorch_cpu (the C shim); the classic one links what ATen, the dispatcher and
# torch's pybind11 casters live in.
if(OPBRIDGE_TORCH_LAYER STREQUAL "STABLE")
  set(_torch_library_names torch_cpu)
  # pybind11 from PyPI: torch's bundled copy refuses TORCH_STABLE_ONLY builds (torch 2.10), and the stable
  # module passes no torch type through pybind11, so any pybind11 serves it.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import pybind11; print(pybind11.get_include())"
    OUTPUT_VARIABLE OPBRIDGE_PYBIND11_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _pybind11_result ERROR_QUIET)
  if(NOT _pybind11_result EQUAL 0)
    message(FATAL_ERROR "opbridge: the stable-ABI build needs pybind11 in ${Python_EXECUTABLE}: pip install pybind11")
  endif()
else()
  set(_torch_library_names c10 torch torch_cpu torch_python)
endif()
set(_torch_libraries)
foreach(name ${_torch_library_names})
  find_library(_lib_${name} ${name} PATHS ${_torch_libdirs} NO_DEFAULT_PATH NO_CACHE REQUIRED)
  list(APPEND _torch_libraries "${_lib_${name}}")
endforeach()

add_library(opbridge_torch_deps INTERFACE)
add_library(opbridge::torch ALIAS opbridge_torch_deps)
target_include_directories(opbridge_torch_deps SYSTEM INTERFACE ${_torch_includes})
target_link_libraries(opbridge_torch_deps INTERFACE ${_torch_libraries})
target_compile_definitions(opbridge_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${_cxx11_abi})
# torch >= 2.14 headers need C++20; set per target (a global CMAKE_CXX_STANDARD
# would leak into other projects' checks).
target_compile_features(opbridge_torch_deps INTERFACE cxx_std_20)
