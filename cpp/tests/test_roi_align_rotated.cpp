// roi_align_rotated's kernels: mmcv's published outputs and gradients (4 x 4 map, angles 0 and pi/2), the
// legacy adaptive mode, the roi checks (batch index, huge adaptive grids), and threaded determinism.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/roi_align_rotated.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;
using namespace opbridge::kernels;

constexpr RoiAlignRotatedNames kNames{"op", "input", "rois"};
const std::vector<double> kMap{1, 2, 5, 6, 3, 4, 7, 8, 9, 10, 13, 14, 11, 12, 15, 16};

std::vector<double> run(const std::vector<double>& roi, RoiAlignRotatedAttributes a, std::vector<double>* grad) {
  RoiAlignRotatedShape shape;
  expect(check_roi_align_rotated(kNames, {1, 1, 4, 4}, {1, 6}, a, shape).ok(), "check");
  std::vector<roi_align_rotated_detail::Roi> rois;
  expect(read_rotated_rois(kNames, roi.data(), shape, a, rois).ok(), "rois");
  std::vector<double> out(a.pooled_height * a.pooled_width);
  roi_align_rotated(kMap.data(), rois, out.data(), shape, ThreadedFor{});
  if (grad != nullptr) {
    grad->assign(16, 0.0);
    const std::vector<double> ones(out.size(), 1.0);
    roi_align_rotated_backward(ones.data(), rois, grad->data(), shape, ThreadedFor{});
  }
  return out;
}

void test_published() {  // mmcv tests/test_ops/test_roi_align_rotated.py, (2, 2), scale 1, ratio 2, aligned
  const RoiAlignRotatedAttributes a{2, 2, 2, 1.0, true, false};
  std::vector<double> grad;
  const auto flat = run({0, 1.5, 1.5, 3, 3, 0}, a, &grad);
  const double want[] = {1.9375, 4.75, 7.5625, 10.375};
  const double want_grad[] = {0.47265625, 0.4296875, 0.4296875, 0.04296875, 0.4296875, 0.390625,
                              0.390625,   0.0390625, 0.4296875, 0.390625,   0.390625,  0.0390625,
                              0.04296875, 0.0390625, 0.0390625, 0.00390625};
  for (int i = 0; i < 4; ++i) expect(std::abs(flat[i] - want[i]) < 1e-12, "published output " + std::to_string(i));
  for (int i = 0; i < 16; ++i) expect(std::abs(grad[i] - want_grad[i]) < 1e-12, "published grad " + std::to_string(i));
  const auto turned = run({0, 1.5, 1.5, 3, 3, M_PI / 2}, a, nullptr);
  const double want_turned[] = {7.5625, 1.9375, 10.375, 4.75};
  for (int i = 0; i < 4; ++i) expect(std::abs(turned[i] - want_turned[i]) < 1e-12, "published at pi/2");
  // The legacy mode with an adaptive grid, at 60 degrees (mmcv's definition evaluated by hand elsewhere).
  const auto legacy = run({0, 1.5, 1.5, 3, 3, M_PI / 3}, {2, 2, 0, 1.0, false, false}, nullptr);
  const double want_legacy[] = {7.845011, 3.789183, 13.210817, 9.154989};
  for (int i = 0; i < 4; ++i) expect(std::abs(legacy[i] - want_legacy[i]) < 1e-6, "legacy adaptive");
}

void test_checks() {
  const RoiAlignRotatedAttributes a{2, 2, 0, 1.0, true, false};
  RoiAlignRotatedShape shape;
  expect(check_roi_align_rotated(kNames, {2, 1, 4, 4}, {1, 6}, a, shape).ok(), "check");
  std::vector<roi_align_rotated_detail::Roi> rois;
  for (double index : {2.0, -1.0, 0.5, double(NAN)}) {
    const std::vector<double> roi{index, 1, 1, 2, 2, 0};
    const auto status = read_rotated_rois(kNames, roi.data(), shape, a, rois);
    expect(status.message.find("[0, 2)") != std::string::npos, "batch index refused: " + status.message);
  }
  for (double size : {1e9, 1e30, 1e300}) {  // counts beyond int64 too
    const std::vector<double> roi{0, 1, 1, size, 3, 0};
    expect(!read_rotated_rois(kNames, roi.data(), shape, a, rois).ok(), "huge adaptive grid refused");
  }
  expect(!check_roi_align_rotated(kNames, {1, 1, 4, 4}, {1, 6}, {0, 2, 0, 1.0, true, false}, shape).ok(),
         "output height 0 refused");
  expect(!check_roi_align_rotated(kNames, {1, 1, 4, 4}, {1, 6}, {2, 2, 0, NAN, true, false}, shape).ok(),
         "NaN scale refused");
}

}  // namespace

int main() {
  test_published();
  test_checks();
  return opbridge::testing::report("roi_align_rotated kernel");
}
