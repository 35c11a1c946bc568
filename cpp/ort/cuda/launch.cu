// The ORT CUDA library's launches (launch.h) of the shared CUDA kernels (kernels/<op>.cuh).
#include "ort/cuda/launch.h"

#include <cuda_fp16.h>

#include "kernels/deform_conv2d.cuh"
#include "kernels/grid_sample.cuh"
#include "kernels/ms_deform_attn.cuh"
#include "kernels/my_add.cuh"
#include "kernels/nms.cuh"
#include "kernels/roi_align.cuh"
#include "kernels/rotated.cuh"

namespace opbridge::ort::cuda {
namespace {

const char* message(cudaError_t error) { return error == cudaSuccess ? nullptr : cudaGetErrorString(error); }

template <class T>
struct Device {
  using type = T;
};
template <>
struct Device<uint16_t> {
  using type = __half;
};

}  // namespace

std::string driver_problem() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) return "no driver";
  if (driver / 1000 >= CUDART_VERSION / 1000) return {};
  auto release = [](int version) { return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10); };
  return "the NVIDIA driver supports CUDA " + release(driver) + ", but libopbridge_ort_cuda.so is built with CUDA " +
         release(CUDART_VERSION) + " and needs a driver for CUDA >= " + std::to_string(CUDART_VERSION / 1000) +
         ".0 (R580 or newer for CUDA 13). Update the driver, or build opbridge-ort from source with this machine's "
         "CUDA toolkit (docs/packaging.md)";
}

