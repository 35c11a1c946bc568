// ORT adapter of kernels/my_add.h: opbridge::MyAdd(A, B) -> C, C = 2 * A + B
// with multidirectional broadcasting, for float, double and float16.
#include "kernels/my_add.h"

#include "ort/api.h"

namespace opbridge::ort {
namespace {

// The kernel's element type for each ORT element type (identical bit layouts).
template <class T>
struct KernelType {
  using type = T;
};
template <>
struct KernelType<Ort::Float16_t> {
  using type = kernels::float16;
};

template <class T>
Ort::Status MyAdd(OrtKernelContext* context, const Ort::Custom::Tensor<T>& a, const Ort::Custom::Tensor<T>& b,
                  Ort::Custom::Tensor<T>& c) {
  return guarded("opbridge::MyAdd", [&] {
    std::vector<int64_t> shape;
    const auto status = kernels::broadcast_shapes("opbridge::MyAdd", "input A (index 0)", a.Shape(),
                                                  "input B (index 1)", b.Shape(), shape);
    if (!status.ok()) return from_kernel(status);
    using K = typename KernelType<T>::type;
    K* out = reinterpret_cast<K*>(c.Allocate(shape));
    const auto loop = kernels::make_binary_loop(shape, kernels::broadcast_strides(a.Shape(), shape),
                                                kernels::broadcast_strides(b.Shape(), shape));
    if (loop.numel > 0) {
      kernels::my_add(reinterpret_cast<const K*>(a.Data()), reinterpret_cast<const K*>(b.Data()), out, loop,
                      SessionThreads(context));
    }
    return Ort::Status(nullptr);
  });
}

void append_my_add(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", "CPUExecutionProvider", MyAdd<float>)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", "CPUExecutionProvider", MyAdd<double>)));
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp("MyAdd", "CPUExecutionProvider", MyAdd<Ort::Float16_t>)));
}

}  // namespace

OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add);

}  // namespace opbridge::ort
