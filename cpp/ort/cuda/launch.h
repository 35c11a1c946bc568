// The ORT CUDA library's kernel launches (launch.cu, compiled by nvcc; the kernels are kernels/<op>.cuh's, as in
// the torch CUDA ops), callable from the adapters in plain C++. Each returns nullptr once the kernel is queued on
// `stream`, or a message saying why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <string>
#include <vector>

#include "kernels/box_iou_rotated.h"
#include "kernels/broadcast.h"
#include "kernels/carafe.h"
#include "kernels/cumulative.h"
#include "kernels/deform_conv2d.h"
#include "kernels/grid_sample_taps.h"
#include "kernels/masked_conv2d.h"
#include "kernels/ms_deform_attn.h"
#include "kernels/psa_mask.h"
#include "kernels/rotated_feature_align.h"

namespace opbridge::ort::cuda {

// `bytes` of stream-ordered device memory (cudaMallocAsync on `stream`), freed on the same stream when it goes, so
// after the kernels queued before that. error(): null, or why it could not be had.
class DeviceScratch {
 public:
  DeviceScratch(size_t bytes, void* stream);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  template <class U>
  U* get() const {
    return static_cast<U*>(data_);
  }
  const char* error() const { return error_; }

 private:
  void* data_ = nullptr;
  void* stream_;
  const char* error_ = nullptr;
};

// float16 bits <-> float32 in device memory, kernels/float16.h's conversions (the CPU library's: round to nearest
// even, NaN kept quiet).
const char* widen_float16(const uint16_t* in, float* out, int64_t count, void* stream);
const char* narrow_float16(const float* in, uint16_t* out, int64_t count, void* stream);

// Whether this process can run the library's kernels: empty where the NVIDIA driver supports CUDA >= the major
// release of the runtime linked into the library (CUDA's minor-version compatibility), "no driver" where there
// is none, else a sentence naming both versions and what to do.
std::string driver_problem();

// T: float or double; my_add, ms_deform_attn and grid_sample also float16 as uint16_t bits.
template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream);

// The level table (spatial_shapes, level_start_index) in host memory, checked by check_ms_deform_attn.
template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream);

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream);

template <class T>
const char* grid_sample(const T* input, const T* grid, T* out, const kernels::GridSampleShape& shape,
                        const kernels::GridSampleAttributes& attributes, void* stream);

// The rois read and checked on the host; copied to the device here (stream-ordered memory, freed after the kernel).
template <class T>
const char* roi_align_rotated(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                              const kernels::RoiAlignRotatedShape& shape, void* stream);

template <class T>
const char* roi_align(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                      const kernels::RoiAlignRotatedShape& shape, bool max_pool, void* stream);

template <class T>
const char* rotated_feature_align(const T* features, const T* boxes, T* out,
                                  const kernels::RotatedFeatureAlignShape& shape, double spatial_scale, void* stream);

template <class T>
const char* box_iou_rotated(const T* boxes1, const T* boxes2, T* out, const kernels::BoxIouRotatedShape& shape,
                            int64_t mode, bool clockwise, void* stream);

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

// Running extremes (mmcv's cummax, cummin, MMCVCornerPool): max or min, from the far end when `reverse`; indices
// may be null. T: float, double or int64_t.
template <class T>
const char* cumulative_extreme(const T* input, T* values, int64_t* indices, const kernels::CumulativeShape& shape,
                               bool max, bool reverse, void* stream);

// mmcv's PSAMask: out [N, H * W, H, W], every element written.
template <class T>
const char* psa_mask(const T* input, T* out, const kernels::PsaMaskShape& shape, void* stream);

// mmcv's CARAFE: out [N, C, H * s, W * s].
template <class T>
const char* carafe(const T* features, const T* masks, T* out, const kernels::CarafeShape& shape, void* stream);

// mmcv's MaskedConv2d: out [O, Ho, Wo] zeroed, then the masked positions (flat h * W + w, read and checked on the
// host; copied to the device here) computed. bias may be null.
template <class T>
const char* masked_conv2d(const T* features, const std::vector<int64_t>& positions, const T* weight, const T* bias,
                          T* out, const kernels::MaskedConv2dShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
