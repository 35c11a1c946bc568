"""ORT smoke cases of mmcv::MMCVRoiAlign (the node mmcv's RoIAlign symbolic writes: ints output_height,
output_width, sampling_ratio, aligned, float spatial_scale, string mode): mmcv's published values, max pooling
and the legacy (aligned=0) mode against values derived from mmcv's kernel, a numpy reference written from the
definition on random maps, and bad rois, shapes and attributes. tests/test_openmmlab.py also checks the average
against torchvision.ops.roi_align."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session

MAP = [[1.0, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0], [9.0, 10.0, 13.0, 14.0], [11.0, 12.0, 15.0, 16.0]]
CASES = [  # mmcv's tests/test_ops/test_roi_align.py inputs and rois
    ([[[[1.0, 2.0], [3.0, 4.0]]]], [0.0, 0.0, 0.0, 1.0, 1.0]),
    ([[[[1.0, 2.0], [3.0, 4.0]], [[4.0, 3.0], [2.0, 1.0]]]], [0.0, 0.0, 0.0, 1.0, 1.0]),
    ([[MAP]], [0.0, 0.0, 0.0, 3.0, 3.0]),
]
# (case, mode, aligned, sampling_ratio) -> output: mmcv's published outputs (avg, aligned, ratio 2) and values
# derived from mmcv's kernel for max pooling and the legacy mode (output 2x2, scale 1).
EXPECTED = {
    (0, "avg", 1, 2): [[[1.0, 1.25], [1.5, 1.75]]],
    (1, "avg", 1, 2): [[[1.0, 1.25], [1.5, 1.75]], [[4.0, 3.75], [3.5, 3.25]]],
    (2, "avg", 1, 2): [[[1.9375, 4.75], [7.5625, 10.375]]],
    (0, "avg", 0, 2): [[[1.75, 2.25], [2.75, 3.25]]],
    (0, "max", 1, 2): [[[1.0, 1.375], [1.75, 2.125]]],
    (0, "max", 1, 0): [[[1.0, 1.25], [1.5, 1.75]]],
    (0, "max", 0, 2): [[[2.125, 2.625], [3.125, 3.625]]],
    (1, "max", 1, 2): [[[1.0, 1.375], [1.75, 2.125]], [[4.0, 3.875], [3.75, 3.625]]],
    (1, "max", 0, 0): [[[1.75, 2.25], [2.75, 3.25]], [[3.25, 2.75], [2.25, 1.75]]],
    (2, "avg", 0, 2): [[[3.625, 6.875], [10.125, 13.375]]],
    (2, "max", 1, 2): [[[2.875, 6.375], [9.875, 13.375]]],
    (2, "max", 0, 0): [[[5.125, 8.375], [11.625, 14.875]]],
}


def roi_align_model(dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("MMCVRoiAlign", ["input", "rois"], ["output"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info("input", elem, None), helper.make_tensor_value_info("rois", elem, None)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=("mmcv",),
    )


def as_symbolic(output_size, spatial_scale, sampling_ratio, mode, aligned) -> dict:
    """The attributes as mmcv's RoIAlignFunction.symbolic writes them."""
    return {"output_height": output_size[0], "output_width": output_size[1], "spatial_scale": float(spatial_scale),
            "sampling_ratio": sampling_ratio, "mode": mode, "aligned": int(aligned)}  # fmt: skip


def _bilinear(plane, y, x):
    """mmcv's bilinear_interpolate at one point: 0 beyond one pixel outside, clamped onto the map inside that."""
    height, width = plane.shape
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * plane[y0, x0] + (1 - ly) * lx * plane[y0, x1]
            + ly * (1 - lx) * plane[y1, x0] + ly * lx * plane[y1, x1])  # fmt: skip


