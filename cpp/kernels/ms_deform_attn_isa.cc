// One instruction set's build of ms_deform_attn's CPU task functions (kernels/ms_deform_attn.h, "The CPU
// kernels"; kernels/cpu_isa.h): CMakeLists.txt compiles this file once per instruction set, with that instruction
// set's flags and OPBRIDGE_ISA_NAMESPACE naming the namespace the functions go in; the libraries choose one at run
// time.
#ifndef OPBRIDGE_ISA_NAMESPACE
#error "compile with -DOPBRIDGE_ISA_NAMESPACE=isa_<instruction set> and its flags (CMake target opbridge_cpu_isa)"
#endif
#include "kernels/ms_deform_attn.h"
