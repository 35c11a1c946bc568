"""ORT smoke cases of mmcv::MMCVPSAMask (the node mmcv's PSAMask symbolic writes for mmsegmentation's PSANet:
int psa_type, ints mask_size): both types against a numpy reference written from the definition (odd and even
windows, windows larger than the map), a hand-worked 2x2 case, and bad shapes and attributes."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session


def psa_mask_model(dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("MMCVPSAMask", ["input"], ["output"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info("input", elem, None)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=("mmcv",),
    )


def psa_mask_reference(x, psa_type: int, mask_size):
    """The mask window of each position placed on the map (its centre at the position), as a row of the [H * W,
    H * W] attention: collect reads the map position as the row, distribute as the column."""
    x = np.asarray(x)
    n, _, height, width = x.shape
    mask_h, mask_w = mask_size
    out = np.zeros((n, height * width, height, width), x.dtype)
    for h in range(height):
        for w in range(width):
            for i in range(mask_h):
                for j in range(mask_w):
                    y, xx = h + i - (mask_h - 1) // 2, w + j - (mask_w - 1) // 2
                    if 0 <= y < height and 0 <= xx < width:
                        if psa_type == 0:
                            out[:, y * width + xx, h, w] = x[:, i * mask_w + j, h, w]
                        else:
                            out[:, h * width + w, y, xx] = x[:, i * mask_w + j, h, w]
    return out


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for (height, width), mask in (((5, 7), (3, 3)), ((4, 6), (4, 5)), ((3, 2), (9, 9)), ((6, 5), (1, 1))):
            x = rng.standard_normal((2, mask[0] * mask[1], height, width)).astype(dtype)
            for psa_type in (0, 1):
                (out,) = session(library, psa_mask_model(dtype, psa_type=psa_type, mask_size=list(mask)), 2).run(
                    None, {"input": x}
                )
                np.testing.assert_array_equal(out, psa_mask_reference(x, psa_type, mask))


def check_hand_values(library: str) -> None:
    """A 2x2 map, a 3x3 window numbered 1..9 at every position: collect row y*2+x of position (h, w) is the window
    cell that lands on (y, x), i.e. cell (y - h + 1, x - w + 1)."""
    x = np.tile(np.arange(1.0, 10.0, dtype=np.float32)[None, :, None, None], (1, 1, 2, 2))
    (out,) = session(library, psa_mask_model(psa_type=0, mask_size=[3, 3])).run(None, {"input": x})
    # at position (0, 0): (0,0) <- cell (1,1) = 5, (0,1) <- (1,2) = 6, (1,0) <- (2,1) = 8, (1,1) <- (2,2) = 9
    np.testing.assert_array_equal(out[0, :, 0, 0], [5, 6, 8, 9])
    np.testing.assert_array_equal(out[0, :, 1, 1], [1, 2, 4, 5])
    (out,) = session(library, psa_mask_model(psa_type=1, mask_size=3)).run(None, {"input": x})  # one int
    np.testing.assert_array_equal(out[0, 0].reshape(-1), [5, 6, 8, 9])


def check_bad_input(library: str) -> None:
    sess = session(library, psa_mask_model(psa_type=0, mask_size=[3, 3]))
    expect_error(lambda: sess.run(None, {"input": np.ones((1, 8, 4, 4), np.float32)}), "mmcv::MMCVPSAMask",
                 "input input (index 0)", "mask_h * mask_w = 9")  # fmt: skip
    expect_error(lambda: sess.run(None, {"input": np.ones((9, 4, 4), np.float32)}), "mask_h * mask_w")
    for attrs, fragment in (({"psa_type": 2, "mask_size": [3, 3]}, "'psa_type' must be 0 (collect)"),
                            ({"psa_type": 0, "mask_size": [3, 0]}, "'mask_size' must be two integers"),
                            ({"psa_type": 0}, "'mask_size' must be two integers")):  # fmt: skip
        bad = session(library, psa_mask_model(**attrs))
        expect_error(lambda b=bad: b.run(None, {"input": np.ones((1, 9, 2, 2), np.float32)}), fragment)


CHECKS = [check_against_reference, check_hand_values, check_bad_input]
