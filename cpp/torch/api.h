// The small torch layer every op adapter (cpp/torch/<op>.cpp) is written against: tensors and their checks,
// allocation, parallel-for, the GEMM, op registration and the pybind11 call path. Two implementations:
//
//   api_stable.h   the LibTorch stable ABI (torch/csrc/stable, TORCH_TARGET_VERSION 2.10, TORCH_STABLE_ONLY):
//                  one build loads on every torch >= 2.10;
//   api_classic.h  ATen and TORCH_LIBRARY: a build for exactly one torch (the wheels of torch < 2.10).
//
// CMake picks one (OPBRIDGE_TORCH_STABLE) by the torch it builds against. An adapter uses only what this file
// declares, so it compiles unchanged against both: an op's file is written once.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifdef OPBRIDGE_TORCH_STABLE
#include "torch/api_stable.h"
#else
#include "torch/api_classic.h"
#endif

namespace opbridge::api {

// What an implementation provides (see the two headers):
//   Tensor, ScalarType, IntList (the parameter type of `int[]`), kFloat / kDouble / kHalf / kLong
//   std::vector<int64_t> sizes(const Tensor&), strides(const Tensor&)
//   bool is_cpu(const Tensor&), is_strided(const Tensor&); std::string device_name(const Tensor&)
//   Tensor empty(shape, dtype), zeros(shape, dtype)   (CPU, contiguous)
//   bool same_device(a, b); int32_t device_index(t); Tensor to_cpu(t)
//   Tensor empty_on(shape, dtype, like), zeros_on(shape, dtype, like)   (contiguous, on like's device)
//   Tensor contiguous(const Tensor&), to(const Tensor&, ScalarType)
//   void parallel_for(int64_t tasks, task)   task(t) for t in [0, tasks), on torch's intra-op threads
//   gemm<T>()   c[m, n] = a[m, k] * b[n, k]^T through torch's BLAS, on the calling thread
//   OPBRIDGE_FAIL(message)   throws the error torch turns into a Python RuntimeError
//   OPBRIDGE_LIBRARY_FRAGMENT(m) { m.def(schema); }   OPBRIDGE_LIBRARY_IMPL_CPU(m) { OPBRIDGE_IMPL(m, name, fn); }
//   python::call_op("ns::op", {python tensors...})   the registered op called from pybind11 (see python.h)

// A shape for messages: "[2, 3, 4]".
struct Shape {
  std::vector<int64_t> values;
};
inline std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << '[';
  for (size_t i = 0; i < shape.values.size(); ++i) out << (i ? ", " : "") << shape.values[i];
  return out << ']';
}
inline Shape shape_of(const Tensor& tensor) { return {sizes(tensor)}; }

// Python's names for dtypes, as users write them.
inline const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float:
      return "torch.float32";
    case ScalarType::Double:
      return "torch.float64";
    case ScalarType::Half:
      return "torch.float16";
    case ScalarType::BFloat16:
      return "torch.bfloat16";
    case ScalarType::Long:
      return "torch.int64";
    case ScalarType::Int:
      return "torch.int32";
    case ScalarType::Short:
      return "torch.int16";
    case ScalarType::Char:
      return "torch.int8";
    case ScalarType::Byte:
      return "torch.uint8";
    case ScalarType::Bool:
      return "torch.bool";
    case ScalarType::ComplexFloat:
      return "torch.complex64";
    case ScalarType::ComplexDouble:
      return "torch.complex128";
    default:
      return "a dtype other than float16/32/64, bfloat16, integers, bool and complex";
  }
}
inline bool is_integral(ScalarType dtype) {
  return dtype == ScalarType::Long || dtype == ScalarType::Int || dtype == ScalarType::Short ||
         dtype == ScalarType::Char || dtype == ScalarType::Byte;
}

// float16 and bfloat16 are storage types to the ops: they compute in float32 (accumulating in float32) and round
// once to the storage type at the end, as torch's own half kernels do (docs/api.md, "Precision and autocast").
inline bool is_half(ScalarType dtype) { return dtype == ScalarType::Half || dtype == ScalarType::BFloat16; }
// The floating dtypes every op takes.
inline bool is_float_storage(ScalarType dtype) {
  return dtype == ScalarType::Float || dtype == ScalarType::Double || is_half(dtype);
}
inline constexpr const char* kFloatStorageNames = "float32, float64, float16 or bfloat16";
// Whether a precision-critical input (sampling locations, offsets, masks, boxes) of dtype `other` may accompany the
// op's main input of dtype `primary`: the same dtype, or float32 beside float16/bfloat16 (what autocast gives them:
// a bfloat16 location on a 1333-pixel map is up to 2.6 pixels off).
inline bool pairs_with(ScalarType primary, ScalarType other) {
  return other == primary || (is_half(primary) && other == ScalarType::Float);
}
// A float16/bfloat16 tensor as float32; any other unchanged.
inline Tensor widened(const Tensor& tensor) {
  return is_half(tensor.scalar_type()) ? to(tensor, ScalarType::Float) : tensor;
}
inline std::optional<Tensor> widened(const std::optional<Tensor>& tensor) {
  return tensor ? std::optional<Tensor>(widened(*tensor)) : std::nullopt;
}

template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// f(T{}) with T the C++ type of a float32 or float64 dtype; other dtypes are the caller's to refuse first.
template <class F>
void dispatch_floating(ScalarType dtype, const char* op, const F& f) {
  if (dtype == ScalarType::Float) return f(float{});
  if (dtype == ScalarType::Double) return f(double{});
  OPBRIDGE_FAIL(str(op, ": expected float32 or float64 tensors, got ", dtype_name(dtype)));
}

template <class T>
T* data(Tensor& tensor) {
  return static_cast<T*>(tensor.mutable_data_ptr());
}
template <class T>
const T* data(const Tensor& tensor) {
  return static_cast<const T*>(tensor.const_data_ptr());
}

}  // namespace opbridge::api

// OPBRIDGE_CHECK(condition, message parts...): a failed check raises RuntimeError(message) in Python; the parts
// are streamed (strings, numbers, api::Shape, api::dtype_name(...)).
#define OPBRIDGE_CHECK(condition, ...)                                  \
  do {                                                                  \
    if (!(condition)) OPBRIDGE_FAIL(::opbridge::api::str(__VA_ARGS__)); \
  } while (false)
