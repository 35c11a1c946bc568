// Non-maximum suppression of axis-aligned boxes (x1, y1, x2, y2) with mmcv's semantics, framework-free: hard
// NMS (mmcv::NonMaxSuppression) and soft NMS (mmcv::SoftNonMaxSuppression), both with mmcv's `offset` (a box
// is x2 - x1 + offset wide: 1 for the old pixel-inclusive convention).
//
// IoU = inter / (area_i + area_j - inter), inter = max(0, min(x2) - max(x1) + offset) * (likewise in y), area =
// (x2 - x1 + offset) * (y2 - y1 + offset), unclamped, in the boxes' type. A NaN IoU (two empty boxes with
// offset 0) suppresses nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/nms_rotated.h"  // descending_order

namespace opbridge::kernels {

// boxes [N, 4], scores [N].
inline Status check_nms(const char* op, const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                        int64_t& count) {
  const std::string prefix = std::string(op) + ": ";
  if (boxes.size() != 2 || boxes[1] != 4) {
    return {prefix + "input boxes (index 0) must have shape [N, 4] (x1, y1, x2, y2), got " + shape_to_string(boxes)};
  }
  if (scores.size() != 1 || scores[0] != boxes[0]) {
    return {prefix + "input scores (index 1) must have shape [N] with N = boxes.shape[0] = " +
            std::to_string(boxes[0]) + ", got " + shape_to_string(scores)};
  }
  count = boxes[0];
  return {};
}

inline Status check_nms_offset(const char* op, int64_t offset) {
  if (offset == 0 || offset == 1) return {};
  return {std::string(op) + ": attribute 'offset' must be 0 or 1 (boxes are x2 - x1 + offset wide), got " +
          std::to_string(offset)};
}

namespace nms_detail {

template <class T>
T area(const T* b, T offset) {
  return (b[2] - b[0] + offset) * (b[3] - b[1] + offset);
}

template <class T>
T iou(const T* a, const T* b, T area_a, T area_b, T offset) {
  const T w = std::max(T(0), std::min(a[2], b[2]) - std::max(a[0], b[0]) + offset);
  const T h = std::max(T(0), std::min(a[3], b[3]) - std::max(a[1], b[1]) + offset);
  const T inter = w * h;
  return inter / (area_a + area_b - inter);
}

// Kept boxes as columns (x1, y1, x2, y2, area), which the candidate loops read 64 at a time.
template <class T>
struct BoxColumns {
  std::vector<T> x1, y1, x2, y2, area;
  void push(const T* box, T box_area) {
    x1.push_back(box[0]);
    y1.push_back(box[1]);
    x2.push_back(box[2]);
    y2.push_back(box[3]);
    area.push_back(box_area);
  }
};

}  // namespace nms_detail

// The kept indices in decreasing score order (a stable sort: equal scores keep their input order; NaN first).
// A box is suppressed by a kept box of higher rank with IoU > iou_threshold (strictly, as mmcv >= 1.3.12).
template <class T>
std::vector<int64_t> nms(const T* boxes, const T* scores, int64_t count, double iou_threshold, int64_t offset) {
  // Each candidate, in score order, against the boxes kept so far: the same result as suppressing forward from
  // each kept box. The kept boxes are columns, compared 64 at a time without branches (the compiler vectorizes
  // the loop; IEEE division gives the scalar's bits), stopping after the first chunk that suppresses.
  constexpr int64_t kChunk = 64;
  const T off = static_cast<T>(offset), threshold = static_cast<T>(iou_threshold);
  nms_detail::BoxColumns<T> columns;
  const auto& [x1, y1, x2, y2, area] = columns;
  std::vector<int64_t> keep;
  for (const int64_t i : descending_order(scores, count)) {
    const T* b = boxes + 4 * i;
    const T b_area = nms_detail::area(b, off);
    const auto kept = static_cast<int64_t>(keep.size());
    bool suppressed = false;
    for (int64_t begin = 0; begin < kept && !suppressed; begin += kChunk) {
      const int64_t end = std::min(begin + kChunk, kept);
      int hit = 0;
      for (int64_t k = begin; k < end; ++k) {
        const T right = b[2] < x2[k] ? b[2] : x2[k], left = x1[k] < b[0] ? b[0] : x1[k];
        const T bottom = b[3] < y2[k] ? b[3] : y2[k], top = y1[k] < b[1] ? b[1] : y1[k];
        const T w0 = right - left + off, h0 = bottom - top + off;
        const T w = T(0) < w0 ? w0 : T(0), h = T(0) < h0 ? h0 : T(0);
        const T inter = w * h;
        hit |= inter / (area[k] + b_area - inter) > threshold;
      }
      suppressed = hit != 0;
    }
    if (suppressed) continue;
    columns.push(b, b_area);
    keep.push_back(i);
  }
  return keep;
}

enum class SoftNmsMethod : int64_t { naive = 0, linear = 1, gaussian = 2 };

inline Status check_soft_nms_method(const char* op, int64_t method) {
  if (method >= 0 && method <= 2) return {};
  return {std::string(op) + ": attribute 'method' must be 0 (naive), 1 (linear) or 2 (gaussian), got " +
          std::to_string(method)};
}

// Soft NMS as mmcv computes it (its CPU op and its ONNX Runtime kernel run the same algorithm; the order of the
// result depends on it, so it is followed step by step): round i picks the highest score among the boxes not
// yet picked (the first position on ties, positions being those of a working copy that picks and drops
// reorder), then decays every later box by the picked one:
//   naive: score = 0 if IoU >= iou_threshold;  linear: score *= 1 - IoU if IoU >= iou_threshold;
//   gaussian: score *= exp(-IoU^2 / sigma) (mmcv divides by sigma, not 2 sigma; no threshold).
// A decayed score below min_score drops the box: the last box of the working copy moves into its place and is
// decayed in turn. `dets` gets rows (x1, y1, x2, y2, score at its pick), `inds` the input indices, in pick
// order. The first pick is never compared with min_score.
template <class T>
void soft_nms(const T* boxes, const T* scores, int64_t count, double iou_threshold, double sigma, double min_score,
              SoftNmsMethod method, int64_t offset, std::vector<T>& dets, std::vector<int64_t>& inds) {
  struct Box {
    T x[4];
    T score, area;
    int64_t index;
  };
  const T off = static_cast<T>(offset), threshold = static_cast<T>(iou_threshold);
  const T sigma_t = static_cast<T>(sigma), min_score_t = static_cast<T>(min_score);
  std::vector<Box> work(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    Box& b = work[i];
    std::copy(boxes + 4 * i, boxes + 4 * i + 4, b.x);
    b.score = scores[i];
    b.area = nms_detail::area(b.x, off);
    b.index = i;
  }
  int64_t active = count;
  for (int64_t i = 0; i < active; ++i) {
    int64_t best = i;
    for (int64_t p = i + 1; p < active; ++p) {
      if (work[best].score < work[p].score) best = p;
    }
    std::swap(work[i], work[best]);
    const Box& picked = work[i];
    dets.insert(dets.end(), {picked.x[0], picked.x[1], picked.x[2], picked.x[3], picked.score});
    inds.push_back(picked.index);
    for (int64_t p = i + 1; p < active;) {
      Box& other = work[p];
      const T overlap = nms_detail::iou(picked.x, other.x, picked.area, other.area, off);
      T weight = 1;
      if (method == SoftNmsMethod::naive) {
        if (overlap >= threshold) weight = 0;
      } else if (method == SoftNmsMethod::linear) {
        if (overlap >= threshold) weight = 1 - overlap;
      } else {
        weight = std::exp(-(overlap * overlap) / sigma_t);
      }
      other.score *= weight;
      if (other.score < min_score_t) {
        work[p] = work[active - 1];
        --active;
      } else {
        ++p;
      }
    }
  }
}

// mmdeploy's NMSMatch: boxes [B, N, 4], scores [B, C, N]. For each batch and class, greedy NMS in decreasing
// score order (stable, NaN first) where a kept box suppresses every later live box with IoU >= iou_threshold,
// IoU = inter / (area_i + area_j - inter + 1e-10) with areas (x2 - x1) * (y2 - y1): the intersection and the
// union in T, the 1e-10 and the division in double, rounded to T, as mmdeploy's kernel computes it. A kept box
// whose score is > score_threshold gives one row (batch, class, kept,
// suppressed) per box it suppressed, in suppression order; one at or below the threshold gives none but still
// suppresses. Rows in batch, class, then decreasing score order.
inline Status check_nms_match(const char* op, const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                              int64_t& batch, int64_t& classes, int64_t& count) {
  return check_batched_boxes(op, boxes, scores, 4, "(x1, y1, x2, y2)", batch, classes, count);
}

template <class T, class ParallelFor>
std::vector<int64_t> nms_match(const T* boxes, const T* scores, int64_t batch, int64_t classes, int64_t count,
                               T iou_threshold, T score_threshold, ParallelFor&& parallel_for) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(batch * classes));
  parallel_for(batch * classes, [&](int64_t task) {
    const int64_t b = task / classes, c = task % classes;
    const T* box = boxes + b * count * 4;
    const T* score = scores + task * count;
    const auto order = descending_order(score, count);
    // Each box, in score order, against the boxes kept so far: the first that overlaps it suppresses it (the one
    // that would have reached it first suppressing forward), so stopping there gives the same rows. The kept
    // boxes are columns, compared 64 at a time without branches (vectorized; IEEE arithmetic gives the scalar's
    // bits), then the first hit of a chunk is looked up.
    constexpr size_t kChunk = 64;
    nms_detail::BoxColumns<T> columns;
    const auto& [x1, y1, x2, y2, area] = columns;
    std::vector<int64_t> kept;
    std::vector<std::vector<int64_t>> suppressed_by;
    char hits[kChunk];
    for (const int64_t j : order) {
      const T* q = box + 4 * j;
      const T q_area = (q[2] - q[0]) * (q[3] - q[1]);
      size_t keeper = kept.size();
      for (size_t begin = 0; begin < kept.size() && keeper == kept.size(); begin += kChunk) {
        const size_t size = std::min(kChunk, kept.size() - begin);
        int any = 0;
        for (size_t k = 0; k < size; ++k) {
          const size_t i = begin + k;
          const T right = q[2] < x2[i] ? q[2] : x2[i], left = x1[i] < q[0] ? q[0] : x1[i];
          const T bottom = q[3] < y2[i] ? q[3] : y2[i], top = y1[i] < q[1] ? q[1] : y1[i];
          const T w = T(0) < right - left ? right - left : T(0);
          const T h = T(0) < bottom - top ? bottom - top : T(0);
          const T inter = w * h;
          // mmdeploy's arithmetic: the union in T, then its 1e-10 and the division in double.
          const T iou = static_cast<T>(inter / (static_cast<double>(area[i] + q_area - inter) + 1e-10));
          hits[k] = iou >= iou_threshold;
          any |= hits[k];
        }
        if (any) keeper = begin + static_cast<size_t>(std::find(hits, hits + size, 1) - hits);
      }
      if (keeper < kept.size()) {
        suppressed_by[keeper].push_back(j);
        continue;
      }
      columns.push(q, q_area);
      kept.push_back(j);
      suppressed_by.emplace_back();
    }
    auto& out = rows[task];
    for (size_t k = 0; k < kept.size(); ++k) {
      if (!(score[kept[k]] > score_threshold)) continue;
      for (const int64_t j : suppressed_by[k]) out.insert(out.end(), {b, c, kept[k], j});
    }
  });
  std::vector<int64_t> all;
  for (const auto& part : rows) all.insert(all.end(), part.begin(), part.end());
  return all;
}

}  // namespace opbridge::kernels
