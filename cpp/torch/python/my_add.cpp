// opbridge._C.my_add: the tutorial's pybind11 binding of opbridge::my_add (the op: cpp/torch/my_add.cpp). It
// calls the registered op through the dispatcher (python::call_op), so this file needs none of the op's code.
#include "torch/python/python.h"

namespace opbridge {

OPBRIDGE_PYTHON_BINDING(my_add, module) {
  module.def(
      "my_add",
      [](pybind11::handle a, pybind11::handle b) { return python::call_op("opbridge::my_add", {{"a", a}, {"b", b}}); },
      pybind11::arg("a"), pybind11::arg("b"),
      "my_add(a, b) -> Tensor\n\nReturns 2 * a + b (broadcasting; float32, float64, float16 or bfloat16; CPU).");
}

}  // namespace opbridge
