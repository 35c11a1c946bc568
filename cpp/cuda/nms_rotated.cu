// opbridge::nms_rotated on CUDA, as torchvision's nms does it on the GPU: the boxes sorted by score (cub's radix
// sort, stable: equal scores keep their input order, NaN first, as the CPU op's sort), a bitmask of the pairs that
// overlap above the threshold (64 boxes against 64 in a block, kernels/box_iou_rotated.h's double-precision IoU, the
// CPU op's), and the greedy pass over that mask in one block on the device. The host waits once, for the number of
// kept boxes (the output's size depends on the data).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "cuda/common.cuh"
#include "torch/box_iou_rotated.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::rotated::Polygon;

constexpr int kBlockBoxes = 64;  // boxes a mask word covers

// A sort key that orders as the CPU op's comparator does in decreasing order: NaN above everything, -0 equal to +0.
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

// The boxes in sorted order, prepared; their labels (0 without labels).
template <class T>
__global__ void gather_kernel(const T* __restrict__ boxes, const int64_t* __restrict__ labels,
                              const int64_t* __restrict__ order, int64_t count, bool clockwise, Polygon* polygons,
                              int64_t* sorted_labels) {
  OPBRIDGE_GRID_LOOP(r, count) {
    const int64_t i = order[r];
    polygons[r] = kernels::rotated::prepare(boxes + 5 * i, clockwise);
    sorted_labels[r] = labels != nullptr ? labels[i] : 0;
  }
}

// mask[r * words + w] bit b: box w * 64 + b (in sorted order, after r) has r's label and overlaps r above the
// threshold. Blocks (column block, row block) with column block >= row block; the words left of the diagonal are
// never read.
__global__ void mask_kernel(const Polygon* __restrict__ polygons, const int64_t* __restrict__ labels, int64_t count,
                            int64_t words, double iou_threshold, uint64_t* mask) {
  const int64_t row_block = blockIdx.y, col_block = blockIdx.x;
  if (col_block < row_block) return;
  // Raw storage: a __shared__ array may not have a constructor (Polygon's members have initializers).
  __shared__ alignas(Polygon) unsigned char storage[kBlockBoxes * sizeof(Polygon)];
  auto* columns = reinterpret_cast<Polygon*>(storage);
  __shared__ int64_t column_labels[kBlockBoxes];
  const int64_t col_start = col_block * kBlockBoxes;
  const int col_count = static_cast<int>(std::min<int64_t>(kBlockBoxes, count - col_start));
  if (threadIdx.x < col_count) {
    columns[threadIdx.x] = polygons[col_start + threadIdx.x];
    column_labels[threadIdx.x] = labels[col_start + threadIdx.x];
  }
  __syncthreads();
  const int64_t r = row_block * kBlockBoxes + threadIdx.x;
  if (r >= count) return;
  const Polygon row = polygons[r];
  const int64_t label = labels[r];
  uint64_t bits = 0;
  for (int b = row_block == col_block ? static_cast<int>(threadIdx.x) + 1 : 0; b < col_count; ++b) {
    if (column_labels[b] == label && kernels::rotated::overlap(row, columns[b], 0) > iou_threshold) {
      bits |= uint64_t(1) << b;
    }
  }
  mask[r * words + col_block] = bits;
}

// The greedy pass, in one block: box r (sorted order) is kept unless an earlier kept box's mask row has its bit;
// `removed` (zeroed, one word a column block) collects the kept boxes' rows. Writes the kept boxes' input indices
// in order to `keep` and their number to `kept`.
__global__ void keep_kernel(const uint64_t* __restrict__ mask, const int64_t* __restrict__ order, int64_t count,
                            int64_t words, uint64_t* removed, int64_t* keep, int64_t* kept) {
  __shared__ uint64_t current;
  int64_t n = 0;
  for (int64_t w = 0; w < words; ++w) {
    if (threadIdx.x == 0) current = removed[w];
    __syncthreads();
    uint64_t word = current;  // the same in every thread: each updates its copy from the same rows
    const int64_t end = std::min<int64_t>(kBlockBoxes, count - w * kBlockBoxes);
    for (int b = 0; b < end; ++b) {
      if ((word >> b) & 1) continue;
      const int64_t r = w * kBlockBoxes + b;
      if (threadIdx.x == 0) keep[n] = order[r];
      ++n;
      const uint64_t* row = mask + r * words;
      word |= row[w];
      for (int64_t j = w + 1 + threadIdx.x; j < words; j += blockDim.x) removed[j] |= row[j];
    }
    __syncthreads();  // this word's rows are in `removed` before the next word is read
  }
  if (threadIdx.x == 0) *kept = n;
}

