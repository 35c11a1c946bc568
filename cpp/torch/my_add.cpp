// opbridge::my_add(a, b) = 2 * a + b: the op's schema (the contract that its
// fake kernel, autograd and export rules in python/opbridge/ops/my_add.py
// follow), its CPU adapter of kernels/my_add.h, and its pybind11 binding.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "kernels/my_add.h"
#include "torch/python_bindings.h"

TORCH_LIBRARY_FRAGMENT(opbridge, m) { m.def("my_add(Tensor a, Tensor b) -> Tensor"); }

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace opbridge {
namespace {

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

std::vector<int64_t> to_vector(c10::IntArrayRef values) { return {values.begin(), values.end()}; }

at::Tensor my_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "opbridge::my_add: expected CPU tensors, got a on ",
              a.device(), " and b on ", b.device());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(),
              "opbridge::my_add: a and b must have the same dtype, got a: ", a.scalar_type(),
              " and b: ", b.scalar_type(), " (cast one of them first)");
  const auto dtype = a.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf,
              "opbridge::my_add: expected float32, float64 or float16 tensors, got ", dtype);
  TORCH_CHECK(a.layout() == at::kStrided && b.layout() == at::kStrided,
              "opbridge::my_add: expected dense (strided) tensors, got ", a.layout(), " and ", b.layout());

  std::vector<int64_t> shape;
  const auto status =
      kernels::broadcast_shapes("opbridge::my_add", "a", to_vector(a.sizes()), "b", to_vector(b.sizes()), shape);
  TORCH_CHECK(status.ok(), status.message);

  at::Tensor out = at::empty(shape, a.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  advise_huge_pages(out.mutable_data_ptr(), out.nbytes());
  // expand() gives the strides of each input over the output shape (0 where
  // broadcast) without copying; non-contiguous inputs keep their strides.
  const auto loop =
      kernels::make_binary_loop(shape, to_vector(a.expand(shape).strides()), to_vector(b.expand(shape).strides()));
  auto parallel_for = [](int64_t tasks, const auto& task) {
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) task(t);
    });
  };
  if (dtype == at::kHalf) {
    using Half = kernels::float16;
    kernels::my_add(reinterpret_cast<const Half*>(a.const_data_ptr()),
                    reinterpret_cast<const Half*>(b.const_data_ptr()), reinterpret_cast<Half*>(out.mutable_data_ptr()),
                    loop, parallel_for);
  } else {
    AT_DISPATCH_FLOATING_TYPES(dtype, "opbridge::my_add", [&] {
      kernels::my_add(a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                      loop, parallel_for);
    });
  }
  return out;
}

// The tutorial's pybind11 function. It calls the registered op rather than the
// kernel: the dispatcher routes to the same CPU kernel, and tracers
// (torch.jit.trace for the legacy ONNX exporter, torch.export for the dynamo
// one) record the call as opbridge::my_add; a direct kernel call would be
// recorded as a constant.
at::Tensor my_add_python(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opbridge::my_add", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CPU, m) { m.impl("my_add", &my_add_cpu); }

OPBRIDGE_PYTHON_BINDING(my_add, module) {
  module.def("my_add", &my_add_python, pybind11::arg("a"), pybind11::arg("b"),
             "my_add(a, b) -> Tensor\n\nReturns 2 * a + b (broadcasting; float32, float64 or float16; CPU).");
}

}  // namespace opbridge
