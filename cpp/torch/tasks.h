// How both torch layers hand out a parallel_for's tasks: one at a time from a shared counter, in order, rather than
// as torch's contiguous ranges of one per thread. Threads then work on neighbouring tasks at the same time, which
// share their inputs in the cache, and a slow task holds back no range behind it. MSDA's 800x1333 encoder at 2
// threads (head passes: tasks of (head, block of queries)) took 12.6-13.8 ms with torch's ranges, where each thread
// ran its own heads, and 10.1 ms this way (1 thread: 22-24 ms; docs/architecture.md).
#pragma once

#include <atomic>
#include <cstdint>

namespace opbridge::api {

// The counter on a cache line of its own: next to the calling thread's stack variables, the other threads' fetches
// made MSDA's 512x512 encoder at 2 threads 2.9 ms instead of 1.6.
struct alignas(64) TaskCounter {
  std::atomic<int64_t> next{0};
  char padding[64 - sizeof(std::atomic<int64_t>)] = {};
};

// Runs task(t) for every t the counter hands out below `tasks`: called once on each thread of the parallel region.
template <class F>
void run_counted_tasks(TaskCounter& counter, int64_t tasks, const F& task) {
  for (int64_t t = counter.next.fetch_add(1, std::memory_order_relaxed); t < tasks;
       t = counter.next.fetch_add(1, std::memory_order_relaxed)) {
    task(t);
  }
}

}  // namespace opbridge::api
