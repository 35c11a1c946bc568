// The rotated-detection ops on CUDA, shared by the torch CUDA ops (cpp/cuda/<op>.cu) and the ORT CUDA library
// (cpp/ort/cuda): one thread an overlap (box_iou_rotated), an output bin (roi_align_rotated) or an output pixel
// (rotated_feature_align), each on the CPU kernels' OPBRIDGE_HD arithmetic (box_iou_rotated.h,
// roi_align_rotated.h, rotated_feature_align.h), computed in double as there. The backwards scatter with atomics.
// Each launcher queues its kernels on `stream` and returns the launch's error; buffers come from the caller.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/box_iou_rotated.h"
#include "kernels/cuda_grid.cuh"
#include "kernels/rotated_feature_align.h"

namespace opbridge::kernels::cuda {

// --- box_iou_rotated ---------------------------------------------------------------------------------------------

template <class T>
__global__ void rotated_prepare_kernel(const T* __restrict__ boxes, int64_t count, bool clockwise,
                                       rotated::Polygon* polygons) {
  OPBRIDGE_GRID_LOOP(i, count) polygons[i] = rotated::prepare(boxes + 5 * i, clockwise);
}

template <class T>
__global__ void box_iou_rotated_kernel(const rotated::Polygon* __restrict__ a, const rotated::Polygon* __restrict__ b,
                                       BoxIouRotatedShape shape, int64_t mode, T* __restrict__ out) {
  const int64_t total = shape.aligned ? shape.rows : shape.rows * shape.cols;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t i = shape.aligned ? t : t / shape.cols, j = shape.aligned ? t : t % shape.cols;
    out[t] = static_cast<T>(rotated::overlap(a[i], b[j], mode));
  }
}

// out [rows, cols] (or [rows] aligned); polygons: device buffers of rows and cols prepared boxes.
template <class T>
cudaError_t box_iou_rotated_forward(const T* boxes1, const T* boxes2, T* out, const BoxIouRotatedShape& shape,
                                    int64_t mode, bool clockwise, rotated::Polygon* polygons1,
                                    rotated::Polygon* polygons2, cudaStream_t stream) {
  const int64_t total = shape.aligned ? shape.rows : shape.rows * shape.cols;
  if (total == 0) return cudaSuccess;
  rotated_prepare_kernel<T><<<blocks_for(shape.rows), kThreads, 0, stream>>>(boxes1, shape.rows, clockwise, polygons1);
  rotated_prepare_kernel<T><<<blocks_for(shape.cols), kThreads, 0, stream>>>(boxes2, shape.cols, clockwise, polygons2);
  box_iou_rotated_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(polygons1, polygons2, shape, mode, out);
  return cudaGetLastError();
}

// --- roi_align_rotated --------------------------------------------------------------------------------------------

template <class T>
__global__ void roi_align_rotated_kernel(const T* __restrict__ input,
                                         const roi_align_rotated_detail::Roi* __restrict__ rois, RoiAlignRotatedShape s,
                                         T* __restrict__ out) {
  namespace detail = roi_align_rotated_detail;
  const int64_t bins = s.pooled_height * s.pooled_width, total = s.rois * s.channels * bins;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t bin = t % bins, c = (t / bins) % s.channels, k = t / (bins * s.channels);
    const detail::Roi r = rois[k];
    if (!r.finite) {
      out[t] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    const T* map = input + (r.batch * s.channels + c) * s.height * s.width;
    const int64_t i = bin / s.pooled_width, j = bin % s.pooled_width;
    double sum = 0;
    for (int64_t iy = 0; iy < r.grid_h; ++iy) {
      for (int64_t ix = 0; ix < r.grid_w; ++ix) sum += detail::sample_value(detail::sample_at(r, s, i, j, iy, ix), map);
    }
    out[t] = static_cast<T>(sum / detail::bin_divisor(r));
  }
}

template <class T>
__global__ void roi_align_rotated_backward_kernel(const T* __restrict__ grad_output,
                                                  const roi_align_rotated_detail::Roi* __restrict__ rois,
                                                  RoiAlignRotatedShape s, T* grad_input) {
  namespace detail = roi_align_rotated_detail;
  const int64_t bins = s.pooled_height * s.pooled_width, total = s.rois * s.channels * bins;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t bin = t % bins, c = (t / bins) % s.channels, k = t / (bins * s.channels);
    const detail::Roi r = rois[k];
    if (!r.finite) continue;  // a NaN output: its gradient reaches no pixel
    T* map = grad_input + (r.batch * s.channels + c) * s.height * s.width;
    const int64_t i = bin / s.pooled_width, j = bin % s.pooled_width;
    const double share = grad_output[t] / detail::bin_divisor(r);
    for (int64_t iy = 0; iy < r.grid_h; ++iy) {
      for (int64_t ix = 0; ix < r.grid_w; ++ix) {
        const auto sample = detail::sample_at(r, s, i, j, iy, ix);
        if (!sample.inside) continue;
        for (int corner = 0; corner < 4; ++corner) {
          atomicAdd(map + sample.index[corner], static_cast<T>(share * sample.weight[corner]));
        }
      }
    }
  }
}

