// The pybind11 module opbridge._C collects the Python functions of the ops: an op's binding file
// (cpp/torch/python/<op>.cpp, beside the op's cpp/torch/<op>.cpp, which stays free of Python) adds its own with
//
//   OPBRIDGE_PYTHON_BINDING(my_add, module) { module.def("my_add", ...); }
//
// so that adding an op edits no shared file (module.cpp runs the bindings). A binding calls the registered op
// with python::call_op, never the kernel: the dispatcher routes to the same CPU kernel, autograd applies, and
// tracers (torch.jit.trace for the legacy ONNX exporter, torch.export for the dynamo one) record the call as the
// op; a direct kernel call would be recorded as a constant.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace opbridge::python {

using Binding = void (*)(pybind11::module_& module);

std::vector<Binding>& bindings();

struct AddBinding {
  explicit AddBinding(Binding binding) { bindings().push_back(binding); }
};

// Calls the registered op `op` ("opbridge::my_add", default overload, one Tensor result) with Python tensors
// given as (argument name, object) and returns the result as a Python tensor. A non-tensor argument raises
// TypeError naming the function and the argument.
pybind11::object call_op(const char* op, std::initializer_list<std::pair<const char*, pybind11::handle>> tensors);

// How call_op reaches the op in this build (opbridge._C.PYTHON_CALL_PATH).
const char* call_path();

}  // namespace opbridge::python

#define OPBRIDGE_PYTHON_BINDING(name, module)                                                                      \
  static void opbridge_python_binding_##name(pybind11::module_& module);                                           \
  static const ::opbridge::python::AddBinding opbridge_python_add_binding_##name{&opbridge_python_binding_##name}; \
  static void opbridge_python_binding_##name(pybind11::module_& module)
