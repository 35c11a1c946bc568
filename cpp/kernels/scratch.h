// Buffers the CPU kernels share: aligned arrays and scratch memory a thread keeps from call to call.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <new>

namespace opbridge::kernels {

// A buffer the kernels load whole vectors from, starting on a 64-byte boundary so that a 64-byte row is one cache
// line. Large blocks from malloc start 16 bytes past a page: every 64-byte load from them then spans two lines (the
// head-major forward of the 800x1333 encoder took 43 ms instead of 36, docs/architecture.md).
template <class T>
struct AlignedArray {
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<T[], Free> data;
  AlignedArray() = default;  // holds nothing
  explicit AlignedArray(size_t count)
      : data(static_cast<T*>(::operator new[](std::max<size_t>(1, count) * sizeof(T), std::align_val_t{64}))) {}
  T* get() const { return data.get(); }
};

// Scratch memory a thread's calls reuse: copies a kernel makes of its inputs (MSDA's head-major copies, 57 MB for
// the 800x1333 encoder; deform_conv2d's channels-last input and its column blocks), which, allocated afresh, the
// system maps page by page on every call (19 ms of page faults in a 31 ms MSDA forward). Each thread keeps kSlots
// blocks, each up to kMaxBytes (larger requests get memory of their own), for the life of the thread; a request
// while all of the thread's blocks are in use (a task run on the thread that holds a kernel's copy, a nested call)
// gets its own. Contents are not initialized. Pool: a tag naming a separate set of blocks (the ORT library's
// float16 nodes keep their float32 copies apart from the kernels' own scratch: ort/api.h).
template <class Pool, int Slots>
class BasicThreadScratch {
 public:
  static constexpr size_t kMaxBytes = size_t(512) << 20;
  static constexpr int kSlots = Slots;
  explicit BasicThreadScratch(size_t bytes) {
    Cache* cache = nullptr;
    for (Cache& slot : caches_of_thread()) {
      if (!slot.in_use) {
        cache = &slot;
        break;
      }
    }
    if (bytes > kMaxBytes || cache == nullptr) {
      own_ = AlignedArray<unsigned char>(bytes);
      data_ = own_.get();
      return;
    }
    if (cache->bytes < bytes) {
      cache->bytes = 0;  // if the allocation below throws, the cache is empty, not smaller than it says
      cache->data = AlignedArray<unsigned char>();  // the old block first: never both at once
      cache->data = AlignedArray<unsigned char>(bytes);
      cache->bytes = bytes;
    }
    cache->in_use = true;
    cache_ = cache;
    data_ = cache->data.get();
  }
  ~BasicThreadScratch() {
    if (cache_ != nullptr) cache_->in_use = false;
  }
  BasicThreadScratch(const BasicThreadScratch&) = delete;
  BasicThreadScratch& operator=(const BasicThreadScratch&) = delete;
  template <class T>
  T* get() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  struct Cache {
    AlignedArray<unsigned char> data;
    size_t bytes = 0;
    bool in_use = false;
  };
  static std::array<Cache, kSlots>& caches_of_thread() {
    static thread_local std::array<Cache, kSlots> caches;
    return caches;
  }
  AlignedArray<unsigned char> own_;  // a request the thread's blocks cannot serve
  Cache* cache_ = nullptr;
  unsigned char* data_ = nullptr;
};

using ThreadScratch = BasicThreadScratch<void, 2>;

}  // namespace opbridge::kernels
