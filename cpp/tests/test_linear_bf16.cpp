// kernels/linear_bf16.h: the bfloat16 GEMM of the ORT library's bfloat16 deformable convolutions, each kernel this
// CPU runs against a float64 evaluation (within float32 sums and one rounding); on CPUs with AVX512-BF16 the
// vdpbf16ps kernel against the portable loop bit for bit (normal values: the instruction flushes only subnormals);
// on CPUs with AMX tiles (and a kernel that grants them) the tile kernel within the bound, its layouts and packing
// against its own bits.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "kernels/linear_bf16.h"

namespace {

using opbridge::kernels::LinearBf16Kernel;
using opbridge::testing::expect;

// The instruction kernels this CPU runs, each as it is named in the messages.
std::vector<std::pair<LinearBf16Kernel, std::string>> instruction_kernels() {
  std::vector<std::pair<LinearBf16Kernel, std::string>> kernels;
  if (opbridge::kernels::linear_bf16_has_instructions()) kernels.emplace_back(LinearBf16Kernel::dpbf16, "vdpbf16ps");
  if (opbridge::kernels::linear_bf16_amx_ready()) kernels.emplace_back(LinearBf16Kernel::amx, "AMX");
  return kernels;
}

uint16_t bf16_of(std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  return opbridge::kernels::bf16_bits(normal(rng));
}

void test_linear_bf16_shapes() {
  using namespace opbridge::kernels;
  std::mt19937 rng(11);
  // (n, m, k): tiles of 12 rows (vdpbf16ps) or 2 x 16 (AMX) and pairs of 16-output panels, with tails of each; k in
  // whole chunks of 32 pairs and not, odd k; k zero; bias or none.
  const int64_t shapes[][3] = {{1, 1, 1},      {12, 32, 2},   {13, 33, 3}, {25, 64, 576}, {7, 20, 27},
                               {40, 17, 9},    {3, 100, 145}, {24, 16, 0}, {5, 48, 1},    {30, 31, 64},
                               {70, 48, 2304}, {16, 16, 32},  {33, 65, 63}};
  for (const auto& shape : shapes) {
    for (const bool with_bias : {false, true}) {
      // Rows of a exactly k long where k is odd, so that a read past a row's last element reads the next row's
      // first (or the NaN after the last row): the results would then differ from the float64 sums.
      const int64_t n = shape[0], m = shape[1], k = shape[2], lda = k % 2 ? k : k + 3, ldb = k + 1;
      std::vector<uint16_t> a(static_cast<size_t>(n * lda + 1)), b(static_cast<size_t>(m * ldb + 1)), bias(m);
      for (auto& v : a) v = bf16_of(rng, 1.0f);
      for (auto& v : b) v = bf16_of(rng, 0.1f);
      a.back() = 0x7fc0;  // NaN
      for (auto& v : bias) v = bf16_of(rng, 1.0f);
      // Output channel-major with a gap after each row (c_col = n + 2), as deform_conv2d's output rows are.
      const int64_t c_col = n + 2;
      std::vector<uint16_t> portable(static_cast<size_t>(m * c_col), 0x7fc1);
      const uint16_t* bias_or_null = with_bias ? bias.data() : nullptr;
      linear_bf16(n, m, k, a.data(), lda, b.data(), ldb, bias_or_null, portable.data(), 1, c_col,
                  LinearBf16Kernel::portable);
      const std::string shape_name = "linear_bf16 " + std::to_string(n) + "x" + std::to_string(m) + "x" +
                                     std::to_string(k) + (with_bias ? " bias" : "");
      std::vector<std::pair<std::string, std::vector<uint16_t>>> results{{shape_name + " portable", portable}};
      for (const auto& [kernel, kernel_name] : instruction_kernels()) {
        std::vector<uint16_t> fast(portable.size(), 0x7fc1);
        linear_bf16(n, m, k, a.data(), lda, b.data(), ldb, bias_or_null, fast.data(), 1, c_col, kernel);
        if (kernel == LinearBf16Kernel::dpbf16) {
          expect(fast == portable, shape_name + ": vdpbf16ps gives the portable loop's bits (gaps untouched)");
        }
        results.emplace_back(shape_name + " " + kernel_name, fast);
      }
      for (const auto& [name, got_bits] : results) {
        bool close = true;
        for (int64_t i = 0; i < n && close; ++i) {
          for (int64_t j = 0; j < m && close; ++j) {
            double exact = with_bias ? bf16_value(bias[j]) : 0.0, magnitude = std::fabs(exact);
            for (int64_t p = 0; p < k; ++p) {
              const double product = double(bf16_value(a[i * lda + p])) * bf16_value(b[j * ldb + p]);
              exact += product, magnitude += std::fabs(product);
            }
            const double got = bf16_value(got_bits[j * c_col + i]);
            // One bfloat16 rounding (2^-8 relative) plus float32 sums (k + 1 additions of 2^-24 each).
            const double bound = std::ldexp(std::fabs(exact), -8) + (k + 2) * std::ldexp(magnitude, -24) * 1.01;
            if (!(std::fabs(got - exact) <= bound)) {
              expect(false, name + ": output " + std::to_string(i) + "," + std::to_string(j) + " is " +
                                std::to_string(got) + ", float64 " + std::to_string(exact));
              close = false;
            }
          }
        }
        for (int64_t j = 0; j < m; ++j) {
          expect(got_bits[j * c_col + n] == 0x7fc1 && got_bits[j * c_col + n + 1] == 0x7fc1, name + ": gap written");
        }
      }
    }
  }
}

// The other layouts and entry points: a row-major output (c_row m, c_col 1: the non-transposed branch), a strided
// one, and LinearBf16Packing (weights packed once per b, shared by calls from several threads). The vdpbf16ps kernel
// against the portable loop bit for bit; the AMX kernel against its own bits in deform_conv2d's layout.
void test_linear_bf16_layouts_and_packing() {
  using namespace opbridge::kernels;
  std::mt19937 rng(5);
  const int64_t n = 45, m = 40, k = 37;
  std::vector<uint16_t> a(n * k), b(2 * m * k), bias(m);
  for (auto& v : a) v = bf16_of(rng, 1.0f);
  for (auto& v : b) v = bf16_of(rng, 0.1f);
  for (auto& v : bias) v = bf16_of(rng, 1.0f);
  const auto reference = [&](LinearBf16Kernel kernel, const uint16_t* weights) {  // [m, n], as deform_conv2d's
    std::vector<uint16_t> planes(static_cast<size_t>(n * m));
    const LinearBf16Kernel want = kernel == LinearBf16Kernel::amx ? kernel : LinearBf16Kernel::portable;
    linear_bf16(n, m, k, a.data(), k, weights, k, bias.data(), planes.data(), 1, n, want);
    return planes;
  };
  for (const auto& [kernel, kernel_name] : instruction_kernels()) {
    const std::vector<uint16_t> want = reference(kernel, b.data());
    for (const auto& [c_row, c_col] : std::vector<std::pair<int64_t, int64_t>>{{m, 1}, {1, n}, {2 * m + 1, 2}}) {
      std::vector<uint16_t> fast(static_cast<size_t>(n * c_row + m * c_col + 1), 0);
      linear_bf16(n, m, k, a.data(), k, b.data(), k, bias.data(), fast.data(), c_row, c_col, kernel);
      bool same = true;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) same = same && fast[i * c_row + j * c_col] == want[j * n + i];
      }
      expect(same, "linear_bf16 " + kernel_name + " with c_row " + std::to_string(c_row) + ", c_col " +
                       std::to_string(c_col));
    }
  }
  // Two weight matrices through one packing cache, from four threads at once, each call as the one-call GEMM of the
  // best kernel (the portable loop's bits where that is vdpbf16ps).
  const LinearBf16Kernel best = linear_bf16_amx_ready()          ? LinearBf16Kernel::amx
                                : linear_bf16_has_instructions() ? LinearBf16Kernel::dpbf16
                                                                 : LinearBf16Kernel::portable;
  LinearBf16Packing packing;
  std::vector<std::vector<uint16_t>> outputs(8, std::vector<uint16_t>(n * m));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int call = t; call < 8; call += 4) {
        const uint16_t* weights = b.data() + (call % 2) * m * k;
        packing(n, m, k, a.data(), k, weights, k, bias.data(), outputs[call].data(), 1, n);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int call = 0; call < 8; ++call) {
    expect(outputs[call] == reference(best, b.data() + (call % 2) * m * k),
           "LinearBf16Packing call " + std::to_string(call));
  }
}

