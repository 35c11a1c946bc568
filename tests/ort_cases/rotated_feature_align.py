"""ORT smoke cases of opbridge::RotatedFeatureAlign and mmcv::MMCVRotatedFeatureAlign (the node mmcv's symbolic
writes): values against a numpy reference of mmcv's definition, points 1 and 5, NaN boxes, bad shapes."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session


def align_model(dtype=np.float32, op_type="RotatedFeatureAlign", domain="opbridge", **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node(op_type, ["features", "best_rboxes"], ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info(n, elem, None) for n in ("features", "best_rboxes")],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def bilinear(plane, y, x):
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return np.zeros(plane.shape[:-2])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0, y = height - 1, float(height - 1)
    if x0 >= width - 1:
        x0, x = width - 1, float(width - 1)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    ly, lx = y - y0, x - x0
    return (
        (1 - ly) * (1 - lx) * plane[..., y0, x0]
        + (1 - ly) * lx * plane[..., y0, x1]
        + ly * (1 - lx) * plane[..., y1, x0]
        + ly * lx * plane[..., y1, x1]
    )


def reference(features, boxes, scale, points):
    """mmcv's definition: (y, x, w, h, angle) per pixel; samples at the center (and the corners)."""
    out = features.astype(np.float64).copy()
    for n, h, w in np.ndindex(*boxes.shape[:3]):
        y, x, bw, bh, angle = boxes[n, h, w].astype(np.float64)
        y, x, bw, bh = y * scale, x * scale, bw * scale, bh * scale
        spots = [(y, x)]
        if points == 5:
            c, s = math.cos(angle), math.sin(angle)
            spots += [
                (y + sw * s * bw / 2 + sh * c * bh / 2, x + sw * c * bw / 2 - sh * s * bh / 2)
                for sw, sh in ((1, 1), (-1, 1), (-1, -1), (1, -1))
            ]
        for py, px in spots:
            out[n, :, h, w] += bilinear(features[n].astype(np.float64), py, px)
    return out


def check_values(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        features = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
        boxes = np.concatenate(
            [rng.uniform(-4, 50, (2, 5, 6, 2)), rng.uniform(0, 30, (2, 5, 6, 2)), rng.uniform(-2, 2, (2, 5, 6, 1))],
            axis=3,
        ).astype(dtype)
        for op_type, domain in (("RotatedFeatureAlign", "opbridge"), ("MMCVRotatedFeatureAlign", "mmcv")):
            for points in (1, 5):
                sess = session(library, align_model(dtype, op_type, domain, spatial_scale=0.125, points=points), 2)
                (out,) = sess.run(None, {"features": features, "best_rboxes": boxes})
                np.testing.assert_allclose(out, reference(features, boxes, 0.125, points), rtol=1e-5, atol=1e-5)
    boxes[0, 1, 2, 4] = np.nan
    (out,) = session(library, align_model(np.float64, points=5)).run(None, {"features": features, "best_rboxes": boxes})
    assert np.isnan(out[0, :, 1, 2]).all() and not np.isnan(np.delete(out[0].reshape(3, -1), 8, axis=1)).any()


def check_bad_input(library: str) -> None:
    sess = session(library, align_model(spatial_scale=0.125, points=1))
    expect_error(
        lambda: sess.run(
            None, {"features": np.ones((1, 2, 4, 4), np.float32), "best_rboxes": np.ones((1, 4, 3, 5), np.float32)}
        ),
        "opbridge::RotatedFeatureAlign",
        "input best_rboxes (index 1)",
        "[1, 4, 4, 5]",
    )
    bad = session(library, align_model(op_type="MMCVRotatedFeatureAlign", domain="mmcv", points=3))
    expect_error(
        lambda: bad.run(
            None, {"features": np.ones((1, 2, 4, 4), np.float32), "best_rboxes": np.ones((1, 4, 4, 5), np.float32)}
        ),
        "mmcv::MMCVRotatedFeatureAlign",
        "points must be 1",
    )


CHECKS = [check_values, check_bad_input]
