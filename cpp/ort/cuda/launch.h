// What every launch file of the ORT CUDA library shares (launch.cu, compiled by nvcc): stream-ordered scratch,
// float16 conversions and the driver check. Each op's launches are declared in cuda/<op>.h and defined in
// cuda/<op>.cu (the kernels are kernels/<op>.cuh's, as in the torch CUDA ops); each returns nullptr once the
// kernel is queued on `stream`, or a message saying why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <string>
#include <vector>

namespace opbridge::ort::cuda {

// `bytes` of stream-ordered device memory (cudaMallocAsync on `stream`), freed on the same stream when it goes, so
// after the kernels queued before that. error(): null, or why it could not be had.
class DeviceScratch {
 public:
  DeviceScratch(size_t bytes, void* stream);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  template <class U>
  U* get() const {
    return static_cast<U*>(data_);
  }
  const char* error() const { return error_; }

 private:
  void* data_ = nullptr;
  void* stream_;
  const char* error_ = nullptr;
};

// float16 bits <-> float32 in device memory, kernels/float16.h's conversions (the CPU library's: round to nearest
// even, NaN kept quiet).
const char* widen_float16(const uint16_t* in, float* out, int64_t count, void* stream);
const char* narrow_float16(const float* in, uint16_t* out, int64_t count, void* stream);

// Whether this process can run the library's kernels: empty where the NVIDIA driver supports CUDA >= the major
// release of the runtime linked into the library (CUDA's minor-version compatibility), "no driver" where there
// is none, else a sentence naming both versions and what to do.
std::string driver_problem();

}  // namespace opbridge::ort::cuda
