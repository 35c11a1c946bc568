// The library's single export: RegisterCustomOps, called by ONNX Runtime when a
// session's options load this library. It negotiates the API version so that
// one build runs on every ORT from 1.16 to the newest.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ort/api.h"
#include "ort/gemm.h"

namespace opbridge::ort {
namespace {

constexpr int kMinimumApiVersion = 16;  // the lite custom-op API needs ORT >= 1.16
int g_api_version = 0;

// A node of the CUDA library (libopbridge_ort_cuda.so) with its domain.
struct DeviceOp {
  std::string domain;
  OrtCustomOp* op;
};

bool runtime_has(const OrtApi* api, const char* provider) {
  char** providers = nullptr;
  int count = 0;
  if (OrtStatus* status = api->GetAvailableProviders(&providers, &count)) {
    api->ReleaseStatus(status);
    return false;
  }
  bool found = false;
  for (int i = 0; i < count; ++i) found = found || std::string(providers[i]) == provider;
  if (OrtStatus* status = api->ReleaseAvailableProviders(providers, count)) api->ReleaseStatus(status);
  return found;
}

// The CUDA nodes, where the runtime has the CUDA execution provider and libopbridge_ort_cuda.so lies beside this
// library (the runtime wheel builds it where nvcc was found). Without either, opbridge's nodes run on the CPU
// execution provider (ORT copies their inputs there); OPBRIDGE_ORT_CUDA=0 chooses that.
std::vector<DeviceOp> cuda_ops(const OrtApi* api, int version) {
  std::vector<DeviceOp> ops;
  const char* choice = std::getenv("OPBRIDGE_ORT_CUDA");
  if ((choice != nullptr && std::string(choice) == "0") || !runtime_has(api, "CUDAExecutionProvider")) return ops;
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&runtime_has), &self) == 0 || self.dli_fname == nullptr) return ops;
  std::string path = self.dli_fname;
  path = path.substr(0, path.find_last_of('/') + 1) + "libopbridge_ort_cuda.so";
  if (FILE* file = std::fopen(path.c_str(), "rb")) {
    std::fclose(file);
  } else {
    return ops;  // a library built without CUDA
  }
  // Never closed: the nodes live as long as the process (see make_domains).
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  // A machine without an NVIDIA driver runs no CUDA session: nothing to say. A driver too old for the library's
  // CUDA runtime: said once, and the nodes run on the CPU execution provider.
  using Problem = int (*)(char*, int);
  auto problem = library != nullptr ? reinterpret_cast<Problem>(dlsym(library, "opbridge_ort_cuda_problem")) : nullptr;
  char reason[512] = {};
  if (const int found = problem != nullptr ? problem(reason, sizeof(reason)) : 0; found != 0) {
    if (found == 2) std::fprintf(stderr, "opbridge: %s; opbridge's nodes run on the CPU execution provider\n", reason);
    return ops;
  }
  using Entry = int (*)(const OrtApi*, int, void (*)(void*, const char*, OrtCustomOp*), void*);
  auto entry = library != nullptr ? reinterpret_cast<Entry>(dlsym(library, "opbridge_ort_cuda_ops")) : nullptr;
  if (entry == nullptr || entry(
                              api, version,
                              [](void* context, const char* domain, OrtCustomOp* op) {
                                static_cast<std::vector<DeviceOp>*>(context)->push_back({domain, op});
                              },
                              &ops) < 0) {
    std::fprintf(stderr, "opbridge: %s could not be loaded (%s); opbridge's nodes run on the CPU execution provider\n",
                 path.c_str(), library == nullptr ? dlerror() : "no CUDA nodes");
    ops.clear();
  }
  return ops;
}

