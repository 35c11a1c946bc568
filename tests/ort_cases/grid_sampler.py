"""ORT smoke cases of mmcv::grid_sampler and mmdeploy::grid_sampler (the nodes their symbolics write for
torch.nn.functional.grid_sample, int attributes interpolation_mode, padding_mode, align_corners): every mode
against a numpy reference written from grid_sample's definition, hand-computed values, non-finite grids, and bad
shapes and attributes. tests/test_openmmlab.py also checks the reference against torch."""

from __future__ import annotations

import itertools

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session

NODES = (("grid_sampler", "mmcv"), ("grid_sampler", "mmdeploy"))
INTERPOLATIONS, PADDINGS = ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection")


def grid_model(dtype=np.float32, domain="mmdeploy", **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("grid_sampler", ["input", "grid"], ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info("input", elem, None), helper.make_tensor_value_info("grid", elem, None)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def as_symbolic(interpolation: str, padding: str, align_corners: bool) -> dict:
    """The attributes as mmcv's and mmdeploy's grid_sampler symbolics write them (torch's enum values)."""
    return {
        "interpolation_mode": INTERPOLATIONS.index(interpolation),
        "padding_mode": PADDINGS.index(padding),
        "align_corners": int(align_corners),
    }


def _reflect(x, low2, high2):
    if low2 == high2:
        return np.zeros_like(x)
    low, span = low2 / 2, (high2 - low2) / 2
    x = np.abs(x - low)
    extra, flips = np.fmod(x, span), np.floor(x / span)
    return np.where(flips % 2 == 0, extra + low, span - extra + low)


def _pad(x, size, padding, align_corners):
    if padding == "zeros":
        return x
    if padding == "reflection":
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
    return np.clip(x, 0, size - 1)


def _cubic(t):
    """Keys' cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2 around fraction t."""
    a = -0.75
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample_reference(x, grid, interpolation="bilinear", padding="zeros", align_corners=False):
    """torch.nn.functional.grid_sample of 4-D input, in float64; a non-finite grid coordinate reads 0."""
    x, grid = np.asarray(x, np.float64), np.asarray(grid, np.float64)
    n, c, h, w = x.shape
    if x.size == 0 or grid.size == 0:
        return np.zeros((n, c, *grid.shape[1:3]))
    gx, gy = grid[..., 0], grid[..., 1]  # [N, Ho, Wo]
    if align_corners:
        px, py = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
    else:
        px, py = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
    finite = np.isfinite(px) & np.isfinite(py)
    px, py = np.where(finite, px, 0.0), np.where(finite, py, 0.0)
    batch = np.arange(n)[:, None, None]

    def tap(yi, xi):  # [N, C, Ho, Wo]; 0 outside the map
        inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w) & finite
        values = x[batch, :, np.clip(yi, 0, h - 1).astype(np.int64), np.clip(xi, 0, w - 1).astype(np.int64)]
        return np.moveaxis(values, -1, 1) * inside[:, None]

    if interpolation == "bicubic":
        x0, y0 = np.floor(px), np.floor(py)
        wx, wy = _cubic(px - x0), _cubic(py - y0)
        out = 0.0
        for i in range(4):
            ty = _pad(y0 - 1 + i, h, padding, align_corners)
            for j in range(4):
                tx = _pad(x0 - 1 + j, w, padding, align_corners)
                out = out + (wy[i] * wx[j])[:, None] * tap(np.trunc(ty), np.trunc(tx))
        return out
    px, py = _pad(px, w, padding, align_corners), _pad(py, h, padding, align_corners)
    if interpolation == "nearest":
        return tap(np.rint(py), np.rint(px))  # ties to even, as torch's nearbyint
    x0, y0 = np.floor(px), np.floor(py)
    fx, fy = (px - x0)[:, None], (py - y0)[:, None]
    return ((1 - fy) * (1 - fx) * tap(y0, x0) + (1 - fy) * fx * tap(y0, x0 + 1)
            + fy * (1 - fx) * tap(y0 + 1, x0) + fy * fx * tap(y0 + 1, x0 + 1))  # fmt: skip


def check_every_mode(library: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 7))
    grid = rng.uniform(-1.7, 1.7, (2, 4, 6, 2))
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0, 0]]  # corners and center exactly
    for (_, domain), dtype in itertools.product(NODES, (np.float32, np.float64)):
        for interpolation, padding, align in itertools.product(INTERPOLATIONS, PADDINGS, (False, True)):
            sess = session(library, grid_model(dtype, domain, **as_symbolic(interpolation, padding, align)), 2)
            (out,) = sess.run(None, {"input": x.astype(dtype), "grid": grid.astype(dtype)})
            want = grid_sample_reference(x.astype(dtype), grid.astype(dtype), interpolation, padding, align)
            tolerance = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance, err_msg=f"{domain} {interpolation}")
            assert out.dtype == dtype and out.shape == (2, 3, 4, 6)


