// The ORT CUDA library's launches (launch.h) of the shared CUDA kernels (kernels/<op>.cuh).
#include "ort/cuda/launch.h"

#include <cuda_fp16.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <vector>

#include "kernels/carafe.cuh"
#include "kernels/cumulative.cuh"
#include "kernels/deform_conv2d.cuh"
#include "kernels/float16.h"
#include "kernels/grid_sample.cuh"
#include "kernels/masked_conv2d.cuh"
#include "kernels/ms_deform_attn.cuh"
#include "kernels/my_add.cuh"
#include "kernels/nms.cuh"
#include "kernels/psa_mask.cuh"
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

namespace {

// The cuBLAS the process has loaded (onnxruntime-gpu's CUDA provider loads one; torch's does too), found without
// loading one: its GEMMs, on handles of our own lent from a pool per device, each call setting the session's
// stream and a workspace of its own in stream-ordered memory (so that a handle used on one stream and then on
// another never shares a workspace between them). None loaded, or one without cublasSetWorkspace: null.
struct Cublas {
  using Create = int (*)(void**);
  using SetStream = int (*)(void*, cudaStream_t);
  using SetWorkspace = int (*)(void*, void*, size_t);
  template <class T>
  using Gemm = int (*)(void*, int, int, int, int, int, const T*, const T*, int, const T*, int, const T*, T*, int);
  Create create = nullptr;
  SetStream set_stream = nullptr;
  SetWorkspace set_workspace = nullptr;
  Gemm<float> sgemm = nullptr;
  Gemm<double> dgemm = nullptr;

