// SoftFloat16 (cpp/kernels/float16.h), the half type of builds whose compiler has no _Float16, against a reference
// computed in double from the definition of binary16 (and against the compiler's _Float16 where it has one): every
// one of the 65536 halves to float, and float to half for every float whose low 13 bits are 0, 1, 0xfff, 0x1000,
// 0x1001 or 0x1fff (the rounding cases around each half and each tie) and 2^20 random floats.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/float16.h"
#include "kernels/half_convert.h"
#include "kernels/my_add.h"

namespace {

using opbridge::kernels::SoftFloat16;
using opbridge::testing::expect;

float from_bits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

// binary16 -> its value: sign, exponent bias 15, 10 mantissa bits, subnormals below 2^-14.
double half_value(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The binary16 value nearest to v, ties to even, as a double (infinity at and above 65520).
double nearest_half(float v) {
  const double a = std::fabs(static_cast<double>(v));
  if (a >= 65520.0) return std::copysign(INFINITY, v);
  int exponent = std::ilogb(a == 0 ? 1.0 : a);
  if (exponent < -14) exponent = -14;
  const double step = std::ldexp(1.0, exponent - 10);
  return std::copysign(std::nearbyint(a / step) * step, v);  // nearbyint: the default mode, to nearest even
}

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

void check_float(float v, int& failures) {
  const uint16_t bits = SoftFloat16::from_float(v);
  const double got = half_value(bits), want = std::isnan(v) ? NAN : nearest_half(v);
  bool ok = same(got, want);
#if defined(__FLT16_MAX__)
  const _Float16 native = static_cast<_Float16>(v);
  uint16_t native_bits;
  std::memcpy(&native_bits, &native, sizeof native_bits);
  ok = ok && (std::isnan(v) ? (native_bits & 0x7fff) > 0x7c00 : native_bits == bits);
#endif
  if (!ok && failures++ < 5) {
    uint32_t x;
    std::memcpy(&x, &v, sizeof x);
    expect(false, "float bits " + std::to_string(x) + " -> half bits " + std::to_string(bits) + ", value " +
                      std::to_string(got) + ", want " + std::to_string(want));
  }
}

void test_every_half_to_float() {
  int failures = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = SoftFloat16::to_float(static_cast<uint16_t>(h));
    bool ok = same(got, half_value(static_cast<uint16_t>(h)));
    // A half read back and converted again is itself (NaNs stay NaN).
    ok = ok && (std::isnan(got) ? (SoftFloat16::from_float(got) & 0x7fff) > 0x7c00 : SoftFloat16::from_float(got) == h);
    if (!ok && failures++ < 5) expect(false, "half bits " + std::to_string(h));
  }
  expect(failures == 0, std::to_string(failures) + " halves converted wrongly");
}

void test_float_to_half_rounding() {
  int failures = 0;
  for (uint32_t high = 0; high < (uint32_t(1) << 19); ++high) {
    for (const uint32_t low : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu})
      check_float(from_bits(high << 13 | low), failures);
  }
  std::mt19937 random(7);
  for (int i = 0; i < (1 << 20); ++i) check_float(from_bits(static_cast<uint32_t>(random())), failures);
  expect(failures == 0, std::to_string(failures) + " floats rounded wrongly");
}

void test_operators() {
  // The type the kernels use: explicit conversions both ways, 2 bytes, default zero.
  static_assert(sizeof(SoftFloat16) == 2, "SoftFloat16 is two bytes, like at::Half");
  expect(static_cast<float>(SoftFloat16(2000.5f)) == 2000.0f, "2000.5 rounds to even (2000)");
  expect(static_cast<float>(SoftFloat16(2051.0f)) == 2052.0f, "2051 ties to even (2052, spacing 2)");
  expect(static_cast<float>(SoftFloat16(2049.0f)) == 2048.0f, "2049 ties to even (2048)");
  expect(static_cast<float>(SoftFloat16{}) == 0.0f, "default is zero");
}

// A kernel computing in half precision gives the same bits on SoftFloat16 as on the reference (in float, rounded
// once): my_add's 2 * a + b over random halves, broadcasting b.
void test_kernel_on_soft_halves() {
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(-3000.0f, 3000.0f);
  constexpr int kRows = 64, kCols = 33;
  SoftFloat16 a[kRows * kCols], b[kCols], out[kRows * kCols];
  for (auto& v : a) v = SoftFloat16(uniform(random));
  for (auto& v : b) v = SoftFloat16(uniform(random));
  const auto loop = opbridge::kernels::make_binary_loop({kRows, kCols}, {kCols, 1}, {0, 1});
  opbridge::kernels::my_add(a, b, out, loop, opbridge::testing::ThreadedFor{});
  int wrong = 0;
  for (int i = 0; i < kRows * kCols; ++i) {
    const float want =
        static_cast<float>(nearest_half(2.0f * static_cast<float>(a[i]) + static_cast<float>(b[i % kCols])));
    wrong += static_cast<float>(out[i]) != want;
  }
  expect(wrong == 0, std::to_string(wrong) + " of my_add's half outputs differ from 2a + b rounded once");
}

