// Greedy non-maximum suppression on the GPU, as torchvision's nms does it, for any box type: shared by the torch
// CUDA op (cpp/cuda/nms_rotated.cu) and the ORT CUDA nodes (cpp/ort/cuda/launch.cu: mmcv's NonMaxSuppression,
// opbridge's NmsRotated). The boxes sorted by score (cub's radix sort, stable: equal scores keep their input order,
// NaN first, as the CPU kernels' descending_order), a bitmask of the pairs that overlap above the threshold (64
// boxes against 64 in a block, on the CPU kernels' own overlap arithmetic), and the greedy pass over that mask in
// one block on the device. The host waits once, for the number of kept boxes (the output's size is the data's).
//
// A box type is used through two device functors: Prepare (`Box operator()(int64_t i)`: input box i, prepared) and
// Overlaps (`bool operator()(const Box& kept, const Box& candidate)`: whether a kept box of higher rank suppresses
// the candidate). Boxes of different groups (labels) never suppress each other.
#pragma once

#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/box_iou_rotated.h"
#include "kernels/cuda_grid.cuh"

namespace opbridge::kernels::cuda {
namespace nms_device {

constexpr int kBlockBoxes = 64;  // boxes a mask word covers
// The mask's grid is words x words blocks, at most 65535 in y.
constexpr int64_t kMaxBoxes = int64_t(65535) * kBlockBoxes;

// A sort key that orders as the CPU kernels' comparator does in decreasing order: NaN above everything, -0 equal to
// +0.
template <class T>
struct Key;
template <>
struct Key<float> {
  using Type = uint32_t;
  static __device__ Type of(float s) {
    if (isnan(s)) return ~Type(0);
    const Type bits = s == 0.0f ? 0u : __float_as_uint(s);
    return (bits >> 31) != 0 ? ~bits : bits | (Type(1) << 31);
  }
};
template <>
struct Key<double> {
  using Type = uint64_t;
  static __device__ Type of(double s) {
    if (isnan(s)) return ~Type(0);
    const Type bits = s == 0.0 ? 0ull : static_cast<Type>(__double_as_longlong(s));
    return (bits >> 63) != 0 ? ~bits : bits | (Type(1) << 63);
  }
};

template <class T>
__global__ void keys_kernel(const T* __restrict__ scores, int64_t count, typename Key<T>::Type* keys,
                            int64_t* indices) {
  OPBRIDGE_GRID_LOOP(i, count) {
    keys[i] = Key<T>::of(scores[i]);
    indices[i] = i;
  }
}

// The boxes in sorted order, prepared, and their groups (0 without groups).
template <class Box, class Prepare>
__global__ void gather_kernel(Prepare prepare, const int64_t* __restrict__ groups, const int64_t* __restrict__ order,
                              int64_t count, Box* sorted, int64_t* sorted_groups) {
  OPBRIDGE_GRID_LOOP(r, count) {
    const int64_t i = order[r];
    sorted[r] = prepare(i);
    sorted_groups[r] = groups != nullptr ? groups[i] : 0;
  }
}

// mask[r * words + w] bit b: box w * 64 + b (in sorted order, after r) is in r's group and r suppresses it. Blocks
// (column block, row block) with column block >= row block; the words left of the diagonal are never read. With
// `tasks` > 1 (batched suppression), task t's boxes are [t * count, (t + 1) * count) and its rows
// [t * count * words, ...) of the mask; only its first valid[t] boxes take part (valid null: all `count`), and
// the words past them are never written nor read. groups null: every box of a task in one group.
template <class Box, class Overlaps>
__global__ void mask_kernel(const Box* __restrict__ boxes, const int64_t* __restrict__ groups,
                            const unsigned* __restrict__ valid, int64_t tasks, int64_t count, int64_t words,
                            Overlaps overlaps, uint64_t* mask) {
  const int64_t row_block = blockIdx.y, col_block = blockIdx.x;
  if (col_block < row_block) return;
  // Raw storage: a __shared__ array may not have a constructor (a box type's members may have initializers).
  __shared__ alignas(Box) unsigned char storage[kBlockBoxes * sizeof(Box)];
  auto* columns = reinterpret_cast<Box*>(storage);
  __shared__ int64_t column_groups[kBlockBoxes];
  const int64_t col_start = col_block * kBlockBoxes;
  for (int64_t task = blockIdx.z; task < tasks; task += gridDim.z) {  // the same in every thread of the block
    const int64_t n = valid != nullptr ? static_cast<int64_t>(valid[task]) : count;
    if (col_start >= n) continue;
    const int col_count = static_cast<int>(std::min<int64_t>(kBlockBoxes, n - col_start));
    const int64_t base = task * count;
    __syncthreads();  // the previous task's columns are read before they are replaced
    if (threadIdx.x < col_count) {
      columns[threadIdx.x] = boxes[base + col_start + threadIdx.x];
      column_groups[threadIdx.x] = groups != nullptr ? groups[base + col_start + threadIdx.x] : 0;
    }
    __syncthreads();
    const int64_t r = row_block * kBlockBoxes + threadIdx.x;
    if (r >= n) continue;
    const Box row = boxes[base + r];
    const int64_t group = groups != nullptr ? groups[base + r] : 0;
    uint64_t bits = 0;
    for (int b = row_block == col_block ? static_cast<int>(threadIdx.x) + 1 : 0; b < col_count; ++b) {
      if (column_groups[b] == group && overlaps(row, columns[b])) bits |= uint64_t(1) << b;
    }
    mask[(base + r) * words + col_block] = bits;
  }
}

// The greedy pass, one block a task: box r (sorted order) is kept unless an earlier kept box's mask row has its
// bit; `removed` (zeroed, `words` words a task) collects the kept boxes' rows. Writes task t's kept boxes' input
// indices (order[t * count + r]) in order from keep[t * count] and their number to kept[t]. valid as mask_kernel's.
// suppressor (null: not asked for; else filled with -1): for each box a kept box suppresses, the sorted position
// (t * count + r) of the first kept box that does, which is the one whose row first sets its bit.
// (A template, so that every file including this header may instantiate it.)
template <class Word = uint64_t>
__global__ void keep_kernel(const Word* __restrict__ mask, const int64_t* __restrict__ order,
                            const unsigned* __restrict__ valid, int64_t count, int64_t words, Word* removed,
                            int64_t* keep, int64_t* kept, int64_t* suppressor) {
  __shared__ Word current;
  const int64_t task = blockIdx.x, base = task * count;
  const int64_t boxes = valid != nullptr ? static_cast<int64_t>(valid[task]) : count;
  const int64_t used = (boxes + kBlockBoxes - 1) / kBlockBoxes;  // the task's words
  Word* task_removed = removed + task * words;
  // The boxes of `bits` (word j of the task) that kept row r suppresses first.
  auto record = [&](Word bits, int64_t j, int64_t r) {
    for (; bits != 0; bits &= bits - 1)
      suppressor[base + j * kBlockBoxes + __ffsll(static_cast<long long>(bits)) - 1] = r;
  };
  int64_t n = 0;
  for (int64_t w = 0; w < used; ++w) {
    if (threadIdx.x == 0) current = task_removed[w];
    __syncthreads();
    Word word = current;  // the same in every thread: each updates its copy from the same rows
    const int64_t end = std::min<int64_t>(kBlockBoxes, boxes - w * kBlockBoxes);
    for (int b = 0; b < end; ++b) {
      if ((word >> b) & 1) continue;
      const int64_t r = base + w * kBlockBoxes + b;
      if (threadIdx.x == 0) keep[base + n] = order[r];
      ++n;
      const Word* row = mask + r * words;
      if (suppressor != nullptr && threadIdx.x == 0) record(row[w] & ~word, w, r);
      word |= row[w];
      for (int64_t j = w + 1 + threadIdx.x; j < used; j += blockDim.x) {
        if (suppressor != nullptr) record(row[j] & ~task_removed[j], j, r);
        task_removed[j] |= row[j];
      }
    }
    __syncthreads();  // this word's rows are in `removed` before the next word is read
  }
  if (threadIdx.x == 0) kept[task] = n;
}

inline size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace nms_device

// The device memory one suppression of `count` boxes (scores of type T, prepared boxes of type Box) needs, in one
// workspace the caller allocates: Plan::make sizes it (asking cub for its sort's scratch), run lays it out.
template <class T, class Box>
struct NmsPlan {
  using KeyType = typename nms_device::Key<T>::Type;
  int64_t count = 0, words = 0;
  size_t sort_bytes = 0, keys = 0, indices = 0, boxes = 0, groups = 0, mask = 0, removed = 0, keep = 0, sort = 0,
         bytes = 0;

