// The ORT CUDA library's launches of mmcv's MMCVPSAMask (psa_mask.cu, compiled by nvcc), callable from
// the adapters in plain C++ (psa_mask.cc). Each returns nullptr once the kernel is queued on `stream`, or why it could
// not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/psa_mask.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// mmcv's PSAMask: out [N, H * W, H, W], every element written.
template <class T>
const char* psa_mask(const T* input, T* out, const kernels::PsaMaskShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