  static const Cublas* loaded() {
    static const Cublas* found = [] {
      for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}) {
        void* library = dlopen(name, RTLD_NOW | RTLD_NOLOAD);  // never closed: its functions are kept
        if (library == nullptr) continue;
        auto* blas = new Cublas{reinterpret_cast<Create>(dlsym(library, "cublasCreate_v2")),
                                reinterpret_cast<SetStream>(dlsym(library, "cublasSetStream_v2")),
                                reinterpret_cast<SetWorkspace>(dlsym(library, "cublasSetWorkspace_v2")),
                                reinterpret_cast<Gemm<float>>(dlsym(library, "cublasSgemm_v2")),
                                reinterpret_cast<Gemm<double>>(dlsym(library, "cublasDgemm_v2"))};
        if (blas->create && blas->set_stream && blas->set_workspace && blas->sgemm && blas->dgemm) {
          return static_cast<const Cublas*>(blas);
        }
        delete blas;
      }
      return static_cast<const Cublas*>(nullptr);
    }();
    return found;
  }

  // A handle on `device`, lent to one call at a time: taken from the device's pool, or created when the pool is
  // empty (so there are as many as calls ever ran at once, each kept for the process's life), and given back by
  // the Lease. Null where none could be had, or (`creating` false) where the pool is empty.
  class Lease {
   public:
    Lease(int device, void* handle) : device_(device), handle_(handle) {}
    ~Lease() {
      if (handle_ != nullptr) give_back(device_, handle_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    void* get() const { return handle_; }

   private:
    int device_;
    void* handle_;
  };

  Lease lend(int device, bool creating) const {
    {
      const std::lock_guard<std::mutex> lock(pool_mutex());
      auto& free = pool()[device];
      if (!free.empty()) {
        void* handle = free.back();
        free.pop_back();
        return {device, handle};
      }
    }
    void* handle = nullptr;
    if (!creating || create(&handle) != 0) handle = nullptr;
    return {device, handle};
  }

 private:
  static std::mutex& pool_mutex() {
    static auto* mutex = new std::mutex;  // never destroyed, as the pool: a lease may end after static destructors
    return *mutex;
  }
  static std::map<int, std::vector<void*>>& pool() {
    static auto* handles = new std::map<int, std::vector<void*>>;  // never destroyed: handles outlive main()
    return *handles;
  }
  static void give_back(int device, void* handle) {
    const std::lock_guard<std::mutex> lock(pool_mutex());
    pool()[device].push_back(handle);
  }

 public:
  template <class T>
  Gemm<T> gemm() const {
    if constexpr (std::is_same_v<T, double>) {
      return dgemm;
    } else {
      return sgemm;
    }
  }
};

// cuBLAS's own recommendation for Hopper and newer (4 MiB suffices before).
constexpr size_t kCublasWorkspace = size_t(32) << 20;

// The forward as the torch CUDA op computes it: the columns of a chunk of images (kernels/deform_conv2d.cuh's
// im2col), one GEMM per weight group with `blas` (no tensor-core math: cuBLAS's default, float32 products in
// float32), the result scattered into NCHW with the bias. nullptr, or why it could not run (the caller then runs
// the fused kernel).
template <class T>
const char* deform_conv2d_im2col(const Cublas& blas, void* handle, const T* input, const T* weight, const T* offset,
                                 const T* mask, const T* bias, T* out, const kernels::DeformConv2dShape& s,
                                 cudaStream_t stream) {
  namespace kc = kernels::cuda;
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t depth = s.in_channels / s.groups * taps, out_per_group = s.out_channels / s.groups;
  const int64_t chunk = kc::chunk_images(s, sizeof(T));
  if (chunk * pixels > INT32_MAX || depth > INT32_MAX || out_per_group > INT32_MAX) return "sizes past cuBLAS's int";
  // The stream, then (cublasSetStream resets it) this call's workspace, freed after its GEMMs on the same stream.
  if (blas.set_stream(handle, stream) != 0) return "cublasSetStream failed";
  const DeviceScratch workspace(kCublasWorkspace, stream);
  if (workspace.error() != nullptr) return workspace.error();
  if (blas.set_workspace(handle, workspace.get<void>(), kCublasWorkspace) != 0) return "cublasSetWorkspace failed";
  const DeviceScratch columns(sizeof(T) * static_cast<size_t>(s.in_channels * taps * chunk * pixels), stream);
  if (columns.error() != nullptr) return columns.error();
  const DeviceScratch buffer(sizeof(T) * static_cast<size_t>(s.out_channels * chunk * pixels), stream);
  if (buffer.error() != nullptr) return buffer.error();
  const char* failed = nullptr;
  kc::with_index_type(s, chunk, [&](auto index) {
    using I = decltype(index);
    for (int64_t first = 0; first < s.batch && failed == nullptr; first += chunk) {
      const int64_t count = std::min(chunk, s.batch - first), width = count * pixels;
      kc::im2col_kernel<T, I><<<kc::blocks_for(kc::im2col_threads(s, width)), kc::kThreads, 0, stream>>>(
          input, offset, mask, s, first, count, columns.get<T>());
      if ((failed = message(cudaGetLastError())) != nullptr) return;
      // Row-major buffer_g [out_per_group, width] = W_g [out_per_group, depth] x columns_g [depth, width], as
      // column-major: buffer_g^T = columns_g^T x W_g^T.
      const T one = 1, zero = 0;
      for (int64_t g = 0; g < s.groups && failed == nullptr; ++g) {
        if (blas.gemm<T>()(handle, 0, 0, static_cast<int>(width), static_cast<int>(out_per_group),
                           static_cast<int>(depth), &one, columns.get<T>() + g * depth * width, static_cast<int>(width),
                           weight + g * out_per_group * depth, static_cast<int>(depth), &zero,
                           buffer.get<T>() + g * out_per_group * width, static_cast<int>(width)) != 0) {
          failed = "a cuBLAS GEMM failed";
        }
      }
      if (failed != nullptr) return;
      kc::scatter_out_kernel<T, I><<<kc::blocks_for(s.out_channels * width), kc::kThreads, 0, stream>>>(
          buffer.get<T>(), bias, s, first, count, out);
      failed = message(cudaGetLastError());
    }
  });
  return failed;
}

// OPBRIDGE_ORT_CUDA_DCN: unset (or auto): im2col + the process's cuBLAS where one is loaded, the fused kernel where
// not or where that path fails; cublas: that path or an error (the tests' way to know it ran); fused: never.
enum class DcnPath { automatic, cublas, fused };

DcnPath dcn_path() {
  const char* choice = std::getenv("OPBRIDGE_ORT_CUDA_DCN");  // read per call: the tests and benchmarks switch it
  if (choice == nullptr || std::strcmp(choice, "auto") == 0 || choice[0] == '\0') return DcnPath::automatic;
  if (std::strcmp(choice, "cublas") == 0) return DcnPath::cublas;
  if (std::strcmp(choice, "fused") == 0) return DcnPath::fused;
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "opbridge: OPBRIDGE_ORT_CUDA_DCN=%s is not one of auto, cublas, fused; ignored\n", choice);
  });
  return DcnPath::automatic;
}

}  // namespace

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream) {
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  const auto s = static_cast<cudaStream_t>(stream);
  if constexpr (!std::is_same_v<T, uint16_t>) {
    const DcnPath path = dcn_path();
    const Cublas* blas = path == DcnPath::fused ? nullptr : Cublas::loaded();
    if (blas == nullptr && path == DcnPath::cublas) {
      return "OPBRIDGE_ORT_CUDA_DCN=cublas, but no cuBLAS is loaded in this process (libcublas.so.13, .12 or .11)";
    }
    int device = 0;
    if (blas != nullptr && cudaGetDevice(&device) == cudaSuccess) {
      // A stream being captured into a CUDA graph takes no new handle (creating one allocates).
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      (void)cudaStreamIsCapturing(s, &capturing);
      const Cublas::Lease handle = blas->lend(device, capturing == cudaStreamCaptureStatusNone);
      const char* failed = handle.get() == nullptr ? "no cuBLAS handle could be created"
                                                   : deform_conv2d_im2col(*blas, handle.get(), input, weight, offset,
                                                                          mask, bias, out, shape, s);
      if (failed == nullptr) return nullptr;
      if (path == DcnPath::cublas) return failed;
      // Else the fused kernel, which needs no handle, scratch or GEMM (an allocation's error is cleared by
      // DeviceScratch; cuBLAS keeps its own), said once per process.
      static std::once_flag said;
      std::call_once(said, [&] {
        std::fprintf(stderr,
                     "opbridge: the DeformConv2d node's cuBLAS path could not run (%s); it runs its fused "
                     "kernel instead (OPBRIDGE_ORT_CUDA_DCN=fused chooses that)\n",
                     failed);
      });
    }
  }
  return message(kernels::cuda::deform_conv2d_forward(
      reinterpret_cast<const D*>(input), reinterpret_cast<const D*>(weight), reinterpret_cast<const D*>(offset),
      reinterpret_cast<const D*>(mask), reinterpret_cast<const D*>(bias), shape, reinterpret_cast<D*>(out), s));
}

