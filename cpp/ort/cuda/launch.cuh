// Helpers of the ORT CUDA library's launch files (cuda/<op>.cu, nvcc only): CUDA errors as messages, the device type
// of float16 bits, and the RoI tables' trip to the device.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

inline const char* message(cudaError_t error) { return error == cudaSuccess ? nullptr : cudaGetErrorString(error); }

template <class T>
struct Device {
  using type = T;
};
template <>
struct Device<uint16_t> {
  using type = __half;
};

// The rois read and checked on the host, in stream-ordered device memory for the kernel (from pageable memory:
// the copy returns once `rois` is staged, so the vector may go).
template <class Launch>
const char* with_rois(const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, cudaStream_t stream,
                      Launch&& launch) {
  using Roi = kernels::roi_align_rotated_detail::Roi;
  const DeviceScratch table(sizeof(Roi) * rois.size(), stream);
  if (table.error() != nullptr) return table.error();
  const cudaError_t copied =
      cudaMemcpyAsync(table.get<Roi>(), rois.data(), sizeof(Roi) * rois.size(), cudaMemcpyHostToDevice, stream);
  if (copied != cudaSuccess) return message(copied);
  return message(launch(table.get<Roi>()));
}

}  // namespace opbridge::ort::cuda
