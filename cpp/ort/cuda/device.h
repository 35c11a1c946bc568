// The ORT CUDA library's device helpers, shared by its node files (cuda/<op>.cc, plain C++): the session's stream,
// a launch's error as an exception (the adapters' `guarded` turns it into the node's error status), float16 as its
// bits for the launches that read it as stored, and DeviceInput / DeviceOutput for those that widen it (the CPU
// library's KernelInput / KernelOutput, on the GPU: inputs widened to float32 on the device, the output rounded once).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ort/api.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort {

inline void* stream_of(OrtKernelContext* context) { return Ort::KernelContext(context).GetGPUComputeStream(); }

inline void check(const char* error) {
  if (error != nullptr) throw std::runtime_error(std::string("CUDA kernel not launched: ") + error);
}

template <class T>
struct Bits {
  using type = T;
};
template <>
struct Bits<Ort::Float16_t> {
  using type = uint16_t;
};

// An input as a float32 launch reads it: the tensor's own device memory, or (float16) a float32 copy widened on the
// device (the CPU library's KernelInput, on the GPU).
template <class T>
class DeviceInput {
 public:
  DeviceInput(const T* data, int64_t count, void* stream) {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      scratch_.emplace(sizeof(float) * static_cast<size_t>(std::max<int64_t>(count, 0)), stream);
      check(scratch_->error());
      check(cuda::widen_float16(reinterpret_cast<const uint16_t*>(data), scratch_->get<float>(), count, stream));
      data_ = scratch_->get<float>();
    } else {
      data_ = data;
    }
  }
  const kernel_type<T>* get() const { return data_; }

 private:
  std::optional<cuda::DeviceScratch> scratch_;
  const kernel_type<T>* data_ = nullptr;
};

// An output as a float32 launch writes it: the tensor's device memory, or (float16) a float32 buffer that
// finish() rounds into the tensor once (the CPU library's KernelOutput, on the GPU).
template <class T>
class DeviceOutput {
 public:
  DeviceOutput(T* out, int64_t count, void* stream) : out_(out), count_(count), stream_(stream) {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      scratch_.emplace(sizeof(float) * static_cast<size_t>(std::max<int64_t>(count, 0)), stream);
      check(scratch_->error());
      data_ = scratch_->get<float>();
    } else {
      data_ = out;
    }
  }
  kernel_type<T>* get() const { return data_; }
  void finish() {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      check(cuda::narrow_float16(data_, reinterpret_cast<uint16_t*>(out_), count_, stream_));
    }
  }

 private:
  T* out_;
  int64_t count_;
  void* stream_;
  std::optional<cuda::DeviceScratch> scratch_;
  kernel_type<T>* data_ = nullptr;
};

using Ops = std::vector<Ort::Custom::OrtLiteCustomOp*>;

}  // namespace opbridge::ort
