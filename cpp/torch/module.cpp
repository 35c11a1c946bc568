// opbridge._C: the pybind11 face of the same ops, and (by being loaded) the
// TORCH_LIBRARY registrations of schemas.cpp and cpu/*.cpp.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

namespace {

// Calls the registered op rather than the kernel function: the dispatcher routes
// to the same CPU kernel, and tracers (torch.jit.trace for the legacy ONNX
// exporter, torch.export for the dynamo one) record the call as
// opbridge::my_add. A direct kernel call would be recorded as a constant.
at::Tensor my_add(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opbridge::my_add", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "opbridge's C++ ops through pybind11 (the same kernels as torch.ops.opbridge).";
  m.def("my_add", &my_add, pybind11::arg("a"), pybind11::arg("b"),
        "my_add(a, b) -> Tensor\n\nReturns 2 * a + b (broadcasting; float32, float64 or float16; CPU).");
  m.attr("TORCH_VERSION") = OPBRIDGE_TORCH_VERSION;
}
