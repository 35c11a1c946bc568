// Where ms_deform_attn's forward spends its time (docs/architecture.md): the CPU kernel on Deformable DETR's
// encoder inputs (every pixel of four levels queries around its own centre, offsets of about two pixels, 8 heads
// x 32 channels, 4 points), then the same kernel with one part taken away at a time:
//   all locations NaN        no value row is read (every corner reads the row of zeros): what is left is reading
//                            the inputs, the sample arithmetic and the sums;
//   all locations one point  every corner reads the same few rows, always in the L1 cache: the gathers cost
//                            nothing beyond their loads;
// in both of the forward's orders (head-major, the one these shapes run in, and query-major), single-threaded,
// best of 5. Build: cmake -DOPBRIDGE_BUILD_BENCH=ON, then
//   build/cpp/bench/opbridge_ms_deform_attn_parts [512]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/ms_deform_attn.h"

using namespace opbridge::kernels;

namespace {

struct Serial {
  template <class F>
  void operator()(int64_t tasks, const F& task) const {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
};

template <class F>
double best_ms(const F& f) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> levels = {{100, 167}, {50, 84}, {25, 42}, {13, 21}};
  const char* name = "800x1333";
  if (argc > 1 && std::strcmp(argv[1], "512") == 0) {
    levels = {{64, 64}, {32, 32}, {16, 16}, {8, 8}};
    name = "512x512";
  }
  const int64_t heads = 8, channels = 32, points = 4, count = static_cast<int64_t>(levels.size());
  std::vector<int64_t> spatial, start;
  int64_t keys = 0;
  for (auto [h, w] : levels) {
    spatial.push_back(h), spatial.push_back(w), start.push_back(keys);
    keys += h * w;
  }
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> value(keys * heads * channels);
  for (auto& v : value) v = normal(rng);
  const int64_t queries = keys, lp = count * points;
  std::vector<float> loc(queries * heads * lp * 2), attn(queries * heads * lp);
  int64_t q = 0;
  for (auto [h, w] : levels) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x, ++q) {
        for (int64_t i = 0; i < heads * lp; ++i) {
          const auto [lh, lw] = levels[i / points % count];
          const int64_t at = q * heads * lp + i;
          loc[2 * at] = (x + 0.5f) / w + normal(rng) * 2.f / lw;
          loc[2 * at + 1] = (y + 0.5f) / h + normal(rng) * 2.f / lh;
          attn[at] = std::exp(normal(rng)) / lp;
        }
      }
    }
  }
  const MSDeformAttnShape s{1, keys, heads, channels, queries, count, points};
  std::vector<float> out(queries * heads * channels);
  for (auto [order, order_name] : {std::pair{MSDeformAttnOrder::head_major, "head-major (this shape's order)"},
                                   std::pair{MSDeformAttnOrder::query_major, "query-major (the inputs' order)"}}) {
    auto forward = [&](const std::vector<float>& locations) {
      return best_ms([&] {
        ms_deform_attn(value.data(), spatial.data(), start.data(), locations.data(), attn.data(), out.data(), s,
                       Serial{}, order);
      });
    };
    const double full = forward(loc);
    const double no_rows = forward(std::vector<float>(loc.size(), NAN));
    const double one_row = forward(std::vector<float>(loc.size(), 0.01f));
    std::printf("ms_deform_attn forward, %s encoder, 1 thread, %s: %.1f ms\n", name, order_name, full);
    std::printf("  all locations NaN (no value row read):    %.1f ms\n", no_rows);
    std::printf("  all locations one point (rows in L1):     %.1f ms\n", one_row);
    std::printf("  so fetching value rows costs about        %.1f ms (%.0f%%)\n", full - one_row,
                100 * (full - one_row) / full);
  }
  return 0;
}