// The domain and its ops live as long as the process: sessions keep pointers to
// them, and destroying them at exit could run after the runtime is unloaded.
// One Ort::CustomOpDomain per domain name the ops registered ("opbridge" first), holding the CPU nodes and the
// same nodes for other execution providers (`device_ops`).
std::vector<Ort::CustomOpDomain*> make_domains(int version, const std::vector<DeviceOp>& device_ops) {
  std::vector<Ort::CustomOpDomain*> domains;
  std::vector<std::string> names{"opbridge"};
  for (const auto& registration : registered_ops()) {
    if (std::find(names.begin(), names.end(), registration.domain) == names.end()) names.push_back(registration.domain);
  }
  for (const auto& name : names) {
    std::vector<OrtCustomOp*> ops;
    for (const auto& registration : registered_ops()) {
      if (name != registration.domain) continue;
      std::vector<Ort::Custom::OrtLiteCustomOp*> lite;
      registration.append(lite);
      ops.insert(ops.end(), lite.begin(), lite.end());
    }
    for (const auto& device_op : device_ops) {
      if (device_op.domain == name) ops.push_back(device_op.op);
    }
    auto* domain = new Ort::CustomOpDomain(name.c_str());
    for (auto* op : ops) {
      // Declare the negotiated version, not the headers': an older runtime
      // rejects ops that claim a newer API ("Unsupported version").
      op->version = static_cast<uint32_t>(version);
      domain->Add(op);
    }
    domains.push_back(domain);
  }
  return domains;
}

// Minor version of a "1.MINOR.PATCH" string; a future 2.x counts as the newest.
int runtime_minor_version(const char* version) {
  int major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%d.%d", &major, &minor) != 2) return -1;
  return major > 1 ? ORT_API_VERSION : minor;
}

}  // namespace

int api_version() { return g_api_version; }

std::vector<OpRegistration>& registered_ops() {
  // Constructed on first use: the ops' files register during static
  // initialisation, in an order the linker chooses.
  static std::vector<OpRegistration> ops;
  return ops;
}

}  // namespace opbridge::ort

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace opbridge::ort;
  if (api_base == nullptr) return nullptr;  // nothing to report an error through
  const char* runtime_version = api_base->GetVersionString();
  const int minor = runtime_minor_version(runtime_version);
  // Version 1 of the API exists in every runtime: use it to report errors.
  const OrtApi* fallback = api_base->GetApi(1);
  if (minor < kMinimumApiVersion) {
    const std::string message = std::string("opbridge custom-op library: ONNX Runtime ") +
                                (runtime_version ? runtime_version : "(unknown version)") +
                                " is too old; opbridge needs ONNX Runtime >= 1.16. Upgrade onnxruntime.";
    return fallback->CreateStatus(ORT_FAIL, message.c_str());
  }
  const int version = minor < ORT_API_VERSION ? minor : ORT_API_VERSION;
  const OrtApi* api = api_base->GetApi(static_cast<uint32_t>(version));
  if (api == nullptr) {
    const std::string message = "opbridge custom-op library: ONNX Runtime " + std::string(runtime_version) +
                                " does not provide API version " + std::to_string(version);
    return fallback->CreateStatus(ORT_FAIL, message.c_str());
  }
  static std::once_flag once;
  // Never destroyed (see make_domains): a static vector would be, at exit, leaving the domains unreachable.
  static auto* domains = new std::vector<Ort::CustomOpDomain*>();
  std::call_once(once, [&] {
    g_api_version = version;
    Ort::InitApi(api);
    init_gemm();
    *domains = make_domains(version, cuda_ops(api, version));
  });
  // Session options that already carry the domain (the library registered twice, e.g. by hand and then by
  // opbridge_ort.session_options) keep it once: ORT refuses a duplicate domain when the session is created.
  // The same key marks them for opbridge_ort's Python helpers.
  constexpr const char* kRegisteredKey = "opbridge.custom_ops_library";
  int registered = 0;
  if (OrtStatus* status = api->HasSessionConfigEntry(options, kRegisteredKey, &registered)) {
    api->ReleaseStatus(status);
    registered = 0;
  }
  if (registered) return nullptr;
  for (auto* domain : *domains) {
    if (OrtStatus* status = api->AddCustomOpDomain(options, *domain)) return status;
  }
  return api->AddSessionConfigEntry(options, kRegisteredKey, "1");
}
