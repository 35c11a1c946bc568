// ORT adapter of my_add, for any device: opbridge::MyAdd(A, B) -> C, C = 2 * A + B with multidirectional
// broadcasting, for float, double and float16. `Device` runs the checked loop: the CPU library's (my_add.cc) or the
// CUDA one's (cuda/my_add.cc).
#pragma once

#include <vector>

#include "kernels/broadcast.h"
#include "ort/api.h"

namespace opbridge::ort::my_add_adapter {

template <class Device, class T>
Ort::Status compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& a, const Ort::Custom::Tensor<T>& b,
                    Ort::Custom::Tensor<T>& c) {
  return guarded("opbridge::MyAdd", [&] {
    std::vector<int64_t> shape;
    const auto status = kernels::broadcast_shapes("opbridge::MyAdd", "input A (index 0)", a.Shape(),
                                                  "input B (index 1)", b.Shape(), shape);
    if (!status.ok()) return from_kernel(status);
    T* out = c.Allocate(shape);
    const auto loop = kernels::make_binary_loop(shape, kernels::broadcast_strides(a.Shape(), shape),
                                                kernels::broadcast_strides(b.Shape(), shape));
    if (loop.numel > 0) Device::template my_add<T>(context, a.Data(), b.Data(), out, loop);
    return Ort::Status(nullptr);
  });
}

template <class Device>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", Device::kProvider, compute<Device, float>)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", Device::kProvider, compute<Device, double>)));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", Device::kProvider, compute<Device, Ort::Float16_t>)));
}

}  // namespace opbridge::ort::my_add_adapter
