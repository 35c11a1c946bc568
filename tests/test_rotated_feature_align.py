"""rotated_feature_align against mmcv's published output and gradient, a plain-Python reference for 1 and 5
points, gradcheck and gradgradcheck, opcheck, and both lowerings through both exporters at other sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge.ops.rotated_feature_align import reference
from rotated_helpers import export

# mmcv tests/test_ops/test_rotated_feature_align.py (spatial_scale 1/8, points 1; compared at rtol 1e-2)
FEATURE = [
    [
        [
            [1.2924, -0.2172, -0.5222, 0.1172],
            [0.9144, 1.2248, 1.3115, -0.9690],
            [-0.8949, -1.1797, -0.9093, -0.3961],
            [-0.4586, 0.5062, -0.7947, -0.7397],
        ],
        [
            [-1.0943, -0.7495, 1.3461, -1.1652],
            [0.2034, 0.6763, -1.2357, 0.5231],
            [-1.0062, 1.2592, 1.4225, -0.3951],
            [-0.1242, -1.6240, 0.1932, 2.7181],
        ],
        [
            [-1.6271, -1.0276, 0.0578, -0.2997],
            [-0.9684, -1.6946, -1.3188, -1.1938],
            [-1.6744, -0.8917, -0.6556, 1.0073],
            [-0.1205, 0.3671, -0.3731, -0.5347],
        ],
    ],
    [
        [
            [0.7035, 0.2089, -0.1774, 3.4670],
            [-0.8505, -0.9278, 1.4714, 0.1644],
            [0.0898, 0.3531, -0.4007, 0.1927],
            [1.2569, -0.2636, -0.5223, 0.0616],
        ],
        [
            [0.1760, -0.7639, -0.4600, -1.3260],
            [-0.9921, -0.2970, -0.8955, 1.0508],
            [1.3515, -0.1641, 1.9679, 1.1986],
            [-0.3616, 0.6287, 0.4933, 0.3360],
        ],
        [
            [-0.5860, 0.2124, -0.8700, 2.4200],
            [-0.0551, -1.5103, -1.6779, 0.8399],
            [0.8431, 1.2414, -1.1243, -0.3887],
            [-2.1254, 0.6047, -0.3515, 0.7254],
        ],
    ],
]
BBOX = [
    [
        [
            [1.3080e01, 1.2688e01, 1.1214e01, 9.3944e01, -9.1905e-01],
            [3.8104e01, 1.0134e01, 1.4659e02, 9.0306e01, -9.8211e-01],
            [-5.3213e01, 4.9508e01, 5.1513e01, 3.2055e01, -3.1954e-01],
            [2.6974e01, 2.5248e01, 5.4495e01, 3.1083e00, -6.2127e-01],
        ],
        [
            [-1.5604e01, -5.1908e01, 2.3998e02, 1.5008e01, -1.2546e00],
            [3.1354e01, -7.3635e00, 6.7879e01, 3.5081e01, -3.3851e-01],
            [-5.3292e00, 9.1946e00, 1.2834e01, 1.0485e01, -1.3039e00],
            [-2.3925e01, 3.6623e01, 3.9875e01, 7.2009e01, -6.5934e-01],
        ],
        [
            [7.2114e01, -2.3781e01, 2.9106e01, 8.4501e01, -1.1340e00],
            [2.6258e01, -7.7034e00, 1.7629e02, 1.0615e02, -1.2156e00],
            [3.8057e01, 4.6016e01, 1.2965e01, 6.9384e00, -1.0855e00],
            [2.4428e01, -1.6189e01, 2.0572e02, 3.1622e01, -1.5719e-01],
        ],
        [
            [3.8226e00, 2.9608e01, 1.4457e01, 6.8179e01, -9.1997e-01],
            [2.5003e01, -4.2490e01, 9.6007e01, 4.9086e01, -1.4786e00],
            [8.5983e01, 5.4980e01, 7.8080e01, 1.0003e02, -1.0926e00],
            [9.9065e00, 4.1457e01, 5.9799e00, 1.7973e01, -5.6313e-01],
        ],
    ],
    [
        [
            [-1.8244e01, 4.6309e00, 5.3010e01, 2.4310e01, -7.0345e-01],
            [1.9419e01, 3.6704e01, 5.2390e01, 5.4133e01, -3.7730e-01],
            [5.6387e01, 2.3752e01, 9.0441e00, 1.7792e01, -1.5583e00],
            [3.6303e01, 1.6396e01, 2.0283e01, 1.9148e01, -8.3419e-01],
        ],
        [
            [3.2169e01, 3.0521e01, 2.6283e01, 1.9680e02, -3.0454e-01],
            [2.5788e01, -3.2189e01, 8.8882e01, 1.0207e02, -1.5328e00],
            [8.4676e00, -1.6668e01, 2.4657e01, 1.1275e02, -4.0388e-01],
            [-1.0799e01, 6.0422e00, 9.5807e00, 3.3677e01, -3.5438e-01],
        ],
        [
            [6.9363e01, 1.0850e01, 2.5968e01, 2.2311e01, -1.6408e-01],
            [2.8140e00, 4.6843e00, 3.1289e00, 2.1480e01, -6.7583e-01],
            [2.6661e01, 4.5290e01, 6.1679e00, 3.0005e01, -8.9806e-01],
            [5.0871e00, 1.3234e01, 9.2087e01, 4.9622e01, -2.8020e-01],
        ],
        [
            [-1.2643e01, 2.5176e01, 5.0488e01, 5.4246e01, -4.4840e-01],
            [-3.4521e01, 9.8435e-01, 5.2413e01, 9.7996e00, -8.4218e-01],
            [4.9829e01, -1.0808e01, 2.9848e01, 7.3579e01, -6.2672e-01],
            [8.0446e01, 2.8064e01, 4.5273e01, 5.3809e01, -1.2359e00],
        ],
    ],
]
EXPECTED = [
    [
        [
            [1.1095, -0.2172, -0.5222, -0.6225],
            [0.9144, 0.7662, 1.0487, -0.9690],
            [-0.8949, -1.6384, -0.9093, -0.3961],
            [-0.8604, 0.5062, -0.7947, -0.7397],
        ],
        [
            [-0.3961, -0.7495, 1.3461, 1.5528],
            [0.2034, 0.5522, -1.6722, 0.5231],
            [-1.0062, 1.1350, 1.4225, -0.3951],
            [-0.4826, -1.6240, 0.1932, 2.7181],
        ],
        [
            [-2.6436, -1.0276, 0.0578, -0.8344],
            [-0.9684, -1.8151, -2.1843, -1.1938],
            [-1.6744, -1.0121, -0.6556, 1.0073],
            [-0.8474, 0.3671, -0.3731, -0.5347],
        ],
    ],
    [
        [
            [0.7035, 0.2089, -0.1774, 3.4670],
            [-0.8505, -0.9278, 1.4714, 0.1644],
            [0.0898, 0.3064, -0.4007, 0.5849],
            [1.2569, -0.2636, -0.5223, 0.0616],
        ],
        [
            [0.1760, -0.7639, -0.4600, -1.3260],
            [-0.9921, -0.2970, -0.8955, 1.0508],
            [1.3515, -0.6125, 1.9679, 0.5550],
            [-0.3616, 0.6287, 0.4933, 0.3360],
        ],
        [
            [-0.5860, 0.2124, -0.8700, 2.4200],
            [-0.0551, -1.5103, -1.6779, 0.8399],
            [0.8431, 0.8455, -1.1243, -1.5994],
            [-2.1254, 0.6047, -0.3515, 0.7254],
        ],
    ],
]
GRAD_N0 = [
    [1.0000, 1.8507, 1.1493, 1.5222],
    [1.0000, 1.1511, 1.2139, 1.4778],
    [1.0000, 1.2629, 1.3721, 1.0000],
    [3.0000, 1.0000, 1.0000, 2.0000],
]
GRAD_N1 = [
    [1.2687, 1.5055, 1.2382, 1.0000],
    [1.1458, 1.4258, 1.4160, 1.0000],
    [1.0000, 1.0000, 1.0000, 1.0000],
    [1.0000, 1.0000, 1.0000, 1.0000],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_published_values(dtype):
    feature = torch.tensor(FEATURE, dtype=dtype, requires_grad=True)
    out = opbridge.rotated_feature_align(feature, torch.tensor(BBOX, dtype=dtype), spatial_scale=1 / 8, points=1)
    torch.testing.assert_close(out, torch.tensor(EXPECTED, dtype=dtype), rtol=1e-2, atol=1e-4)
    out.backward(torch.ones_like(out))
    grad = torch.tensor([[GRAD_N0] * 3, [GRAD_N1] * 3], dtype=dtype)
    torch.testing.assert_close(feature.grad, grad, rtol=1e-2, atol=1e-4)


def _inputs(generator, n=2, c=3, h=5, w=6, dtype=torch.float64):
    features = torch.randn(n, c, h, w, generator=generator, dtype=torch.float64)
    boxes = torch.cat(
        [
            torch.rand(n, h, w, 2, generator=generator, dtype=torch.float64) * 60 - 6,
            torch.rand(n, h, w, 2, generator=generator, dtype=torch.float64) * 40,
            (torch.rand(n, h, w, 1, generator=generator, dtype=torch.float64) - 0.5) * 6,
        ],
        3,
    )
    return features.to(dtype), boxes.to(dtype)


@pytest.mark.parametrize("points", [1, 5])
def test_matches_reference(generator, points):
    features, boxes = _inputs(generator)
    torch.testing.assert_close(
        opbridge.rotated_feature_align(features, boxes, 0.125, points), reference(features, boxes, 0.125, points)
    )


@pytest.mark.parametrize("points", [1, 5])
def test_gradients(generator, points):
    features, boxes = _inputs(generator, 1, 2, 4, 5)
    features.requires_grad_()

    def op(f):
        return opbridge.rotated_feature_align(f, boxes, 0.125, points)

    assert torch.autograd.gradcheck(op, (features,))
    assert torch.autograd.gradgradcheck(op, (features,))
    torch.library.opcheck(torch.ops.opbridge.rotated_feature_align.default, (features.detach(), boxes, 0.125, points))


class _Align(torch.nn.Module):
    def __init__(self, points):
        super().__init__()
        self.points = points

    def forward(self, features, best_rboxes):
        return opbridge.rotated_feature_align(features, best_rboxes, 0.25, self.points)


@pytest.mark.parametrize("lowering", ["standard", "custom"])
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 11), (False, 17), (True, 18)])
@pytest.mark.parametrize("points", [1, 5])
def test_export_at_other_sizes(generator, lowering, dynamo, opset, points):
    model = _Align(points)
    args = _inputs(generator, 2, 3, 5, 6, torch.float32)
    dims = {"features": {0: "n", 2: "h", 3: "w"}, "best_rboxes": {0: "n", 1: "h", 2: "w"}}
    proto = export(model, args, ("features", "best_rboxes"), dims, opset, dynamo, lowering)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert (("opbridge", "RotatedFeatureAlign") in ops) == (lowering == "custom")
    session = opbridge_ort.InferenceSession(proto)
    for shape in ((1, 3, 7, 4), (3, 3, 2, 9)):
        features, boxes = _inputs(generator, *shape, dtype=torch.float32)
        (got,) = session.run(None, {"features": features.numpy(), "best_rboxes": boxes.numpy()})
        np.testing.assert_allclose(got, model(features, boxes).numpy(), atol=2e-5)


CONTRACT_CASES = {
    "opbridge.rotated_feature_align": [
        (lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), None), TypeError, ["best_rboxes"]),
        (
            lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, 5), points=3),
            ValueError,
            ["points must be 1"],
        ),
        (
            lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, 5), spatial_scale=0),
            ValueError,
            ["positive finite"],
        ),
        (
            lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 3, 5)),
            RuntimeError,
            ["[batch, height, width, 5]", "[1, 2, 2, 5]"],
        ),
        (
            lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, 5, dtype=torch.float64)),
            RuntimeError,
            ["dtype"],
        ),
        (
            lambda: opbridge.rotated_feature_align(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, 5, device="meta")),
            RuntimeError,
            ["one device"],
        ),
    ],
}


def test_benchmark_runs_on_small_sizes(monkeypatch, tmp_path):
    """Every path of the four rotated ops' benchmarks (`python -m opbridge bench`) runs and is checked against its
    baseline first; no timing is asserted."""
    import json

    from opbridge.tools import bench
    from opbridge.tools.bench import box_iou_rotated, nms_rotated, roi_align_rotated, rotated_feature_align

    monkeypatch.setattr(box_iou_rotated, "CASES", {"small": 30})
    monkeypatch.setattr(nms_rotated, "CASES", {"small": (40, 0.3)})
    monkeypatch.setattr(roi_align_rotated, "CASES", {"small": (6, 4)})
    monkeypatch.setattr(roi_align_rotated, "MAP", 16)
    monkeypatch.setattr(rotated_feature_align, "SHAPE", (1, 3, 9, 7))
    report = tmp_path / "bench.json"
    ops = ["box_iou_rotated", "nms_rotated", "roi_align_rotated", "rotated_feature_align"]
    assert bench.main(["--threads", "1", "--warmup", "0", "--repeat", "1", "--json", str(report), "--ops", *ops]) == 0
    timed = {(r["op"], r["path"]) for r in json.loads(report.read_text())["rows"] if r["median_ms"] is not None}
    for op in ops:
        assert {(op, "torch_op"), (op, "torch_vectorized"), (op, "ort_custom")} <= timed, op
