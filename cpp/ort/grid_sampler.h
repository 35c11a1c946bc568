// ORT adapter of 2-D grid sampling, for any device, under the names mmcv's and mmdeploy's exporters write for
// torch.nn.functional.grid_sample (Mask2Former, DINO, Deformable DETR exported without the MSDA node):
// mmcv::grid_sampler and mmdeploy::grid_sampler(input [N, C, H, W], grid [N, Ho, Wo, 2]) -> [N, C, Ho, Wo], int
// attributes interpolation_mode (0 bilinear, 1 nearest, 2 bicubic), padding_mode (0 zeros, 1 border,
// 2 reflection) and align_corners (0 or 1), torch's encodings. Their symbolics always write all three; absent, they
// take grid_sample's defaults. `Device` runs the checked call: the CPU library's (grid_sampler.cc: float, double and
// float16, computed in float32) or the CUDA one's (cuda/<op>.cc: float, double and float16).
#pragma once

#include <vector>

#include "kernels/grid_sample_taps.h"
#include "ort/api.h"

namespace opbridge::ort::grid_sampler_adapter {

inline constexpr char kMmcvOp[] = "mmcv::grid_sampler";
inline constexpr char kMmdeployOp[] = "mmdeploy::grid_sampler";

template <class Device, class T, const char* Op>
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
      T* y = out.Allocate(out_shape);
      if (element_count(out_shape) == 0) return Ort::Status(nullptr);
      Device::template grid_sample<T>(context, input.Data(), grid.Data(), y, shape, attributes);
      return Ort::Status(nullptr);
    });
  }

  kernels::GridSampleAttributes attributes;
};

template <class Device, class T, const char* Op>
void append_typed(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<GridSampler<Device, T, Op>>("grid_sampler", Device::kProvider)));
}

template <class Device, const char* Op>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_typed<Device, float, Op>(ops);
  append_typed<Device, double, Op>(ops);
}

}  // namespace opbridge::ort::grid_sampler_adapter