template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream) {
  if (!kernels::cuda::my_add_fits(loop)) return "more than 16 dimensions after merging broadcast ones";
  using D = typename Device<T>::type;
  using Acc = std::conditional_t<std::is_same_v<D, double>, double, float>;
  return message(kernels::cuda::my_add<D, Acc>(reinterpret_cast<const D*>(a), reinterpret_cast<const D*>(b),
                                               reinterpret_cast<D*>(out), loop, static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream) {
  if (const char* unsupported = kernels::cuda::ms_deform_attn_unsupported(shape)) return unsupported;
  kernels::cuda::MSDeformAttnTable table;
  kernels::cuda::ms_deform_attn_levels(shape, spatial_shapes, level_start_index, table.levels);
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::ms_deform_attn_forward(
      reinterpret_cast<const D*>(value), reinterpret_cast<const D*>(locations), reinterpret_cast<const D*>(weights),
      reinterpret_cast<D*>(out), shape, table, static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream) {
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::deform_conv2d_forward(
      reinterpret_cast<const D*>(input), reinterpret_cast<const D*>(weight), reinterpret_cast<const D*>(offset),
      reinterpret_cast<const D*>(mask), reinterpret_cast<const D*>(bias), shape, reinterpret_cast<D*>(out),
      static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* grid_sample(const T* input, const T* grid, T* out, const kernels::GridSampleShape& shape,
                        const kernels::GridSampleAttributes& attributes, void* stream) {
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::grid_sample_forward(reinterpret_cast<const D*>(input), reinterpret_cast<const D*>(grid),
                                                    reinterpret_cast<D*>(out), shape, attributes,
                                                    static_cast<cudaStream_t>(stream)));
}

// `bytes` of stream-ordered device memory for the kernels of one call, freed after them on the same stream.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t stream) : stream_(stream) {
    error_ = cudaMallocAsync(&data_, bytes > 0 ? bytes : 1, stream);
  }
  ~StreamBuffer() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  template <class U>
  U* get() const {
    return static_cast<U*>(data_);
  }
  cudaError_t error() const { return error_; }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
  cudaError_t error_;
};

// The rois read and checked on the host, in stream-ordered device memory for the kernel (from pageable memory:
// the copy returns once `rois` is staged, so the vector may go).
template <class Launch>
const char* with_rois(const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, cudaStream_t stream,
                      Launch&& launch) {
  using Roi = kernels::roi_align_rotated_detail::Roi;
  const StreamBuffer table(sizeof(Roi) * rois.size(), stream);
  if (table.error() != cudaSuccess) return message(table.error());
  const cudaError_t copied =
      cudaMemcpyAsync(table.get<Roi>(), rois.data(), sizeof(Roi) * rois.size(), cudaMemcpyHostToDevice, stream);
  if (copied != cudaSuccess) return message(copied);
  return message(launch(table.get<Roi>()));
}

template <class T>
const char* roi_align_rotated(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                              const kernels::RoiAlignRotatedShape& shape, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return with_rois(rois, s, [&](const auto* table) {
    return kernels::cuda::roi_align_rotated_forward(input, table, out, shape, s);
  });
}

template <class T>
const char* roi_align(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                      const kernels::RoiAlignRotatedShape& shape, bool max_pool, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return with_rois(rois, s, [&](const auto* table) {
    return kernels::cuda::roi_align_forward(input, table, out, shape, max_pool, s);
  });
}

template <class T>
const char* rotated_feature_align(const T* features, const T* boxes, T* out,
                                  const kernels::RotatedFeatureAlignShape& shape, double spatial_scale, void* stream) {
  return message(kernels::cuda::rotated_feature_align_forward(features, boxes, out, shape, spatial_scale,
                                                              static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* box_iou_rotated(const T* boxes1, const T* boxes2, T* out, const kernels::BoxIouRotatedShape& shape,
                            int64_t mode, bool clockwise, void* stream) {
  using kernels::rotated::Polygon;
  const auto s = static_cast<cudaStream_t>(stream);
  const StreamBuffer polygons(sizeof(Polygon) * (shape.rows + shape.cols), s);
  if (polygons.error() != cudaSuccess) return message(polygons.error());
  return message(kernels::cuda::box_iou_rotated_forward(
      boxes1, boxes2, out, shape, mode, clockwise, polygons.get<Polygon>(), polygons.get<Polygon>() + shape.rows, s));
}

// kernels/nms.cuh's suppression in stream-ordered workspace, then the kept indices copied into the output.
template <class T, class Box, class Prepare, class Overlaps>
const char* suppress(const T* scores, const int64_t* groups, int64_t count, Prepare prepare, Overlaps overlaps,
                     const std::function<int64_t*(int64_t)>& allocate, cudaStream_t stream) {
  if (count > kernels::cuda::nms_device::kMaxBoxes) {
    return "more boxes than one suppression on CUDA takes (65535 * 64, the grid of its mask); pre-filter them by "
           "score";
  }
  kernels::cuda::NmsPlan<T, Box> plan;
  if (const cudaError_t error = kernels::cuda::NmsPlan<T, Box>::make(count, plan); error != cudaSuccess) {
    return message(error);
  }
  const StreamBuffer workspace(plan.bytes, stream);
  if (workspace.error() != cudaSuccess) return message(workspace.error());
  const int64_t* keep = nullptr;
  int64_t kept = 0;
  if (const cudaError_t error =
          kernels::cuda::nms(plan, workspace.get<void>(), scores, groups, prepare, overlaps, stream, keep, kept);
      error != cudaSuccess) {
    return message(error);
  }
  int64_t* out = allocate(kept);
  if (kept == 0) return nullptr;
  return message(cudaMemcpyAsync(out, keep, sizeof(int64_t) * kept, cudaMemcpyDeviceToDevice, stream));
}

template <class T>
const char* nms(const T* boxes, const T* scores, int64_t count, double iou_threshold, int64_t offset,
                const std::function<int64_t*(int64_t)>& allocate, void* stream) {
  const T off = static_cast<T>(offset);
  return suppress<T, kernels::cuda::AxisBox<T>>(scores, nullptr, count, kernels::cuda::AxisBoxes<T>{boxes, off},
                                                kernels::cuda::AxisOverlaps<T>{off, static_cast<T>(iou_threshold)},
                                                allocate, static_cast<cudaStream_t>(stream));
}

template <class T>
const char* nms_rotated(const T* boxes, const T* scores, const int64_t* labels, int64_t count, double iou_threshold,
                        bool clockwise, const std::function<int64_t*(int64_t)>& allocate, void* stream) {
  return suppress<T, kernels::rotated::Polygon>(scores, labels, count, kernels::cuda::RotatedBoxes<T>{boxes, clockwise},
                                                kernels::cuda::RotatedOverlaps{iou_threshold}, allocate,
                                                static_cast<cudaStream_t>(stream));
}

namespace {

// Rows (batch, class, box) of the tasks' kept candidates, task t's from offsets[t] (rows; offsets[tasks]: all).
__global__ void batched_rows_kernel(const int64_t* __restrict__ keep, const int64_t* __restrict__ offsets,
                                    int64_t tasks, int64_t classes, int64_t count, int64_t* rows) {
  OPBRIDGE_GRID_LOOP(j, tasks * count) {
    const int64_t task = j / count, k = j % count;
    if (k >= offsets[task + 1] - offsets[task]) continue;
    int64_t* row = rows + 3 * (offsets[task] + k);
    row[0] = task / classes;
    row[1] = task % classes;
    row[2] = keep[j] % count;
  }
}

}  // namespace

template <class T>
const char* batched_nms_rotated(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count,
                                double iou_threshold, double score_threshold,
                                const std::function<int64_t*(int64_t)>& allocate, void* stream) {
  namespace kc = kernels::cuda;
  using kernels::rotated::Polygon;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t tasks = batch * classes;
  if (count > kc::nms_device::kMaxBoxes) {
    return "more boxes than one suppression on CUDA takes (65535 * 64, the grid of its mask); pre-filter them by "
           "score";
  }
  if (tasks * count > int64_t(INT32_MAX)) {
    return "more than 2^31 - 1 scores (batch x classes x boxes) in one call; pre-filter the boxes by score";
  }
  kc::BatchedNmsPlan<T, Polygon> plan;
  if (const cudaError_t error = kc::BatchedNmsPlan<T, Polygon>::make(tasks, count, plan); error != cudaSuccess) {
    return message(error);
  }
  const StreamBuffer workspace(plan.bytes, s);
  if (workspace.error() != cudaSuccess) return message(workspace.error());
  const int64_t* keep = nullptr;
  std::vector<int64_t> offsets(static_cast<size_t>(tasks) + 1, 0);
  if (const cudaError_t error = kc::batched_nms(plan, workspace.get<void>(), scores, score_threshold,
                                                kc::BatchedRotatedBoxes<T>{boxes, classes, count},
                                                kc::RotatedOverlaps{iou_threshold}, s, keep, offsets.data() + 1);
      error != cudaSuccess) {
    return message(error);
  }
  for (size_t t = 1; t < offsets.size(); ++t) offsets[t] += offsets[t - 1];  // the kept counts, summed
  int64_t* rows = allocate(offsets.back());
  if (offsets.back() == 0) return nullptr;
  const StreamBuffer table(sizeof(int64_t) * offsets.size(), s);
  if (table.error() != cudaSuccess) return message(table.error());
  // From pageable memory: returns once `offsets` is staged.
  const cudaError_t copied = cudaMemcpyAsync(table.get<int64_t>(), offsets.data(), sizeof(int64_t) * offsets.size(),
                                             cudaMemcpyHostToDevice, s);
  if (copied != cudaSuccess) return message(copied);
  batched_rows_kernel<<<kc::blocks_for(tasks * count), kc::kThreads, 0, s>>>(keep, table.get<int64_t>(), tasks, classes,
                                                                             count, rows);
  return message(cudaGetLastError());
}

template const char* my_add(const float*, const float*, float*, const kernels::BinaryLoop&, void*);
template const char* my_add(const double*, const double*, double*, const kernels::BinaryLoop&, void*);
template const char* my_add(const uint16_t*, const uint16_t*, uint16_t*, const kernels::BinaryLoop&, void*);
template const char* ms_deform_attn(const float*, const int64_t*, const int64_t*, const float*, const float*, float*,
                                    const kernels::MSDeformAttnShape&, void*);
template const char* ms_deform_attn(const double*, const int64_t*, const int64_t*, const double*, const double*,
                                    double*, const kernels::MSDeformAttnShape&, void*);
template const char* ms_deform_attn(const uint16_t*, const int64_t*, const int64_t*, const uint16_t*, const uint16_t*,
                                    uint16_t*, const kernels::MSDeformAttnShape&, void*);
template const char* deform_conv2d(const float*, const float*, const float*, const float*, const float*, float*,
                                   const kernels::DeformConv2dShape&, void*);
template const char* deform_conv2d(const double*, const double*, const double*, const double*, const double*, double*,
                                   const kernels::DeformConv2dShape&, void*);
template const char* deform_conv2d(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                   uint16_t*, const kernels::DeformConv2dShape&, void*);

template const char* grid_sample(const float*, const float*, float*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);
template const char* grid_sample(const double*, const double*, double*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);
template const char* grid_sample(const uint16_t*, const uint16_t*, uint16_t*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);

#define OPBRIDGE_ROTATED_LAUNCHES(T)                                                                                   \
  template const char* roi_align_rotated(const T*, const std::vector<kernels::roi_align_rotated_detail::Roi>&, T*,     \
                                         const kernels::RoiAlignRotatedShape&, void*);                                 \
  template const char* roi_align(const T*, const std::vector<kernels::roi_align_rotated_detail::Roi>&, T*,             \
                                 const kernels::RoiAlignRotatedShape&, bool, void*);                                   \
  template const char* rotated_feature_align(const T*, const T*, T*, const kernels::RotatedFeatureAlignShape&, double, \
                                             void*);                                                                   \
  template const char* box_iou_rotated(const T*, const T*, T*, const kernels::BoxIouRotatedShape&, int64_t, bool,      \
                                       void*);                                                                         \
  template const char* nms(const T*, const T*, int64_t, double, int64_t, const std::function<int64_t*(int64_t)>&,      \
                           void*);                                                                                     \
  template const char* nms_rotated(const T*, const T*, const int64_t*, int64_t, double, bool,                          \
                                   const std::function<int64_t*(int64_t)>&, void*);                                    \
  template const char* batched_nms_rotated(const T*, const T*, int64_t, int64_t, int64_t, double, double,              \
                                           const std::function<int64_t*(int64_t)>&, void*);
OPBRIDGE_ROTATED_LAUNCHES(float)
OPBRIDGE_ROTATED_LAUNCHES(double)
#undef OPBRIDGE_ROTATED_LAUNCHES

}  // namespace opbridge::ort::cuda