void test_linear_bf16_special_values() {
  using namespace opbridge::kernels;
  // NaN and infinity propagate (a NaN sum stays NaN after rounding); a zero k gives the bias. Each kernel.
  const uint16_t one = bf16_bits(1.0f), nan = 0x7fc0, inf = 0x7f80;
  const std::vector<uint16_t> a{one, nan, one, one, inf, one}, b{one, one, one};
  auto kernels = instruction_kernels();
  kernels.emplace_back(LinearBf16Kernel::portable, "portable");
  for (const auto& [kernel, name] : kernels) {
    std::vector<uint16_t> c(2, 0);
    linear_bf16(2, 1, 3, a.data(), 3, b.data(), 3, nullptr, c.data(), 1, 1, kernel);
    expect(std::isnan(bf16_value(c[0])), name + ": a NaN input gives NaN");
    expect(std::isinf(bf16_value(c[1])) && bf16_value(c[1]) > 0, name + ": an infinite input gives infinity");
    const uint16_t bias = bf16_bits(2.5f);
    linear_bf16(1, 1, 0, a.data(), 0, b.data(), 0, &bias, c.data(), 1, 1, kernel);
    expect(c[0] == bias, name + ": k = 0: the bias");
  }
}

}  // namespace

int main() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  // On a CPU with AVX512-BF16 the instruction path must run (else the comparisons above compare the loop with itself).
  __builtin_cpu_init();
  expect(!__builtin_cpu_supports("avx512bf16") || opbridge::kernels::linear_bf16_has_instructions(),
         "this CPU has AVX512-BF16: linear_bf16 takes its instruction path");
#endif
  test_linear_bf16_shapes();
  test_linear_bf16_layouts_and_packing();
  test_linear_bf16_special_values();
  std::string kernels = "portable";
  for (const auto& [kernel, name] : instruction_kernels()) kernels += ", " + name;
  return opbridge::testing::report(("linear_bf16 kernel tests (" + kernels + ")").c_str());
}