def check_hand_values(library: str) -> None:
    """Values worked out by hand on a 2x2 map [[1, 2], [3, 4]]."""
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    grid = np.array([[[[0.0, 0.0], [-1.0, -1.0], [1.0, -1.0], [-2.0, 0.0]]]], np.float32)
    cases = {
        # align_corners: (-1, -1) is pixel (0, 0), (0, 0) the middle (mean 2.5); (-2, 0) lies at x = -0.5.
        ("bilinear", "zeros", True): [2.5, 1.0, 2.0, 1.0],
        # without: (-1, -1) is the corner (-0.5, -0.5) of pixel (0, 0): a quarter of it.
        ("bilinear", "zeros", False): [2.5, 0.25, 0.5, 0.0],
        ("bilinear", "border", False): [2.5, 1.0, 2.0, 2.0],
        ("nearest", "border", True): [1.0, 1.0, 2.0, 1.0],  # 0.5 rounds to even: (0, 0) -> pixel (0, 0)
    }
    for (interpolation, padding, align), want in cases.items():
        (out,) = session(library, grid_model(**as_symbolic(interpolation, padding, align))).run(
            None, {"input": x, "grid": grid}
        )
        np.testing.assert_allclose(out[0, 0, 0], want, atol=1e-6, err_msg=f"{interpolation} {padding} {align}")


def check_non_finite_and_empty(library: str) -> None:
    sess = session(library, grid_model(**as_symbolic("bilinear", "border", False)))
    x = np.ones((1, 2, 3, 3), np.float32)
    grid = np.array([[[[np.nan, 0.0], [0.0, np.inf], [1e30, -1e30]]]], np.float32)
    (out,) = sess.run(None, {"input": x, "grid": grid})
    np.testing.assert_array_equal(out[0, :, 0], [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # border clamps 1e30
    (out,) = sess.run(None, {"input": x, "grid": np.zeros((1, 0, 4, 2), np.float32)})
    assert out.shape == (1, 2, 0, 4)


def check_bad_input(library: str) -> None:
    for op_type, domain in NODES:
        sess = session(library, grid_model(np.float32, domain, **as_symbolic("bilinear", "zeros", False)))
        name = f"{domain}::{op_type}"
        bad_feeds = [
            ((2, 1, 3, 3), (1, 2, 2, 2), ["input grid (index 1)", "batch = 2"]),
            ((1, 1, 3, 3), (1, 2, 2, 3), ["[batch, out_height"]),
            ((1, 3, 3), (1, 2, 2, 2), ["4-D"]),
            ((1, 1, 0, 3), (1, 2, 2, 2), ["non-empty"]),
        ]
        for x_shape, grid_shape, fragments in bad_feeds:
            feeds = {"input": np.ones(x_shape, np.float32), "grid": np.zeros(grid_shape, np.float32)}
            expect_error(lambda s=sess, f=feeds: s.run(None, f), name, *fragments)
    for attribute, value, words in (("interpolation_mode", 3, "bicubic"), ("padding_mode", -1, "reflection"),
                                    ("align_corners", 2, "0 or 1")):  # fmt: skip
        attrs = {**as_symbolic("bilinear", "zeros", False), attribute: value}

        def run(attrs=attrs):
            session(library, grid_model(**attrs)).run(
                None, {"input": np.ones((1, 1, 2, 2), np.float32), "grid": np.zeros((1, 1, 1, 2), np.float32)}
            )

        expect_error(run, attribute, words)


CHECKS = [check_every_mode, check_hand_values, check_non_finite_and_empty, check_bad_input]
