// The ORT CUDA library's shared launch pieces (launch.h): the driver check, stream-ordered scratch, float16
// conversions.
#include "ort/cuda/launch.h"

#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda_grid.cuh"
#include "kernels/float16.h"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

std::string driver_problem() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) return "no driver";
  if (driver / 1000 >= CUDART_VERSION / 1000) return {};
  auto release = [](int version) { return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10); };
  return "the NVIDIA driver supports CUDA " + release(driver) + ", but libopbridge_ort_cuda.so is built with CUDA " +
         release(CUDART_VERSION) + " and needs a driver for CUDA >= " + std::to_string(CUDART_VERSION / 1000) +
         ".0 (R580 or newer for CUDA 13). Update the driver, or build opbridge-ort from source with this machine's "
         "CUDA toolkit (docs/packaging.md)";
}

namespace {

// Keeps up to 256 MiB of freed stream-ordered memory in `device`'s default pool instead of returning it to the
// driver at each synchronization (the pool's default), so that the scratch of each call (float16 copies, NMS
// workspaces, RoI tables) is taken from the pool, not the driver. Once per device; never lowers a threshold someone
// else set (torch's cudaMallocAsync backend shares the pool); a pool that cannot be tuned is left as it is.
void keep_freed_memory(int device) {
  static std::mutex mutex;
  static std::set<int> tuned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!tuned.insert(device).second) return;
  cudaMemPool_t pool = nullptr;
  uint64_t current = 0, threshold = uint64_t(256) << 20;
  if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &current) != cudaSuccess ||
      (current < threshold &&
       cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) != cudaSuccess)) {
    (void)cudaGetLastError();
  }
}

}  // namespace

DeviceScratch::DeviceScratch(size_t bytes, void* stream) : stream_(stream) {
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) keep_freed_memory(device);
  error_ = message(cudaMallocAsync(&data_, bytes > 0 ? bytes : 1, static_cast<cudaStream_t>(stream)));
  if (error_ != nullptr) {
    data_ = nullptr;
    (void)cudaGetLastError();  // not left for the next launch (ours or the runtime's) to report as its own
  }
}

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFreeAsync(data_, static_cast<cudaStream_t>(stream_));
}

namespace {

__global__ void widen_kernel(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t count) {
  OPBRIDGE_GRID_LOOP(i, count) { out[i] = kernels::SoftFloat16::to_float(in[i]); }
}

__global__ void narrow_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t count) {
  OPBRIDGE_GRID_LOOP(i, count) { out[i] = kernels::SoftFloat16::from_float(in[i]); }
}

}  // namespace

const char* widen_float16(const uint16_t* in, float* out, int64_t count, void* stream) {
  if (count <= 0) return nullptr;
  widen_kernel<<<kernels::cuda::blocks_for(count), kernels::cuda::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, count);
  return message(cudaGetLastError());
}

const char* narrow_float16(const float* in, uint16_t* out, int64_t count, void* stream) {
  if (count <= 0) return nullptr;
  narrow_kernel<<<kernels::cuda::blocks_for(count), kernels::cuda::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, count);
  return message(cudaGetLastError());
}

}  // namespace opbridge::ort::cuda
