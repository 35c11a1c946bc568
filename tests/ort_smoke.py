"""Checks of the opbridge ORT custom-op library with nothing but onnxruntime,
onnx and numpy: no torch, no pytest, no opbridge Python package.

    python tests/ort_smoke.py path/to/libopbridge_ort.so [--models DIR]

Runs hand-built opbridge::MyAdd models against numpy, and malformed models and
inputs that must fail with an error naming the op, never crash; with --models, also
the models tests/export_reference_models.py exported (with PyTorch's outputs). Used by ctest
(a C++ developer's build), by `nox -s ort_versions` (old and newest ORT) and by
the pytest suite. Prints one line per check and "N passed, N failed".
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

DTYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int32: TensorProto.INT32,
}


def my_add_model(dtype=np.float32, a_shape=None, b_shape=None, inputs=("A", "B"), opset=17) -> bytes:
    """A one-node model C = opbridge::MyAdd(A, B); shapes may use None or names for dynamic dims."""
    elem = DTYPES[dtype]
    node = helper.make_node("MyAdd", list(inputs), ["C"], domain="opbridge")
    graph = helper.make_graph(
        [node],
        "my_add",
        [
            helper.make_tensor_value_info(name, elem, shape)
            for name, shape in (("A", a_shape), ("B", b_shape))
            if name in inputs
        ],
        [helper.make_tensor_value_info("C", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8  # readable by every ORT from 1.16 on
    return model.SerializeToString()


def session(library: str, model: bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def expect_error(call, *fragments: str) -> str:
    try:
        call()
    except Exception as error:  # ORT raises its own exception types per version
        message = str(error)
        missing = [f for f in fragments if f not in message]
        if missing:
            raise AssertionError(f"error message lacks {missing}: {message}") from None
        return message
    raise AssertionError("expected an error, got none")


def check_values(library: str) -> None:
    rng = np.random.default_rng(0)
    cases = [
        ((2, 3), (2, 3)),
        ((4, 1, 5), (3, 1)),
        ((), (7,)),
        ((0, 3), (1, 3)),
        ((1000, 257), (257,)),
        ((65536 * 3 + 5,), ()),
    ]
    for dtype, tolerance in ((np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 1e-3)):
        for a_shape, b_shape in cases:
            a = rng.standard_normal(a_shape).astype(dtype)
            b = rng.standard_normal(b_shape).astype(dtype)
            for threads in (1, 2):
                sess = session(library, my_add_model(dtype, [None] * len(a_shape), [None] * len(b_shape)), threads)
                (c,) = sess.run(None, {"A": a, "B": b})
                expected = 2 * a.astype(np.float64) + b.astype(np.float64)
                assert c.dtype == dtype and c.shape == expected.shape, (c.dtype, c.shape, expected.shape)
                np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


def check_bad_shapes(library: str) -> None:
    sess = session(library, my_add_model(np.float32, ["n", "m"], ["k"]))
    expect_error(
        lambda: sess.run(None, {"A": np.ones((2, 3), np.float32), "B": np.ones(4, np.float32)}),
        "opbridge::MyAdd",
        "input A (index 0) of shape [2, 3]",
        "input B (index 1) of shape [4]",
        "cannot be broadcast",
    )
    # The session stays usable after an error.
    (c,) = sess.run(None, {"A": np.ones((2, 3), np.float32), "B": np.ones(3, np.float32)})
    assert (c == 3).all()


def check_bad_dtype(library: str) -> None:
    # No int32 kernel: the runtime refuses the model when the session is created.
    expect_error(lambda: session(library, my_add_model(np.int32, [2], [2])), "MyAdd")
    # Mixed dtypes in one model.
    node = helper.make_node("MyAdd", ["A", "B"], ["C"], domain="opbridge")
    graph = helper.make_graph(
        [node],
        "mixed",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("B", TensorProto.DOUBLE, [2]),
        ],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    expect_error(lambda: session(library, model.SerializeToString()), "MyAdd")


def check_bad_arity(library: str) -> None:
    # Too few, an omitted (empty-named) and too many inputs: refused at load time.
    for inputs in (("A",), ("A", ""), ("A", "B", "A")):
        expect_error(lambda inputs=inputs: session(library, my_add_model(np.float32, [2], [2], inputs=inputs)), "MyAdd")


def check_registration_is_repeatable(library: str) -> None:
    for _ in range(3):
        (c,) = session(library, my_add_model(np.float32, [2], [2])).run(
            None, {"A": np.ones(2, np.float32), "B": np.ones(2, np.float32)}
        )
        assert (c == 3).all()


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
    node = helper.make_node("DeformConv2d", list(inputs), ["Y"], domain="opbridge", **attributes)
    graph = helper.make_graph(
        [node],
        "deform",
        [helper.make_tensor_value_info(name, elem, None) for name in inputs if name],
        [helper.make_tensor_value_info("Y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def _deform_case(
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
            feeds, attributes = _deform_case(rng, dtype, **kwargs)
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
    feeds, attributes = _deform_case(rng, np.float32)
    bad_attributes = [
        ({"group": 3}, "group(s) must divide"),
        ({"group": 0}, "group(s) must divide"),
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


def check_old_runtime_is_refused(library: str) -> None:
    """Below ORT 1.16 the library must refuse to register, with a message, not crash."""
    expect_error(lambda: session(library, my_add_model(np.float32, [2], [2])), "too old", ">= 1.16")


CHECKS = [
    check_values,
    check_bad_shapes,
    check_bad_dtype,
    check_bad_arity,
    check_registration_is_repeatable,
    check_deform_conv2d_values,
    check_deform_conv2d_bad_input,
]


def runtime_version() -> tuple[int, int]:
    major, minor = ort.__version__.split(".")[:2]
    return int(major), int(minor)


def check_exported_models(library: str, directory: str) -> None:
    """Models exported by tests/export_reference_models.py, against PyTorch's saved outputs."""
    from pathlib import Path

    models = sorted(Path(directory).glob("*.onnx"))
    assert models, f"no exported models in {directory}"
    for path in models:
        data = np.load(path.with_suffix(".npz"))
        expected = data["expected"]
        try:
            sess = session(library, path.read_bytes())
        except Exception as error:
            if "Unsupported model IR version" not in str(error):
                raise
            # Expected: e.g. ORT 1.16 reads IR <= 9, the dynamo exporter writes IR 10.
            print(f"     {path.name}: n/a, this onnxruntime cannot read its IR version ({error})".splitlines()[0])
            continue
        (got,) = sess.run(None, {name: data[name] for name in data.files if name != "expected"})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=path.name)
        print(f"     {path.name}: max error {float(np.abs(got - expected).max()):.1e}")


def main(argv: list[str]) -> int:
    models = None
    if len(argv) == 4 and argv[2] == "--models":
        models = argv[3]
        argv = argv[:2]
    if len(argv) != 2:
        print(__doc__)
        return 2
    library = argv[1]
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, library {library}")
    passed = failed = 0
    checks = CHECKS if runtime_version() >= (1, 16) else [check_old_runtime_is_refused]
    if models and runtime_version() >= (1, 16):
        checks = [*checks, lambda library: check_exported_models(library, models)]
        checks[-1].__name__ = "check_exported_models"
    for check in checks:
        try:
            check(library)
        except Exception:
            failed += 1
            print(f"FAIL {check.__name__}\n{traceback.format_exc()}")
        else:
            passed += 1
            print(f"ok   {check.__name__}")
    if "torch" in sys.modules:
        failed += 1
        print("FAIL torch was imported")
    else:
        print("ok   torch was not imported")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
