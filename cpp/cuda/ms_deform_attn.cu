// opbridge::ms_deform_attn and its backward on CUDA: kernels/ms_deform_attn.h's sample (corners, bilinear
// weights) and gradient arithmetic per (image, query, head) row, as on the CPU.
//
// A row's channels are spread over `lanes` threads (a power of two up to a warp; each thread owns channels
// lane, lane + lanes, ...), so a corner's value row is read in one coalesced access. The forward owns its output
// elements. The backward owns the gradients of locations and weights (the lanes' partial dot products are summed
// by warp shuffles in a fixed order) and adds into grad_value with atomics: the order of those float additions,
// and so grad_value's last bits, can vary between runs (python/opbridge/ops/ms_deform_attn.py raises or warns
// under torch.use_deterministic_algorithms, as torch's own CUDA kernels with atomics do).
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "cuda/common.cuh"
#include "kernels/ms_deform_attn.h"
#include "torch/ms_deform_attn.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::MSDeformAttnShape;

constexpr int kMaxLevels = 32;

// The checked level table, by value: the kernels read no table from device memory.
struct Levels {
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
};

Levels levels_of(const ms_deform_attn_op::Inputs& in) {
  OPBRIDGE_CHECK(in.shape.levels <= kMaxLevels, "opbridge::ms_deform_attn: the CUDA kernels take up to ", kMaxLevels,
                 " levels, got ", in.shape.levels);
  const auto* shapes = api::data<int64_t>(in.spatial_shapes);
  const auto* starts = api::data<int64_t>(in.level_start_index);
  Levels levels{};
  for (int64_t l = 0; l < in.shape.levels; ++l) {
    levels.height[l] = shapes[2 * l], levels.width[l] = shapes[2 * l + 1], levels.start[l] = starts[l];
  }
  return levels;
}

// Threads per row for rows of `units` (channels, or vectors of them): up to a warp.
int lanes_for(int64_t units) {
  int lanes = 1;
  while (lanes < 32 && lanes < units) lanes *= 2;
  return lanes;
}

// Loops a warp's threads over rows * lanes work items together (the bound is the same for the whole warp, so
// the shuffles of the backward are never reached by part of a warp).
#define OPBRIDGE_WARP_LOOP(t, total)                                            \
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       t - static_cast<int64_t>(threadIdx.x & 31) < (total); t += static_cast<int64_t>(gridDim.x) * blockDim.x)

// T values moved as one aligned load (16 bytes for float x 4 or double x 2).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// A row's channels in vectors of kVec (channels % kVec == 0 and value 16-byte aligned, else kVec = 1): `lanes`
// threads a row, each owning vectors lane, lane + lanes, ...; every sample's four corners are loaded before their
// multiply-adds, which follow the CPU kernel's order (acc += w0 v0 + w1 v1 + w2 v2 + w3 v3).
template <class T, int kVec>
__global__ void forward_kernel(const T* __restrict__ value, const T* __restrict__ locations,
                               const T* __restrict__ weights, T* __restrict__ out, MSDeformAttnShape s, Levels levels,
                               int lanes) {
  using V = Vec<T, kVec>;
  const int64_t rows = s.batch * s.queries * s.heads, lp = s.levels * s.points, d = s.channels;
  const int64_t key_stride = s.heads * d;
  OPBRIDGE_WARP_LOOP(t, rows * lanes) {
    if (t >= rows * lanes) continue;
    const int64_t row = t / lanes, lane = t % lanes, m = row % s.heads, n = row / (s.heads * s.queries);
    const T* value_nm = value + (n * s.keys * s.heads + m) * d;
    const T* loc = locations + row * lp * 2;
    const T* attn = weights + row * lp;
    for (int64_t c0 = lane * kVec; c0 < d; c0 += lanes * kVec) {
      T acc[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = T(0);
      for (int64_t l = 0; l < s.levels; ++l) {
        for (int64_t p = 0; p < s.points; ++p) {
          const int64_t i = l * s.points + p;
          const auto sample = kernels::ms_deform_attn_sample(loc[2 * i], loc[2 * i + 1], levels.height[l],
                                                             levels.width[l], levels.start[l]);
          if (!sample.any) continue;
          const T a = attn[i];
          T w[4];
          V v[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            w[k] = sample.inside[k] ? a * sample.weight[k] : T(0);
            if (sample.inside[k]) {
              v[k] = *reinterpret_cast<const V*>(value_nm + sample.key[k] * key_stride + c0);
            } else {
#pragma unroll
              for (int j = 0; j < kVec; ++j) v[k].v[j] = T(0);
            }
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            acc[j] += w[0] * v[0].v[j] + w[1] * v[1].v[j] + w[2] * v[2].v[j] + w[3] * v[3].v[j];
          }
        }
      }
      V result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) result.v[j] = acc[j];
      *reinterpret_cast<V*>(out + row * d + c0) = result;
    }
  }
}

