// The pybind11 module opbridge._C collects the Python functions of every op:
// an op's file adds its own with
//
//   OPBRIDGE_PYTHON_BINDING(my_add, module) { module.def("my_add", ...); }
//
// so that adding an op edits no shared file (module.cpp runs the bindings).
#pragma once

#include <torch/extension.h>

#include <vector>

namespace opbridge::python {

using Binding = void (*)(pybind11::module_& module);

std::vector<Binding>& bindings();

struct AddBinding {
  explicit AddBinding(Binding binding) { bindings().push_back(binding); }
};

}  // namespace opbridge::python

#define OPBRIDGE_PYTHON_BINDING(name, module)                                                                      \
  static void opbridge_python_binding_##name(pybind11::module_& module);                                           \
  static const ::opbridge::python::AddBinding opbridge_python_add_binding_##name{&opbridge_python_binding_##name}; \
  static void opbridge_python_binding_##name(pybind11::module_& module)
