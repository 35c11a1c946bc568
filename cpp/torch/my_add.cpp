// opbridge::my_add(a, b) = 2 * a + b: the op's schema (the contract that its
// fake kernel, autograd and export rules in python/opbridge/ops/my_add.py
// follow) and its CPU adapter of kernels/my_add.h. Its pybind11 binding is
// cpp/torch/python/my_add.cpp.
#include "kernels/my_add.h"

#include "torch/api.h"
#include "torch/my_add.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) { m.def("my_add(Tensor a, Tensor b) -> Tensor"); }

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace opbridge {
namespace {

using api::Tensor;

// A large output is fresh memory: writing it first costs a page fault per 4 KiB
// page, which takes longer than the arithmetic and does not scale with threads.
// Asking for transparent huge pages on it (where the system enables them on
// request, as torch's own THP_MEM_ALLOC_ENABLE does for all allocations) makes
// that one fault per 2 MiB. Advisory only: nothing changes where it is refused.
void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < 4 * kHuge) return;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) / kHuge * kHuge;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / kHuge * kHuge;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

Tensor my_add_cpu(const Tensor& a, const Tensor& b) {
  OPBRIDGE_CHECK(api::is_cpu(a) && api::is_cpu(b), "opbridge::my_add: expected CPU tensors, got a on ",
                 api::device_name(a), " and b on ", api::device_name(b));
  const auto plan = my_add_op::checked_plan(a, b);
  const auto dtype = plan.dtype;
  const auto& loop = plan.loop;
  Tensor out = api::empty(plan.shape, dtype);
  if (out.numel() == 0) return out;
  advise_huge_pages(out.mutable_data_ptr(), static_cast<size_t>(out.numel()) * out.element_size());
  auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };
  auto run = [&](auto tag) {
    using T = decltype(tag);
    kernels::my_add(api::data<T>(a), api::data<T>(b), api::data<T>(out), loop, parallel_for);
  };
  if (dtype == api::ScalarType::Half) {
    run(kernels::float16{});
  } else if (dtype == api::ScalarType::BFloat16) {
    run(kernels::bfloat16{});
  } else {
    api::dispatch_floating(dtype, "opbridge::my_add", run);
  }
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) { OPBRIDGE_IMPL(m, "my_add", my_add_cpu); }

}  // namespace opbridge
