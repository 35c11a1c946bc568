// opbridge._C: the pybind11 module. Loading it also runs the op registrations of every op's file
// (cpp/torch/<op>.cpp); the Python functions those files add with OPBRIDGE_PYTHON_BINDING are defined here.
// python::call_op, the one place where Python tensors meet the registered ops, has an implementation per torch
// layer (cpp/torch/api.h).
#include "torch/python/python.h"

#include <string>

#ifdef OPBRIDGE_TORCH_STABLE
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/tensor.h>

#include <array>

// The stable Python interop of torch >= 2.14 (torch/csrc/stable/pyobject.h) and the message of the last error
// (torch >= 2.13), declared weak: this build targets 2.10, where they do not exist, and uses them where the
// running torch has them. Their signatures are those of torch/csrc/stable/c/shim.h.
extern "C" {
__attribute__((weak)) AOTITorchError torch_tensor_from_pyobject(void* py_obj, AtenTensorHandle* ret);
__attribute__((weak)) AOTITorchError torch_tensor_to_pyobject(AtenTensorHandle ath, void* py_type, void** ret);
__attribute__((weak)) const char* torch_exception_get_what_without_backtrace();
}
#else
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>
#endif

namespace opbridge::python {
namespace py = pybind11;

std::vector<Binding>& bindings() {
  // Constructed on first use: the ops' files register during static
  // initialisation, in an order the linker chooses.
  static std::vector<Binding> all;
  return all;
}

namespace {

[[noreturn]] void not_a_tensor(const char* op, const char* name, py::handle object) {
  throw py::type_error(std::string(op) + ": " + name + " must be a torch.Tensor, got " +
                       py::str(py::type::of(object).attr("__name__")).cast<std::string>());
}

}  // namespace

#ifdef OPBRIDGE_TORCH_STABLE

namespace {

bool has_pyobject_shims() {
  return torch_tensor_from_pyobject != nullptr && torch_tensor_to_pyobject != nullptr &&
         torch_exception_get_what_without_backtrace != nullptr;
}

// torch < 2.14: the registered op through torch.ops (Python's own path to the dispatcher).
py::object call_through_torch_ops(const char* op, std::initializer_list<std::pair<const char*, py::handle>> tensors) {
  const std::string qualified(op);
  const auto separator = qualified.find("::");
  py::object function = py::module_::import("torch")
                            .attr("ops")
                            .attr(qualified.substr(0, separator).c_str())
                            .attr(qualified.substr(separator + 2).c_str());
  py::tuple args(tensors.size());
  size_t i = 0;
  for (const auto& [name, object] : tensors) args[i++] = py::reinterpret_borrow<py::object>(object);
  return function(*args);
}

// The error of a failed shim call. A Python exception (raised by the op's autograd formula, for example) is
// re-raised as it is; otherwise torch's message of the C++ exception, which for an error that passed through
// Python carries a formatted traceback ("RuntimeError: <message>\n\nAt:\n...") that is cut off.
[[noreturn]] void raise_last_error() {
  if (PyErr_Occurred()) throw py::error_already_set();
  std::string message = torch_exception_get_what_without_backtrace();
  if (const auto at = message.find("\n\nAt:\n"); at != std::string::npos) message.resize(at);
  if (const std::string prefix = "RuntimeError: "; message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  throw std::runtime_error(message);
}

}  // namespace

py::object call_op(const char* op, std::initializer_list<std::pair<const char*, py::handle>> tensors) {
  static const py::handle tensor_type = py::object(py::module_::import("torch").attr("Tensor")).release();
  for (const auto& [name, object] : tensors) {
    if (!py::isinstance(object, tensor_type)) not_a_tensor(op, name, object);
  }
  if (!has_pyobject_shims()) return call_through_torch_ops(op, tensors);
  // torch >= 2.14: Python tensors to stable tensors (the same TensorImpl) and back, the op through the
  // dispatcher. The stack holds the arguments, then the result.
  std::vector<StableIValue> stack;
  for (const auto& [name, object] : tensors) {
    AtenTensorHandle handle = nullptr;
    if (torch_tensor_from_pyobject(object.ptr(), &handle) != TORCH_SUCCESS) not_a_tensor(op, name, object);
    stack.push_back(torch::stable::detail::from(handle));  // owned by the stack, released by the call
  }
  if (torch_call_dispatcher(op, "", stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS) raise_last_error();
  const auto result = torch::stable::detail::to<torch::stable::Tensor>(stack[0]);
  void* object = nullptr;
  if (torch_tensor_to_pyobject(result.get(), nullptr, &object) != TORCH_SUCCESS) raise_last_error();
  return py::reinterpret_steal<py::object>(static_cast<PyObject*>(object));
}

const char* call_path() {
  return has_pyobject_shims() ? "stable pyobject conversions (torch >= 2.14)" : "torch.ops (torch < 2.14)";
}

#else

py::object call_op(const char* op, std::initializer_list<std::pair<const char*, py::handle>> tensors) {
  torch::jit::Stack stack;
  for (const auto& [name, object] : tensors) {
    if (!THPVariable_Check(object.ptr())) not_a_tensor(op, name, object);
    stack.emplace_back(THPVariable_Unpack(object.ptr()));
  }
  c10::Dispatcher::singleton().findSchemaOrThrow(op, "").callBoxed(stack);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(stack.at(0).toTensor()));
}

const char* call_path() { return "torch's pybind11 tensor casters (classic build)"; }

#endif

}  // namespace opbridge::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "opbridge's C++ ops through pybind11 (the same kernels as torch.ops.opbridge).";
  for (const auto binding : opbridge::python::bindings()) binding(m);
  m.attr("TORCH_VERSION") = OPBRIDGE_TORCH_VERSION;
#ifdef OPBRIDGE_TORCH_STABLE
  m.attr("TORCH_ABI") = "stable";
#else
  m.attr("TORCH_ABI") = "classic";
#endif
  m.attr("PYTHON_CALL_PATH") = opbridge::python::call_path();
}
