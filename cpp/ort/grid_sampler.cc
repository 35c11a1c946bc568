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
      T* y = out.Allocate({shape.batch, shape.channels, shape.out_height, shape.out_width});
      if constexpr (std::is_same_v<T, Ort::Float16_t>) {  // float32 arithmetic, one rounding (ort/api.h)
        const auto x = widened(input.Data(), shape.batch * shape.channels * shape.height * shape.width);
        const auto g = widened(grid.Data(), shape.batch * shape.out_height * shape.out_width * 2);
        std::vector<float> result(
            static_cast<size_t>(shape.batch * shape.channels * shape.out_height * shape.out_width));
        kernels::grid_sample(x.data(), g.data(), result.data(), shape, attributes, SessionThreads(context));
        narrow(result, y);
      } else {
        kernels::grid_sample(input.Data(), grid.Data(), y, shape, attributes, SessionThreads(context));
      }
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
