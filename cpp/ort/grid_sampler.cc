// ORT adapter of kernels/grid_sample.h under the names mmcv's and mmdeploy's exporters write for
// torch.nn.functional.grid_sample (Mask2Former, DINO, Deformable DETR exported without the MSDA node):
// mmcv::grid_sampler and mmdeploy::grid_sampler(input [N, C, H, W], grid [N, Ho, Wo, 2]) -> [N, C, Ho, Wo], int
// attributes interpolation_mode (0 bilinear, 1 nearest, 2 bicubic), padding_mode (0 zeros, 1 border,
// 2 reflection) and align_corners (0 or 1), torch's encodings. Their symbolics always write all three; absent, they
// take grid_sample's defaults. float, double and float16 (computed in float32).
#include <type_traits>
#include <vector>

#include "kernels/grid_sample.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kMmcvOp[] = "mmcv::grid_sampler";
constexpr char kMmdeployOp[] = "mmdeploy::grid_sampler";

template <class T, const char* Op>
struct GridSampler {
  GridSampler(const OrtApi* api, const OrtKernelInfo* info) {
    attributes.interpolation = int_attribute(api, info, Op, "interpolation_mode", 0);
    attributes.padding = int_attribute(api, info, Op, "padding_mode", 0);
    attributes.align_corners = bool_attribute(api, info, Op, "align_corners", false);
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& grid, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      kernels::GridSampleShape shape;
      const auto status = kernels::check_grid_sample(Op, input.Shape(), grid.Shape(), attributes, shape);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape{shape.batch, shape.channels, shape.out_height, shape.out_width};
      KernelOutput<T> y(out.Allocate(out_shape), element_count(out_shape));  // float16: float32 inside (ort/api.h)
      kernels::grid_sample(KernelInput<T>(input).get(), KernelInput<T>(grid).get(), y.get(), shape, attributes,
                           SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  kernels::GridSampleAttributes attributes;
};

template <const char* Op>
void append_grid_sampler(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<GridSampler<float, Op>>("grid_sampler", "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<GridSampler<double, Op>>("grid_sampler", "CPUExecutionProvider")));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<GridSampler<Ort::Float16_t, Op>>("grid_sampler", "CPUExecutionProvider")));
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, grid_sampler, 1, append_grid_sampler<kMmcvOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, grid_sampler, 1, append_grid_sampler<kMmdeployOp>);

}  // namespace opbridge::ort
