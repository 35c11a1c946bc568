// The rooflines of multi-scale deformable attention for `nox -s bench`: its essential work and nothing else. A
// table gives, per group (one query and head), `taps` value rows and their weights (the four bilinear corners of
// every sample times its attention weight, computed beforehand from the same sampling locations); the forward sums
// the weighted rows of each group, the backward dots each row with the group's output gradient and adds the
// weighted gradient into the row's gradient. Compiled for this machine (-march=native, fused multiply-adds,
// four independent sums), the table read in order: no position arithmetic, no bounds, no clones. Not part of any
// shipped library.
#include <cstdint>
#include <cstring>

namespace {

typedef float Vector __attribute__((vector_size(64)));

inline Vector load(const float* p) {
  Vector v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Vector v) { std::memcpy(p, &v, sizeof v); }

// Channels in whole 16-float vectors (the benchmarks' D = 32), so every row is whole registers.
template <int D>
void forward_groups(const float* value, const int32_t* rows, const float* weights, int64_t first, int64_t last,
                    int64_t taps, float* out) {
  constexpr int kVectors = D / 16;
  for (int64_t g = first; g < last; ++g) {
    const int32_t* r = rows + g * taps;
    const float* w = weights + g * taps;
    Vector acc[4][kVectors] = {};
    int64_t t = 0;
    for (; t + 4 <= taps; t += 4) {
      for (int u = 0; u < 4; ++u) {
        const float* row = value + static_cast<int64_t>(r[t + u]) * D;
        for (int v = 0; v < kVectors; ++v) acc[u][v] += w[t + u] * load(row + 16 * v);
      }
    }
    for (; t < taps; ++t) {
      const float* row = value + static_cast<int64_t>(r[t]) * D;
      for (int v = 0; v < kVectors; ++v) acc[0][v] += w[t] * load(row + 16 * v);
    }
    for (int v = 0; v < kVectors; ++v) store(out + g * D + 16 * v, (acc[0][v] + acc[1][v]) + (acc[2][v] + acc[3][v]));
  }
}

template <int D>
void backward_groups(const float* value, const int32_t* rows, const float* weights, const float* grad_out,
                     int64_t first, int64_t last, int64_t taps, float* grad_value, float* dots) {
  constexpr int kVectors = D / 16;
  for (int64_t g = first; g < last; ++g) {
    const int32_t* r = rows + g * taps;
    const float* w = weights + g * taps;
    Vector grad[kVectors];
    for (int v = 0; v < kVectors; ++v) grad[v] = load(grad_out + g * D + 16 * v);
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t offset = static_cast<int64_t>(r[t]) * D;
      Vector dot = {};
      for (int v = 0; v < kVectors; ++v) {
        dot += grad[v] * load(value + offset + 16 * v);
        store(grad_value + offset + 16 * v, load(grad_value + offset + 16 * v) + w[t] * grad[v]);
      }
      float sum = 0;
      for (int l = 0; l < 16; ++l) sum += dot[l];
      dots[g * taps + t] = sum;
    }
  }
}

}  // namespace

// Forward: out[g, :] = sum over t of weights[g, t] * value[rows[g, t], :], groups split evenly over `threads`.
// Returns 0, or 1 for a channel count other than 32 or 64.
extern "C" __attribute__((visibility("default"))) int opbridge_bench_gather_forward(
    const float* value, const int32_t* rows, const float* weights, int64_t groups, int64_t taps, int64_t channels,
    float* out, int threads) {
  if (channels != 32 && channels != 64) return 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int part = 0; part < threads; ++part) {
    const int64_t first = groups * part / threads, last = groups * (part + 1) / threads;
    if (channels == 32) {
      forward_groups<32>(value, rows, weights, first, last, taps, out);
    } else {
      forward_groups<64>(value, rows, weights, first, last, taps, out);
    }
  }
  return 0;
}

// Backward: dots[g, t] = grad_out[g, :] . value[rows[g, t], :] and grad_value[rows[g, t], :] += weights[g, t] *
// grad_out[g, :]. The groups come in `parts` runs that write disjoint rows (one per head: its rows are its own),
// split over `threads`.
extern "C" __attribute__((visibility("default"))) int opbridge_bench_gather_backward(
    const float* value, const int32_t* rows, const float* weights, const float* grad_out, int64_t groups, int64_t taps,
    int64_t channels, int64_t parts, float* grad_value, float* dots, int threads) {
  if (channels != 32 && channels != 64) return 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = groups * part / parts, last = groups * (part + 1) / parts;
    if (channels == 32) {
      backward_groups<32>(value, rows, weights, grad_out, first, last, taps, grad_value, dots);
    } else {
      backward_groups<64>(value, rows, weights, grad_out, first, last, taps, grad_value, dots);
    }
  }
  return 0;
}
