// ORT adapter of kernels/carafe.h under the nodes mmcv's CARAFE symbolics write (mmdetection's CARAFE FPN):
// mmcv::MMCVCARAFE and mmcv::MMCVCARAFENaive(features [N, C, H, W], masks [N, group_size * kernel_size^2, H * s,
// W * s]) -> [N, C, H * s, W * s], int attributes kernel_size and group_size, float scale_factor (an integer value).
// The two nodes compute the same thing (mmcv's two kernels differ in speed only). No ONNX Runtime kernel existed
// for either. float and double.
#include <string>
#include <vector>

#include "kernels/carafe.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kOp[] = "mmcv::MMCVCARAFE";
constexpr char kNaiveOp[] = "mmcv::MMCVCARAFENaive";

template <class T, const char* Op>
struct Carafe {
  Carafe(const OrtApi* api, const OrtKernelInfo* info)
      : kernel(int_attribute(api, info, Op, "kernel_size", 0)),
        group(int_attribute(api, info, Op, "group_size", 1)),
        scale(float_attribute(api, info, Op, "scale_factor", 0.0f)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& features,
                      const Ort::Custom::Tensor<T>& masks, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      kernels::CarafeShape shape;
      const auto status = kernels::check_carafe(Op, features.Shape(), masks.Shape(), kernel, group, scale, shape);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape{shape.batch, shape.channels, shape.height * shape.scale,
                                           shape.width * shape.scale};
      KernelOutput<T> y(out.Allocate(out_shape), element_count(out_shape));
      kernels::carafe(KernelInput<T>(features).get(), KernelInput<T>(masks).get(), y.get(), shape,
                      SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  int64_t kernel, group;
  double scale;
};

template <const char* Op>
void append_carafe(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Carafe<float, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Carafe<double, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<Carafe<Ort::Float16_t, Op>>(op_type, "CPUExecutionProvider")));
}

void append_mmcv_carafe(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { append_carafe<kOp>("MMCVCARAFE", ops); }
void append_mmcv_carafe_naive(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_carafe<kNaiveOp>("MMCVCARAFENaive", ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFE, 1, append_mmcv_carafe);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFENaive, 1, append_mmcv_carafe_naive);

}  // namespace opbridge::ort
