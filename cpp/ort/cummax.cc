// ORT adapters of kernels/cumulative.h, under the nodes mmcv's exporter writes:
// - mmcv::cummax and mmcv::cummin(input) -> (values, indices int64), int attribute dim (negative counts from the
//   end): torch.cummax / torch.cummin, for which ONNX has no operator (mmcv 1.x's symbolics; CornerNet heads,
//   mmdet's mask post-processing);
// - mmcv::MMCVCornerPool(input [N, C, H, W]) -> [N, C, H, W], int attribute mode: 0 top (running maximum from the
//   bottom edge upwards), 1 bottom (from the top edge down), 2 left (from the right edge), 3 right (from the left
//   edge): CornerNet's and CentripetalNet's corner pools.
// float and double (and int64 for cummax/cummin, as torch).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cumulative.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kCpu[] = "CPUExecutionProvider";
constexpr char kCummax[] = "mmcv::cummax";
constexpr char kCummin[] = "mmcv::cummin";
constexpr char kCornerPool[] = "mmcv::MMCVCornerPool";

template <class T, bool Max, const char* Op>
struct Cumulative {
  Cumulative(const OrtApi* api, const OrtKernelInfo* info) : dim(int_attribute(api, info, Op, "dim", 0)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input, Ort::Custom::Tensor<T>& values,
                      Ort::Custom::Tensor<int64_t>& indices) {
    return guarded(Op, [&] {
      kernels::CumulativeShape shape;
      const auto status = kernels::check_cumulative(Op, "input input (index 0)", input.Shape(), dim, "dim", shape);
      if (!status.ok()) return from_kernel(status);
      KernelOutput<T> v(values.Allocate(input.Shape()), element_count(input.Shape()));
      int64_t* i = indices.Allocate(input.Shape());
      kernels::cumulative_extreme<Max>(KernelInput<T>(input).get(), v.get(), i, shape, false, SessionThreads(context));
      v.finish();
      return Ort::Status(nullptr);
    });
  }

  int64_t dim;
};

template <class T>
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
      KernelOutput<T> y(out.Allocate(shape), element_count(shape));
      kernels::cumulative_extreme<true>(KernelInput<T>(input).get(), y.get(), nullptr, cumulative,
                                        mode == 0 || mode == 2, SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  int64_t mode;
};

template <bool Max, const char* Op>
void append_cumulative(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Cumulative<float, Max, Op>>(op_type, kCpu)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Cumulative<double, Max, Op>>(op_type, kCpu)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Cumulative<int64_t, Max, Op>>(op_type, kCpu)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Cumulative<Ort::Float16_t, Max, Op>>(op_type, kCpu)));
}

void append_cummax(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { append_cumulative<true, kCummax>("cummax", ops); }
void append_cummin(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_cumulative<false, kCummin>("cummin", ops);
}

void append_corner_pool(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<CornerPool<float>>("MMCVCornerPool", kCpu)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<CornerPool<double>>("MMCVCornerPool", kCpu)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<CornerPool<Ort::Float16_t>>("MMCVCornerPool", kCpu)));
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummax, 1, append_cummax);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummin, 1, append_cummin);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCornerPool, 1, append_corner_pool);

}  // namespace opbridge::ort