def roi_align_reference(x, rois, output_size, spatial_scale, sampling_ratio, mode, aligned):
    """mmcv's RoIAlign written from its definition, point by point, in float64."""
    x, rois = np.asarray(x, np.float64), np.asarray(rois, np.float64)
    ph, pw = output_size
    out = np.zeros((len(rois), x.shape[1], ph, pw))
    offset = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        sx, sy = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        w, h = x2 * spatial_scale - offset - sx, y2 * spatial_scale - offset - sy
        if not all(math.isfinite(v) for v in (sx, sy, w, h)):
            out[k] = np.nan  # a roi with a NaN or infinite number
            continue
        if not aligned:
            w, h = max(w, 1.0), max(h, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else max(math.ceil(h / ph), 0)
        gw = sampling_ratio if sampling_ratio > 0 else max(math.ceil(w / pw), 0)
        if gh * gw == 0:  # no samples (a huge gh with gw 0 must not build gh-long lists)
            out[k] = -10000.0 if mode == "max" else 0.0
            continue
        for c in range(x.shape[1]):
            plane = x[int(b), c]
            for i in range(ph):
                for j in range(pw):
                    ys = [sy + (i + (iy + 0.5) / gh) * h / ph for iy in range(gh)]
                    xs = [sx + (j + (ix + 0.5) / gw) * w / pw for ix in range(gw)]
                    samples = [_bilinear(plane, y, x) for y in ys for x in xs]
                    if mode == "max":
                        out[k, c, i, j] = max([-10000.0, *samples])
                    else:
                        out[k, c, i, j] = sum(samples) / max(gh * gw, 1)
    return out


def check_published_and_derived_values(library: str) -> None:
    for dtype in (np.float32, np.float64):
        for (case, mode, aligned, ratio), want in EXPECTED.items():
            x, roi = CASES[case]
            sess = session(library, roi_align_model(dtype, **as_symbolic((2, 2), 1.0, ratio, mode, aligned)))
            (out,) = sess.run(None, {"input": np.array(x, dtype), "rois": np.array([roi], dtype)})
            np.testing.assert_allclose(out[0], want, atol=1e-6, err_msg=f"case {case} {mode} {aligned} {ratio}")


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 11))
    rois = np.concatenate([rng.integers(0, 2, (6, 1)), rng.uniform(-4, 10, (6, 2)), np.zeros((6, 2))], axis=1)
    rois[:, 3:5] = rois[:, 1:3] + rng.uniform(0, 14, (6, 2))  # x2 >= x1, y2 >= y1
    rois[0, 3:5] = rois[0, 1:3]  # an empty roi
    for dtype in (np.float32, np.float64):
        for mode in ("avg", "max"):
            for aligned, ratio, scale, size in ((1, 0, 1.0, (3, 2)), (0, 2, 0.5, (2, 4)), (1, 3, 2.0, (1, 1))):
                attrs = as_symbolic(size, scale, ratio, mode, aligned)
                (out,) = session(library, roi_align_model(dtype, **attrs), 2).run(
                    None, {"input": x.astype(dtype), "rois": rois.astype(dtype)}
                )
                want = roi_align_reference(x.astype(dtype), rois.astype(dtype), size, scale, ratio, mode, aligned)
                tolerance = 1e-5 if dtype == np.float32 else 1e-12
                np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance, err_msg=f"{mode} {attrs}")


def check_bad_input(library: str) -> None:
    sess = session(library, roi_align_model(**as_symbolic((2, 2), 1.0, 2, "avg", True)))
    x = np.ones((2, 1, 4, 4), np.float32)
    for index in (2.0, -1.0, 0.5, float("nan")):
        expect_error(lambda i=index: sess.run(None, {"input": x, "rois": np.array([[i, 0, 0, 2, 2]], np.float32)}),
                     "mmcv::MMCVRoiAlign", "batch index", "[0, 2)")  # fmt: skip
    expect_error(lambda: sess.run(None, {"input": x, "rois": np.ones((1, 6), np.float32)}), "input rois (index 1)",
                 "[rois, 5]")  # fmt: skip
    expect_error(lambda: sess.run(None, {"input": x[0], "rois": np.zeros((1, 5), np.float32)}), "4-D")
    expect_error(lambda: session(library, roi_align_model(**as_symbolic((2, 2), 1.0, 2, "mean", True))),
                 "attribute 'mode'", '"avg" or "max"')  # fmt: skip
    expect_error(lambda: session(library, roi_align_model(**{**as_symbolic((2, 2), 1.0, 2, "avg", True), "mode": 1})),
                 "attribute 'mode' must be a string")  # fmt: skip
    no_size = session(library, roi_align_model(spatial_scale=1.0, sampling_ratio=2, mode="avg", aligned=1))
    expect_error(lambda: no_size.run(None, {"input": x, "rois": np.zeros((1, 5), np.float32)}), "output size")


CHECKS = [check_published_and_derived_values, check_against_reference, check_bad_input]
