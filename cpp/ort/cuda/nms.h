// The ORT CUDA library's launches of mmcv's NonMaxSuppression and mmdeploy's NMSMatch (the launches of every NMS node)
// (nms.cu, compiled by nvcc), callable from the adapters in plain C++ (nms.cc, nms_rotated.cc). Each returns nullptr
// once the kernel is queued on `stream`, or why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// Hard NMS: the kept indices (decreasing score order) go to `allocate(kept)`, the output in device memory, once
// their number is known (the call waits for the stream once). `boxes`, `scores` (and `labels`, null for one group)
// in device memory; count >= 1. mmcv's NonMaxSuppression (boxes [count, 4], offset 0 or 1) and opbridge's
// NmsRotated (boxes [count, 5]).
template <class T>
const char* nms(const T* boxes, const T* scores, int64_t count, double iou_threshold, int64_t offset,
                const std::function<int64_t*(int64_t)>& allocate, void* stream);

template <class T>
const char* nms_rotated(const T* boxes, const T* scores, const int64_t* labels, int64_t count, double iou_threshold,
                        bool clockwise, const std::function<int64_t*(int64_t)>& allocate, void* stream);

// mmdeploy's NMSRotated: boxes [batch, count, 5], scores [batch, classes, count] in device memory; per (batch,
// class), the boxes whose score is > score_threshold suppressed among themselves (clockwise angles). The rows
// (batch, class, box), in batch, class, then decreasing score order, go to `allocate(rows)` (rows x 3 int64, device
// memory) once their number is known (the call waits for the stream once).
template <class T>
const char* batched_nms_rotated(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count,
                                double iou_threshold, double score_threshold,
                                const std::function<int64_t*(int64_t)>& allocate, void* stream);

// mmdeploy's NMSMatch: boxes [batch, count, 4] (x1, y1, x2, y2), scores [batch, classes, count] in device memory;
// per (batch, class), greedy suppression over every box (IoU >= iou_threshold, kernels/nms.h's arithmetic); a kept
// box whose score is > score_threshold gives a row (batch, class, kept, suppressed) per box it suppressed. The rows,
// in batch, class, kept box's and suppressed box's score order, go to `allocate(rows)` (rows x 4 int64, device
// memory) once their number is known (the call waits for the stream twice).
template <class T>
const char* nms_match(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count, T iou_threshold,
                      T score_threshold, const std::function<int64_t*(int64_t)>& allocate, void* stream);

}  // namespace opbridge::ort::cuda
