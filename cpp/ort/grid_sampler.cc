// The CPU ORT kernels of mmcv::grid_sampler and mmdeploy::grid_sampler (grid_sampler.h): kernels/grid_sample.h on
// the session's threads; float16 computed in float32 (KernelInput / KernelOutput, ort/api.h).
#include "ort/grid_sampler.h"

#include <type_traits>
#include <vector>

#include "kernels/grid_sample.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void grid_sample(OrtKernelContext* context, const T* input, const T* grid, T* out,
                          const kernels::GridSampleShape& s, const kernels::GridSampleAttributes& a) {
    const KernelInput<T> x(input, s.batch * s.channels * s.height * s.width);
    const KernelInput<T> g(grid, s.batch * s.out_height * s.out_width * 2);
    KernelOutput<T> y(out, s.batch * s.channels * s.out_height * s.out_width);
    kernels::grid_sample(x.get(), g.get(), y.get(), s, a, SessionThreads(context));
    y.finish();
  }
};

template <const char* Op>
void append_grid_sampler(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  grid_sampler_adapter::append<Cpu, Op>(ops);
  grid_sampler_adapter::append_typed<Cpu, Ort::Float16_t, Op>(ops);
  grid_sampler_adapter::append_typed<Cpu, Ort::BFloat16_t, Op>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmcvOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmdeployOp>);

}  // namespace opbridge::ort