// target[0..kVec) += value[0..kVec) atomically: one vector atomic for float x 4 on sm_90, else per element.
template <class T, int kVec>
__device__ inline void atomic_add(T* target, const T (&value)[kVec]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kVector = std::is_same_v<T, float> && kVec == 4;
#else
  constexpr bool kVector = false;
#endif
  if constexpr (kVector) {
    atomicAdd(reinterpret_cast<float4*>(target), make_float4(value[0], value[1], value[2], value[3]));
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) atomicAdd(target + j, value[j]);
  }
}

// The backward in the forward's layout (vectors of kVec channels, `lanes` threads a row). Per sample, each lane
// adds its channels' terms of the four dot products g . v_c and scatters a * w_c * g into grad_value; the lanes'
// partial dots are then summed by shuffles in a fixed order, and lane 0 writes the sample's gradients.
template <class T, int kVec>
__global__ void backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ value,
                                const T* __restrict__ locations, const T* __restrict__ weights, MSDeformAttnShape s,
                                Levels levels, int lanes, T* grad_value, T* __restrict__ grad_locations,
                                T* __restrict__ grad_weights) {
  using V = Vec<T, kVec>;
  const int64_t rows = s.batch * s.queries * s.heads, lp = s.levels * s.points, d = s.channels;
  const int64_t key_stride = s.heads * d;
  OPBRIDGE_WARP_LOOP(t, rows * lanes) {
    const bool active = t < rows * lanes;
    const int64_t row = active ? t / lanes : 0, lane = t % lanes, m = row % s.heads, n = row / (s.heads * s.queries);
    const T* value_nm = value + (n * s.keys * s.heads + m) * d;
    T* grad_value_nm = grad_value + (n * s.keys * s.heads + m) * d;
    const T* g = grad_out + row * d;
    const T* loc = locations + row * lp * 2;
    const T* attn = weights + row * lp;
    for (int64_t l = 0; l < s.levels; ++l) {
      for (int64_t p = 0; p < s.points; ++p) {
        const int64_t i = l * s.points + p;
        const auto sample = kernels::ms_deform_attn_sample(loc[2 * i], loc[2 * i + 1], levels.height[l],
                                                           levels.width[l], levels.start[l]);
        bool inside[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) inside[c] = active && sample.any && sample.inside[c];
        const T a = attn[i];
        T dots[4] = {T(0), T(0), T(0), T(0)};
        for (int64_t c0 = lane * kVec; c0 < d; c0 += lanes * kVec) {
          if (!active || !sample.any) break;
          const V gv = *reinterpret_cast<const V*>(g + c0);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if (!inside[k]) continue;
            const int64_t offset = sample.key[k] * key_stride + c0;
            const V v = *reinterpret_cast<const V*>(value_nm + offset);
            const T scale = a * sample.weight[k];
            T add[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              dots[k] += gv.v[j] * v.v[j];
              add[j] = scale * gv.v[j];
            }
            atomic_add<T, kVec>(grad_value_nm + offset, add);
          }
        }
        for (int offset = lanes / 2; offset > 0; offset /= 2) {
#pragma unroll
          for (int k = 0; k < 4; ++k) dots[k] += __shfl_xor_sync(0xffffffffu, dots[k], offset, lanes);
        }
        if (active && lane == 0) {
          T* grad_loc = grad_locations + (row * lp + i) * 2;
          if (sample.any) {
            kernels::ms_deform_attn_sample_grads(sample, dots, a, levels.height[l], levels.width[l],
                                                 grad_weights[row * lp + i], grad_loc[0], grad_loc[1]);
          } else {
            grad_weights[row * lp + i] = grad_loc[0] = grad_loc[1] = T(0);
          }
        }
      }
    }
  }
}

