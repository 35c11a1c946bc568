// Shared plumbing of the ORT adapters: the negotiated API, error statuses, and
// the session's intra-op thread pool as a parallel_for for the kernels.
#pragma once

// No link to libonnxruntime: RegisterCustomOps receives the API from the runtime.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_lite_custom_op.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/float16.h"
#include "kernels/half_convert.h"
#include "kernels/scratch.h"

namespace opbridge::ort {

// The OrtApi version agreed with the runtime (see register.cc).
int api_version();

inline Ort::Status invalid_argument(const std::string& message) {
  return Ort::Status(message.c_str(), ORT_INVALID_ARGUMENT);
}

inline Ort::Status from_kernel(const kernels::Status& status) {
  return status.ok() ? Ort::Status(nullptr) : invalid_argument(status.message);
}

// float16 and bfloat16 nodes on the CPU: the kernels compute in float32 on widened copies of the inputs and the
// output is rounded once, as the torch ops do with half storage (cpp/torch/api.h, is_half). Ort::Float16_t holds
// the binary16 bits, Ort::BFloat16_t the bfloat16 bits (the top half of a float32).
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, Ort::Float16_t> || std::is_same_v<T, Ort::BFloat16_t>;
// The kernels' element type for a node's element type: the half types are computed in float32.
template <class T>
struct KernelTypeOf {
  using type = T;
};
template <>
struct KernelTypeOf<Ort::Float16_t> {
  using type = float;
};
template <>
struct KernelTypeOf<Ort::BFloat16_t> {
  using type = float;
};
template <class T>
using kernel_type = typename KernelTypeOf<T>::type;

// to[i] = the float value of half from[i] (exact), for i < count.
template <class T>
inline void widen_half(const T* from, float* to, int64_t count) {
  static_assert(is_half_v<T>, "float16 or bfloat16");
  const auto* bits = reinterpret_cast<const uint16_t*>(from);
  if constexpr (std::is_same_v<T, Ort::Float16_t>) {
    kernels::float16_to_float(bits, to, count);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(to + i, &word, sizeof word);
    }
  }
}

// to[i] = from[i] rounded once to half (to nearest even; NaN stays NaN), for i < count.
template <class T>
inline void round_to_half(const float* from, T* to, int64_t count) {
  static_assert(is_half_v<T>, "float16 or bfloat16");
  if constexpr (std::is_same_v<T, Ort::Float16_t>) {
    kernels::float_to_float16(from, reinterpret_cast<uint16_t*>(to), count);
  } else {
    kernels::round_to_bf16(reinterpret_cast<kernels::BFloat16*>(to), from, count);
  }
}

inline int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t size : shape) count *= size;
  return count;
}

// The float32 copies of float16 nodes, kept by the thread from call to call (kernels/scratch.h: fresh memory costs
// a page fault per 4 KiB, 20 ms on the 800x1333 encoder's 75 MB of copies), apart from the kernels' own scratch.
struct HalfCopies;
using HalfScratch = kernels::BasicThreadScratch<HalfCopies, 6>;

// An input's data as a kernel reads it: the tensor's own, or a float32 copy of a float16 or bfloat16 tensor.
template <class T>
class KernelInput {
 public:
  explicit KernelInput(const Ort::Custom::Tensor<T>& tensor)
      : KernelInput(tensor.Data(), element_count(tensor.Shape())) {}
  KernelInput(const T* data, int64_t count) : copy_(is_half_v<T> ? bytes_of(count) : 0) {
    if constexpr (is_half_v<T>) {
      widen_half(data, copy_.get<float>(), std::max<int64_t>(count, 0));
      data_ = copy_.get<float>();
    } else {
      data_ = data;
      (void)count;
    }
  }
  KernelInput(const KernelInput&) = delete;  // data_ may point into copy_
  KernelInput& operator=(const KernelInput&) = delete;
  const kernel_type<T>* get() const { return data_; }

 private:
  static size_t bytes_of(int64_t count) { return static_cast<size_t>(std::max<int64_t>(count, 0)) * sizeof(float); }
  HalfScratch copy_;
  const kernel_type<T>* data_ = nullptr;
};

// An output as a kernel writes it: the tensor's own memory, or a float32 buffer that finish() rounds into the
// float16 or bfloat16 tensor.
template <class T>
class KernelOutput {
 public:
  KernelOutput(T* out, int64_t count)
      : out_(out),
        count_(std::max<int64_t>(count, 0)),
        copy_(is_half_v<T> ? static_cast<size_t>(count_) * sizeof(float) : 0) {
    if constexpr (is_half_v<T>) {
      data_ = copy_.get<float>();
    } else {
      data_ = out;
    }
  }
  KernelOutput(const KernelOutput&) = delete;  // data_ may point into copy_
  KernelOutput& operator=(const KernelOutput&) = delete;
  kernel_type<T>* get() { return data_; }
  void finish() {
    if constexpr (is_half_v<T>) round_to_half(copy_.get<float>(), out_, count_);
  }

