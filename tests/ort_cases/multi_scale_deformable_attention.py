"""ORT smoke cases of opbridge::MultiScaleDeformableAttention and mmdeploy::MMCVMultiScaleDeformableAttention:
values against a numpy reference written from the definition, at 1 and 2 threads, and malformed inputs (error
statuses naming op, input and expectation)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session

NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def ms_deform_attn_reference(value, spatial_shapes, level_start_index, locations, weights):
    """Multi-scale deformable attention in plain numpy, one sample at a time (Deformable DETR's definition:
    pixel (x * W - 0.5, y * H - 0.5), bilinear, zero outside the map)."""
    n, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = locations.shape
    out = np.zeros((n, queries, heads, channels))
    for b in range(n):
        for q in range(queries):
            for m in range(heads):
                for level in range(levels):
                    height, width = (int(v) for v in spatial_shapes[level])
                    start = int(level_start_index[level])
                    for p in range(points):
                        x = locations[b, q, m, level, p, 0] * width - 0.5
                        y = locations[b, q, m, level, p, 1] * height - 0.5
                        if not (-1 < x < width and -1 < y < height):
                            continue
                        x0, y0 = int(np.floor(x)), int(np.floor(y))
                        for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
                            if 0 <= yy < height and 0 <= xx < width:
                                corner = (1 - abs(y - yy)) * (1 - abs(x - xx))
                                out[b, q, m] += (weights[b, q, m, level, p] * corner
                                                 * value[b, start + yy * width + xx, m])  # fmt: skip
    return out.reshape(n, queries, heads * channels).astype(value.dtype)


def msda_model(dtype=np.float32, op_type="MultiScaleDeformableAttention", domain="opbridge", **attributes) -> bytes:
    elem = DTYPES[dtype]
    types = [elem, TensorProto.INT64, TensorProto.INT64, elem, elem]
    return one_node_model(
        helper.make_node(op_type, NAMES, ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info(name, t, None) for name, t in zip(NAMES, types, strict=True)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def msda_case(rng, dtype, batch=2, levels=((5, 6), (3, 2), (1, 1)), queries=6, heads=2, channels=3, points=2):
    shapes = np.array(levels, dtype=np.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)
    return {
        "value": rng.standard_normal((batch, int(areas.sum()), heads, channels)).astype(dtype),
        "spatial_shapes": shapes,
        "level_start_index": starts,
        "sampling_locations": (rng.random((batch, queries, heads, len(levels), points, 2)) * 1.3 - 0.15).astype(dtype),
        "attention_weights": rng.random((batch, queries, heads, len(levels), points)).astype(dtype),
    }


def check_ms_deform_attn_values(library: str) -> None:
    rng = np.random.default_rng(3)
    for dtype, tolerance in ((np.float32, 1e-5), (np.float64, 1e-12)):
        for kwargs in ({}, {"levels": ((4, 4),), "points": 1, "heads": 1, "channels": 33}, {"batch": 0}):
            feeds = msda_case(rng, dtype, **kwargs)
            expected = ms_deform_attn_reference(*(feeds[n] for n in NAMES))
            for model in (msda_model(dtype), msda_model(dtype, "MMCVMultiScaleDeformableAttention", "mmdeploy",
                                                        im2col_step=64)):  # fmt: skip
                for threads in (1, 2):
                    (y,) = session(library, model, threads).run(None, feeds)
                    assert y.shape == expected.shape, (y.shape, expected.shape)
                    np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)


def check_ms_deform_attn_bad_input(library: str) -> None:
    rng = np.random.default_rng(4)
    feeds = msda_case(rng, np.float32)
    sess = session(library, msda_model(np.float32))
    op = "opbridge::MultiScaleDeformableAttention"
    bad_inputs = [
        ({"value": feeds["value"][0]}, "input value (index 0) must be 4-D"),
        (
            {"spatial_shapes": feeds["spatial_shapes"][:, :1]},
            "input spatial_shapes (index 1) must have shape [levels, 2]",
        ),
        (
            {"level_start_index": np.array([0, 30, 37], dtype=np.int64)},
            "level_start_index (index 2)[2] = 37 must be 36",
        ),
        ({"spatial_shapes": np.array([[5, 6], [3, 2], [1, 2]], dtype=np.int64)}, "cover 38 keys"),
        ({"spatial_shapes": np.array([[5, 6], [-3, 2], [1, 1]], dtype=np.int64)}, "non-negative sizes"),
        ({"sampling_locations": feeds["sampling_locations"][..., :1]}, "input sampling_locations (index 3) must have"),
        ({"attention_weights": feeds["attention_weights"][:, :2]}, "input attention_weights (index 4) must have"),
        ({"level_start_index": feeds["level_start_index"][:2]}, "input level_start_index (index 2) shape [levels]"),
    ]
    for change, fragment in bad_inputs:
        expect_error(lambda change=change: sess.run(None, {**feeds, **change}), op, fragment)
    # NaN and far-away locations sample zeros, never crash.
    far = feeds["sampling_locations"].copy()
    far[0, 0], far[0, 1], far[1, 2] = np.nan, 1e30, -np.inf
    (y,) = sess.run(None, {**feeds, "sampling_locations": far})
    assert np.all(y[0, :2] == 0) and np.all(y[1, 2] == 0) and np.isfinite(y).all()
    (y,) = sess.run(None, feeds)  # still usable
    assert np.isfinite(y).all()


CHECKS = [check_ms_deform_attn_values, check_ms_deform_attn_bad_input]
