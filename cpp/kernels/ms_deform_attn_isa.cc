// One instruction set's build of ms_deform_attn's CPU task functions (kernels/ms_deform_attn.h, "The CPU
// kernels"): CMakeLists.txt compiles this file once per instruction set, with that instruction set's flags and
// OPBRIDGE_MSDA_ISA naming the namespace the functions go in; the libraries choose one at run time.
#ifndef OPBRIDGE_MSDA_ISA
#error "compile with -DOPBRIDGE_MSDA_ISA=msda_<instruction set> and its flags (target opbridge_msda_cpu)"
#endif
#include "kernels/ms_deform_attn.h"