 private:
  T* out_;
  int64_t count_;
  HalfScratch copy_;
  kernel_type<T>* data_ = nullptr;
};

// Runs an op body, turning exceptions into an error status: nothing may unwind
// through ONNX Runtime's C interface.
template <class Body>
Ort::Status guarded(const char* op, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& error) {
    return Ort::Status((std::string(op) + ": " + error.what()).c_str(), ORT_RUNTIME_EXCEPTION);
  } catch (...) {
    return Ort::Status((std::string(op) + ": unknown error").c_str(), ORT_RUNTIME_EXCEPTION);
  }
}

// Node attributes, read in a kernel's constructor. An absent attribute gives `fallback` (the node's default);
// one of another type, or out of range, throws an error naming the op and the attribute, which the runtime
// reports when it creates the session (complete_op turns it into a status). The runtime words absence as
// "No attribute with name ..." or "No attribute with this name ..." depending on its version.
namespace attribute_detail {
inline bool absent(const OrtApi* api, OrtStatus* status, const char* op, const char* name, const char* expected) {
  if (status == nullptr) return false;
  const std::string message = api->GetErrorMessage(status);
  api->ReleaseStatus(status);
  if (message.find("No attribute with") != std::string::npos) return true;
  throw std::invalid_argument(std::string(op) + ": attribute '" + name + "' must be " + expected + " (" + message +
                              ")");
}
}  // namespace attribute_detail

inline int64_t int_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* name,
                             int64_t fallback) {
  int64_t value = fallback;
  const bool absent =
      attribute_detail::absent(api, api->KernelInfoGetAttribute_int64(info, name, &value), op, name, "an integer");
  return absent ? fallback : value;
}

// An int attribute that must be 0 or 1 (ONNX has no bool attributes).
inline bool bool_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* name,
                           bool fallback) {
  const int64_t value = int_attribute(api, info, op, name, fallback ? 1 : 0);
  if (value != 0 && value != 1) {
    throw std::invalid_argument(std::string(op) + ": attribute '" + name + "' must be 0 or 1, got " +
                                std::to_string(value));
  }
  return value == 1;
}

inline float float_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* name,
                             float fallback) {
  float value = fallback;
  const bool absent =
      attribute_detail::absent(api, api->KernelInfoGetAttribute_float(info, name, &value), op, name, "a float");
  return absent ? fallback : value;
}

inline std::string string_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* name,
                                    std::string fallback) {
  size_t size = 0;
  if (attribute_detail::absent(api, api->KernelInfoGetAttribute_string(info, name, nullptr, &size), op, name,
                               "a string")) {
    return fallback;
  }
  std::string value(size, '\0');  // size counts the terminating NUL
  if (size > 0) {
    attribute_detail::absent(api, api->KernelInfoGetAttribute_string(info, name, value.data(), &size), op, name,
                             "a string");
    value.resize(size > 0 ? size - 1 : 0);
  }
  return value;
}

inline std::vector<int64_t> ints_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op,
                                           const char* name, std::vector<int64_t> fallback) {
  size_t size = 0;
  if (attribute_detail::absent(api, api->KernelInfoGetAttributeArray_int64(info, name, nullptr, &size), op, name,
                               "a list of integers")) {
    return fallback;
  }
  std::vector<int64_t> values(size);
  if (size > 0) {
    attribute_detail::absent(api, api->KernelInfoGetAttributeArray_int64(info, name, values.data(), &size), op, name,
                             "a list of integers");
  }
  return values;
}

// A list of ints that may also be written as one int (mmcv's symbolics write `name_i=value` with whatever the
// model passed): one int gives `repeat` copies of it.
inline std::vector<int64_t> int_or_ints_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op,
                                                  const char* name, std::vector<int64_t> fallback, size_t repeat) {
  int64_t single = 0;
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, name, &single)) {
    api->ReleaseStatus(status);  // absent, or a list: read below
  } else {
    return std::vector<int64_t>(repeat, single);
  }
  return ints_attribute(api, info, op, name, std::move(fallback));
}

// An optional input, absent when the node has fewer inputs or an empty name there (the lite API's optional
// tensors dereference an omitted input: read optional inputs through this).
inline std::optional<Ort::ConstValue> optional_input(Ort::KernelContext& context, size_t index) {
  if (context.GetInputCount() > index && context.GetInput(index)) return context.GetInput(index);
  return std::nullopt;
}

