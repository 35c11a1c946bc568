// my_add's kernel against a naive broadcasting loop over random shapes, and
// the shape checks' messages.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/my_add.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;

// Naive reference: for every output index, map to each input's index.
std::vector<double> reference(const std::vector<double>& a, const std::vector<int64_t>& a_shape,
                              const std::vector<double>& b, const std::vector<int64_t>& b_shape,
                              const std::vector<int64_t>& out_shape) {
  int64_t numel = 1;
  for (auto d : out_shape) numel *= d;
  std::vector<double> out(static_cast<size_t>(numel));
  const auto a_strides = opbridge::kernels::broadcast_strides(a_shape, out_shape);
  const auto b_strides = opbridge::kernels::broadcast_strides(b_shape, out_shape);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t rest = i, a_index = 0, b_index = 0;
    for (int64_t d = static_cast<int64_t>(out_shape.size()) - 1; d >= 0; --d) {
      const int64_t coordinate = rest % out_shape[d];
      rest /= out_shape[d];
      a_index += coordinate * a_strides[d];
      b_index += coordinate * b_strides[d];
    }
    out[i] = 2 * a[a_index] + b[b_index];
  }
  return out;
}

void test_random_broadcasts() {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> rank_dist(0, 5), size_dist(0, 6), coin(0, 3);
  std::normal_distribution<double> value(0.0, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> out_shape(rank_dist(rng));
    for (auto& d : out_shape) d = size_dist(rng) == 0 ? 1 : size_dist(rng);
    // Now and then a long last row, so that rows span several parallel chunks.
    if (trial % 50 == 0) out_shape = {3, 2, opbridge::kernels::kMyAddChunk + 7};
    // Each input: a suffix of the output shape with some dimensions set to 1.
    auto make_input = [&] {
      std::vector<int64_t> shape(out_shape.begin() + (out_shape.empty() ? 0 : coin(rng) % (out_shape.size() + 1)),
                                 out_shape.end());
      for (auto& d : shape)
        if (coin(rng) == 0) d = 1;
      return shape;
    };
    const auto a_shape = make_input(), b_shape = make_input();
    std::vector<int64_t> shape;
    const auto status = opbridge::kernels::broadcast_shapes("t", "a", a_shape, "b", b_shape, shape);
    expect(status.ok(), "broadcast of compatible shapes: " + status.message);
    int64_t a_numel = 0, b_numel = 0, numel = 0;
    opbridge::kernels::checked_numel(a_shape, a_numel);
    opbridge::kernels::checked_numel(b_shape, b_numel);
    opbridge::kernels::checked_numel(shape, numel);
    std::vector<double> a(a_numel), b(b_numel), out(numel, -1.0);
    for (auto& x : a) x = value(rng);
    for (auto& x : b) x = value(rng);
    const auto loop = opbridge::kernels::make_binary_loop(shape, opbridge::kernels::broadcast_strides(a_shape, shape),
                                                          opbridge::kernels::broadcast_strides(b_shape, shape));
    opbridge::kernels::my_add(a.data(), b.data(), out.data(), loop, ThreadedFor{});
    const auto expected = reference(a, a_shape, b, b_shape, shape);
    bool same = true;
    for (int64_t i = 0; i < numel; ++i) same = same && out[i] == expected[i];
    expect(same, "my_add " + opbridge::kernels::shape_to_string(a_shape) + " + " +
                     opbridge::kernels::shape_to_string(b_shape));
  }
}

void test_errors() {
  std::vector<int64_t> shape;
  auto status = opbridge::kernels::broadcast_shapes("opbridge::MyAdd", "input A", {2, 3}, "input B", {4}, shape);
  expect(!status.ok(), "[2, 3] and [4] must not broadcast");
  expect(status.message.find("input A of shape [2, 3] and input B of shape [4]") != std::string::npos,
         "message names inputs and shapes: " + status.message);
  status = opbridge::kernels::broadcast_shapes("op", "a", {int64_t(1) << 40, int64_t(1) << 40}, "b", {1}, shape);
  expect(!status.ok() && status.message.find("too many elements") != std::string::npos, "overflow is reported");
}

void test_float16_rounds_once() {
  using opbridge::kernels::float16;
  // 2 * 1000 + 0.5 = 2000.5 rounds to 2000 in half precision (spacing 1 at 2048 > x >= 1024).
  const float16 a[] = {float16(1000.0f)}, b[] = {float16(0.5f)};
  float16 out[1];
  const auto loop = opbridge::kernels::make_binary_loop({1}, {0}, {0});
  opbridge::kernels::my_add(a, b, out, loop, ThreadedFor{});
  expect(static_cast<float>(out[0]) == 2000.0f, "float16 result");
}

}  // namespace

int main() {
  test_random_broadcasts();
  test_errors();
  test_float16_rounds_once();
  return opbridge::testing::report("my_add kernel tests");
}
