// IoU of rotated boxes (mmcv's box_iou_rotated semantics), framework-free: the geometry the rotated ops share
// (nms_rotated.h includes it), the shape checks and the pairwise / aligned kernel.
//
// A box is (cx, cy, w, h, angle), angle in radians. Its corners are the center plus R(angle) applied to
// (+-w/2, +-h/2), R(a) = [[cos a, -sin a], [sin a, cos a]]: with `clockwise` (mmcv's default) the angle is used
// as given, which in image coordinates (y down) turns the box clockwise; without it the angle is negated first.
//
// iou = area(A n B) / (area(A) + area(B) - area(A n B));  iof = area(A n B) / area(A).
// A box of area w * h below 1e-14 (zero-size, or one negative side) overlaps nothing: 0 (as mmcv). A box with a
// NaN or infinite number gives NaN (mmcv's result there is undefined).
//
// The intersection area comes from Green's theorem, without building the intersection polygon: the area of a
// region is the sum over its boundary pieces [p, q] of cross(p, q) / 2, and the boundary of A n B is the part of
// A's boundary inside B plus the part of B's boundary inside A. For a convex B the part of one edge of A inside
// B is one interval, found by clipping the edge against B's four half-planes (Liang-Barsky). A piece where the
// two boundaries coincide is counted once: from A when both run the same way (then the two interiors are on the
// same side), from neither when they run opposite ways (the boxes only touch). Computed in double, relative to
// the first box's center, whatever the element type: identical, nearly identical, tiny and huge boxes keep
// their precision.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/device.h"

