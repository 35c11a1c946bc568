// Kernels built once per x86-64 instruction set and chosen at run time. A kernel's `<op>_isa.cc` (cpp/kernels/) is
// compiled once per instruction set with that instruction set's flags (-mavx512f, -mavx2, none) and
// OPBRIDGE_ISA_NAMESPACE (isa_avx512f, isa_avx2, isa_baseline) naming the namespace its functions go in (CMake
// target opbridge_cpu_isa, which also defines OPBRIDGE_ISA_DISPATCH for the targets that link it); the callers pick
// a namespace's function by cpu_isa(). Functions in those files must touch no standard-library code (an inline
// library function emitted there, compiled for AVX-512, could be picked by the linker for every caller).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace opbridge::kernels {

// The instruction sets the kernels are built for, narrowest first.
enum class CpuIsa { baseline, avx2, avx512f };

#if defined(OPBRIDGE_ISA_DISPATCH)
// The widest instruction set this CPU (and its OS) supports, at most the one named by the environment variable
// OPBRIDGE_CPU_ISA (baseline, avx2 or avx512f: to run and time the narrower builds on a wide CPU), read once.
inline CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    CpuIsa found = __builtin_cpu_supports("avx512f") ? CpuIsa::avx512f
                   : __builtin_cpu_supports("avx2")  ? CpuIsa::avx2
                                                     : CpuIsa::baseline;
    if (const char* cap = std::getenv("OPBRIDGE_CPU_ISA")) {
      const bool known =
          std::strcmp(cap, "baseline") == 0 || std::strcmp(cap, "avx2") == 0 || std::strcmp(cap, "avx512f") == 0;
      if (!known) {  // a misspelt cap would otherwise time the widest build while claiming to time another
        std::fprintf(stderr, "opbridge: OPBRIDGE_CPU_ISA=%s is not one of baseline, avx2, avx512f; ignored\n", cap);
      }
      const CpuIsa limit = std::strcmp(cap, "baseline") == 0 ? CpuIsa::baseline
                           : std::strcmp(cap, "avx2") == 0   ? CpuIsa::avx2
                                                             : CpuIsa::avx512f;
      found = std::min(found, limit);
    }
    return found;
  }();
  return isa;
}
#endif

}  // namespace opbridge::kernels
