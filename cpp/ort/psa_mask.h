// ORT adapter of kernels/psa_mask.h, for any device, under the node mmcv's PSAMask symbolic writes
// (mmsegmentation's PSANet): mmcv::MMCVPSAMask(input [N, mask_h * mask_w, H, W]) -> [N, H * W, H, W], int attribute
// psa_type (0 collect, 1 distribute) and ints mask_size (mask_h, mask_w; one int for both). No ONNX Runtime kernel
// existed for it. `Device` runs the checked call: the CPU library's (psa_mask.cc: float, double and float16) or the
// CUDA one's (cuda/<op>.cc: the same).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/psa_mask.h"
#include "ort/api.h"

namespace opbridge::ort::psa_mask_adapter {

inline constexpr char kOp[] = "mmcv::MMCVPSAMask";

template <class Device, class T>
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
      T* y = out.Allocate({shape.batch, pixels, shape.height, shape.width});
      if (shape.batch * pixels == 0) return Ort::Status(nullptr);
      Device::template psa_mask<T>(context, input.Data(), y, shape);
      return Ort::Status(nullptr);
    });
  }

  int64_t psa_type;
  std::vector<int64_t> mask_size;
};

template <class Device, class T>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<PsaMask<Device, T>>("MMCVPSAMask", Device::kProvider)));
}

}  // namespace opbridge::ort::psa_mask_adapter
