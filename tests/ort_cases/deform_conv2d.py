"""ORT smoke cases of opbridge::DeformConv2d: values against a numpy reference written from the
definition, malformed attributes and inputs (error statuses naming op, input and expectation)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session


def deform_conv2d_reference(
    x,
    weight,
    offset,
    bias=None,
    mask=None,
    stride=(1, 1),
    pads=(0, 0, 0, 0),
    dilation=(1, 1),
    groups=1,
    offset_groups=1,
):
    """Deformable convolution in plain numpy, written from the definition (torchvision / ONNX DeformConv)."""
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[2:]
    taps = kh * kw
    columns = np.zeros((n, c, taps, out_h, out_w), dtype=np.float64)
    oy, ox = np.meshgrid(np.arange(out_h), np.arange(out_w), indexing="ij")
    xd = x.astype(np.float64)
    for image in range(n if h > 0 and w > 0 else 0):  # an empty image samples zeros
        for channel in range(c):
            group = channel // (c // offset_groups)
            for i in range(kh):
                for j in range(kw):
                    tap = i * kw + j
                    dy = offset[image, group * 2 * taps + 2 * tap]
                    dx = offset[image, group * 2 * taps + 2 * tap + 1]
                    y = oy * stride[0] - pads[0] + i * dilation[0] + dy
                    xx = ox * stride[1] - pads[1] + j * dilation[1] + dx
                    value = np.zeros((out_h, out_w))
                    y0, x0 = np.floor(y), np.floor(xx)
                    for cy, cx, wy, wx in (
                        (y0, x0, y0 + 1 - y, x0 + 1 - xx),
                        (y0, x0 + 1, y0 + 1 - y, xx - x0),
                        (y0 + 1, x0, y - y0, x0 + 1 - xx),
                        (y0 + 1, x0 + 1, y - y0, xx - x0),
                    ):
                        ok = (
                            (cy >= 0)
                            & (cy <= h - 1)
                            & (cx >= 0)
                            & (cx <= w - 1)
                            & (y > -1)
                            & (y < h)
                            & (xx > -1)
                            & (xx < w)
                        )
                        # Positions may be NaN or infinite (then `ok` is False): index somewhere valid.
                        cy, cx = (
                            np.nan_to_num(cy, nan=0, posinf=0, neginf=0),
                            np.nan_to_num(cx, nan=0, posinf=0, neginf=0),
                        )
                        iy, ix = np.clip(cy, 0, h - 1).astype(int), np.clip(cx, 0, w - 1).astype(int)
                        value += np.where(ok, wy * wx * xd[image, channel][iy, ix], 0.0)
                    if mask is not None:
                        value *= mask[image, group * taps + tap]
                    columns[image, channel, tap] = value
    out = np.zeros((n, c_out, out_h, out_w))
    per_group_in, per_group_out = c // groups, c_out // groups
    for g in range(groups):
        cols = columns[:, g * per_group_in : (g + 1) * per_group_in].reshape(n, per_group_in * taps, -1)
        kernel = weight[g * per_group_out : (g + 1) * per_group_out].reshape(per_group_out, -1).astype(np.float64)
        out[:, g * per_group_out : (g + 1) * per_group_out] = (kernel @ cols).reshape(n, per_group_out, out_h, out_w)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out.astype(x.dtype)


def deform_model(dtype=np.float32, inputs=("X", "W", "offset", "B", "mask"), **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("DeformConv2d", list(inputs), ["Y"], domain="opbridge", **attributes),
        [helper.make_tensor_value_info(name, elem, None) for name in inputs if name],
        [helper.make_tensor_value_info("Y", elem, None)],
    )


def deform_case(
    rng,
    dtype,
    n=2,
    c=4,
    h=6,
    w=7,
    c_out=6,
    k=(3, 2),
    stride=(1, 2),
    pads=(1, 0, 1, 0),
    dilation=(1, 1),
    groups=2,
    offset_groups=2,
):
    out_h = (h + pads[0] + pads[2] - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1
    out_w = (w + pads[1] + pads[3] - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1
    taps = k[0] * k[1]
    feeds = {
        "X": rng.standard_normal((n, c, h, w)).astype(dtype),
        "W": rng.standard_normal((c_out, c // groups, *k)).astype(dtype),
        "offset": (2 * rng.standard_normal((n, 2 * offset_groups * taps, out_h, out_w))).astype(dtype),
        "B": rng.standard_normal(c_out).astype(dtype),
        "mask": rng.random((n, offset_groups * taps, out_h, out_w)).astype(dtype),
    }
    attributes = {
        "strides": list(stride),
        "pads": list(pads),
        "dilations": list(dilation),
        "group": groups,
        "offset_group": offset_groups,
    }
    return feeds, attributes


def check_deform_conv2d_values(library: str) -> None:
    rng = np.random.default_rng(1)
    for dtype, tolerance in ((np.float32, 1e-4), (np.float64, 1e-10)):
        for kwargs in (
            {},
            {"k": (1, 1), "groups": 1, "offset_groups": 1, "pads": (0, 0, 0, 0)},
            {"dilation": (2, 1), "pads": (2, 1, 0, 1), "offset_groups": 4, "stride": (2, 1)},
        ):
            feeds, attributes = deform_case(rng, dtype, **kwargs)
            for inputs in (
                ("X", "W", "offset", "B", "mask"),
                ("X", "W", "offset"),
                ("X", "W", "offset", "", "mask"),
                ("X", "W", "offset", "B"),
            ):
                present = {name: feeds[name] for name in inputs if name}
                for threads in (1, 2):
                    sess = session(library, deform_model(dtype, inputs, **attributes), threads)
                    (y,) = sess.run(None, present)
                    expected = deform_conv2d_reference(
                        feeds["X"],
                        feeds["W"],
                        feeds["offset"],
                        present.get("B"),
                        present.get("mask"),
                        attributes["strides"],
                        attributes["pads"],
                        attributes["dilations"],
                        attributes["group"],
                        attributes["offset_group"],
                    )
                    np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)


def check_deform_conv2d_bad_input(library: str) -> None:
    rng = np.random.default_rng(2)
    feeds, attributes = deform_case(rng, np.float32)
    bad_attributes = [
        ({"group": 3}, "group(s) must divide"),
        ({"group": -2}, "group(s) must divide"),
        ({"offset_group": -1}, "offset group(s) must divide"),
        ({"offset_group": 3}, "offset group(s) must divide"),
        ({"pads": [1, 0]}, "pads 4"),
        ({"pads": [-1, 0, -1, 0]}, "pads must not be negative"),
        ({"strides": [0, 1]}, "must be positive"),
        ({"dilations": [1, -2]}, "must be positive"),
        ({"kernel_shape": [5, 5]}, "does not match input W"),
        ({"dilations": [2**62, 1]}, "too large"),  # (kernel_h - 1) * dilation overflows int64
        ({"dilations": [1, 2**62]}, "does not fit"),
        ({"pads": [2**62, 0, 2**62, 0]}, "too large"),
        ({"pads": [1, 0, 2**63 - 1, 0]}, "too large"),  # found by the fuzzer under UBSan: pads summed unchecked
        ({"strides": [1, 1]}, "input offset (index 2) must have shape"),
    ]
    for change, fragment in bad_attributes:
        sess = session(library, deform_model(np.float32, **{**attributes, **change}))
        expect_error(lambda sess=sess: sess.run(None, feeds), "opbridge::DeformConv2d", fragment)
    # group = offset_group = 0: inferred from the shapes (what an export writes where the exporter does not know the
    # channel counts), giving what the true counts give.
    (expected,) = session(library, deform_model(np.float32, **attributes)).run(None, feeds)
    inferred = session(library, deform_model(np.float32, **{**attributes, "group": 0, "offset_group": 0}))
    np.testing.assert_array_equal(inferred.run(None, feeds)[0], expected)
    assert attributes["group"] > 1 and attributes["offset_group"] > 1, "the case must not be the default groups"
    # Attributes of the wrong type are errors, never silently replaced by a default: an integer given as a float
    # fails at load; a list given as floats or a string reads as an empty list, which fails at run.
    wrong_types = [({"group": 2.0}, "attribute 'group' must be an integer"), ({"strides": [1.0, 2.0]}, "need 2 values"),
                   ({"pads": "1"}, "pads 4")]  # fmt: skip
    for change, fragment in wrong_types:
        model = deform_model(np.float32, **{**attributes, **change})
        expect_error(lambda model=model: session(library, model).run(None, feeds), "opbridge::DeformConv2d", fragment)
    # Absent attributes take ONNX DeformConv's defaults (stride 1, no padding, dilation 1, one group).
    x, w = np.ascontiguousarray(feeds["X"][:, :2]), np.ascontiguousarray(feeds["W"])  # W: [6, 2, 3, 2]
    offset = rng.standard_normal((2, 12, x.shape[2] - 2, x.shape[3] - 1)).astype(np.float32)
    plain = {"X": x, "W": w, "offset": offset}
    defaults = session(library, deform_model(np.float32, inputs=("X", "W", "offset")))
    (y,) = defaults.run(None, plain)
    np.testing.assert_allclose(
        y, deform_conv2d_reference(plain["X"], plain["W"], plain["offset"]), rtol=1e-5, atol=1e-5
    )
    sess = session(library, deform_model(np.float32, **attributes))
    bad_inputs = [
        ({"X": feeds["X"][0]}, "input X (index 0) must be 4-D"),
        ({"offset": feeds["offset"][:, :3]}, "input offset (index 2) must have shape"),
        ({"mask": feeds["mask"][:1]}, "input mask (index 4) must have shape"),
        ({"B": feeds["B"][:2]}, "input B (index 3) must have 6 elements"),
        ({"W": feeds["W"][:, :, :1]}, "must have shape"),
        ({"X": feeds["X"][:, :, :0]}, "does not fit"),
    ]
    for change, fragment in bad_inputs:
        expect_error(lambda change=change: sess.run(None, {**feeds, **change}), "opbridge::DeformConv2d", fragment)
    (y,) = sess.run(None, feeds)  # still usable
    assert np.isfinite(y).all()


def mmcv_model(domain: str, dtype=np.float32, with_bias: bool = True, **attributes) -> bytes:
    """The node as mmcv's (domain "mmcv") and mmdeploy's ("mmdeploy") DCNv2 symbolic writes it:
    MMCVModulatedDeformConv2d(input, offset, mask, weight[, bias]), attributes stride, padding, dilation,
    groups, deform_groups."""
    elem = DTYPES[dtype]
    inputs = ["input", "offset", "mask", "weight"] + (["bias"] if with_bias else [])
    return one_node_model(
        helper.make_node("MMCVModulatedDeformConv2d", inputs, ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info(name, elem, None) for name in inputs],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def check_mmcv_modulated_deform_conv2d(library: str) -> None:
    """Models mmcv/mmdeploy exported run on the library, in either domain, with and without bias."""
    rng = np.random.default_rng(3)
    for domain in ("mmcv", "mmdeploy"):
        for dtype, tolerance in ((np.float32, 1e-4), (np.float64, 1e-10)):
            feeds, attributes = deform_case(rng, dtype, pads=(1, 2, 1, 2), stride=(2, 1), dilation=(1, 2))
            mmcv_attributes = {"stride": attributes["strides"], "padding": attributes["pads"][:2],
                               "dilation": attributes["dilations"], "groups": attributes["group"],
                               "deform_groups": attributes["offset_group"]}  # fmt: skip
            for with_bias in (True, False):
                model = mmcv_model(domain, dtype, with_bias, **mmcv_attributes)
                names = ["input", "offset", "mask", "weight"] + (["bias"] if with_bias else [])
                values = [feeds["X"], feeds["offset"], feeds["mask"], feeds["W"], feeds["B"]]
                (y,) = session(library, model, 2).run(None, dict(zip(names, values, strict=False)))
                expected = deform_conv2d_reference(
                    feeds["X"], feeds["W"], feeds["offset"], feeds["B"] if with_bias else None, feeds["mask"],
                    attributes["strides"], attributes["pads"], attributes["dilations"], attributes["group"],
                    attributes["offset_group"],
                )  # fmt: skip
                np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)
    # Bad input names the node and the input.
    feeds, attributes = deform_case(rng, np.float32)
    model = mmcv_model("mmcv", np.float32, True, groups=attributes["group"], deform_groups=attributes["offset_group"],
                       padding=[1, 0], stride=[1, 2])  # fmt: skip
    bad = {"input": feeds["X"], "offset": feeds["offset"], "mask": feeds["mask"][:, :3], "weight": feeds["W"],
           "bias": feeds["B"]}  # fmt: skip
    expect_error(lambda: session(library, model).run(None, bad), "MMCVModulatedDeformConv2d", "input mask (index 2)")


def dcn_v1_model(domain: str, dtype=np.float32, **attributes) -> bytes:
    """The node as mmcv's (domain "mmcv") and mmdeploy's ("mmdeploy") DCNv1 symbolics write it:
    MMCVDeformConv2d(input, offset, weight), attributes stride, padding, dilation, groups, deform_groups (mmcv also
    bias=0 and im2col_step)."""
    elem = DTYPES[dtype]
    inputs = ["input", "offset", "weight"]
    return one_node_model(
        helper.make_node("MMCVDeformConv2d", inputs, ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info(name, elem, None) for name in inputs],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def dcn_v1_attributes(domain: str, pad_h: int, pad_w: int, stride, dilation, groups, deform_groups) -> dict:
    """mmcv's symbolic writes padding (pad_h, pad_w) and bias/im2col_step; mmdeploy's writes padding as
    [pad_h, pad_h, pad_w, pad_w] (zip(padding, padding)) and neither."""
    attributes = {"stride": list(stride), "dilation": list(dilation), "groups": groups, "deform_groups": deform_groups}
    if domain == "mmcv":
        return {**attributes, "padding": [pad_h, pad_w], "bias": 0, "im2col_step": 32}
    return {**attributes, "padding": [pad_h, pad_h, pad_w, pad_w]}


def check_mmcv_deform_conv2d(library: str) -> None:
    """DCNv1 (mmcv's DeformConv2d: RepPoints, CenterPoint), in both domains, with unequal height and width
    padding (so a swapped pair would show)."""
    rng = np.random.default_rng(5)
    for domain in ("mmcv", "mmdeploy"):
        for dtype, tolerance in ((np.float32, 1e-4), (np.float64, 1e-10)):
            feeds, attributes = deform_case(rng, dtype, pads=(2, 1, 2, 1), stride=(1, 2), dilation=(2, 1))
            model = dcn_v1_model(domain, dtype, **dcn_v1_attributes(domain, 2, 1, attributes["strides"],
                                 attributes["dilations"], attributes["group"], attributes["offset_group"]))  # fmt: skip
            (y,) = session(library, model, 2).run(
                None, {"input": feeds["X"], "offset": feeds["offset"], "weight": feeds["W"]}
            )
            expected = deform_conv2d_reference(
                feeds["X"], feeds["W"], feeds["offset"], None, None, attributes["strides"], attributes["pads"],
                attributes["dilations"], attributes["group"], attributes["offset_group"],
            )  # fmt: skip
            np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)
    # Plain ints, as mmcv's symbolic writes them when a model passes ints (TOOD).
    feeds, attributes = deform_case(rng, np.float32, pads=(1, 1, 1, 1), stride=(2, 2), dilation=(1, 1))
    plain = {"stride": 2, "padding": 1, "dilation": 1, "groups": attributes["group"],
             "deform_groups": attributes["offset_group"], "bias": 0, "im2col_step": 32}  # fmt: skip
    (y,) = session(library, dcn_v1_model("mmcv", **plain)).run(
        None, {"input": feeds["X"], "offset": feeds["offset"], "weight": feeds["W"]}
    )
    expected = deform_conv2d_reference(feeds["X"], feeds["W"], feeds["offset"], None, None, (2, 2), (1, 1, 1, 1),
                                       (1, 1), attributes["group"], attributes["offset_group"])  # fmt: skip
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    feeds, attributes = deform_case(rng, np.float32)
    good = dcn_v1_attributes("mmcv", 0, 0, (1, 1), (1, 1), attributes["group"], attributes["offset_group"])
    bad = {"input": feeds["X"], "offset": feeds["offset"][:, :3], "weight": feeds["W"]}
    expect_error(lambda: session(library, dcn_v1_model("mmcv", **good)).run(None, bad), "MMCVDeformConv2d",
                 "input offset (index 1)")  # fmt: skip
    expect_error(lambda: session(library, dcn_v1_model("mmcv", **{**good, "bias": 1})), "attribute 'bias' must be 0")
    expect_error(lambda: session(library, dcn_v1_model("mmdeploy", **{**good, "padding": [1, 1, 1]})),
                 "attribute 'padding'", "(top, bottom, left, right)")  # fmt: skip


CHECKS = [check_deform_conv2d_values, check_deform_conv2d_bad_input, check_mmcv_modulated_deform_conv2d,
          check_mmcv_deform_conv2d]  # fmt: skip
