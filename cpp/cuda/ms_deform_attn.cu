// opbridge::ms_deform_attn and its backward on CUDA. The forward is kernels/ms_deform_attn.cuh's (shared with the
// ORT CUDA library); the backward, in the forward's layout, owns the gradients of locations and weights (the
// lanes' partial dot products are summed by warp shuffles in a fixed order) and adds into grad_value with
// atomics: the order of those float additions, and so grad_value's last bits, can vary between runs
// (python/opbridge/ops/ms_deform_attn.py raises or warns under torch.use_deterministic_algorithms, as torch's own
// CUDA kernels with atomics do).
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "kernels/ms_deform_attn.cuh"
#include "torch/ms_deform_attn.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::MSDeformAttnShape;

using kernels::cuda::MSDeformAttnLevelTile;
using kernels::cuda::MSDeformAttnSlot;
using kernels::cuda::MSDeformAttnTable;
using kernels::cuda::Vec;

// The launch's level table: by value where it is on the host (checked there), else the device tensors.
MSDeformAttnTable table_of(const ms_deform_attn_op::Inputs& in) {
  const char* unsupported = kernels::cuda::ms_deform_attn_unsupported(in.shape);
  OPBRIDGE_CHECK(unsupported == nullptr, "opbridge::ms_deform_attn: ", unsupported, ", got ", in.shape.levels,
                 " levels and ", in.shape.keys, " keys");
  MSDeformAttnTable table;
  if (in.table_on_host) {
    kernels::cuda::ms_deform_attn_levels(in.shape, api::data<int64_t>(in.spatial_shapes),
                                         api::data<int64_t>(in.level_start_index), table.levels);
  } else {
    table.shapes = api::data<int64_t>(in.spatial_shapes);
    table.starts = api::data<int64_t>(in.level_start_index);
  }
  return table;
}