// The kernels' parallel_for over the session's intra-op threads (so
// intra_op_num_threads is honoured). KernelContext_ParallelFor exists from API
// 17 (ORT 1.17); on ORT 1.16 the tasks run on the calling thread.
class SessionThreads {
 public:
  explicit SessionThreads(OrtKernelContext* context) : context_(context) {}

  template <class Task>
  void operator()(int64_t tasks, const Task& task) const {
    if (api_version() < 17) {
      for (int64_t t = 0; t < tasks; ++t) task(t);
      return;
    }
    // Nothing may unwind through the runtime's thread pool: the first exception
    // of any task is kept and rethrown here, on the calling thread.
    struct Call {
      const Task& task;
      std::once_flag once;
      std::exception_ptr error;
    } call{task, {}, nullptr};
    auto trampoline = [](void* data, size_t index) {
      auto& call = *static_cast<Call*>(data);
      try {
        call.task(static_cast<int64_t>(index));
      } catch (...) {
        std::call_once(call.once, [&] { call.error = std::current_exception(); });
      }
    };
    Ort::KernelContext(context_).ParallelFor(trampoline, static_cast<size_t>(tasks), 0, &call);
    if (call.error) std::rethrow_exception(call.error);
  }

 private:
  OrtKernelContext* context_;
};

// Completes an op made by the lite API so that every supported runtime can use it:
// - The lite API declares every input and output optional, so a node that omits
//   one (an empty input name) would reach the kernel and dereference a null value.
//   Inputs are declared required, except those whose bit is set in
//   `OptionalInputs`; the runtime then rejects such models when it loads them.
// - For status-returning kernels the lite API fills CreateKernel but not
//   CreateKernelV2, and ORT 1.16 calls CreateKernelV2 unconditionally once an op
//   declares API 16: it is provided here, turning exceptions into a status.
template <uint64_t OptionalInputs = 0>
Ort::Custom::OrtLiteCustomOp* complete_op(Ort::Custom::OrtLiteCustomOp* op) {
  op->GetInputCharacteristic = [](const OrtCustomOp*, size_t index) {
    return index < 64 && ((OptionalInputs >> index) & 1) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  op->GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  if (op->CreateKernelV2 == nullptr) {
    op->CreateKernelV2 = [](const OrtCustomOp* self, const OrtApi* api, const OrtKernelInfo* info,
                            void** kernel) -> OrtStatusPtr {
      try {
        *kernel = self->CreateKernel(self, api, info);
        return nullptr;
      } catch (const std::exception& error) {
        return api->CreateStatus(ORT_RUNTIME_EXCEPTION, error.what());
      }
    };
  }
  return op;
}

// The library's op list. Each op's file adds itself, so adding an op edits no
// shared file:
//
//   void append_my_add(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { ... }  // one per element type
//   OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add)
//
// The registrations run when the library is loaded; RegisterCustomOps creates the
// ops once it has negotiated the API version (creating them needs the API).
using OpFactory = void (*)(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops);

struct OpRegistration {
  const char* domain;   // "opbridge", or another project's domain whose nodes the op also runs
  const char* op_type;  // the node's op_type in that domain
  int since_version;    // the domain version that introduced it
  OpFactory append;
};

std::vector<OpRegistration>& registered_ops();

struct RegisterOp {
  RegisterOp(const char* domain, const char* op_type, int since_version, OpFactory append) {
    registered_ops().push_back({domain, op_type, since_version, append});
  }
};

}  // namespace opbridge::ort

// Also leaves "opbridge-ort-op:<OpType>:<version>" in the library's read-only data:
// opbridge_ort.ops() reads the op list from the file, without loading it into a runtime.
#define OPBRIDGE_ORT_OP(OpType, Version, Append)                                                                 \
  static const ::opbridge::ort::RegisterOp opbridge_ort_register_##OpType{"opbridge", #OpType, Version, Append}; \
  [[gnu::used]] static const char opbridge_ort_marker_##OpType[] = "opbridge-ort-op:" #OpType ":" #Version

// The same for a node another project's exporter writes (e.g. mmcv::MMCVModulatedDeformConv2d), so that
// models it exported run on the library too; marker "opbridge-ort-foreign-op:<Domain>:<OpType>:<version>".
#define OPBRIDGE_ORT_FOREIGN_OP(Domain, OpType, Version, Append)                                                \
  static const ::opbridge::ort::RegisterOp opbridge_ort_register_##Domain##_##OpType{#Domain, #OpType, Version, \
                                                                                     Append};                   \
  [[gnu::used]] static const char opbridge_ort_marker_##Domain##_##OpType[] =                                   \
      "opbridge-ort-foreign-op:" #Domain ":" #OpType ":" #Version

namespace opbridge::ort {}  // namespace opbridge::ort