  static cudaError_t make(int64_t count, NmsPlan& plan) {
    using nms_device::aligned;
    plan.count = count;
    plan.words = (count + nms_device::kBlockBoxes - 1) / nms_device::kBlockBoxes;
    const cudaError_t queried = cub::DeviceRadixSort::SortPairsDescending(
        nullptr, plan.sort_bytes, static_cast<const KeyType*>(nullptr), static_cast<KeyType*>(nullptr),
        static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(count), 0,
        int(8 * sizeof(KeyType)));
    if (queried != cudaSuccess) return queried;
    const auto n = static_cast<size_t>(count), words = static_cast<size_t>(plan.words);
    size_t at = 0;
    for (auto [field, size] : {std::pair{&plan.keys, 2 * n * sizeof(KeyType)},
                               {&plan.indices, 2 * n * 8},
                               {&plan.boxes, n * sizeof(Box)},
                               {&plan.groups, n * 8},
                               {&plan.mask, n * words * 8},
                               {&plan.removed, words * 8},
                               {&plan.keep, (n + 1) * 8},
                               {&plan.sort, plan.sort_bytes}}) {
      *field = at;
      at += aligned(size);
    }
    plan.bytes = at;
    return cudaSuccess;
  }
};

// Suppresses `plan.count` boxes (scores [count], groups [count] or null: one group) in `workspace` (plan.bytes of
// device memory), waits for the stream once and returns the kept boxes' input indices, in decreasing score order,
// at the device pointer `keep` (plan.count entries of the workspace) and their number in `kept`. count >= 1 and at
// most nms_device::kMaxBoxes.
template <class T, class Box, class Prepare, class Overlaps>
cudaError_t nms(const NmsPlan<T, Box>& plan, void* workspace, const T* scores, const int64_t* groups, Prepare prepare,
                Overlaps overlaps, cudaStream_t stream, const int64_t*& keep, int64_t& kept) {
  using namespace nms_device;
  using KeyType = typename NmsPlan<T, Box>::KeyType;
  auto* base = static_cast<unsigned char*>(workspace);
  auto at = [&](size_t offset) { return static_cast<void*>(base + offset); };
  const int64_t count = plan.count, words = plan.words;
  auto* keys_in = static_cast<KeyType*>(at(plan.keys));
  auto* keys_out = keys_in + count;
  auto* indices_in = static_cast<int64_t*>(at(plan.indices));
  auto* order = indices_in + count;
  keys_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(scores, count, keys_in, indices_in);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  size_t sort_bytes = plan.sort_bytes;
  error = cub::DeviceRadixSort::SortPairsDescending(at(plan.sort), sort_bytes, keys_in, keys_out, indices_in, order,
                                                    static_cast<int>(count), 0, int(8 * sizeof(KeyType)), stream);
  if (error != cudaSuccess) return error;
  auto* sorted = static_cast<Box*>(at(plan.boxes));
  auto* sorted_groups = static_cast<int64_t*>(at(plan.groups));
  gather_kernel<Box><<<blocks_for(count), kThreads, 0, stream>>>(prepare, groups, order, count, sorted, sorted_groups);
  auto* mask = static_cast<uint64_t*>(at(plan.mask));
  mask_kernel<Box><<<dim3(static_cast<unsigned>(words), static_cast<unsigned>(words)), kBlockBoxes, 0, stream>>>(
      sorted, sorted_groups, nullptr, 1, count, words, overlaps, mask);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  auto* removed = static_cast<uint64_t*>(at(plan.removed));
  if ((error = cudaMemsetAsync(removed, 0, static_cast<size_t>(words) * 8, stream)) != cudaSuccess) return error;
  auto* kept_indices = static_cast<int64_t*>(at(plan.keep));
  keep_kernel<<<1, 1024, 0, stream>>>(mask, order, nullptr, count, words, removed, kept_indices, kept_indices + count,
                                      nullptr);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  if ((error = cudaMemcpyAsync(&kept, kept_indices + count, sizeof(int64_t), cudaMemcpyDeviceToHost, stream)) !=
      cudaSuccess) {
    return error;
  }
  keep = kept_indices;
  return cudaStreamSynchronize(stream);
}

// --- batched: independent suppressions of equal size (mmdeploy's per (batch, class) NMS) ---------------------------

namespace nms_device {

// Sort keys of the candidates: their score's where it is > *score_threshold (never for NaN; every candidate where
// score_threshold is null), else 0, below every score's key (Key<T>::of is 0 for none); valid[t] counts task t's
// candidates that pass.
template <class T>
__global__ void batched_keys_kernel(const T* __restrict__ scores, int64_t total, int64_t count, bool filter,
                                    double score_threshold, typename Key<T>::Type* keys, int64_t* indices,
                                    unsigned* valid) {
  OPBRIDGE_GRID_LOOP(i, total) {
    const T s = scores[i];
    const bool passes = !filter || static_cast<double>(s) > score_threshold;
    keys[i] = passes ? Key<T>::of(s) : typename Key<T>::Type(0);
    indices[i] = i;
    if (passes) atomicAdd(valid + i / count, 1u);
  }
}

// (A template, as keep_kernel.)
template <class Index = int64_t>
__global__ void task_keys_kernel(const Index* __restrict__ order, int64_t total, int64_t count, uint32_t* task_keys) {
  OPBRIDGE_GRID_LOOP(r, total) { task_keys[r] = static_cast<uint32_t>(order[r] / count); }
}

// The valid boxes of each task in sorted order, prepared.
template <class Box, class Prepare>
__global__ void batched_gather_kernel(Prepare prepare, const int64_t* __restrict__ order,
                                      const unsigned* __restrict__ valid, int64_t total, int64_t count, Box* sorted) {
  OPBRIDGE_GRID_LOOP(r, total) {
    if (r % count < static_cast<int64_t>(valid[r / count])) sorted[r] = prepare(order[r]);
  }
}

inline int bits_for(int64_t values) {
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < values) ++bits;
  return bits;
}

}  // namespace nms_device

// The device memory of `tasks` suppressions of `count` candidates each (scores of type T, prepared boxes of type
// Box), in one workspace the caller allocates: make sizes it. The mask takes tasks * count * words words: it grows
// with the tasks, not with their square.
template <class T, class Box>
struct BatchedNmsPlan {
  using KeyType = typename nms_device::Key<T>::Type;
  int64_t tasks = 0, count = 0, words = 0;
  size_t keys = 0, indices = 0, task_keys = 0, valid = 0, boxes = 0, mask = 0, removed = 0, keep = 0, kept = 0,
         suppressor = 0, sort = 0, bytes = 0;
  bool record = false;

