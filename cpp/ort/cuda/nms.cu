// The ORT CUDA library's launches of mmcv's NonMaxSuppression and mmdeploy's NMSMatch (the launches of every NMS node)
// (cuda/nms.h).
#include "ort/cuda/nms.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/nms.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

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

template const char* nms(const float*, const float*, int64_t, double, int64_t, const std::function<int64_t*(int64_t)>&,
                         void*);
template const char* nms_rotated(const float*, const float*, const int64_t*, int64_t, double, bool,
                                 const std::function<int64_t*(int64_t)>&, void*);
template const char* batched_nms_rotated(const float*, const float*, int64_t, int64_t, int64_t, double, double,
                                         const std::function<int64_t*(int64_t)>&, void*);
template const char* nms_match(const float*, const float*, int64_t, int64_t, int64_t, float, float,
                               const std::function<int64_t*(int64_t)>&, void*);
template const char* nms(const double*, const double*, int64_t, double, int64_t,
                         const std::function<int64_t*(int64_t)>&, void*);
template const char* nms_rotated(const double*, const double*, const int64_t*, int64_t, double, bool,
                                 const std::function<int64_t*(int64_t)>&, void*);
template const char* batched_nms_rotated(const double*, const double*, int64_t, int64_t, int64_t, double, double,
                                         const std::function<int64_t*(int64_t)>&, void*);
template const char* nms_match(const double*, const double*, int64_t, int64_t, int64_t, double, double,
                               const std::function<int64_t*(int64_t)>&, void*);

}  // namespace opbridge::ort::cuda
