// The ORT CUDA library's mmcv's and mmdeploy's grid_sampler: float, double and float16 read as stored: the adapter of
// ort/grid_sampler.h with a device that queues this op's launches (cuda/grid_sampler.h) on the session's CUDA stream
// (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/grid_sampler.h"
#include "ort/grid_sampler.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void grid_sample(OrtKernelContext* context, const T* input, const T* grid, T* out,
                          const kernels::GridSampleShape& shape, const kernels::GridSampleAttributes& attributes) {
    using B = typename Bits<T>::type;  // float16: read as stored, float32 arithmetic, one rounding
    check(cuda::grid_sample(reinterpret_cast<const B*>(input), reinterpret_cast<const B*>(grid),
                            reinterpret_cast<B*>(out), shape, attributes, stream_of(context)));
  }
};

template <const char* Op>
void append_grid_sampler(Ops& ops) {
  grid_sampler_adapter::append<Cuda, Op>(ops);
  grid_sampler_adapter::append_typed<Cuda, Ort::Float16_t, Op>(ops);  // a float16 model's (Mask2Former after .half())
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmcvOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmdeployOp>);

}  // namespace opbridge::ort
