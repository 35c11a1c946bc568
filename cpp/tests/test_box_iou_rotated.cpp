// box_iou_rotated's kernel: mmcv's published table, exact cases (identical, nested, touching, degenerate, NaN),
// invariance under translation far from the origin, threaded rows, and the shape checks.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/box_iou_rotated.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;
using namespace opbridge::kernels;

std::vector<double> iou(const std::vector<double>& a, const std::vector<double>& b, int64_t mode = 0,
                        bool clockwise = true) {
  BoxIouRotatedShape shape;
  const auto status =
      check_box_iou_rotated("t", "a", {int64_t(a.size() / 5), 5}, "b", {int64_t(b.size() / 5), 5}, mode, false, shape);
  expect(status.ok(), status.message);
  std::vector<double> out(a.size() / 5 * (b.size() / 5));
  box_iou_rotated(a.data(), b.data(), out.data(), shape, mode, clockwise, ThreadedFor{});
  return out;
}

void test_published_table() {  // mmcv tests/test_ops/test_box_iou_rotated.py
  const std::vector<double> b1{1, 1, 3, 4, 0.5, 2, 2, 3, 4, 0.6, 7, 7, 8, 8, 0.4};
  const std::vector<double> b2{0, 2, 2, 5, 0.3, 2, 1, 3, 3, 0.5, 5, 5, 6, 7, 0.4};
  const double ious[] = {0.3708, 0.4351, 0, 0.1104, 0.4487, 0.0424, 0, 0, 0.3622};
  const double iofs[] = {0.4959, 0.5306, 0, 0.1823, 0.5420, 0.1832, 0, 0, 0.4404};
  const auto got_iou = iou(b1, b2), got_iof = iou(b1, b2, 1);
  for (int i = 0; i < 9; ++i) {
    expect(std::abs(got_iou[i] - ious[i]) < 1e-4, "published iou " + std::to_string(i));
    expect(std::abs(got_iof[i] - iofs[i]) < 1e-4, "published iof " + std::to_string(i));
  }
}

void test_exact_cases() {
  const std::vector<double> box{3, -2, 4, 1.5, 0.7};
  expect(std::abs(iou(box, box)[0] - 1) < 1e-12, "identical boxes: 1");
  expect(std::abs(iou(box, {3, -2, 4, 1.5, 0.7 + M_PI})[0] - 1) < 1e-12, "turned half a turn: the same box");
  expect(std::abs(iou({3, -2, 2, 0.75, 0.7}, box)[0] - 0.25) < 1e-12, "a quarter inside: 1/4");
  expect(std::abs(iou({3, -2, 2, 0.75, 0.7}, box, 1)[0] - 1) < 1e-12, "inside: iof 1");
  expect(iou({0, 0, 2, 2, 0}, {2, 0, 2, 2, 0})[0] == 0, "touching along an edge: 0");
  expect(std::abs(iou({0, 0, 2, 2, 0}, {1, 0, 2, 2, 0})[0] - 1.0 / 3) < 1e-12, "half overlapping squares: 1/3");
  expect(iou({3, -2, 0, 1.5, 0.7}, box)[0] == 0, "zero width: 0");
  expect(std::isnan(iou({NAN, -2, 4, 1.5, 0.7}, box)[0]), "NaN center: NaN");
  expect(std::isnan(iou({3, -2, INFINITY, 1.5, 0.7}, box)[0]), "infinite width: NaN");
  // Far from the origin the result is the one near it.
  const auto near = iou({1, 1, 3, 4, 0.5}, {2, 1, 3, 3, 0.5});
  const auto far = iou({1e7 + 1, 1e7 + 1, 3, 4, 0.5}, {1e7 + 2, 1e7 + 1, 3, 3, 0.5});
  expect(std::abs(near[0] - far[0]) < 1e-9, "translation by 1e7");
  // The angle's sign: clockwise=false negates it.
  expect(std::abs(iou({1, 1, 3, 4, -0.5}, {2, 1, 3, 3, -0.5}, 0, false)[0] - near[0]) < 1e-12, "clockwise flag");
}

void test_checks() {
  BoxIouRotatedShape shape;
  expect(!check_box_iou_rotated("op", "b1", {2, 4}, "b2", {2, 5}, 0, false, shape).ok(), "last dim 4 refused");
  expect(!check_box_iou_rotated("op", "b1", {2, 5}, "b2", {2, 5}, 2, false, shape).ok(), "mode 2 refused");
  const auto status = check_box_iou_rotated("op", "b1", {2, 5}, "b2", {3, 5}, 0, true, shape);
  expect(status.message.find("2 and 3") != std::string::npos, "aligned counts named: " + status.message);
}

}  // namespace

int main() {
  test_published_table();
  test_exact_cases();
  test_checks();
  return opbridge::testing::report("box_iou_rotated kernel");
}
