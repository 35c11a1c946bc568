// The CPU ORT kernel of opbridge::MyAdd (my_add.h): kernels/my_add.h on the session's threads.
#include "kernels/my_add.h"

#include "ort/my_add.h"

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
template <>
struct KernelType<Ort::BFloat16_t> {
  using type = kernels::bfloat16;
};

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void my_add(OrtKernelContext* context, const T* a, const T* b, T* out, const kernels::BinaryLoop& loop) {
    using K = typename KernelType<T>::type;
    kernels::my_add(reinterpret_cast<const K*>(a), reinterpret_cast<const K*>(b), reinterpret_cast<K*>(out), loop,
                    SessionThreads(context));
  }
};

void append_my_add(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  my_add_adapter::append<Cpu>(ops);
  // bfloat16 on the CPU only (the CUDA library's MyAdd takes float, double and float16).
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp("MyAdd", Cpu::kProvider, my_add_adapter::compute<Cpu, Ort::BFloat16_t>)));
}

}  // namespace

OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add);

}  // namespace opbridge::ort
