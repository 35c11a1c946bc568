// The ORT CUDA library's mmcv's NonMaxSuppression and mmdeploy's NMSMatch (the launches of every NMS node): the adapter
// of ort/nms.h with a device that queues this op's launches (cuda/nms.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/nms.h"
#include "ort/nms.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void nms(OrtKernelContext* context, const T* boxes, const T* scores, int64_t count, double iou_threshold,
                  int64_t offset, const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, count * 4, stream), s(scores, count, stream);
    check(cuda::nms(b.get(), s.get(), count, iou_threshold, offset, allocate, stream));
  }
  // The thresholds in host memory (the adapter asks for them there).
  template <class T>
  static void nms_match(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch, int64_t classes,
                        int64_t count, const T* iou_threshold, const T* score_threshold,
                        const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, batch * count * 4, stream), s(scores, batch * classes * count, stream);
    check(cuda::nms_match(b.get(), s.get(), batch, classes, count, KernelInput<T>(iou_threshold, 1).get()[0],
                          KernelInput<T>(score_threshold, 1).get()[0], allocate, stream));
  }
};

void append_nms(Ops& ops) {
  nms_adapter::append_nms<Cuda, float>(ops);
  nms_adapter::append_nms<Cuda, double>(ops);
  nms_adapter::append_nms<Cuda, Ort::Float16_t>(ops);
}
void append_nms_match(Ops& ops) {
  nms_adapter::append_nms_match<Cuda, float>(ops);
  nms_adapter::append_nms_match<Cuda, double>(ops);
  nms_adapter::append_nms_match<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, NonMaxSuppression, 1, append_nms);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSMatch, 1, append_nms_match);

}  // namespace opbridge::ort
