// Every opbridge op's schema, in one place: the schema string is the contract
// that the CPU kernels, the fake kernels (python/opbridge/_meta.py), autograd and
// the exporters all follow.
#include <torch/library.h>

TORCH_LIBRARY(opbridge, m) { m.def("my_add(Tensor a, Tensor b) -> Tensor"); }
