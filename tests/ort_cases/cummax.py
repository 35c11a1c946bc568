"""ORT smoke cases of mmcv::cummax, mmcv::cummin and mmcv::MMCVCornerPool (the nodes mmcv's symbolics write for
torch.cummax / torch.cummin and for CornerNet's corner pools): values and indices against a numpy reference written
from torch's definition (ties take the last index, NaN propagates), every axis and mode, hand-worked corner
pools, and bad axes, modes and ranks. tests/test_openmmlab.py also checks them against torch."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session

DTYPES = {**DTYPES, np.int64: TensorProto.INT64}
CORNER_MODES = ("top", "bottom", "left", "right")  # the mode attribute's 0..3


def cumulative_model(op_type: str, dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    outputs = ["values", "indices"] if op_type in ("cummax", "cummin") else ["output"]
    return one_node_model(
        helper.make_node(op_type, ["input"], outputs, domain="mmcv", **attributes),
        [helper.make_tensor_value_info("input", elem, None)],
        [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "indices" else elem, None) for n in outputs],
        domains=("mmcv",),
    )


def cumulative_reference(x, dim: int, maximum: bool):
    """(values, indices) of torch.cummax (maximum) or torch.cummin along dim, written from the definition."""
    x = np.asarray(x)
    moved = np.moveaxis(x.reshape(x.shape or (1,)), dim, 0)
    values, indices = np.empty_like(moved), np.zeros(moved.shape, np.int64)
    for i in range(moved.shape[0]):
        if i == 0:
            values[0], indices[0] = moved[0], 0
            continue
        value, best = moved[i], values[i - 1]
        with np.errstate(invalid="ignore"):
            better = value >= best if maximum else value <= best
        if np.issubdtype(x.dtype, np.floating):
            better = np.isnan(value) | (better & ~np.isnan(best))
        values[i] = np.where(better, value, best)
        indices[i] = np.where(better, i, indices[i - 1])
    shape = x.shape
    return np.moveaxis(values, 0, dim).reshape(shape), np.moveaxis(indices, 0, dim).reshape(shape)


def corner_pool_reference(x, mode: str):
    """CornerNet's pools: top = running maximum from the bottom row upwards, bottom from the top row down, left
    from the right column leftwards, right from the left column rightwards."""
    axis = 2 if mode in ("top", "bottom") else 3
    if mode in ("top", "left"):
        return np.flip(cumulative_reference(np.flip(x, axis), axis, True)[0], axis)
    return cumulative_reference(x, axis, True)[0]


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).round(1)  # rounded: ties occur
    x[0, 0, 1, 1] = np.nan
    for op_type, maximum in (("cummax", True), ("cummin", False)):
        for dtype in (np.float32, np.float64, np.int64):
            data = x * 10 if dtype == np.int64 else x
            data = np.nan_to_num(data) if dtype == np.int64 else data
            data = data.astype(dtype)
            for dim in (0, 1, 2, 3, -1, -4):
                sess = session(library, cumulative_model(op_type, dtype, dim=dim))
                values, indices = sess.run(None, {"input": data})
                want_values, want_indices = cumulative_reference(data, dim, maximum)
                np.testing.assert_array_equal(values, want_values, err_msg=f"{op_type} {dtype} {dim}")
                np.testing.assert_array_equal(indices, want_indices, err_msg=f"{op_type} {dtype} {dim}")
                assert values.dtype == dtype and indices.dtype == np.int64
    # The documented examples: ties take the last index; a NaN stays once met.
    values, indices = session(library, cumulative_model("cummax", dim=0)).run(
        None, {"input": np.array([1, 3, 3, 2, np.nan, 5], np.float32)}
    )
    np.testing.assert_array_equal(values, [1, 3, 3, 3, np.nan, np.nan])
    np.testing.assert_array_equal(indices, [0, 1, 2, 2, 4, 4])
    values, indices = session(library, cumulative_model("cummin", dim=0)).run(
        None, {"input": np.array([4, 2, 5, 2, 1], np.float32)}
    )
    np.testing.assert_array_equal(values, [4, 2, 2, 2, 1])
    np.testing.assert_array_equal(indices, [0, 1, 1, 3, 4])
    # 0-d and empty tensors, as torch.cummax.
    values, indices = session(library, cumulative_model("cummax", dim=0)).run(None, {"input": np.array(7, np.float32)})
    assert values.shape == () and values == 7 and indices == 0
    values, _ = session(library, cumulative_model("cummax", dim=1)).run(None, {"input": np.ones((2, 0), np.float32)})
    assert values.shape == (2, 0)


def check_corner_pools(library: str) -> None:
    x = np.array([[[[2.0, 1.0, 3.0], [0.0, 5.0, 1.0], [4.0, 0.0, 2.0]]]], np.float32)
    hand = {
        "top": [[4, 5, 3], [4, 5, 2], [4, 0, 2]],
        "bottom": [[2, 1, 3], [2, 5, 3], [4, 5, 3]],
        "left": [[3, 3, 3], [5, 5, 1], [4, 2, 2]],
        "right": [[2, 2, 3], [0, 5, 5], [4, 4, 4]],
    }
    rng = np.random.default_rng(1)
    data = rng.standard_normal((2, 3, 5, 6))
    for mode, name in enumerate(CORNER_MODES):
        (out,) = session(library, cumulative_model("MMCVCornerPool", mode=mode)).run(None, {"input": x})
        np.testing.assert_array_equal(out[0, 0], hand[name], err_msg=name)
        for dtype in (np.float32, np.float64):
            (out,) = session(library, cumulative_model("MMCVCornerPool", dtype, mode=mode), 2).run(
                None, {"input": data.astype(dtype)}
            )
            np.testing.assert_array_equal(out, corner_pool_reference(data.astype(dtype), name), err_msg=name)


def check_bad_input(library: str) -> None:
    for dim in (2, -3):
        sess = session(library, cumulative_model("cummax", dim=dim))
        expect_error(lambda s=sess: s.run(None, {"input": np.ones((2, 3), np.float32)}), "mmcv::cummax",
                     "attribute 'dim'", "[-2, 1]")  # fmt: skip
    sess = session(library, cumulative_model("MMCVCornerPool", mode=0))
    expect_error(lambda: sess.run(None, {"input": np.ones((2, 3, 4), np.float32)}), "mmcv::MMCVCornerPool", "4-D")
    expect_error(lambda: session(library, cumulative_model("MMCVCornerPool", mode=4)), "attribute 'mode'", "(right)")
    expect_error(lambda: session(library, cumulative_model("cummin", dim=0.5)), "attribute 'dim'", "integer")


CHECKS = [check_against_reference, check_corner_pools, check_bad_input]
