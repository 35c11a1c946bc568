// Non-maximum suppression of rotated boxes, framework-free: opbridge's nms_rotated (mmcv's semantics) and the
// batched, per-class form of mmdeploy's NMSRotated node. The overlap is box_iou_rotated.h's IoU.
//
// Greedy, in decreasing score order (a stable sort: equal scores keep their input order; NaN scores sort
// first, as torch's descending sort puts them): a box is kept unless a kept box of higher rank (of the same
// label, when labels are given) overlaps it with IoU > iou_threshold. A NaN IoU (a box with a NaN or infinite
// number) suppresses nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/box_iou_rotated.h"

namespace opbridge::kernels {

// boxes [N, 5], scores [N], labels [N] (optional).
inline Status check_nms_rotated(const char* op, const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                                const std::vector<int64_t>* labels, int64_t& count) {
  const std::string prefix = std::string(op) + ": ";
  if (boxes.size() != 2 || boxes[1] != 5) {
    return {prefix + "boxes must have shape [N, 5] (cx, cy, w, h, angle), got " + shape_to_string(boxes)};
  }
  if (scores.size() != 1 || scores[0] != boxes[0]) {
    return {prefix + "scores must have shape [N] with N = boxes.shape[0] = " + std::to_string(boxes[0]) + ", got " +
            shape_to_string(scores)};
  }
  if (labels != nullptr && (labels->size() != 1 || (*labels)[0] != boxes[0])) {
    return {prefix + "labels must have shape [N] with N = boxes.shape[0] = " + std::to_string(boxes[0]) + ", got " +
            shape_to_string(*labels)};
  }
  count = boxes[0];
  return {};
}

// Indices of `count` scores in decreasing order, stable, NaN first.
template <class T>
std::vector<int64_t> descending_order(const T* scores, int64_t count, int64_t stride = 1) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
    const T a = scores[i * stride], b = scores[j * stride];
    if (std::isnan(b)) return false;
    return std::isnan(a) || a > b;
  });
  return order;
}

// Greedy suppression over `order` (indices into `polygons`); appends the kept indices to `keep`. `same_group(i,
// j)` says whether two boxes may suppress each other.
template <class SameGroup>
void greedy_nms(const std::vector<rotated::Polygon>& polygons, const std::vector<int64_t>& order, double iou_threshold,
                const SameGroup& same_group, std::vector<int64_t>& keep) {
  std::vector<char> suppressed(order.size(), 0);
  for (size_t r = 0; r < order.size(); ++r) {
    if (suppressed[r]) continue;
    const int64_t i = order[r];
    keep.push_back(i);
    for (size_t s = r + 1; s < order.size(); ++s) {
      if (suppressed[s] || !same_group(i, order[s])) continue;
      if (rotated::overlap(polygons[i], polygons[order[s]], 0) > iou_threshold) suppressed[s] = 1;
    }
  }
}

// The kept indices in decreasing score order. labels may be null (all boxes one label).
template <class T, class Label>
std::vector<int64_t> nms_rotated(const T* boxes, const T* scores, const Label* labels, int64_t count,
                                 double iou_threshold, bool clockwise) {
  const auto polygons = prepare_boxes(boxes, count, clockwise);
  const auto order = descending_order(scores, count);
  std::vector<int64_t> keep;
  if (labels == nullptr) {
    greedy_nms(polygons, order, iou_threshold, [](int64_t, int64_t) { return true; }, keep);
  } else {
    greedy_nms(polygons, order, iou_threshold, [&](int64_t i, int64_t j) { return labels[i] == labels[j]; }, keep);
  }
  return keep;
}

// mmdeploy's NMSRotated: boxes [B, N, 5], scores [B, C, N]; for each batch b and class c, the boxes whose score
// is above score_threshold, suppressed among themselves; rows (b, c, box index) in batch, class, then
// decreasing score order.
// boxes [batch, boxes, width] (`layout` names the columns), scores [batch, classes, boxes]: the inputs of
// mmdeploy's batched NMS nodes (NMSRotated, NMSMatch).
inline Status check_batched_boxes(const char* op, const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                                  int64_t width, const char* layout, int64_t& batch, int64_t& classes, int64_t& count) {
  const std::string prefix = std::string(op) + ": ";
  if (boxes.size() != 3 || boxes[2] != width) {
    return {prefix + "input boxes (index 0) must have shape [batch, boxes, " + std::to_string(width) + "] " + layout +
            ", got " + shape_to_string(boxes)};
  }
  if (scores.size() != 3 || scores[0] != boxes[0] || scores[2] != boxes[1]) {
    return {prefix + "input scores (index 1) must have shape [batch, classes, boxes] = [" + std::to_string(boxes[0]) +
            ", classes, " + std::to_string(boxes[1]) + "], got " + shape_to_string(scores)};
  }
  batch = boxes[0];
  classes = scores[1];
  count = boxes[1];
  return {};
}

inline Status check_batched_nms_rotated(const char* op, const std::vector<int64_t>& boxes,
                                        const std::vector<int64_t>& scores, int64_t& batch, int64_t& classes,
                                        int64_t& count) {
  return check_batched_boxes(op, boxes, scores, 5, "(cx, cy, w, h, angle)", batch, classes, count);
}

template <class T, class ParallelFor>
std::vector<int64_t> batched_nms_rotated(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count,
                                         double iou_threshold, double score_threshold, ParallelFor&& parallel_for) {
  // One task per (batch, class); the rows are concatenated in that order afterwards.
  std::vector<std::vector<int64_t>> kept(static_cast<size_t>(batch * classes));
  std::vector<std::vector<rotated::Polygon>> polygons(static_cast<size_t>(batch));
  parallel_for(batch, [&](int64_t b) { polygons[b] = prepare_boxes(boxes + b * count * 5, count, true); });
  parallel_for(batch * classes, [&](int64_t task) {
    const T* s = scores + task * count;
    std::vector<int64_t> order;
    for (int64_t i : descending_order(s, count)) {
      if (s[i] > score_threshold) order.push_back(i);  // NaN scores never pass
    }
    greedy_nms(polygons[task / classes], order, iou_threshold, [](int64_t, int64_t) { return true; }, kept[task]);
  });
  std::vector<int64_t> rows;
  for (int64_t task = 0; task < batch * classes; ++task) {
    for (int64_t i : kept[task]) rows.insert(rows.end(), {task / classes, task % classes, i});
  }
  return rows;
}

}  // namespace opbridge::kernels
