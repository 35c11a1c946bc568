// Every opbridge op's schema, in one place: the schema string is the contract
// that the CPU kernels, the fake kernels and autograd (python/opbridge/ops.py)
// and the exporters (python/opbridge/defs/) all follow.
#include <torch/library.h>

TORCH_LIBRARY(opbridge, m) {
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
  // torchvision.ops.deform_conv2d's signature and semantics.
  m.def(
      "deform_conv2d(Tensor input, Tensor offset, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, Tensor? mask=None) -> Tensor");
}
