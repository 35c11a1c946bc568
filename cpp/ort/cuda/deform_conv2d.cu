// The ORT CUDA library's launches of the deformable convolution nodes (opbridge's, mmcv's and mmdeploy's)
// (cuda/deform_conv2d.h).
#include "ort/cuda/deform_conv2d.h"

#include <cuda_fp16.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/deform_conv2d.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

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

template const char* deform_conv2d(const float*, const float*, const float*, const float*, const float*, float*,
                                   const kernels::DeformConv2dShape&, void*);
template const char* deform_conv2d(const double*, const double*, const double*, const double*, const double*, double*,
                                   const kernels::DeformConv2dShape&, void*);
template const char* deform_conv2d(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                   uint16_t*, const kernels::DeformConv2dShape&, void*);

}  // namespace opbridge::ort::cuda
