// Kernel tests without torch or ORT (ctest): a test file per op, test_<op>.cpp,
// each its own executable. The shared helpers of those files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace opbridge::testing {

inline int failures = 0;

inline void expect(bool condition, const std::string& what) {
  if (!condition) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

// A parallel_for that really uses threads, to exercise chunk boundaries.
struct ThreadedFor {
  template <class Task>
  void operator()(int64_t tasks, const Task& task) const {
    std::vector<std::thread> threads;
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w] {
        for (int64_t t = w; t < tasks; t += 3) task(t);
      });
    }
    for (auto& thread : threads) thread.join();
  }
};

inline int report(const char* what) {
  std::printf("%s: %s\n", what, failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace opbridge::testing
