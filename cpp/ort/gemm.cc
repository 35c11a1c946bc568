#include "ort/gemm.h"

namespace opbridge::ort {

#ifdef OPBRIDGE_WITH_OPENBLAS
// Global to this OpenBLAS copy, which only libraries linked to scipy-openblas32 share.
void init_gemm() { scipy_openblas_set_num_threads(1); }
#else
void init_gemm() {}
#endif

}  // namespace opbridge::ort
