// When the CPU kernels write an output with streaming (non-temporal) stores: once it is larger than the last-level
// cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace opbridge::kernels {

// The size in bytes of one instance of the last-level cache CPU 0 sees (the cache the cores near it share), from
// sysfs; 0 where unknown. Not glibc's sysconf(_SC_LEVEL3_CACHE_SIZE): on AMD EPYC it reports the whole package's
// L3 (384 MiB for twelve 32-MiB slices, each shared by 8 cores).
inline int64_t last_level_cache_bytes() {
  int best_level = 0;
  int64_t bytes = 0;
  for (int index = 0; index < 8; ++index) {
    char path[80];
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
    int level = 0;
    if (FILE* file = std::fopen(path, "r")) {
      if (std::fscanf(file, "%d", &level) != 1) level = 0;
      std::fclose(file);
    }
    if (level <= best_level) continue;
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
    long long size = 0;
    char unit = 0;
    if (FILE* file = std::fopen(path, "r")) {
      if (std::fscanf(file, "%lld%c", &size, &unit) < 1) size = 0;
      std::fclose(file);
    }
    const int64_t scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
    if (size > 0) best_level = level, bytes = size * scale;
  }
  return bytes;
}

// Outputs at least this large (bytes) are written with streaming stores (my_add, the bench's triad bound): beyond the
// last-level cache a plain store first reads the line it overwrites (4 memory passes per element instead of 3) and
// evicts the inputs; such an output leaves the cache before anyone reads it anyway. The last-level cache's size, 8 MiB
// where it is unknown, at least 4 MiB so that an output the size of a small cache stays there for its consumer.
inline int64_t streaming_store_bytes() {
  static const int64_t bytes = [] {
    const int64_t cache = last_level_cache_bytes();
    return cache > 0 ? std::max<int64_t>(cache, int64_t(4) << 20) : int64_t(8) << 20;
  }();
  return bytes;
}

}  // namespace opbridge::kernels