// rois: the rois read and checked on the host (read_rotated_rois), in device memory.
template <class T>
cudaError_t roi_align_rotated_forward(const T* input, const roi_align_rotated_detail::Roi* rois, T* out,
                                      const RoiAlignRotatedShape& s, cudaStream_t stream) {
  const int64_t total = s.rois * s.channels * s.pooled_height * s.pooled_width;
  if (total == 0) return cudaSuccess;
  roi_align_rotated_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(input, rois, s, out);
  return cudaGetLastError();
}

// grad_input zeroed by the caller.
template <class T>
cudaError_t roi_align_rotated_backward(const T* grad_output, const roi_align_rotated_detail::Roi* rois, T* grad_input,
                                       const RoiAlignRotatedShape& s, cudaStream_t stream) {
  const int64_t total = s.rois * s.channels * s.pooled_height * s.pooled_width;
  if (total == 0) return cudaSuccess;
  roi_align_rotated_backward_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(grad_output, rois, s, grad_input);
  return cudaGetLastError();
}

// --- rotated_feature_align ----------------------------------------------------------------------------------------

template <class T>
__global__ void rotated_feature_align_kernel(const T* __restrict__ features, const T* __restrict__ boxes,
                                             RotatedFeatureAlignShape s, double scale, T* __restrict__ out) {
  using roi_align_rotated_detail::Sample;
  const int64_t plane = s.height * s.width, total = s.batch * s.channels * plane;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t p = t % plane, n = t / (s.channels * plane);
    const T* map = features + (t - p);
    Sample samples[5];
    if (!rotated_feature_align_detail::box_samples(boxes + (n * plane + p) * 5, s.points, s.height, s.width, scale,
                                                   samples)) {
      out[t] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    double value = map[p];
    for (int64_t i = 0; i < s.points; ++i) value += roi_align_rotated_detail::sample_value(samples[i], map);
    out[t] = static_cast<T>(value);
  }
}

// grad (holding grad_output already: the identity term) += each sample's share at its four pixels.
template <class T>
__global__ void rotated_feature_align_backward_kernel(const T* __restrict__ grad_output, const T* __restrict__ boxes,
                                                      RotatedFeatureAlignShape s, double scale, T* grad) {
  using roi_align_rotated_detail::Sample;
  const int64_t plane = s.height * s.width, total = s.batch * s.channels * plane;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t p = t % plane, n = t / (s.channels * plane);
    Sample samples[5];
    if (!rotated_feature_align_detail::box_samples(boxes + (n * plane + p) * 5, s.points, s.height, s.width, scale,
                                                   samples)) {
      continue;
    }
    const T g = grad_output[t];
    T* map = grad + (t - p);
    for (int64_t i = 0; i < s.points; ++i) {
      if (!samples[i].inside) continue;
      for (int corner = 0; corner < 4; ++corner) {
        atomicAdd(map + samples[i].index[corner], static_cast<T>(g * samples[i].weight[corner]));
      }
    }
  }
}

template <class T>
cudaError_t rotated_feature_align_forward(const T* features, const T* boxes, T* out, const RotatedFeatureAlignShape& s,
                                          double spatial_scale, cudaStream_t stream) {
  const int64_t total = s.batch * s.channels * s.height * s.width;
  if (total == 0) return cudaSuccess;
  rotated_feature_align_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(features, boxes, s, spatial_scale, out);
  return cudaGetLastError();
}

template <class T>
cudaError_t rotated_feature_align_backward(const T* grad_output, const T* boxes, T* grad,
                                           const RotatedFeatureAlignShape& s, double spatial_scale,
                                           cudaStream_t stream) {
  const int64_t total = s.batch * s.channels * s.height * s.width;
  if (total == 0) return cudaSuccess;
  const cudaError_t copied = cudaMemcpyAsync(grad, grad_output, sizeof(T) * total, cudaMemcpyDeviceToDevice, stream);
  if (copied != cudaSuccess) return copied;
  rotated_feature_align_backward_kernel<T>
      <<<blocks_for(total), kThreads, 0, stream>>>(grad_output, boxes, s, spatial_scale, grad);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
