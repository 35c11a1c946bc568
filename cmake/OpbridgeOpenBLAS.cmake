# Provides the IMPORTED target opbridge::openblas from the scipy-openblas32
# Python package of the build's interpreter, if it has one, and sets
# OPBRIDGE_OPENBLAS_LIBDIR. Nothing is downloaded here: install the package
# (pip install scipy-openblas32) or configure with -DOPBRIDGE_ORT_BLAS=REFERENCE.
include_guard(GLOBAL)

if(NOT Python_EXECUTABLE)
  find_package(Python 3.9 COMPONENTS Interpreter)
endif()
if(Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import scipy_openblas32 as blas
print(blas.get_include_dir())
print(blas.get_lib_dir())
print(blas.get_library(fullname=True))
]=]
    OUTPUT_VARIABLE _openblas_info OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET
    RESULT_VARIABLE _openblas_result)
  if(_openblas_result EQUAL 0)
    string(REPLACE "\n" ";" _openblas_info "${_openblas_info}")
    list(GET _openblas_info 0 _openblas_include)
    list(GET _openblas_info 1 OPBRIDGE_OPENBLAS_LIBDIR)
    list(GET _openblas_info 2 _openblas_file)
    add_library(opbridge::openblas SHARED IMPORTED GLOBAL)
    set_target_properties(opbridge::openblas PROPERTIES
      IMPORTED_LOCATION "${OPBRIDGE_OPENBLAS_LIBDIR}/${_openblas_file}"
      IMPORTED_NO_SONAME FALSE
      INTERFACE_INCLUDE_DIRECTORIES "${_openblas_include}")
  endif()
endif()