template <class T>
const char* grid_sample(const T* input, const T* grid, T* out, const kernels::GridSampleShape& shape,
                        const kernels::GridSampleAttributes& attributes, void* stream) {
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::grid_sample_forward(reinterpret_cast<const D*>(input), reinterpret_cast<const D*>(grid),
                                                    reinterpret_cast<D*>(out), shape, attributes,
                                                    static_cast<cudaStream_t>(stream)));
}

namespace {

// Keeps up to 256 MiB of freed stream-ordered memory in `device`'s default pool instead of returning it to the
// driver at each synchronization (the pool's default), so that the scratch of each call (float16 copies, NMS
// workspaces, RoI tables) is taken from the pool, not the driver. Once per device; never lowers a threshold someone
// else set (torch's cudaMallocAsync backend shares the pool); a pool that cannot be tuned is left as it is.
void keep_freed_memory(int device) {
  static std::mutex mutex;
  static std::set<int> tuned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!tuned.insert(device).second) return;
  cudaMemPool_t pool = nullptr;
  uint64_t current = 0, threshold = uint64_t(256) << 20;
  if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &current) != cudaSuccess ||
      (current < threshold &&
       cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) != cudaSuccess)) {
    (void)cudaGetLastError();
  }
}

}  // namespace

DeviceScratch::DeviceScratch(size_t bytes, void* stream) : stream_(stream) {
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) keep_freed_memory(device);
  error_ = message(cudaMallocAsync(&data_, bytes > 0 ? bytes : 1, static_cast<cudaStream_t>(stream)));
  if (error_ != nullptr) {
    data_ = nullptr;
    (void)cudaGetLastError();  // not left for the next launch (ours or the runtime's) to report as its own
  }
}

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFreeAsync(data_, static_cast<cudaStream_t>(stream_));
}

