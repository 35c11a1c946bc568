// The checks of opbridge::my_add's arguments and its broadcast loop, shared by its CPU adapter (my_add.cpp) and
// its CUDA adapter (cpp/cuda/my_add.cu).
#pragma once

#include <vector>

#include "kernels/broadcast.h"
#include "torch/api.h"

namespace opbridge::my_add_op {

struct Plan {
  api::ScalarType dtype;
  std::vector<int64_t> shape;  // the broadcast output shape
  kernels::BinaryLoop loop;    // each input keeps its own strides (0 where broadcast): nothing is copied
};

inline Plan checked_plan(const api::Tensor& a, const api::Tensor& b) {
  OPBRIDGE_CHECK(api::same_device(a, b), "opbridge::my_add: a and b must be on one device, got a on ",
                 api::device_name(a), " and b on ", api::device_name(b));
  const auto dtype = a.scalar_type();
  OPBRIDGE_CHECK(dtype == b.scalar_type(),
                 "opbridge::my_add: a and b must have the same dtype, got a: ", api::dtype_name(dtype),
                 " and b: ", api::dtype_name(b.scalar_type()), " (cast one of them first)");
  OPBRIDGE_CHECK(api::is_float_storage(dtype), "opbridge::my_add: expected ", api::kFloatStorageNames, " tensors, got ",
                 api::dtype_name(dtype));
  OPBRIDGE_CHECK(api::is_strided(a) && api::is_strided(b), "opbridge::my_add: expected dense (strided) tensors");
  Plan plan{dtype, {}, {}};
  const auto a_shape = api::sizes(a), b_shape = api::sizes(b);
  const auto status = kernels::broadcast_shapes("opbridge::my_add", "a", a_shape, "b", b_shape, plan.shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  plan.loop = kernels::make_binary_loop(plan.shape, kernels::broadcast_strides(a_shape, api::strides(a), plan.shape),
                                        kernels::broadcast_strides(b_shape, api::strides(b), plan.shape));
  return plan;
}

}  // namespace opbridge::my_add_op