// target[0..kVec) += value[0..kVec) atomically: one vector atomic per float x 4 on sm_90 (kVec 4, float32 or half
// storage beside a float32 grad_value; target 16-byte aligned there), else per element.
template <class T, int kVec>
__device__ inline void atomic_add(T* target, const T (&value)[kVec]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kVector = std::is_same_v<T, float> && kVec % 4 == 0;
#else
  constexpr bool kVector = false;
#endif
  if constexpr (kVector) {
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      atomicAdd(reinterpret_cast<float4*>(target + j), make_float4(value[j], value[j + 1], value[j + 2], value[j + 3]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) atomicAdd(target + j, value[j]);
  }
}

// The backward in the forward's layout (vectors of kVec channels, `lanes` threads a row, the row's samples computed
// once into shared-memory slots as in the forward). Per sample, each lane adds its channels' terms of the four dot
// products g . v_c and scatters a * w_c * g into grad_value; the lanes' partial dots are then summed by shuffles in
// a fixed order, and the lane that computed the sample keeps them and writes the sample's gradients. S: the storage
// of grad_out and value (T, or float16/bfloat16 beside float32 T: read as stored, in vectors); locations, weights
// and every gradient in T (for half storage: float32 copies and buffers, rounded once by the caller).
template <class S, class T, int kVec, class I>
__global__ void __launch_bounds__(cuda::kThreads, 2)
    backward_kernel(const S* __restrict__ grad_out, const S* __restrict__ value, const T* __restrict__ locations,
                    const T* __restrict__ weights, MSDeformAttnShape s, MSDeformAttnTable table, int lanes,
                    T* grad_value, T* __restrict__ grad_locations, T* __restrict__ grad_weights) {
  using V = Vec<S, kVec>;
  __shared__ MSDeformAttnLevelTile levels;
  __shared__ MSDeformAttnSlot<T> slots[cuda::kThreads];
  kernels::cuda::ms_deform_attn_load_levels(table, s, levels);
  const int64_t rows = s.batch * s.queries * s.heads, lp = s.levels * s.points, d = s.channels;
  const int64_t key_stride = s.heads * d;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  MSDeformAttnSlot<T>* group = slots + (threadIdx.x - lane);
  OPBRIDGE_WARP_LOOP(t, rows * lanes) {
    const bool active = t < rows * lanes;
    const int64_t row = active ? t / lanes : 0, m = row % s.heads, n = row / (s.heads * s.queries);
    const S* value_nm = value + (n * s.keys * s.heads + m) * d;
    T* grad_value_nm = grad_value + (n * s.keys * s.heads + m) * d;
    const S* g = grad_out + row * d;
    const T* loc = locations + row * lp * 2;
    const T* attn = weights + row * lp;
    for (int64_t first = 0; first < lp; first += lanes) {
      const int64_t own = first + lane;  // the sample this lane computes
      const bool owns = active && own < lp;
      group[lane] = owns ? kernels::cuda::ms_deform_attn_slot<T, I>(loc, attn, own, s.points, levels)
                         : kernels::cuda::ms_deform_attn_empty_slot<T>();
      __syncwarp();
      T own_dots[4] = {T(0), T(0), T(0), T(0)};
      const int count = static_cast<int>(lp - first < lanes ? lp - first : lanes);
#pragma unroll 1
      for (int i = 0; i < count; ++i) {
        const MSDeformAttnSlot<T> slot = group[i];
        T dots[4] = {T(0), T(0), T(0), T(0)};
#pragma unroll 1  // one pass for the usual rows (D = 32 floats: 8 lanes x 4); unrolled copies only cost registers
        for (int64_t c0 = lane * kVec; active && c0 < d; c0 += lanes * kVec) {
          const V gv = *reinterpret_cast<const V*>(g + c0);
          V v[4];
          kernels::cuda::ms_deform_attn_corners(value_nm, slot, key_stride, c0, v);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if (slot.key[k] < 0) continue;
            T add[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const T gj = static_cast<T>(gv.v[j]);
              dots[k] += gj * static_cast<T>(v[k].v[j]);
              add[j] = slot.weight[k] * gj;
            }
            atomic_add<T, kVec>(grad_value_nm + static_cast<int64_t>(slot.key[k]) * key_stride + c0, add);
          }
        }
        for (int offset = lanes / 2; offset > 0; offset /= 2) {
#pragma unroll
          for (int k = 0; k < 4; ++k) dots[k] += __shfl_xor_sync(0xffffffffu, dots[k], offset, lanes);
        }
        if (lane == i) {
#pragma unroll
          for (int k = 0; k < 4; ++k) own_dots[k] = dots[k];
        }
      }
      __syncwarp();  // the slots are read before the next samples overwrite them
      if (owns) {    // the sample again (cheaper than holding it in registers over the loop)
        const int64_t l = own / s.points;
        const auto sample = kernels::cuda::ms_deform_attn_sample_at<T, I>(loc, own, s.points, levels);
        const T a = attn[own];
        T* grad_loc = grad_locations + (row * lp + own) * 2;
        if (sample.any) {
          kernels::ms_deform_attn_sample_grads(sample, own_dots, a, static_cast<I>(levels.height[l]),
                                               static_cast<I>(levels.width[l]), grad_weights[row * lp + own],
                                               grad_loc[0], grad_loc[1]);
        } else {
          grad_weights[row * lp + own] = grad_loc[0] = grad_loc[1] = T(0);
        }
      }
    }
  }
}

