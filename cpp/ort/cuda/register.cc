// libopbridge_ort_cuda.so's one export, called by libopbridge_ort.so (register.cc) when the runtime has the CUDA
// execution provider: it creates this library's CUDA nodes (cuda/<op>.cc) with the runtime's API and hands each to the
// main library, which adds them to its domains beside the CPU nodes of the same names. ONNX Runtime then gives
// a node the CUDA kernel when the session places it on the CUDA execution provider.
#include <cstring>

#include "ort/api.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort {
namespace {
int g_api_version = 0;
}  // namespace

int api_version() { return g_api_version; }

std::vector<OpRegistration>& registered_ops() {
  static std::vector<OpRegistration> ops;
  return ops;
}

}  // namespace opbridge::ort

// `add(context, domain, op)` once per CUDA node; returns how many there were (-1 on failure). Called once per
// process.
extern "C" __attribute__((visibility("default"))) int opbridge_ort_cuda_ops(
    const OrtApi* api, int version, void (*add)(void* context, const char* domain, OrtCustomOp* op), void* context) {
  using namespace opbridge::ort;
  g_api_version = version;
  Ort::InitApi(api);
  try {
    int count = 0;
    for (const auto& registration : registered_ops()) {
      std::vector<Ort::Custom::OrtLiteCustomOp*> ops;
      registration.append(ops);
      for (auto* op : ops) add(context, registration.domain, op), ++count;
    }
    return count;
  } catch (...) {
    return -1;
  }
}

// 0 where this process can run the CUDA nodes; else 1 (no NVIDIA driver) or 2 (a driver too old for the CUDA
// runtime linked in), with the reason in `message` (at most `size` bytes, terminated). Called before
// opbridge_ort_cuda_ops.
extern "C" __attribute__((visibility("default"))) int opbridge_ort_cuda_problem(char* message, int size) {
  const std::string problem = opbridge::ort::cuda::driver_problem();
  if (size > 0) {
    std::strncpy(message, problem.c_str(), static_cast<size_t>(size) - 1);
    message[size - 1] = '\0';
  }
  return problem.empty() ? 0 : problem == "no driver" ? 1 : 2;
}
