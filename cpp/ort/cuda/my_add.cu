// The ORT CUDA library's launches of MyAdd (cuda/my_add.h).
#include "ort/cuda/my_add.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/my_add.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream) {
  if (!kernels::cuda::my_add_fits(loop)) return "more than 16 dimensions after merging broadcast ones";
  using D = typename Device<T>::type;
  using Acc = std::conditional_t<std::is_same_v<D, double>, double, float>;
  return message(kernels::cuda::my_add<D, Acc>(reinterpret_cast<const D*>(a), reinterpret_cast<const D*>(b),
                                               reinterpret_cast<D*>(out), loop, static_cast<cudaStream_t>(stream)));
}

template const char* my_add(const float*, const float*, float*, const kernels::BinaryLoop&, void*);
template const char* my_add(const double*, const double*, double*, const kernels::BinaryLoop&, void*);
template const char* my_add(const uint16_t*, const uint16_t*, uint16_t*, const kernels::BinaryLoop&, void*);

}  // namespace opbridge::ort::cuda
