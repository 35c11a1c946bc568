// opbridge._C: the pybind11 module. Loading it also runs the TORCH_LIBRARY
// registrations of every op's file (cpp/torch/<op>.cpp); the Python functions
// those files add with OPBRIDGE_PYTHON_BINDING are defined here.
#include "torch/python_bindings.h"

namespace opbridge::python {

std::vector<Binding>& bindings() {
  // Constructed on first use: the ops' files register during static
  // initialisation, in an order the linker chooses.
  static std::vector<Binding> all;
  return all;
}

}  // namespace opbridge::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "opbridge's C++ ops through pybind11 (the same kernels as torch.ops.opbridge).";
  for (const auto binding : opbridge::python::bindings()) binding(m);
  m.attr("TORCH_VERSION") = OPBRIDGE_TORCH_VERSION;
}
