// The ORT CUDA library's MyAdd: float, double and float16 (native loops): the adapter of ort/my_add.h with a device
// that queues this op's launches (cuda/my_add.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/my_add.h"
#include "ort/my_add.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void my_add(OrtKernelContext* context, const T* a, const T* b, T* out, const kernels::BinaryLoop& loop) {
    using B = typename Bits<T>::type;
    check(cuda::my_add(reinterpret_cast<const B*>(a), reinterpret_cast<const B*>(b), reinterpret_cast<B*>(out), loop,
                       stream_of(context)));
  }
};

void append_my_add(Ops& ops) { my_add_adapter::append<Cuda>(ops); }

}  // namespace

OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add);

}  // namespace opbridge::ort
