// rotated_feature_align's kernels: hand-computed samples at the center and the corners, the backward as the
// adjoint of the forward (<g, forward(x)> = <backward(g), x>), NaN boxes, and the checks.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/rotated_feature_align.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;
using namespace opbridge::kernels;

constexpr RotatedFeatureAlignNames kNames{"op", "features", "boxes"};

void test_center_sample() {
  // One 2 x 2 map; every pixel's box centered at (y, x) = (0.5, 0.5) / scale: each adds the mean of the map.
  const std::vector<double> map{1, 2, 3, 4};
  std::vector<double> boxes;
  for (int p = 0; p < 4; ++p) boxes.insert(boxes.end(), {1.0, 1.0, 0.0, 0.0, 0.3});
  RotatedFeatureAlignShape shape;
  expect(check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 2, 5}, 0.5, 1, shape).ok(), "check");
  std::vector<double> out(4);
  rotated_feature_align(map.data(), boxes.data(), out.data(), shape, 0.5, ThreadedFor{});
  for (int p = 0; p < 4; ++p) expect(std::abs(out[p] - (map[p] + 2.5)) < 1e-12, "center sample");
  // Five points of a zero-size box: the center five times.
  expect(check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 2, 5}, 0.5, 5, shape).ok(), "check 5");
  rotated_feature_align(map.data(), boxes.data(), out.data(), shape, 0.5, ThreadedFor{});
  for (int p = 0; p < 4; ++p) expect(std::abs(out[p] - (map[p] + 12.5)) < 1e-12, "five samples");
}

void test_backward_is_the_adjoint() {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> position(-10, 50), size(0, 40), angle(-3, 3);
  const int64_t n = 2, c = 3, h = 5, w = 6;
  std::vector<double> x(n * c * h * w), g(x.size()), boxes;
  for (auto& v : x) v = normal(rng);
  for (auto& v : g) v = normal(rng);
  for (int64_t p = 0; p < n * h * w; ++p)
    boxes.insert(boxes.end(), {position(rng), position(rng), size(rng), size(rng), angle(rng)});
  for (int64_t points : {1, 5}) {
    RotatedFeatureAlignShape shape;
    expect(check_rotated_feature_align(kNames, {n, c, h, w}, {n, h, w, 5}, 0.125, points, shape).ok(), "check");
    std::vector<double> y(x.size()), gx(x.size());
    rotated_feature_align(x.data(), boxes.data(), y.data(), shape, 0.125, ThreadedFor{});
    rotated_feature_align_backward(g.data(), boxes.data(), gx.data(), shape, 0.125, ThreadedFor{});
    double left = 0, right = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      left += g[i] * y[i];
      right += gx[i] * x[i];
    }
    expect(std::abs(left - right) < 1e-9 * (1 + std::abs(left)), "adjoint, points " + std::to_string(points));
  }
}

void test_checks_and_nan() {
  RotatedFeatureAlignShape shape;
  expect(!check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 3, 5}, 0.5, 1, shape).ok(), "box grid refused");
  expect(!check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 2, 5}, 0.5, 3, shape).ok(), "points 3 refused");
  expect(!check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 2, 5}, 0.0, 1, shape).ok(), "scale 0 refused");
  const std::vector<double> map{1, 2, 3, 4};
  std::vector<double> boxes(20, 1.0), out(4);
  boxes[7] = NAN;  // pixel 1's width
  expect(check_rotated_feature_align(kNames, {1, 1, 2, 2}, {1, 2, 2, 5}, 0.5, 5, shape).ok(), "check");
  rotated_feature_align(map.data(), boxes.data(), out.data(), shape, 0.5, ThreadedFor{});
  expect(std::isnan(out[1]) && !std::isnan(out[0]) && !std::isnan(out[2]), "NaN only at the NaN box's pixel");
}

}  // namespace

int main() {
  test_center_sample();
  test_backward_is_the_adjoint();
  test_checks_and_nan();
  return opbridge::testing::report("rotated_feature_align kernel");
}
