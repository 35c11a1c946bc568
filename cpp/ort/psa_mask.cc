// ORT adapter of kernels/psa_mask.h under the node mmcv's PSAMask symbolic writes (mmsegmentation's PSANet):
// mmcv::MMCVPSAMask(input [N, mask_h * mask_w, H, W]) -> [N, H * W, H, W], int attribute psa_type (0 collect,
// 1 distribute) and ints mask_size (mask_h, mask_w; one int for both). No ONNX Runtime kernel existed for it.
// float and double.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/psa_mask.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kOp[] = "mmcv::MMCVPSAMask";

template <class T>
struct PsaMask {
  PsaMask(const OrtApi* api, const OrtKernelInfo* info)
      : psa_type(int_attribute(api, info, kOp, "psa_type", 0)),
        mask_size(int_or_ints_attribute(api, info, kOp, "mask_size", {}, 2)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input, Ort::Custom::Tensor<T>& out) {
    return guarded(kOp, [&] {
      kernels::PsaMaskShape shape;
      const auto status = kernels::check_psa_mask(kOp, input.Shape(), psa_type, mask_size, shape);
      if (!status.ok()) return from_kernel(status);
      const int64_t pixels = shape.height * shape.width;
      KernelOutput<T> y(out.Allocate({shape.batch, pixels, shape.height, shape.width}), shape.batch * pixels * pixels);
      std::fill(y.get(), y.get() + shape.batch * pixels * pixels, kernel_type<T>(0));
      kernels::psa_mask(KernelInput<T>(input).get(), y.get(), shape, SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  int64_t psa_type;
  std::vector<int64_t> mask_size;
};

void append_psa_mask(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<PsaMask<float>>("MMCVPSAMask", "CPUExecutionProvider")));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<PsaMask<double>>("MMCVPSAMask", "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<PsaMask<Ort::Float16_t>>("MMCVPSAMask", "CPUExecutionProvider")));
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVPSAMask, 1, append_psa_mask);

}  // namespace opbridge::ort
