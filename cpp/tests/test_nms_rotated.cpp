// nms_rotated's kernels: mmcv's published boxes, labels, the threshold's edge, ties, and mmdeploy's batched
// NMSRotated rows on its test inputs.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/nms_rotated.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;
using namespace opbridge::kernels;

void test_published() {  // mmcv tests/test_ops/test_nms_rotated.py
  const std::vector<float> boxes{6, 3, 8, 7, 0.5f, 3, 6, 9, 11, 0.6f, 3, 7, 10, 12, 0.3f, 1, 4, 13, 7, 0.6f};
  const std::vector<float> scores{0.7f, 0.8f, 0.5f, 0.9f};
  const std::vector<int64_t> labels{1, 0, 1, 0};
  expect(
      nms_rotated<float, int64_t>(boxes.data(), scores.data(), nullptr, 4, 0.5, true) == std::vector<int64_t>{3, 1, 0},
      "published keep [3, 1, 0]");
  expect(nms_rotated(boxes.data(), scores.data(), labels.data(), 4, 0.5, true) == std::vector<int64_t>{3, 1, 0, 2},
         "per label: [3, 1, 0, 2] (mmcv's batched_nms)");
}

void test_edges() {
  const std::vector<double> boxes{0, 0, 4, 2, 0, 1, 0, 4, 2, 0};  // IoU 3/5
  const std::vector<double> scores{0.9, 0.8}, tied{0.5, 0.5};
  expect(nms_rotated<double, int64_t>(boxes.data(), scores.data(), nullptr, 2, 0.6, true).size() == 2,
         "IoU at the threshold: kept");
  expect(nms_rotated<double, int64_t>(boxes.data(), scores.data(), nullptr, 2, 0.59, true).size() == 1,
         "IoU above the threshold: suppressed");
  expect(nms_rotated<double, int64_t>(boxes.data(), tied.data(), nullptr, 2, 0.1, true) == std::vector<int64_t>{0},
         "ties keep the input order");
}

void test_mmdeploy_rows() {  // mmdeploy tests/test_ops/test_ops.py::test_nms_rotated, score_threshold 0.1
  const std::vector<float> boxes{60, 75, 20, 50, 0, 65, 80, 10, 40, 0, 30, 30, 40, 40, 0,
                                 60, 75, 20, 50, 0, 65, 80, 10, 40, 0, 30, 30, 40, 40, 0};
  const std::vector<float> scores{0.5f, 0.1f, 0.1f, 0.1f, 0.6f, 0.1f, 0.1f, 0.1f, 0.7f, 0.1f, 0.1f, 0.1f,
                                  0.1f, 0.1f, 0.1f, 0.7f, 0.1f, 0.1f, 0.1f, 0.6f, 0.1f, 0.1f, 0.1f, 0.5f};
  const auto rows =
      batched_nms_rotated(boxes.data(), scores.data(), 2, 4, 3, 0.3, double(0.1f), ThreadedFor{});  // as ORT reads it
  const std::vector<int64_t> want{0, 0, 0, 0, 1, 1, 0, 2, 2, 1, 1, 0, 1, 2, 1, 1, 3, 2};
  expect(rows == want, "mmdeploy's rows at score_threshold 0.1");
}

}  // namespace

int main() {
  test_published();
  test_edges();
  test_mmdeploy_rows();
  return opbridge::testing::report("nms_rotated kernel");
}
