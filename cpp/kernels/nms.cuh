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
// (column block, row block) with column block >= row block; the words left of the diagonal are never read.
template <class Box, class Overlaps>
__global__ void mask_kernel(const Box* __restrict__ boxes, const int64_t* __restrict__ groups, int64_t count,
                            int64_t words, Overlaps overlaps, uint64_t* mask) {
  const int64_t row_block = blockIdx.y, col_block = blockIdx.x;
  if (col_block < row_block) return;
  // Raw storage: a __shared__ array may not have a constructor (a box type's members may have initializers).
  __shared__ alignas(Box) unsigned char storage[kBlockBoxes * sizeof(Box)];
  auto* columns = reinterpret_cast<Box*>(storage);
  __shared__ int64_t column_groups[kBlockBoxes];
  const int64_t col_start = col_block * kBlockBoxes;
  const int col_count = static_cast<int>(std::min<int64_t>(kBlockBoxes, count - col_start));
  if (threadIdx.x < col_count) {
    columns[threadIdx.x] = boxes[col_start + threadIdx.x];
    column_groups[threadIdx.x] = groups[col_start + threadIdx.x];
  }
  __syncthreads();
  const int64_t r = row_block * kBlockBoxes + threadIdx.x;
  if (r >= count) return;
  const Box row = boxes[r];
  const int64_t group = groups[r];
  uint64_t bits = 0;
  for (int b = row_block == col_block ? static_cast<int>(threadIdx.x) + 1 : 0; b < col_count; ++b) {
    if (column_groups[b] == group && overlaps(row, columns[b])) bits |= uint64_t(1) << b;
  }
  mask[r * words + col_block] = bits;
}

// The greedy pass, in one block: box r (sorted order) is kept unless an earlier kept box's mask row has its bit;
// `removed` (zeroed, one word a column block) collects the kept boxes' rows. Writes the kept boxes' input indices
// in order to `keep` and their number to `kept`.
// (A template, so that every file including this header may instantiate it.)
template <class Word = uint64_t>
__global__ void keep_kernel(const Word* __restrict__ mask, const int64_t* __restrict__ order, int64_t count,
                            int64_t words, Word* removed, int64_t* keep, int64_t* kept) {
  __shared__ Word current;
  int64_t n = 0;
  for (int64_t w = 0; w < words; ++w) {
    if (threadIdx.x == 0) current = removed[w];
    __syncthreads();
    Word word = current;  // the same in every thread: each updates its copy from the same rows
    const int64_t end = std::min<int64_t>(kBlockBoxes, count - w * kBlockBoxes);
    for (int b = 0; b < end; ++b) {
      if ((word >> b) & 1) continue;
      const int64_t r = w * kBlockBoxes + b;
      if (threadIdx.x == 0) keep[n] = order[r];
      ++n;
      const Word* row = mask + r * words;
      word |= row[w];
      for (int64_t j = w + 1 + threadIdx.x; j < words; j += blockDim.x) removed[j] |= row[j];
    }
    __syncthreads();  // this word's rows are in `removed` before the next word is read
  }
  if (threadIdx.x == 0) *kept = n;
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
      sorted, sorted_groups, count, words, overlaps, mask);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  auto* removed = static_cast<uint64_t*>(at(plan.removed));
  if ((error = cudaMemsetAsync(removed, 0, static_cast<size_t>(words) * 8, stream)) != cudaSuccess) return error;
  auto* kept_indices = static_cast<int64_t*>(at(plan.keep));
  keep_kernel<<<1, 1024, 0, stream>>>(mask, order, count, words, removed, kept_indices, kept_indices + count);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  if ((error = cudaMemcpyAsync(&kept, kept_indices + count, sizeof(int64_t), cudaMemcpyDeviceToHost, stream)) !=
      cudaSuccess) {
    return error;
  }
  keep = kept_indices;
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

}  // namespace opbridge::kernels::cuda
