// ORT adapters of kernels/cumulative.h, for any device, under the nodes mmcv's exporter writes:
// - mmcv::cummax and mmcv::cummin(input) -> (values, indices int64), int attribute dim (negative counts from the
//   end): torch.cummax / torch.cummin, for which ONNX has no operator (mmcv 1.x's symbolics; CornerNet heads,
//   mmdet's mask post-processing);
// - mmcv::MMCVCornerPool(input [N, C, H, W]) -> [N, C, H, W], int attribute mode: 0 top (running maximum from the
//   bottom edge upwards), 1 bottom (from the top edge down), 2 left (from the right edge), 3 right (from the left
//   edge): CornerNet's and CentripetalNet's corner pools.
// `Device` runs the checked call: the CPU library's (cummax.cc: float, double, float16 computed in float32, and
// int64 for cummax/cummin, as torch) or the CUDA one's (cuda/<op>.cc: the same).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cumulative.h"
#include "ort/api.h"

namespace opbridge::ort::cumulative_adapter {

inline constexpr char kCummax[] = "mmcv::cummax";
inline constexpr char kCummin[] = "mmcv::cummin";
inline constexpr char kCornerPool[] = "mmcv::MMCVCornerPool";

template <class Device, class T, bool Max, const char* Op>
struct Cumulative {
  Cumulative(const OrtApi* api, const OrtKernelInfo* info) : dim(int_attribute(api, info, Op, "dim", 0)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input, Ort::Custom::Tensor<T>& values,
                      Ort::Custom::Tensor<int64_t>& indices) {
    return guarded(Op, [&] {
      kernels::CumulativeShape shape;
      const auto status = kernels::check_cumulative(Op, "input input (index 0)", input.Shape(), dim, "dim", shape);
      if (!status.ok()) return from_kernel(status);
      T* v = values.Allocate(input.Shape());
      int64_t* i = indices.Allocate(input.Shape());
      if (element_count(input.Shape()) == 0) return Ort::Status(nullptr);
      Device::template cumulative_extreme<Max, T>(context, input.Data(), v, i, shape, false);
      return Ort::Status(nullptr);
    });
  }

  int64_t dim;
};

template <class Device, class T>
struct CornerPool {
  CornerPool(const OrtApi* api, const OrtKernelInfo* info) : mode(int_attribute(api, info, kCornerPool, "mode", 0)) {
    if (mode < 0 || mode > 3) {
      throw std::invalid_argument(std::string(kCornerPool) +
                                  ": attribute 'mode' must be 0 (top), 1 (bottom), 2 (left) or 3 (right), got " +
                                  std::to_string(mode));
    }
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input, Ort::Custom::Tensor<T>& out) {
    return guarded(kCornerPool, [&] {
      const auto& shape = input.Shape();
      if (shape.size() != 4) {
        return invalid_argument(std::string(kCornerPool) +
                                ": input input (index 0) must be 4-D [batch, channels, height, width], got shape " +
                                kernels::shape_to_string(shape));
      }
      // top and bottom run along the height (axis 2), left and right along the width (axis 3); top and left
      // start from the far edge.
      kernels::CumulativeShape cumulative;
      const auto status =
          kernels::check_cumulative(kCornerPool, "input input (index 0)", shape, mode < 2 ? 2 : 3, "mode", cumulative);
      if (!status.ok()) return from_kernel(status);
      T* y = out.Allocate(shape);
      if (element_count(shape) == 0) return Ort::Status(nullptr);
      Device::template cumulative_extreme<true, T>(context, input.Data(), y, nullptr, cumulative,
                                                   mode == 0 || mode == 2);
      return Ort::Status(nullptr);
    });
  }

  int64_t mode;
};

template <class Device, class T, bool Max, const char* Op>
void append_cumulative(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<Cumulative<Device, T, Max, Op>>(op_type, Device::kProvider)));
}

template <class Device, class T>
void append_corner_pool(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<CornerPool<Device, T>>("MMCVCornerPool", Device::kProvider)));
}

}  // namespace opbridge::ort::cumulative_adapter
