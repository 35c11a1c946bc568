// opbridge::my_add on CUDA: kernels/my_add.h's my_add_one per element, inputs addressed through their own
// (broadcast) strides as on the CPU; float32, float64 and float16 (computed in float, rounded once).
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "kernels/my_add.h"
#include "torch/my_add.h"

namespace opbridge {
namespace {

using api::Tensor;

constexpr int kMaxRank = 16;

// The output's (coalesced) sizes and each input's strides, by value.
struct Indexer {
  int rank = 0;
  int64_t sizes[kMaxRank], a_strides[kMaxRank], b_strides[kMaxRank];
};

template <class T, class Acc>
__global__ void my_add_kernel(const T* a, const T* b, T* out, Indexer ix, int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) {
    int64_t rest = i, a_offset = 0, b_offset = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      const int64_t index = rest % ix.sizes[d];
      rest /= ix.sizes[d];
      a_offset += index * ix.a_strides[d];
      b_offset += index * ix.b_strides[d];
    }
    out[i] = kernels::my_add_one<T, Acc>(a[a_offset], b[b_offset]);
  }
}

template <class T, class Acc>
__global__ void my_add_contiguous_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                         int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) { out[i] = kernels::my_add_one<T, Acc>(a[i], b[i]); }
}

Tensor my_add_cuda(const Tensor& a, const Tensor& b) {
  const auto plan = my_add_op::checked_plan(a, b);
  const auto& loop = plan.loop;
  Tensor out = api::empty_on(plan.shape, plan.dtype, a);
  if (out.numel() == 0) return out;
  OPBRIDGE_CHECK(loop.sizes.size() <= kMaxRank, "opbridge::my_add: CUDA supports broadcasts of up to ", kMaxRank,
                 " dimensions after merging, got ", loop.sizes.size());
  Indexer ix;
  ix.rank = static_cast<int>(loop.sizes.size());
  for (int d = 0; d < ix.rank; ++d) {
    ix.sizes[d] = loop.sizes[d], ix.a_strides[d] = loop.a_strides[d], ix.b_strides[d] = loop.b_strides[d];
  }
  const bool contiguous = ix.rank == 1 && ix.a_strides[0] == 1 && ix.b_strides[0] == 1;
  const cuda::Context context(a);
  auto launch = [&](auto tag, auto acc_tag) {
    using T = decltype(tag);
    using Acc = decltype(acc_tag);
    const auto* a_data = static_cast<const T*>(a.const_data_ptr());
    const auto* b_data = static_cast<const T*>(b.const_data_ptr());
    auto* out_data = static_cast<T*>(out.mutable_data_ptr());
    const unsigned blocks = cuda::blocks_for(loop.numel);
    if (contiguous) {
      my_add_contiguous_kernel<T, Acc>
          <<<blocks, cuda::kThreads, 0, context.stream>>>(a_data, b_data, out_data, loop.numel);
    } else {
      my_add_kernel<T, Acc><<<blocks, cuda::kThreads, 0, context.stream>>>(a_data, b_data, out_data, ix, loop.numel);
    }
    cuda::check_launch("opbridge::my_add");
  };
  if (plan.dtype == api::ScalarType::Half) {
    launch(__half{}, float{});
  } else if (plan.dtype == api::ScalarType::Float) {
    launch(float{}, float{});
  } else {
    launch(double{}, double{});
  }
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) { OPBRIDGE_IMPL(m, "my_add", my_add_cuda); }

}  // namespace opbridge