namespace {

__global__ void widen_kernel(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t count) {
  OPBRIDGE_GRID_LOOP(i, count) { out[i] = kernels::SoftFloat16::to_float(in[i]); }
}

__global__ void narrow_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t count) {
  OPBRIDGE_GRID_LOOP(i, count) { out[i] = kernels::SoftFloat16::from_float(in[i]); }
}

}  // namespace

const char* widen_float16(const uint16_t* in, float* out, int64_t count, void* stream) {
  if (count <= 0) return nullptr;
  widen_kernel<<<kernels::cuda::blocks_for(count), kernels::cuda::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, count);
  return message(cudaGetLastError());
}

const char* narrow_float16(const float* in, uint16_t* out, int64_t count, void* stream) {
  if (count <= 0) return nullptr;
  narrow_kernel<<<kernels::cuda::blocks_for(count), kernels::cuda::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, count);
  return message(cudaGetLastError());
}

// The rois read and checked on the host, in stream-ordered device memory for the kernel (from pageable memory:
// the copy returns once `rois` is staged, so the vector may go).
template <class Launch>
const char* with_rois(const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, cudaStream_t stream,
                      Launch&& launch) {
  using Roi = kernels::roi_align_rotated_detail::Roi;
  const DeviceScratch table(sizeof(Roi) * rois.size(), stream);
  if (table.error() != nullptr) return table.error();
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
  const DeviceScratch polygons(sizeof(Polygon) * (shape.rows + shape.cols), s);
  if (polygons.error() != nullptr) return polygons.error();
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
  const DeviceScratch workspace(plan.bytes, stream);
  if (workspace.error() != nullptr) return workspace.error();
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

// NMSMatch's rows, ordered by a stable sort on these keys: the candidate at sorted position p, suppressed by the
// kept candidate at sorted position q = suppressor[p] whose score is > score_threshold, has key q (so: by task,
// then by the keeper's rank, then by its own); the others UINT32_MAX, and are not counted in `rows`.
template <class T>
__global__ void match_keys_kernel(const int64_t* __restrict__ suppressor, const int64_t* __restrict__ order,
                                  const T* __restrict__ scores, int64_t total, T score_threshold, uint32_t* keys,
                                  int64_t* positions, unsigned long long* rows) {
  OPBRIDGE_GRID_LOOP(p, total) {
    const int64_t q = suppressor[p];
    const bool row = q >= 0 && scores[order[q]] > score_threshold;
    keys[p] = row ? static_cast<uint32_t>(q) : UINT32_MAX;
    positions[p] = p;
    if (row) atomicAdd(rows, 1ull);
  }
}

// Rows (batch, class, kept box, suppressed box) of the first `count_rows` sorted keys.
__global__ void match_rows_kernel(const uint32_t* __restrict__ keys, const int64_t* __restrict__ positions,
                                  const int64_t* __restrict__ order, int64_t count_rows, int64_t classes, int64_t count,
                                  int64_t* rows) {
  OPBRIDGE_GRID_LOOP(r, count_rows) {
    const int64_t p = positions[r], q = keys[r], task = p / count;
    int64_t* row = rows + 4 * r;
    row[0] = task / classes;
    row[1] = task % classes;
    row[2] = order[q] % count;
    row[3] = order[p] % count;
  }
}

// kernels/nms.cuh's batched suppression of `tasks` x `count` candidates in stream-ordered workspace; then
// `finish(result, kept)` (kept: each task's number of kept candidates, host memory) builds the node's output while
// the workspace lives.
template <class T, class Box, class Prepare, class Overlaps, class Finish>
const char* batched_suppress(const T* scores, int64_t tasks, int64_t count, const double* score_threshold, bool record,
                             Prepare prepare, Overlaps overlaps, cudaStream_t stream, Finish&& finish) {
  namespace kc = kernels::cuda;
  if (count > kc::nms_device::kMaxBoxes) {
    return "more boxes than one suppression on CUDA takes (65535 * 64, the grid of its mask); pre-filter them by "
           "score";
  }
  if (tasks * count > int64_t(INT32_MAX)) {
    return "more than 2^31 - 1 scores (batch x classes x boxes) in one call; pre-filter the boxes by score";
  }
  kc::BatchedNmsPlan<T, Box> plan;
  if (const cudaError_t error = kc::BatchedNmsPlan<T, Box>::make(tasks, count, record, plan); error != cudaSuccess) {
    return message(error);
  }
  const DeviceScratch workspace(plan.bytes, stream);
  if (workspace.error() != nullptr) {
    thread_local std::string why;
    why = std::string(workspace.error()) + " (the suppression's workspace: " + std::to_string(plan.bytes >> 20) +
          " MiB for " + std::to_string(tasks) + " (batch x class) tasks of " + std::to_string(count) +
          " boxes, its mask growing with the square of the boxes); pre-filter the boxes by score";
    return why.c_str();
  }
  kc::BatchedNmsResult result;
  std::vector<int64_t> kept(static_cast<size_t>(tasks), 0);
  if (const cudaError_t error = kc::batched_nms(plan, workspace.get<void>(), scores, score_threshold, prepare, overlaps,
                                                stream, result, kept.data());
      error != cudaSuccess) {
    return message(error);
  }
  return finish(result, kept);
}

}  // namespace