  // tasks * count <= INT32_MAX (cub's item count), count <= nms_device::kMaxBoxes, tasks < 2^32: the caller checks.
  // record: batched_nms also gives each suppressed candidate's suppressor.
  static cudaError_t make(int64_t tasks, int64_t count, bool record, BatchedNmsPlan& plan) {
    using nms_device::aligned;
    plan.tasks = tasks;
    plan.count = count;
    plan.record = record;
    plan.words = (count + nms_device::kBlockBoxes - 1) / nms_device::kBlockBoxes;
    const auto total = static_cast<int>(tasks * count);
    size_t by_score = 0, by_task = 0;
    cudaError_t queried = cub::DeviceRadixSort::SortPairsDescending(
        nullptr, by_score, static_cast<const KeyType*>(nullptr), static_cast<KeyType*>(nullptr),
        static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), total, 0, int(8 * sizeof(KeyType)));
    if (queried != cudaSuccess) return queried;
    queried = cub::DeviceRadixSort::SortPairs(nullptr, by_task, static_cast<const uint32_t*>(nullptr),
                                              static_cast<uint32_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                              static_cast<int64_t*>(nullptr), total, 0, nms_device::bits_for(tasks));
    if (queried != cudaSuccess) return queried;
    const auto n = static_cast<size_t>(tasks * count), t = static_cast<size_t>(tasks);
    const auto words = static_cast<size_t>(plan.words);
    size_t at = 0;
    for (auto [field, size] : {std::pair{&plan.keys, 2 * n * sizeof(KeyType)},
                               {&plan.indices, 2 * n * 8},
                               {&plan.task_keys, 2 * n * 4},
                               {&plan.valid, t * 4},
                               {&plan.boxes, n * sizeof(Box)},
                               {&plan.mask, n * words * 8},
                               {&plan.removed, t * words * 8},
                               {&plan.keep, n * 8},
                               {&plan.kept, t * 8},
                               {&plan.suppressor, record ? n * 8 : 0},
                               {&plan.sort, std::max(by_score, by_task)}}) {
      *field = at;
      at += aligned(size);
    }
    plan.bytes = at;
    return cudaSuccess;
  }
};

