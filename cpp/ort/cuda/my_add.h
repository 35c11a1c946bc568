// The ORT CUDA library's launches of MyAdd (my_add.cu, compiled by nvcc), callable from
// the adapters in plain C++ (my_add.cc). Each returns nullptr once the kernel is queued on `stream`, or why it could
// not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/broadcast.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// T: float or double; my_add, ms_deform_attn and grid_sample also float16 as uint16_t bits.
template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream);

}  // namespace opbridge::ort::cuda
