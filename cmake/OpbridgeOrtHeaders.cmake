# Provides the INTERFACE target opbridge::ort_headers.
#
# Search order: OPBRIDGE_ORT_INCLUDE_DIR (CMake variable or environment), then the
# system (e.g. Debian's libonnxruntime-dev), then a pinned copy fetched once into
# a cache directory (OPBRIDGE_ORT_HEADERS_CACHE, default ~/.cache/opbridge) by
# fetch_ort_headers.py: a given archive, Debian's package, or ONNX Runtime's
# release archive (each SHA-256 checked; its docstring lists the variables).
# Any headers from ONNX Runtime >= 1.16 work: the library negotiates the API
# version with the runtime it is loaded into, whatever the headers' version.
include_guard(GLOBAL)

set(_opbridge_ort_min_api 16)

function(_opbridge_ort_api_version dir out_var)
  set(${out_var} 0 PARENT_SCOPE)
  foreach(header onnxruntime_c_api.h onnxruntime_cxx_api.h onnxruntime_lite_custom_op.h)
    if(NOT EXISTS "${dir}/${header}")
      return()
    endif()
  endforeach()
  file(STRINGS "${dir}/onnxruntime_c_api.h" _line REGEX "^#define ORT_API_VERSION [0-9]+")
  string(REGEX REPLACE "^#define ORT_API_VERSION ([0-9]+).*" "\\1" _version "${_line}")
  set(${out_var} "${_version}" PARENT_SCOPE)
endfunction()

if(NOT OPBRIDGE_ORT_INCLUDE_DIR AND DEFINED ENV{OPBRIDGE_ORT_INCLUDE_DIR})
  set(OPBRIDGE_ORT_INCLUDE_DIR "$ENV{OPBRIDGE_ORT_INCLUDE_DIR}")
endif()
set(OPBRIDGE_ORT_INCLUDE_DIR "${OPBRIDGE_ORT_INCLUDE_DIR}" CACHE PATH
    "Directory holding onnxruntime_c_api.h, onnxruntime_cxx_api.h and onnxruntime_lite_custom_op.h")

if(OPBRIDGE_ORT_INCLUDE_DIR)
  _opbridge_ort_api_version("${OPBRIDGE_ORT_INCLUDE_DIR}" _api)
  if(_api LESS _opbridge_ort_min_api)
    message(FATAL_ERROR
      "OPBRIDGE_ORT_INCLUDE_DIR=${OPBRIDGE_ORT_INCLUDE_DIR} does not hold the headers of ONNX Runtime >= 1.16 "
      "(onnxruntime_c_api.h, onnxruntime_cxx_api.h, onnxruntime_lite_custom_op.h; found API version '${_api}').")
  endif()
else()
  find_path(_opbridge_system_ort onnxruntime_lite_custom_op.h PATH_SUFFIXES onnxruntime include/onnxruntime)
  if(_opbridge_system_ort)
    _opbridge_ort_api_version("${_opbridge_system_ort}" _api)
  endif()
  if(_opbridge_system_ort AND NOT _api LESS _opbridge_ort_min_api)
    set(OPBRIDGE_ORT_INCLUDE_DIR "${_opbridge_system_ort}" CACHE PATH "" FORCE)
  else()
    if(DEFINED ENV{OPBRIDGE_ORT_HEADERS_CACHE})
      set(_cache "$ENV{OPBRIDGE_ORT_HEADERS_CACHE}")
    elseif(DEFINED ENV{XDG_CACHE_HOME})
      set(_cache "$ENV{XDG_CACHE_HOME}/opbridge")
    else()
      set(_cache "$ENV{HOME}/.cache/opbridge")
    endif()
    if(NOT Python_EXECUTABLE)
      find_package(Python 3.9 REQUIRED COMPONENTS Interpreter)
    endif()
    message(STATUS "opbridge: fetching ONNX Runtime headers into ${_cache}")
    execute_process(
      COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_LIST_DIR}/fetch_ort_headers.py" "${_cache}"
      OUTPUT_VARIABLE _fetched OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_VARIABLE _fetch_error
      RESULT_VARIABLE _fetch_result)
    if(NOT _fetch_result EQUAL 0)
      message(FATAL_ERROR "${_fetch_error}")
    endif()
    set(OPBRIDGE_ORT_INCLUDE_DIR "${_fetched}" CACHE PATH "" FORCE)
  endif()
endif()
_opbridge_ort_api_version("${OPBRIDGE_ORT_INCLUDE_DIR}" OPBRIDGE_ORT_HEADERS_API_VERSION)
message(STATUS "opbridge: ONNX Runtime headers (API ${OPBRIDGE_ORT_HEADERS_API_VERSION}) in ${OPBRIDGE_ORT_INCLUDE_DIR}")

add_library(opbridge_ort_headers INTERFACE)
add_library(opbridge::ort_headers ALIAS opbridge_ort_headers)
target_include_directories(opbridge_ort_headers SYSTEM INTERFACE "${OPBRIDGE_ORT_INCLUDE_DIR}")