// Where batched_nms leaves its results (device memory, in the workspace), task t's from t * count on:
struct BatchedNmsResult {
  const int64_t* keep = nullptr;        // the kept candidates (their i), in decreasing score order
  const int64_t* order = nullptr;       // the candidates (their i) in sorted order: the ones taking part first
  const int64_t* suppressor = nullptr;  // plan.record: per sorted position, the sorted position of the kept
                                        // candidate that suppressed it, else -1 (kept, or not taking part)
};

// `plan.tasks` suppressions: candidate i = t * count + k (scores [tasks * count]) belongs to task t = i / count,
// takes part if its score is > *score_threshold (every candidate where score_threshold is null), and `prepare(i)`
// gives its box. Each task as `nms` above (one group), its candidates in decreasing score order (stable, over i,
// NaN first). Waits for the stream once; then the results are in `result` and task t's number of kept candidates
// at kept[t] (host memory, plan.tasks entries).
template <class T, class Box, class Prepare, class Overlaps>
cudaError_t batched_nms(const BatchedNmsPlan<T, Box>& plan, void* workspace, const T* scores,
                        const double* score_threshold, Prepare prepare, Overlaps overlaps, cudaStream_t stream,
                        BatchedNmsResult& result, int64_t* kept) {
  using namespace nms_device;
  using KeyType = typename BatchedNmsPlan<T, Box>::KeyType;
  auto* base = static_cast<unsigned char*>(workspace);
  auto at = [&](size_t offset) { return static_cast<void*>(base + offset); };
  const int64_t tasks = plan.tasks, count = plan.count, words = plan.words, total = tasks * count;
  auto* keys_in = static_cast<KeyType*>(at(plan.keys));
  auto* keys_out = keys_in + total;
  auto* indices = static_cast<int64_t*>(at(plan.indices));
  auto* by_score = indices + total;
  auto* task_keys_in = static_cast<uint32_t*>(at(plan.task_keys));
  auto* task_keys_out = task_keys_in + total;
  auto* valid = static_cast<unsigned*>(at(plan.valid));
  cudaError_t error = cudaMemsetAsync(valid, 0, static_cast<size_t>(tasks) * 4, stream);
  if (error != cudaSuccess) return error;
  batched_keys_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
      scores, total, count, score_threshold != nullptr, score_threshold != nullptr ? *score_threshold : 0.0, keys_in,
      indices, valid);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  // Two stable sorts: by score (decreasing), then by task: each task's candidates in decreasing score order, the
  // ones that do not pass last.
  size_t sort_bytes = plan.bytes - plan.sort;
  error = cub::DeviceRadixSort::SortPairsDescending(at(plan.sort), sort_bytes, keys_in, keys_out, indices, by_score,
                                                    static_cast<int>(total), 0, int(8 * sizeof(KeyType)), stream);
  if (error != cudaSuccess) return error;
  task_keys_kernel<<<blocks_for(total), kThreads, 0, stream>>>(by_score, total, count, task_keys_in);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  auto* order = indices;  // free again
  sort_bytes = plan.bytes - plan.sort;
  error = cub::DeviceRadixSort::SortPairs(at(plan.sort), sort_bytes, task_keys_in, task_keys_out, by_score, order,
                                          static_cast<int>(total), 0, bits_for(tasks), stream);
  if (error != cudaSuccess) return error;
  auto* sorted = static_cast<Box*>(at(plan.boxes));
  batched_gather_kernel<Box><<<blocks_for(total), kThreads, 0, stream>>>(prepare, order, valid, total, count, sorted);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  auto* mask = static_cast<uint64_t*>(at(plan.mask));
  const auto layers = static_cast<unsigned>(std::min<int64_t>(tasks, 65535));
  mask_kernel<Box>
      <<<dim3(static_cast<unsigned>(words), static_cast<unsigned>(words), layers), kBlockBoxes, 0, stream>>>(
          sorted, nullptr, valid, tasks, count, words, overlaps, mask);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  auto* removed = static_cast<uint64_t*>(at(plan.removed));
  if ((error = cudaMemsetAsync(removed, 0, static_cast<size_t>(tasks * words) * 8, stream)) != cudaSuccess) {
    return error;
  }
  auto* kept_indices = static_cast<int64_t*>(at(plan.keep));
  auto* kept_counts = static_cast<int64_t*>(at(plan.kept));
  auto* suppressor = plan.record ? static_cast<int64_t*>(at(plan.suppressor)) : nullptr;
  if (suppressor != nullptr &&
      (error = cudaMemsetAsync(suppressor, 0xff, static_cast<size_t>(total) * 8, stream)) != cudaSuccess) {
    return error;  // all bits set: -1
  }
  keep_kernel<<<static_cast<unsigned>(tasks), kThreads, 0, stream>>>(mask, order, valid, count, words, removed,
                                                                     kept_indices, kept_counts, suppressor);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  if ((error = cudaMemcpyAsync(kept, kept_counts, sizeof(int64_t) * static_cast<size_t>(tasks), cudaMemcpyDeviceToHost,
                               stream)) != cudaSuccess) {
    return error;
  }
  result = {kept_indices, order, suppressor};
  return cudaStreamSynchronize(stream);
}