namespace opbridge::kernels {

namespace rotated {

// A box prepared for the pairwise work: its center and its corners relative to the center, counter-clockwise
// in a y-up frame (the order the half-plane tests need).
struct Polygon {
  double cx = 0, cy = 0, area = 0, radius = 0;
  double x[4] = {0, 0, 0, 0}, y[4] = {0, 0, 0, 0};
  bool finite = true;
};

constexpr double kMinArea = 1e-14;

template <class T>
OPBRIDGE_HD Polygon prepare(const T* box, bool clockwise) {
  Polygon p;
  const double cx = box[0], cy = box[1], w = box[2], h = box[3];
  const double angle = clockwise ? static_cast<double>(box[4]) : -static_cast<double>(box[4]);
  p.finite = std::isfinite(cx) && std::isfinite(cy) && std::isfinite(w) && std::isfinite(h) && std::isfinite(angle);
  p.cx = cx;
  p.cy = cy;
  p.area = w * h;
  if (!p.finite) return p;
  p.radius = 0.5 * std::hypot(w, h);
  const double c = std::cos(angle), s = std::sin(angle);
  const double ux[4] = {-0.5 * w, 0.5 * w, 0.5 * w, -0.5 * w}, uy[4] = {-0.5 * h, -0.5 * h, 0.5 * h, 0.5 * h};
  for (int i = 0; i < 4; ++i) {
    p.x[i] = c * ux[i] - s * uy[i];
    p.y[i] = s * ux[i] + c * uy[i];
  }
  return p;
}

// Twice the signed area swept by the part of polygon a's boundary inside polygon b (both given by corners
// relative to a common origin): the sum of cross(p, q) over the pieces. `owns_shared` says whether a piece
// lying on one of b's edges, running the same way, counts (see the file comment).
OPBRIDGE_HD inline double boundary_inside(const double (&ax)[4], const double (&ay)[4], const double (&bx)[4],
                                          const double (&by)[4], bool owns_shared, double tolerance) {
  double twice = 0;
  for (int i = 0; i < 4; ++i) {
    const int i1 = (i + 1) & 3;
    const double px = ax[i], py = ay[i], dx = ax[i1] - px, dy = ay[i1] - py;
    const double d_length = std::hypot(dx, dy);
    if (d_length == 0) continue;
    double t0 = 0, t1 = 1;
    for (int j = 0; j < 4 && t0 < t1; ++j) {
      const int j1 = (j + 1) & 3;
      const double ex = bx[j1] - bx[j], ey = by[j1] - by[j];
      const double e_length = std::hypot(ex, ey);
      // f(t) = cross(e, p + t d - b_j) = f0 + t * fd: positive inside b (to the left of a counter-clockwise edge).
      const double f0 = ex * (py - by[j]) - ey * (px - bx[j]);
      const double fd = ex * dy - ey * dx;
      if (std::abs(fd) <= 1e-12 * e_length * d_length) {  // parallel to this edge
        const double distance = f0 / e_length;
        if (distance > tolerance) continue;  // on the inner side: no constraint
        if (distance < -tolerance || !owns_shared || ex * dx + ey * dy <= 0) t1 = -1;
        continue;  // on the edge's line, running the same way: counted from this side
      }
      const double t = -f0 / fd;
      if (fd > 0) {
        t0 = std::max(t0, t);
      } else {
        t1 = std::min(t1, t);
      }
    }
    if (t0 < t1) {
      const double x0 = px + t0 * dx, y0 = py + t0 * dy, x1 = px + t1 * dx, y1 = py + t1 * dy;
      twice += x0 * y1 - y0 * x1;
    }
  }
  return twice;
}

// area(a n b); both polygons finite with positive areas.
OPBRIDGE_HD inline double intersection_area(const Polygon& a, const Polygon& b) {
  const double ox = b.cx - a.cx, oy = b.cy - a.cy;
  if (ox * ox + oy * oy >= (a.radius + b.radius) * (a.radius + b.radius)) return 0;  // the circumcircles are apart
  double bx[4], by[4];
  for (int i = 0; i < 4; ++i) {
    bx[i] = b.x[i] + ox;
    by[i] = b.y[i] + oy;
  }
  // Two points closer than this (relative to the boxes' size) count as one position on a shared edge.
  const double tolerance = 1e-10 * std::max(a.radius, b.radius);
  const double twice =
      boundary_inside(a.x, a.y, bx, by, true, tolerance) + boundary_inside(bx, by, a.x, a.y, false, tolerance);
  return std::clamp(0.5 * twice, 0.0, std::min(a.area, b.area));
}

// mode 0: iou, 1: iof (the intersection over a's area).
OPBRIDGE_HD inline double overlap(const Polygon& a, const Polygon& b, int64_t mode) {
  if (!a.finite || !b.finite) return std::numeric_limits<double>::quiet_NaN();
  if (!(a.area >= kMinArea) || !(b.area >= kMinArea)) return 0;
  const double inter = intersection_area(a, b);
  if (mode == 1) return inter / a.area;
  return inter / (a.area + b.area - inter);
}

}  // namespace rotated

struct BoxIouRotatedShape {
  int64_t rows = 0, cols = 0;
  bool aligned = false;
};

// boxes1 [N, 5], boxes2 [M, 5]; mode 0 (iou) or 1 (iof); aligned needs N == M.
inline Status check_box_iou_rotated(const char* op, const char* boxes1_name, const std::vector<int64_t>& boxes1,
                                    const char* boxes2_name, const std::vector<int64_t>& boxes2, int64_t mode,
                                    bool aligned, BoxIouRotatedShape& shape) {
  const std::string prefix = std::string(op) + ": ";
  for (const auto& [name, boxes] : {std::pair{boxes1_name, &boxes1}, std::pair{boxes2_name, &boxes2}}) {
    if (boxes->size() != 2 || (*boxes)[1] != 5) {
      return {prefix + name + " must have shape [boxes, 5] (cx, cy, w, h, angle), got " + shape_to_string(*boxes)};
    }
  }
  if (mode != 0 && mode != 1) {
    return {prefix + "mode must be 0 (iou) or 1 (iof), got " + std::to_string(mode)};
  }
  if (aligned && boxes1[0] != boxes2[0]) {
    return {prefix + "aligned=True needs as many boxes in " + boxes1_name + " as in " + boxes2_name + ", got " +
            std::to_string(boxes1[0]) + " and " + std::to_string(boxes2[0])};
  }
  int64_t numel = 0;
  if (!aligned && !checked_numel({boxes1[0], boxes2[0]}, numel)) {
    return {prefix + "the output of " + std::to_string(boxes1[0]) + " x " + std::to_string(boxes2[0]) +
            " overlaps has too many elements"};
  }
  shape = {boxes1[0], boxes2[0], aligned};
  return {};
}

template <class T>
std::vector<rotated::Polygon> prepare_boxes(const T* boxes, int64_t count, bool clockwise) {
  std::vector<rotated::Polygon> polygons(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) polygons[i] = rotated::prepare(boxes + 5 * i, clockwise);
  return polygons;
}

// out [rows, cols] (or [rows] when aligned) of T.
template <class T, class ParallelFor>
void box_iou_rotated(const T* boxes1, const T* boxes2, T* out, const BoxIouRotatedShape& shape, int64_t mode,
                     bool clockwise, ParallelFor&& parallel_for) {
  const auto a = prepare_boxes(boxes1, shape.rows, clockwise);
  const auto b = prepare_boxes(boxes2, shape.cols, clockwise);
  if (shape.aligned) {
    constexpr int64_t kChunk = 1024;
    parallel_for((shape.rows + kChunk - 1) / kChunk, [&](int64_t task) {
      const int64_t end = std::min(shape.rows, (task + 1) * kChunk);
      for (int64_t i = task * kChunk; i < end; ++i) out[i] = static_cast<T>(rotated::overlap(a[i], b[i], mode));
    });
    return;
  }
  parallel_for(shape.rows, [&](int64_t i) {
    T* row = out + i * shape.cols;
    for (int64_t j = 0; j < shape.cols; ++j) row[j] = static_cast<T>(rotated::overlap(a[i], b[j], mode));
  });
}

}  // namespace opbridge::kernels