// Whether the vector kernels can serve: whole vectors a row, every vector accessed 16-byte aligned.
template <class T>
bool use_vectors(const MSDeformAttnShape& s, std::initializer_list<const void*> data) {
  if (s.channels % (16 / sizeof(T)) != 0) return false;
  for (const void* pointer : data) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) return false;
  }
  return true;
}

Tensor ms_deform_attn_cuda(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                           const Tensor& sampling_locations, const Tensor& attention_weights) {
  const auto in =
      ms_deform_attn_op::checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  auto out = api::empty_on({s.batch, s.queries, s.heads * s.channels}, value.scalar_type(), value);
  if (out.numel() == 0) return out;
  const Levels levels = levels_of(in);
  const cuda::Context context(value);
  api::dispatch_floating(value.scalar_type(), "opbridge::ms_deform_attn", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vectors = use_vectors<T>(s, {in.value.const_data_ptr(), out.const_data_ptr()});
    const int lanes = lanes_for(vectors ? s.channels / kVec : s.channels);
    const unsigned blocks = cuda::blocks_for(s.batch * s.queries * s.heads * lanes);
    auto kernel = vectors ? forward_kernel<T, kVec> : forward_kernel<T, 1>;
    kernel<<<blocks, cuda::kThreads, 0, context.stream>>>(api::data<T>(in.value), api::data<T>(in.sampling_locations),
                                                          api::data<T>(in.attention_weights), api::data<T>(out), s,
                                                          levels, lanes);
  });
  cuda::check_launch("opbridge::ms_deform_attn");
  return out;
}

std::tuple<Tensor, Tensor, Tensor> ms_deform_attn_backward_cuda(const Tensor& grad_output, const Tensor& value,
                                                                const Tensor& spatial_shapes,
                                                                const Tensor& level_start_index,
                                                                const Tensor& sampling_locations,
                                                                const Tensor& attention_weights) {
  const auto in =
      ms_deform_attn_op::checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  const auto dtype = value.scalar_type();
  const std::vector<int64_t> out_shape{s.batch, s.queries, s.heads * s.channels};
  OPBRIDGE_CHECK(api::same_device(grad_output, value) && grad_output.scalar_type() == dtype,
                 "opbridge::ms_deform_attn_backward: grad_output must be a tensor of value's dtype (",
                 api::dtype_name(dtype), ") on its device (", api::device_name(value), "), got ",
                 api::dtype_name(grad_output.scalar_type()), " on ", api::device_name(grad_output));
  OPBRIDGE_CHECK(api::sizes(grad_output) == out_shape, "opbridge::ms_deform_attn_backward: grad_output ",
                 "must have the output's shape ", api::Shape{out_shape}, ", got ", api::shape_of(grad_output));
  const auto g = api::contiguous(grad_output);
  auto grad_value = api::zeros_on(api::sizes(value), dtype, value);
  auto grad_locations = api::empty_on(api::sizes(sampling_locations), dtype, value);
  auto grad_weights = api::empty_on(api::sizes(attention_weights), dtype, value);
  if (s.batch * s.queries * s.heads * s.levels * s.points == 0) {
    torch::stable::zero_(grad_locations);
    torch::stable::zero_(grad_weights);
    return {grad_value, grad_locations, grad_weights};
  }
  const Levels levels = levels_of(in);
  const cuda::Context context(value);
  api::dispatch_floating(dtype, "opbridge::ms_deform_attn_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vectors =
        use_vectors<T>(s, {in.value.const_data_ptr(), g.const_data_ptr(), grad_value.const_data_ptr()});
    const int lanes = lanes_for(vectors ? s.channels / kVec : s.channels);
    const unsigned blocks = cuda::blocks_for(s.batch * s.queries * s.heads * lanes);
    auto kernel = vectors ? backward_kernel<T, kVec> : backward_kernel<T, 1>;
    kernel<<<blocks, cuda::kThreads, 0, context.stream>>>(
        api::data<T>(g), api::data<T>(in.value), api::data<T>(in.sampling_locations),
        api::data<T>(in.attention_weights), s, levels, lanes, api::data<T>(grad_value), api::data<T>(grad_locations),
        api::data<T>(grad_weights));
  });
  cuda::check_launch("opbridge::ms_deform_attn_backward");
  return {grad_value, grad_locations, grad_weights};
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "ms_deform_attn", ms_deform_attn_cuda);
  OPBRIDGE_IMPL(m, "ms_deform_attn_backward", ms_deform_attn_backward_cuda);
}

}  // namespace opbridge