template <class T>
const char* batched_nms_rotated(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count,
                                double iou_threshold, double score_threshold,
                                const std::function<int64_t*(int64_t)>& allocate, void* stream) {
  namespace kc = kernels::cuda;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t tasks = batch * classes;
  auto finish = [&](const kc::BatchedNmsResult& result, const std::vector<int64_t>& kept) -> const char* {
    std::vector<int64_t> offsets(kept.size() + 1, 0);  // each task's first row
    for (size_t t = 0; t < kept.size(); ++t) offsets[t + 1] = offsets[t] + kept[t];
    int64_t* rows = allocate(offsets.back());
    if (offsets.back() == 0) return nullptr;
    const DeviceScratch table(sizeof(int64_t) * offsets.size(), s);
    if (table.error() != nullptr) return table.error();
    // From pageable memory: returns once `offsets` is staged.
    const cudaError_t copied = cudaMemcpyAsync(table.get<int64_t>(), offsets.data(), sizeof(int64_t) * offsets.size(),
                                               cudaMemcpyHostToDevice, s);
    if (copied != cudaSuccess) return message(copied);
    batched_rows_kernel<<<kc::blocks_for(tasks * count), kc::kThreads, 0, s>>>(result.keep, table.get<int64_t>(), tasks,
                                                                               classes, count, rows);
    return message(cudaGetLastError());
  };
  return batched_suppress<T, kernels::rotated::Polygon>(scores, tasks, count, &score_threshold, false,
                                                        kc::BatchedRotatedBoxes<T>{boxes, classes, count},
                                                        kc::RotatedOverlaps{iou_threshold}, s, finish);
}

