// The ORT CUDA library's launches of mmcv's MMCVPSAMask (cuda/psa_mask.h).
#include "ort/cuda/psa_mask.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/psa_mask.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* psa_mask(const T* input, T* out, const kernels::PsaMaskShape& shape, void* stream) {
  return message(kernels::cuda::psa_mask(input, out, shape, static_cast<cudaStream_t>(stream)));
}

template const char* psa_mask(const float*, float*, const kernels::PsaMaskShape&, void*);
template const char* psa_mask(const double*, double*, const kernels::PsaMaskShape&, void*);

}  // namespace opbridge::ort::cuda
