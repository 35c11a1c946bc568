"""ORT smoke cases of mmcv::MMCVMaskedConv2d (the node mmcv's MaskedConv2d symbolic writes for Guided Anchoring's
heads: features, mask, weight, bias; ints padding and stride): float and bool masks, with and without bias, odd
kernels and paddings, against a numpy convolution written from the definition; and bad shapes and attributes.
tests/test_openmmlab.py also checks it against torch's conv2d."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session


def masked_conv_model(dtype=np.float32, mask_dtype=None, with_bias=True, **attributes) -> bytes:
    elem = DTYPES[dtype]
    mask_elem = TensorProto.BOOL if mask_dtype is bool else DTYPES[mask_dtype or dtype]
    names = ["features", "mask", "weight"] + (["bias"] if with_bias else [])
    return one_node_model(
        helper.make_node("MMCVMaskedConv2d", names, ["output"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info(n, mask_elem if n == "mask" else elem, None) for n in names],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=("mmcv",),
    )


def masked_conv_reference(features, mask, weight, bias, padding):
    """The convolution (stride 1) at the positions where mask > 0, 0 elsewhere, in float64."""
    features, weight = np.asarray(features, np.float64), np.asarray(weight, np.float64)
    _, c, h, w = features.shape
    o, _, kh, kw = weight.shape
    ph, pw = padding
    padded = np.zeros((c, h + 2 * ph, w + 2 * pw))
    padded[:, ph : ph + h, pw : pw + w] = features[0]
    out_h, out_w = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    out = np.zeros((1, o, out_h, out_w))
    for y in range(out_h):
        for x in range(out_w):
            if y < h and x < w and np.asarray(mask)[0, y, x] > 0:
                window = padded[:, y : y + kh, x : x + kw]
                out[0, :, y, x] = np.tensordot(weight, window, axes=3) + (0 if bias is None else bias)
    return out


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype, tolerance in ((np.float32, 1e-4), (np.float64, 1e-10)):
        for (kh, kw), padding in (((3, 3), (1, 1)), ((1, 1), (0, 0)), ((3, 5), (1, 2)), ((2, 2), (1, 0))):
            x = rng.standard_normal((1, 5, 7, 9)).astype(dtype)
            weight = rng.standard_normal((6, 5, kh, kw)).astype(dtype)
            bias = rng.standard_normal(6).astype(dtype)
            out_h, out_w = 7 + 2 * padding[0] - kh + 1, 9 + 2 * padding[1] - kw + 1
            score = np.zeros((1, 7, 9))
            score[:, : min(7, out_h), : min(9, out_w)] = rng.random((1, min(7, out_h), min(9, out_w))) - 0.4
            for mask_dtype in (dtype, bool):
                mask = (score > 0) if mask_dtype is bool else score.astype(dtype)
                for with_bias in (True, False):
                    model = masked_conv_model(dtype, mask_dtype, with_bias, padding=list(padding), stride=[1, 1])
                    feeds = {"features": x, "mask": mask, "weight": weight} | ({"bias": bias} if with_bias else {})
                    (out,) = session(library, model, 2).run(None, feeds)
                    want = masked_conv_reference(x, score, weight, bias if with_bias else None, padding)
                    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)
    # mmcv's symbolic writes ints when the module holds ints (MaskedConv2d(padding=1)).
    x, weight = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((3, 2, 3, 3))
    mask = np.ones((1, 4, 4))
    (out,) = session(library, masked_conv_model(np.float64, with_bias=False, padding=1, stride=1)).run(
        None, {"features": x, "mask": mask, "weight": weight}
    )
    np.testing.assert_allclose(out, masked_conv_reference(x, mask, weight, None, (1, 1)), rtol=1e-10, atol=1e-10)


def check_bad_input(library: str) -> None:
    sess = session(library, masked_conv_model(padding=[1, 1], stride=[1, 1]))
    good = {"features": np.ones((1, 2, 4, 4), np.float32), "mask": np.ones((1, 4, 4), np.float32),
            "weight": np.ones((3, 2, 3, 3), np.float32), "bias": np.zeros(3, np.float32)}  # fmt: skip
    changes = [
        ({"features": np.ones((2, 2, 4, 4), np.float32)}, "input features (index 0)"),
        ({"mask": np.ones((1, 4, 5), np.float32)}, "input mask (index 1)"),
        ({"weight": np.ones((3, 1, 3, 3), np.float32)}, "input weight (index 2)"),
        ({"bias": np.ones(2, np.float32)}, "input bias (index 3)"),
    ]
    for change, fragment in changes:
        expect_error(lambda c=change: sess.run(None, {**good, **c}), "mmcv::MMCVMaskedConv2d", fragment)
    strided = session(library, masked_conv_model(padding=[1, 1], stride=[2, 2]))
    expect_error(lambda: strided.run(None, good), "attribute 'stride' must be 1")
    unpadded = session(library, masked_conv_model(padding=[0, 0], stride=[1, 1]))  # output 2x2: (3, 3) is outside
    expect_error(lambda: unpadded.run(None, good), "selects position (0, 2)", "outside the output [2, 2]")


CHECKS = [check_against_reference, check_bad_input]