// --- box types ---------------------------------------------------------------------------------------------------

// Rotated boxes (cx, cy, w, h, angle) of opbridge.nms_rotated: box_iou_rotated.h's exact IoU in double, > the
// threshold (kernels/nms_rotated.h).
template <class T>
struct RotatedBoxes {
  const T* boxes;
  bool clockwise;
  __device__ rotated::Polygon operator()(int64_t i) const { return rotated::prepare(boxes + 5 * i, clockwise); }
};
// mmdeploy's NMSRotated: candidate i = (b * classes + c) * count + k is box k of batch b (boxes [B, count, 5]),
// clockwise as mmdeploy's kernel reads the angle.
template <class T>
struct BatchedRotatedBoxes {
  const T* boxes;
  int64_t classes, count;
  __device__ rotated::Polygon operator()(int64_t i) const {
    const int64_t b = i / count / classes, k = i % count;
    return rotated::prepare(boxes + 5 * (b * count + k), true);
  }
};
struct RotatedOverlaps {
  double iou_threshold;
  __device__ bool operator()(const rotated::Polygon& kept, const rotated::Polygon& candidate) const {
    return rotated::overlap(kept, candidate, 0) > iou_threshold;
  }
};

// Axis-aligned boxes (x1, y1, x2, y2) with mmcv's offset, as kernels/nms.h computes them: the area and the IoU in
// T, the same operations in the same order (the candidate's coordinate first in each min and max, so NaNs pick the
// same side), > the threshold rounded to T.
template <class T>
struct AxisBox {
  T x1, y1, x2, y2, area;
};
template <class T>
struct AxisBoxes {
  const T* boxes;
  T offset;
  __device__ AxisBox<T> operator()(int64_t i) const {
    const T* b = boxes + 4 * i;
    return {b[0], b[1], b[2], b[3], (b[2] - b[0] + offset) * (b[3] - b[1] + offset)};
  }
};
template <class T>
struct AxisOverlaps {
  T offset, iou_threshold;
  __device__ bool operator()(const AxisBox<T>& k, const AxisBox<T>& b) const {
    const T right = b.x2 < k.x2 ? b.x2 : k.x2, left = k.x1 < b.x1 ? b.x1 : k.x1;
    const T bottom = b.y2 < k.y2 ? b.y2 : k.y2, top = k.y1 < b.y1 ? b.y1 : k.y1;
    const T w0 = right - left + offset, h0 = bottom - top + offset;
    const T w = T(0) < w0 ? w0 : T(0), h = T(0) < h0 ? h0 : T(0);
    const T inter = w * h;
    return inter / (k.area + b.area - inter) > iou_threshold;
  }
};