Tensor ms_deform_attn_cuda(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                           const Tensor& sampling_locations, const Tensor& attention_weights) {
  const auto in =
      ms_deform_attn_op::checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  auto out = api::empty_on({s.batch, s.queries, s.heads * s.channels}, value.scalar_type(), value);
  if (out.numel() == 0) return out;
  const MSDeformAttnTable table = table_of(in);
  const cuda::Context context(value);
  cudaError_t error = cudaSuccess;
  if (api::is_half(value.scalar_type())) {
    // Half storage: value read and out written in float16/bfloat16 vectors, float32 arithmetic and accumulation,
    // one rounding at the end; the locations and weights in float32 (widened here when they came as half).
    const Tensor locations = api::contiguous(api::widened(in.sampling_locations));
    const Tensor weights = api::contiguous(api::widened(in.attention_weights));
    auto launch = [&](auto tag) {
      using S = decltype(tag);
      error = kernels::cuda::ms_deform_attn_forward(static_cast<const S*>(in.value.const_data_ptr()),
                                                    api::data<float>(locations), api::data<float>(weights),
                                                    static_cast<S*>(out.mutable_data_ptr()), s, table, context.stream);
    };
    if (value.scalar_type() == api::ScalarType::Half) {
      launch(__half{});
    } else {
      launch(__nv_bfloat16{});
    }
    cuda::check_launch("opbridge::ms_deform_attn", error);
    return out;
  }
  api::dispatch_floating(value.scalar_type(), "opbridge::ms_deform_attn", [&](auto tag) {
    using T = decltype(tag);
    error = kernels::cuda::ms_deform_attn_forward(api::data<T>(in.value), api::data<T>(in.sampling_locations),
                                                  api::data<T>(in.attention_weights), api::data<T>(out), s, table,
                                                  context.stream);
  });
  cuda::check_launch("opbridge::ms_deform_attn", error);
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
  // Half storage: grad_output and value read as stored; locations and weights as float32 copies (small); every
  // gradient in a float32 buffer (grad_value is a sum over every sample that reads a row), rounded once at the end.
  const bool half = api::is_half(dtype);
  const auto wide = half ? api::ScalarType::Float : dtype;
  const Tensor locations = half ? api::contiguous(api::widened(in.sampling_locations)) : in.sampling_locations;
  const Tensor weights = half ? api::contiguous(api::widened(in.attention_weights)) : in.attention_weights;
  auto grad_value = api::zeros_on(api::sizes(value), wide, value);
  auto grad_locations = api::empty_on(api::sizes(sampling_locations), wide, value);
  auto grad_weights = api::empty_on(api::sizes(attention_weights), wide, value);
  auto finish = [&]() -> std::tuple<Tensor, Tensor, Tensor> {
    if (!half) return {grad_value, grad_locations, grad_weights};
    return {api::to(grad_value, dtype), api::to(grad_locations, sampling_locations.scalar_type()),
            api::to(grad_weights, attention_weights.scalar_type())};
  };
  if (s.batch * s.queries * s.heads * s.levels * s.points == 0) {
    torch::stable::zero_(grad_locations);
    torch::stable::zero_(grad_weights);
    return finish();
  }
  const MSDeformAttnTable table = table_of(in);
  const cuda::Context context(value);
  auto launch = [&](auto storage, auto arithmetic) {
    using S = decltype(storage);
    using T = decltype(arithmetic);
    constexpr int kVec = kernels::cuda::ms_deform_attn_vector<S>();
    const bool vectors = kernels::cuda::ms_deform_attn_vectors<S>(s, {in.value.const_data_ptr(), g.const_data_ptr()}) &&
                         reinterpret_cast<uintptr_t>(grad_value.const_data_ptr()) % 16 == 0;
    const int lanes = kernels::cuda::ms_deform_attn_lanes(vectors ? s.channels / kVec : s.channels);
    const unsigned blocks = cuda::blocks_for(s.batch * s.queries * s.heads * lanes);
    const bool int32 = kernels::cuda::ms_deform_attn_int32_samples(s);
    auto kernel = vectors ? (int32 ? backward_kernel<S, T, kVec, int32_t> : backward_kernel<S, T, kVec, int64_t>)
                          : (int32 ? backward_kernel<S, T, 1, int32_t> : backward_kernel<S, T, 1, int64_t>);
    kernel<<<blocks, cuda::kThreads, 0, context.stream>>>(
        static_cast<const S*>(g.const_data_ptr()), static_cast<const S*>(in.value.const_data_ptr()),
        api::data<T>(locations), api::data<T>(weights), s, table, lanes, api::data<T>(grad_value),
        api::data<T>(grad_locations), api::data<T>(grad_weights));
  };
  if (dtype == api::ScalarType::Half) {
    launch(__half{}, float{});
  } else if (dtype == api::ScalarType::BFloat16) {
    launch(__nv_bfloat16{}, float{});
  } else {
    api::dispatch_floating(dtype, "opbridge::ms_deform_attn_backward", [&](auto tag) { launch(tag, tag); });
  }
  cuda::check_launch("opbridge::ms_deform_attn_backward");
  return finish();
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "ms_deform_attn", ms_deform_attn_cuda);
  OPBRIDGE_IMPL(m, "ms_deform_attn_backward", ms_deform_attn_backward_cuda);
}

}  // namespace opbridge
