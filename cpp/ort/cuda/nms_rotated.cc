// The ORT CUDA library's NmsRotated and mmdeploy's NMSRotated (their launches are in nms.cu): the adapter of ort/nms.h
// with a device that queues this op's launches (cuda/nms.h) on the session's CUDA stream (cuda/device.h).
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
  static void nms_rotated(OrtKernelContext* context, const T* boxes, const T* scores, const int64_t* labels,
                          int64_t count, double iou_threshold, bool clockwise, const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, count * 5, stream), s(scores, count, stream);
    check(cuda::nms_rotated(b.get(), s.get(), labels, count, iou_threshold, clockwise, allocate, stream));
  }
  template <class T>
  static void batched_nms_rotated(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch,
                                  int64_t classes, int64_t count, double iou_threshold, double score_threshold,
                                  const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, batch * count * 5, stream), s(scores, batch * classes * count, stream);
    check(cuda::batched_nms_rotated(b.get(), s.get(), batch, classes, count, iou_threshold, score_threshold, allocate,
                                    stream));
  }
};

void append_nms_rotated(Ops& ops) {
  nms_adapter::append_nms_rotated<Cuda, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>(ops);
  nms_adapter::append_nms_rotated<Cuda, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>(ops);
  nms_adapter::append_nms_rotated<Cuda, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>(ops);
}
void append_mmdeploy_nms_rotated(Ops& ops) {
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, float>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, double>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(NmsRotated, 1, append_nms_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSRotated, 1, append_mmdeploy_nms_rotated);

}  // namespace opbridge::ort
