// Leak and lifetime check of the ORT library, as a C++ program so that
// LeakSanitizer sees only ONNX Runtime and opbridge (no interpreter):
//
//   opbridge_leak_check libonnxruntime.so libopbridge_ort.so my_add.onnx deform.onnx [sessions]
//   (or: python tests/leak_check.py opbridge_leak_check libopbridge_ort.so [sessions])
//
// Creates, runs and destroys `sessions` (default 1000) sessions of each model,
// registering the library in every one (dlopen through ORT, as servers do), then
// runs one session of each many times. Prints the resident set size after the
// first tenth and at the end of each phase; exits 1 if it grew by more than 1 KiB
// per session or per 10 runs, or if an output differs from the first one. Built
// with -DOPBRIDGE_SANITIZE=ON, LeakSanitizer reports leaks at exit (nox -s sanitize).
#include <dlfcn.h>
#include <onnxruntime_c_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

const OrtApi* api = nullptr;

void check(OrtStatus* status, const char* what) {
  if (status != nullptr) {
    std::fprintf(stderr, "%s failed: %s\n", what, api->GetErrorMessage(status));
    api->ReleaseStatus(status);
    std::exit(2);
  }
}

long rss_kib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4;
}

std::string read_file(const char* path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

struct Input {
  const char* name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

Input make_input(const char* name, std::vector<int64_t> shape, float scale) {
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  std::vector<float> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = scale * std::sin(0.37f * static_cast<float>(i) + scale);
  return {name, std::move(shape), std::move(data)};
}

class Model {
 public:
  Model(OrtEnv* env, const char* path, const char* library, std::vector<Input> inputs)
      : env_(env), bytes_(read_file(path)), library_(library), inputs_(std::move(inputs)) {
    check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory_), "CreateCpuMemoryInfo");
  }
  ~Model() { api->ReleaseMemoryInfo(memory_); }

  OrtSession* open() const {
    OrtSessionOptions* options = nullptr;
    check(api->CreateSessionOptions(&options), "CreateSessionOptions");
    check(api->SetIntraOpNumThreads(options, 2), "SetIntraOpNumThreads");
    check(api->RegisterCustomOpsLibrary_V2(options, library_), "RegisterCustomOpsLibrary_V2");
    OrtSession* session = nullptr;
    check(api->CreateSessionFromArray(env_, bytes_.data(), bytes_.size(), options, &session), "CreateSession");
    api->ReleaseSessionOptions(options);
    return session;
  }

  // Runs once; returns the output's values.
  std::vector<float> run(OrtSession* session) const {
    std::vector<OrtValue*> values;
    std::vector<const char*> names;
    for (const auto& input : inputs_) {
      OrtValue* value = nullptr;
      check(api->CreateTensorWithDataAsOrtValue(memory_, const_cast<float*>(input.data.data()),
                                                input.data.size() * sizeof(float), input.shape.data(),
                                                input.shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
            "CreateTensor");
      values.push_back(value);
      names.push_back(input.name);
    }
    const char* output_names[] = {output_name()};
    OrtValue* output = nullptr;
    check(api->Run(session, nullptr, names.data(), values.data(), values.size(), output_names, 1, &output), "Run");
    float* data = nullptr;
    check(api->GetTensorMutableData(output, reinterpret_cast<void**>(&data)), "GetTensorMutableData");
    OrtTensorTypeAndShapeInfo* info = nullptr;
    check(api->GetTensorTypeAndShape(output, &info), "GetTensorTypeAndShape");
    size_t count = 0;
    check(api->GetTensorShapeElementCount(info, &count), "GetTensorShapeElementCount");
    api->ReleaseTensorTypeAndShapeInfo(info);
    std::vector<float> result(data, data + count);
    api->ReleaseValue(output);
    for (auto* value : values) api->ReleaseValue(value);
    return result;
  }

 private:
  const char* output_name() const { return inputs_.size() == 2 ? "C" : "Y"; }

  OrtEnv* env_;
  std::string bytes_;
  const char* library_;
  std::vector<Input> inputs_;
  OrtMemoryInfo* memory_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s libonnxruntime.so libopbridge_ort.so my_add.onnx deform.onnx [sessions]\n",
                 argv[0]);
    return 2;
  }
  const int sessions = argc > 5 ? std::atoi(argv[5]) : 1000;
  void* runtime = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (runtime == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto get_api_base = reinterpret_cast<const OrtApiBase* (*)()>(dlsym(runtime, "OrtGetApiBase"));
  api = get_api_base()->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    std::fprintf(stderr, "this ONNX Runtime does not provide API version %d\n", ORT_API_VERSION);
    return 2;
  }
  OrtEnv* env = nullptr;
  check(api->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "leak_check", &env), "CreateEnv");
  int failures = 0;
  {
    // The shapes tests/leak_check_models.py writes the models for.
    const Model my_add(env, argv[3], argv[2], {make_input("A", {3, 4}, 1.0f), make_input("B", {4}, 2.0f)});
    const Model deform(env, argv[4], argv[2],
                       {make_input("X", {1, 4, 5, 5}, 1.0f), make_input("W", {6, 2, 3, 3}, 0.5f),
                        make_input("offset", {1, 36, 5, 5}, 1.5f), make_input("B", {6}, 0.1f),
                        make_input("mask", {1, 18, 5, 5}, 0.7f)});
    for (const Model* model : {&my_add, &deform}) {
      OrtSession* first = model->open();
      const std::vector<float> want = model->run(first);
      api->ReleaseSession(first);
      long warm = 0;
      for (int i = 0; i < sessions; ++i) {
        OrtSession* session = model->open();
        if (model->run(session) != want) ++failures;
        api->ReleaseSession(session);
        if (i == sessions / 10) warm = rss_kib();
      }
      const long grown_sessions = rss_kib() - warm;
      OrtSession* session = model->open();
      const int runs = 10 * sessions;
      for (int i = 0; i < runs; ++i) {
        if (model->run(session) != want) ++failures;
        if (i == runs / 10) warm = rss_kib();
      }
      const long grown_runs = rss_kib() - warm;
      api->ReleaseSession(session);
      const char* name = model == &my_add ? "MyAdd" : "DeformConv2d";
      std::printf("%s: %d sessions: RSS %+ld KiB after the first tenth; %d runs: %+ld KiB\n", name, sessions,
                  grown_sessions, runs, grown_runs);
#if defined(__SANITIZE_ADDRESS__)
      // ASan's quarantine keeps freed memory resident: LeakSanitizer checks at exit instead.
      std::printf("%s: resident memory not checked under AddressSanitizer\n", name);
      if (false) {
#else
      if (grown_sessions > sessions || grown_runs > runs / 10) {
#endif
        std::printf("%s: memory grows with the number of sessions or runs\n", name);
        ++failures;
      }
    }
  }
  api->ReleaseEnv(env);
  std::printf("%s\n", failures == 0 ? "leak check passed" : "leak check FAILED");
  return failures == 0 ? 0 : 1;
}