// mmdeploy's NMSMatch: candidate i = (b * classes + c) * count + k is box k (x1, y1, x2, y2) of batch b
// (boxes [B, count, 4]), its area (x2 - x1) * (y2 - y1); a kept box suppresses a candidate whose IoU, inter /
// (union + 1e-10) with the union in T and the 1e-10 and the division in double, rounded to T, is >= the threshold:
// kernels/nms.h's nms_match, operation for operation.
template <class T>
struct BatchedAxisBoxes {
  const T* boxes;
  int64_t classes, count;
  __device__ AxisBox<T> operator()(int64_t i) const {
    const int64_t b = i / count / classes, k = i % count;
    const T* x = boxes + 4 * (b * count + k);
    return {x[0], x[1], x[2], x[3], (x[2] - x[0]) * (x[3] - x[1])};
  }
};
template <class T>
struct MatchOverlaps {
  T iou_threshold;
  __device__ bool operator()(const AxisBox<T>& k, const AxisBox<T>& q) const {
    const T right = q.x2 < k.x2 ? q.x2 : k.x2, left = k.x1 < q.x1 ? q.x1 : k.x1;
    const T bottom = q.y2 < k.y2 ? q.y2 : k.y2, top = k.y1 < q.y1 ? q.y1 : k.y1;
    const T w = T(0) < right - left ? right - left : T(0);
    const T h = T(0) < bottom - top ? bottom - top : T(0);
    const T inter = w * h;
    return static_cast<T>(inter / (static_cast<double>(k.area + q.area - inter) + 1e-10)) >= iou_threshold;
  }
};

}  // namespace opbridge::kernels::cuda
