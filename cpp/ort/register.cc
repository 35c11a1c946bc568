// The library's single export: RegisterCustomOps, called by ONNX Runtime when a
// session's options load this library. It negotiates the API version so that
// one build runs on every ORT from 1.16 to the newest.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "ort/api.h"
#include "ort/gemm.h"

namespace opbridge::ort {
namespace {

constexpr int kMinimumApiVersion = 16;  // the lite custom-op API needs ORT >= 1.16
int g_api_version = 0;

// The domain and its ops live as long as the process: sessions keep pointers to
// them, and destroying them at exit could run after the runtime is unloaded.
// One Ort::CustomOpDomain per domain name the ops registered ("opbridge" first).
std::vector<Ort::CustomOpDomain*> make_domains(int version) {
  std::vector<Ort::CustomOpDomain*> domains;
  std::vector<std::string> names{"opbridge"};
  for (const auto& registration : registered_ops()) {
    if (std::find(names.begin(), names.end(), registration.domain) == names.end()) names.push_back(registration.domain);
  }
  for (const auto& name : names) {
    std::vector<Ort::Custom::OrtLiteCustomOp*> ops;
    for (const auto& registration : registered_ops()) {
      if (name == registration.domain) registration.append(ops);
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
    *domains = make_domains(version);
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