template <class T>
Tensor suppress(const char* op, const Tensor& boxes, const Tensor& scores, const std::optional<Tensor>& labels,
                int64_t count, double iou_threshold, bool clockwise, cudaStream_t stream) {
  using KeyType = typename Key<T>::Type;
  const auto b = api::contiguous(boxes), s = api::contiguous(scores);
  const auto l =
      labels ? std::optional<Tensor>(api::contiguous(api::to(*labels, api::ScalarType::Long))) : std::nullopt;
  const int64_t words = (count + kBlockBoxes - 1) / kBlockBoxes;
  OPBRIDGE_CHECK(words <= 65535, op, ": at most ", 65535 * kBlockBoxes, " boxes on CUDA (the grid of the mask), got ",
                 count, "; pre-filter the boxes by score");
  auto byte_buffer = [&](int64_t bytes) { return api::empty_on({bytes}, api::ScalarType::Byte, boxes); };
  auto long_buffer = [&](int64_t n) { return api::empty_on({n}, api::ScalarType::Long, boxes); };
  // The sort.
  auto keys = byte_buffer(2 * count * static_cast<int64_t>(sizeof(KeyType)));
  auto* keys_in = static_cast<KeyType*>(keys.mutable_data_ptr());
  auto* keys_out = keys_in + count;
  auto indices = long_buffer(2 * count);
  auto* indices_in = api::data<int64_t>(indices);
  auto* order = indices_in + count;
  keys_kernel<T><<<cuda::blocks_for(count), cuda::kThreads, 0, stream>>>(api::data<T>(s), count, keys_in, indices_in);
  cuda::check_launch(op);
  size_t temp_bytes = 0;
  cuda::check_launch(
      op, cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, keys_in, keys_out, indices_in, order,
                                                    static_cast<int>(count), 0, int(8 * sizeof(KeyType)), stream));
  auto temp = byte_buffer(static_cast<int64_t>(temp_bytes) + 1);
  cuda::check_launch(op, cub::DeviceRadixSort::SortPairsDescending(temp.mutable_data_ptr(), temp_bytes, keys_in,
                                                                   keys_out, indices_in, order, static_cast<int>(count),
                                                                   0, int(8 * sizeof(KeyType)), stream));
  // The boxes in that order, the mask, the greedy pass.
  auto polygons = byte_buffer(count * static_cast<int64_t>(sizeof(Polygon)));
  auto* sorted = static_cast<Polygon*>(polygons.mutable_data_ptr());
  auto sorted_labels = long_buffer(count);
  gather_kernel<T><<<cuda::blocks_for(count), cuda::kThreads, 0, stream>>>(
      api::data<T>(b), l ? api::data<int64_t>(*l) : nullptr, order, count, clockwise, sorted,
      api::data<int64_t>(sorted_labels));
  cuda::check_launch(op);
  auto mask = byte_buffer(count * words * 8);
  auto* mask_words = static_cast<uint64_t*>(mask.mutable_data_ptr());
  mask_kernel<<<dim3(static_cast<unsigned>(words), static_cast<unsigned>(words)), kBlockBoxes, 0, stream>>>(
      sorted, api::data<int64_t>(sorted_labels), count, words, iou_threshold, mask_words);
  cuda::check_launch(op);
  auto removed = api::zeros_on({words}, api::ScalarType::Long, boxes);
  auto keep = long_buffer(count + 1);  // the kept indices, then their number
  int64_t* keep_data = api::data<int64_t>(keep);
  keep_kernel<<<1, 1024, 0, stream>>>(mask_words, order, count, words,
                                      reinterpret_cast<uint64_t*>(api::data<int64_t>(removed)), keep_data,
                                      keep_data + count);
  cuda::check_launch(op);
  int64_t kept = 0;
  cuda::check_launch(op, cudaMemcpyAsync(&kept, keep_data + count, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  cuda::check_launch(op, cudaStreamSynchronize(stream));
  auto out = long_buffer(kept);
  if (kept > 0) {
    cuda::check_launch(op, cudaMemcpyAsync(api::data<int64_t>(out), keep_data, sizeof(int64_t) * kept,
                                           cudaMemcpyDeviceToDevice, stream));
  }
  return out;
}

Tensor nms_rotated_cuda(const Tensor& boxes, const Tensor& scores, double iou_threshold,
                        const std::optional<Tensor>& labels, bool clockwise) {
  constexpr const char* kOp = "opbridge::nms_rotated";
  const int64_t count = rotated_op::checked_nms(kOp, boxes, scores, labels);
  const auto dtype = boxes.scalar_type();
  if (api::is_half(dtype)) {  // half storage: the overlaps computed in double, as for float32
    return nms_rotated_cuda(api::widened(boxes), api::widened(scores), iou_threshold, labels, clockwise);
  }
  if (count == 0) return api::empty_on({0}, api::ScalarType::Long, boxes);
  const cuda::Context context(boxes);
  Tensor out;
  api::dispatch_floating(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    out = suppress<T>(kOp, boxes, scores, labels, count, iou_threshold, clockwise, context.stream);
  });
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) { OPBRIDGE_IMPL(m, "nms_rotated", nms_rotated_cuda); }

}  // namespace opbridge