template <class T>
const char* nms_match(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count, T iou_threshold,
                      T score_threshold, const std::function<int64_t*(int64_t)>& allocate, void* stream) {
  namespace kc = kernels::cuda;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t tasks = batch * classes, total = tasks * count;
  auto finish = [&](const kc::BatchedNmsResult& result, const std::vector<int64_t>&) -> const char* {
    size_t sort_bytes = 0;
    cudaError_t error = cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(total), 0, 32);
    if (error != cudaSuccess) return message(error);
    const auto n = static_cast<size_t>(total);
    const size_t keys_at = 0, positions_at = kc::nms_device::aligned(2 * n * 4),
                 counter_at = positions_at + kc::nms_device::aligned(2 * n * 8), sort_at = counter_at + 256;
    const DeviceScratch work(sort_at + sort_bytes, s);
    if (work.error() != nullptr) return work.error();
    auto* base = work.get<unsigned char>();
    auto* keys = reinterpret_cast<uint32_t*>(base + keys_at);
    auto* positions = reinterpret_cast<int64_t*>(base + positions_at);
    auto* counter = reinterpret_cast<unsigned long long*>(base + counter_at);
    if ((error = cudaMemsetAsync(counter, 0, sizeof(*counter), s)) != cudaSuccess) return message(error);
    match_keys_kernel<T><<<kc::blocks_for(total), kc::kThreads, 0, s>>>(result.suppressor, result.order, scores, total,
                                                                        score_threshold, keys, positions, counter);
    if ((error = cudaGetLastError()) != cudaSuccess) return message(error);
    error = cub::DeviceRadixSort::SortPairs(base + sort_at, sort_bytes, keys, keys + total, positions,
                                            positions + total, static_cast<int>(total), 0, 32, s);
    if (error != cudaSuccess) return message(error);
    unsigned long long count_rows = 0;
    if ((error = cudaMemcpyAsync(&count_rows, counter, sizeof(count_rows), cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
        (error = cudaStreamSynchronize(s)) != cudaSuccess) {
      return message(error);
    }
    const auto found = static_cast<int64_t>(count_rows);
    int64_t* rows = allocate(found);
    if (found == 0) return nullptr;
    match_rows_kernel<<<kc::blocks_for(found), kc::kThreads, 0, s>>>(keys + total, positions + total, result.order,
                                                                     found, classes, count, rows);
    return message(cudaGetLastError());
  };
  const double* every_candidate = nullptr;  // NMSMatch suppresses with every box; the threshold only filters rows
  return batched_suppress<T, kc::AxisBox<T>>(scores, tasks, count, every_candidate, true,
                                             kc::BatchedAxisBoxes<T>{boxes, classes, count},
                                             kc::MatchOverlaps<T>{iou_threshold}, s, finish);
}

template <class T>
const char* cumulative_extreme(const T* input, T* values, int64_t* indices, const kernels::CumulativeShape& shape,
                               bool max, bool reverse, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return message(max ? kernels::cuda::cumulative_extreme<true>(input, values, indices, shape, reverse, s)
                     : kernels::cuda::cumulative_extreme<false>(input, values, indices, shape, reverse, s));
}

template <class T>
const char* psa_mask(const T* input, T* out, const kernels::PsaMaskShape& shape, void* stream) {
  return message(kernels::cuda::psa_mask(input, out, shape, static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* carafe(const T* features, const T* masks, T* out, const kernels::CarafeShape& shape, void* stream) {
  return message(kernels::cuda::carafe(features, masks, out, shape, static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* masked_conv2d(const T* features, const std::vector<int64_t>& positions, const T* weight, const T* bias,
                          T* out, const kernels::MaskedConv2dShape& shape, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto count = static_cast<int64_t>(positions.size());
  const DeviceScratch table(sizeof(int64_t) * positions.size(), s);
  if (table.error() != nullptr) return table.error();
  if (count > 0) {
    // From pageable memory: returns once `positions` is staged.
    const cudaError_t copied = cudaMemcpyAsync(table.get<int64_t>(), positions.data(),
                                               sizeof(int64_t) * positions.size(), cudaMemcpyHostToDevice, s);
    if (copied != cudaSuccess) return message(copied);
  }
  return message(kernels::cuda::masked_conv2d(features, table.get<int64_t>(), count, weight, bias, out, shape, s));
}

template const char* masked_conv2d(const float*, const std::vector<int64_t>&, const float*, const float*, float*,
                                   const kernels::MaskedConv2dShape&, void*);
template const char* masked_conv2d(const double*, const std::vector<int64_t>&, const double*, const double*, double*,
                                   const kernels::MaskedConv2dShape&, void*);
template const char* carafe(const float*, const float*, float*, const kernels::CarafeShape&, void*);
template const char* carafe(const double*, const double*, double*, const kernels::CarafeShape&, void*);
template const char* psa_mask(const float*, float*, const kernels::PsaMaskShape&, void*);
template const char* psa_mask(const double*, double*, const kernels::PsaMaskShape&, void*);
template const char* cumulative_extreme(const float*, float*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);
template const char* cumulative_extreme(const double*, double*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);
template const char* cumulative_extreme(const int64_t*, int64_t*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);
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
                                           const std::function<int64_t*(int64_t)>&, void*);                            \
  template const char* nms_match(const T*, const T*, int64_t, int64_t, int64_t, T, T,                                  \
                                 const std::function<int64_t*(int64_t)>&, void*);
OPBRIDGE_ROTATED_LAUNCHES(float)
OPBRIDGE_ROTATED_LAUNCHES(double)
#undef OPBRIDGE_ROTATED_LAUNCHES

}  // namespace opbridge::ort::cuda
