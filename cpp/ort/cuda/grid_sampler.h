// The ORT CUDA library's launches of mmcv's and mmdeploy's grid_sampler (grid_sampler.cu, compiled by nvcc), callable
// from the adapters in plain C++ (grid_sampler.cc). Each returns nullptr once the kernel is queued on `stream`, or why
// it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/grid_sample_taps.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

template <class T>
const char* grid_sample(const T* input, const T* grid, T* out, const kernels::GridSampleShape& shape,
                        const kernels::GridSampleAttributes& attributes, void* stream);

}  // namespace opbridge::ort::cuda
