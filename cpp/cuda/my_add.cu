// opbridge::my_add on CUDA: kernels/my_add.cuh's kernels (shared with the ORT CUDA library) on torch's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "kernels/my_add.cuh"
#include "torch/my_add.h"

namespace opbridge {
namespace {

using api::Tensor;

Tensor my_add_cuda(const Tensor& a, const Tensor& b) {
  const auto plan = my_add_op::checked_plan(a, b);
  const auto& loop = plan.loop;
  Tensor out = api::empty_on(plan.shape, plan.dtype, a);
  if (out.numel() == 0) return out;
  OPBRIDGE_CHECK(kernels::cuda::my_add_fits(loop), "opbridge::my_add: CUDA supports broadcasts of up to ",
                 kernels::cuda::kMaxAddRank, " dimensions after merging, got ", loop.sizes.size());
  const cuda::Context context(a);
  auto launch = [&](auto tag, auto acc_tag) {
    using T = decltype(tag);
    using Acc = decltype(acc_tag);
    cuda::check_launch("opbridge::my_add",
                       kernels::cuda::my_add<T, Acc>(static_cast<const T*>(a.const_data_ptr()),
                                                     static_cast<const T*>(b.const_data_ptr()),
                                                     static_cast<T*>(out.mutable_data_ptr()), loop, context.stream));
  };
  if (plan.dtype == api::ScalarType::Half) {
    launch(__half{}, float{});
  } else if (plan.dtype == api::ScalarType::BFloat16) {
    launch(__nv_bfloat16{}, float{});
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