// bfloat16 (BFloat16): every one of the 65536 values to float is the top half of the float's bits; float to
// bfloat16 rounds to nearest even (checked against the nearest of the two neighbours in double, ties to the even
// one) and a NaN becomes 0x7fc0, as c10::BFloat16 does.
void test_bfloat16() {
  using opbridge::kernels::BFloat16;
  static_assert(sizeof(BFloat16) == 2, "BFloat16 is two bytes, like at::BFloat16");
  int failures = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float value = BFloat16::to_float(static_cast<uint16_t>(b));
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    failures += bits != (b << 16);
  }
  std::mt19937 random(13);
  for (int i = 0; i < (1 << 20); ++i) {
    const auto x = static_cast<uint32_t>(random());
    const float v = from_bits(x);
    const uint16_t got = BFloat16::from_float(v);
    if (std::isnan(v)) {
      failures += got != 0x7fc0;
      continue;
    }
    // The two neighbours (toward zero and away from it; the latter may be infinity): the nearer in double, the
    // even one on a tie.
    if (std::isinf(v)) {
      failures += got != static_cast<uint16_t>(x >> 16);
      continue;
    }
    const uint32_t low = x & 0xffff0000u, high = low + 0x10000u;
    // Past the largest finite value the next one would be 2^128 (rounding there gives infinity).
    const double high_value = (high & 0x7f800000u) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), v)
                                                                  : static_cast<double>(from_bits(high));
    const double below = std::fabs(static_cast<double>(v) - static_cast<double>(from_bits(low)));
    const double above = std::fabs(high_value - static_cast<double>(v));
    const uint32_t want = below < above ? low : above < below ? high : (((low >> 16) & 1u) ? high : low);
    failures += got != static_cast<uint16_t>(want >> 16);
  }
  expect(failures == 0, std::to_string(failures) + " bfloat16 conversions wrong");
  expect(static_cast<float>(BFloat16(1.0f + 1.0f / 256)) == 1.0f, "1 + 2^-8 ties to even (1)");
  expect(static_cast<float>(BFloat16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256, "1 + 3 * 2^-8 ties to even (1 + 2^-6)");
}

// The array conversions (kernels/half_convert.h: F16C where this CPU has it) give SoftFloat16's bits: every half to
// float (a signaling NaN may come out quiet), and float to half for the rounding cases and random floats (NaNs of
// every payload included), at lengths that leave a tail after the 8-wide blocks.
void test_array_conversions() {
  using opbridge::kernels::float16_to_float;
  using opbridge::kernels::float_to_float16;
  std::vector<uint16_t> halves(65536 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> widened(halves.size());
  float16_to_float(halves.data(), widened.data(), static_cast<int64_t>(halves.size()));
  int failures = 0;
  for (size_t i = 0; i < halves.size(); ++i) {
    uint32_t got, want;
    const float reference = SoftFloat16::to_float(halves[i]);
    std::memcpy(&got, &widened[i], sizeof got);
    std::memcpy(&want, &reference, sizeof want);
    // F16C quiets a signaling NaN (the 1022 halves with exponent 31 and the quiet bit clear); still a NaN.
    const bool signaling = (halves[i] & 0x7e00u) == 0x7c00u && (halves[i] & 0x1ffu) != 0;
    failures += signaling ? !std::isnan(widened[i]) : got != want;
  }
  std::mt19937 random(17);
  std::vector<float> floats(1 << 18 | 3);
  for (size_t i = 0; i < floats.size(); ++i) {
    const auto bits = static_cast<uint32_t>(random());
    const uint32_t low[] = {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu};
    floats[i] = from_bits(i % 2 ? bits : (bits & ~0x1fffu) | low[i % 6]);
  }
  std::vector<uint16_t> narrowed(floats.size());
  float_to_float16(floats.data(), narrowed.data(), static_cast<int64_t>(floats.size()));
  for (size_t i = 0; i < floats.size(); ++i) failures += narrowed[i] != SoftFloat16::from_float(floats[i]);
  expect(failures == 0, std::to_string(failures) + " array conversions differ from SoftFloat16's");
}

// transpose_halves against the definition, for sizes around its 8 x 8 tiles and strides past the sizes.
void test_transpose_halves() {
  for (const int64_t rows : {1, 7, 8, 9, 16, 23}) {
    for (const int64_t cols : {1, 8, 13, 64}) {
      const int64_t from_row = cols + 3, to_row = rows + 5;
      std::vector<uint16_t> from(static_cast<size_t>(rows * from_row)), to(static_cast<size_t>(cols * to_row), 0);
      for (size_t k = 0; k < from.size(); ++k) from[k] = static_cast<uint16_t>((k * 2654435761u) >> 7);
      opbridge::kernels::transpose_halves(from.data(), from_row, to.data(), to_row, rows, cols);
      bool same = true;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) same = same && to[j * to_row + i] == from[i * from_row + j];
      }
      bool untouched = true;  // the gaps between destination rows stay as they were
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = rows; i < to_row; ++i) untouched = untouched && to[j * to_row + i] == 0;
      }
      expect(same && untouched, "transpose_halves " + std::to_string(rows) + " x " + std::to_string(cols));
      // bfloat16 bits to float: each value's float, BFloat16's own widening.
      std::vector<float> wide(static_cast<size_t>(cols * to_row), 0.0f);
      opbridge::kernels::transpose_halves(from.data(), from_row, wide.data(), to_row, rows, cols);
      bool widened = true;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          const float want = opbridge::kernels::BFloat16::to_float(from[i * from_row + j]);
          widened = widened && std::memcmp(&wide[j * to_row + i], &want, sizeof want) == 0;
        }
      }
      expect(widened, "transpose_halves to float " + std::to_string(rows) + " x " + std::to_string(cols));
    }
  }
}

}  // namespace

int main() {
  test_transpose_halves();
  test_array_conversions();
  test_bfloat16();
  test_kernel_on_soft_halves();
  test_every_half_to_float();
  test_float_to_half_rounding();
  test_operators();
  return opbridge::testing::report("float16 tests");
}
