"""mmdeploy's own ONNX Runtime library against opbridge's, on the same models and inputs (not part of the test
suite: it needs mmdeploy's prebuilt library, which runs only on ONNX Runtime <= 1.15, so each side runs in its own
environment). Torch-free.

    # mmdeploy 1.3.1's wheel ships mmdeploy/lib/libmmdeploy_onnxruntime_ops.so (built against ORT 1.15.1)
    pip download --no-deps mmdeploy==1.3.1 && unzip mmdeploy-1.3.1-*.whl 'mmdeploy/lib/*' -d mmd
    python3 -m venv ort115 && ort115/bin/pip install onnxruntime==1.15.1 onnx numpy
    LD_LIBRARY_PATH=mmd/mmdeploy/lib ort115/bin/python tests/compare_mmdeploy.py run \\
        mmd/mmdeploy/lib/libmmdeploy_onnxruntime_ops.so out/mmdeploy
    python tests/compare_mmdeploy.py run "$(python -c 'import opbridge_ort; print(opbridge_ort.library_path())')" \\
        out/opbridge
    python tests/compare_mmdeploy.py compare out/mmdeploy out/opbridge     # a markdown table

Each node runs at one intra-op thread, the median of 20 runs after one warm-up; the outputs are saved and compared
(max abs difference, or identical rows for the index outputs).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(op_type: str, inputs: list[str], output_type, **attributes) -> bytes:
    node = helper.make_node(op_type, inputs, ["out"], domain="mmdeploy", **attributes)
    graph = helper.make_graph([node], op_type, [helper.make_tensor_value_info(n, FLOAT, None) for n in inputs],
                              [helper.make_tensor_value_info("out", output_type, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("mmdeploy", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def cases() -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    f32 = np.float32
    found = {}
    grid = {"interpolation_mode": 0, "padding_mode": 0, "align_corners": 0}
    shapes = {"grid_sampler MSDA level 100x100": (8, 32, 100, 100, 10_000, 4),
              "grid_sampler PointRend 2000 points": (1, 256, 64, 64, 2_000, 1)}  # fmt: skip
    for name, (n, c, h, w, q, p) in shapes.items():
        feeds = {"input": rng.standard_normal((n, c, h, w)).astype(f32),
                 "grid": rng.uniform(-1.05, 1.05, (n, q, p, 2)).astype(f32)}  # fmt: skip
        found[name] = (_model("grid_sampler", ["input", "grid"], FLOAT, **grid), feeds)
    feeds = {"input": rng.standard_normal((1, 3, 40, 40)).astype(f32),
             "grid": rng.uniform(-1.2, 1.2, (1, 30, 30, 2)).astype(f32)}  # fmt: skip
    bicubic = {"interpolation_mode": 2, "padding_mode": 2, "align_corners": 1}
    found["grid_sampler bicubic reflection"] = (_model("grid_sampler", ["input", "grid"], FLOAT, **bicubic), feeds)
    # DCNv2 where mmdeploy's kernel is right (channels * kh * kw a multiple of 8) and where it is not.
    for channels in (64, 3):
        names = ["input", "offset", "mask", "weight", "bias"]
        feeds = {"input": rng.standard_normal((1, channels, 32, 32)).astype(f32),
                 "offset": rng.standard_normal((1, 18, 32, 32)).astype(f32),
                 "mask": rng.random((1, 9, 32, 32)).astype(f32),
                 "weight": (rng.standard_normal((64, channels, 3, 3)) * 0.1).astype(f32),
                 "bias": rng.standard_normal(64).astype(f32)}  # fmt: skip
        attributes = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "deform_groups": 1}
        found[f"MMCVModulatedDeformConv2d C{channels} 3x3"] = (
            _model("MMCVModulatedDeformConv2d", names, FLOAT, **attributes), feeds)  # fmt: skip
    boxes = np.concatenate([rng.uniform(0, 200, (1, 500, 2)), rng.uniform(5, 40, (1, 500, 2)),
                            rng.uniform(-1.5, 1.5, (1, 500, 1))], 2)  # fmt: skip
    feeds = {"boxes": boxes.astype(f32), "scores": rng.random((1, 3, 500)).astype(f32)}
    found["NMSRotated 500 boxes 3 classes"] = (
        _model("NMSRotated", ["boxes", "scores"], INT64, iou_threshold=0.1, score_threshold=0.05), feeds)  # fmt: skip
    rois = np.concatenate([np.zeros((500, 1)), rng.uniform(10, 500, (500, 2)), rng.uniform(16, 120, (500, 2)),
                           rng.uniform(-1.5, 1.5, (500, 1))], 1)  # fmt: skip
    feeds = {"input": rng.standard_normal((1, 256, 64, 64)).astype(f32), "rois": rois.astype(f32)}
    attributes = {"output_height": 7, "output_width": 7, "spatial_scale": 0.125, "sampling_ratio": 2, "aligned": 1,
                  "clockwise": 0}  # fmt: skip
    found["MMCVRoIAlignRotated 500 rois 7x7 C256"] = (_model("MMCVRoIAlignRotated", ["input", "rois"], FLOAT,
                                                             **attributes), feeds)  # fmt: skip
    corners = rng.uniform(0, 300, (1, 400, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(10, 60, (1, 400, 2))], 2)
    feeds = {"boxes": boxes.astype(f32), "scores": rng.random((1, 4, 400)).astype(f32),
             "iou_threshold": np.array([0.3], f32), "score_threshold": np.array([0.05], f32)}  # fmt: skip
    found["NMSMatch 400 boxes 4 classes"] = (_model("NMSMatch", list(feeds), INT64), feeds)
    return found


def run(library: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    for name, (model, feeds) in cases().items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.register_custom_ops_library(library)
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        np.save(out / f"{name.replace(' ', '_')}.npy", session.run(None, feeds)[0])
        runs = []
        for _ in range(20):
            start = time.perf_counter()
            session.run(None, feeds)
            runs.append(time.perf_counter() - start)
        times[name] = float(np.median(runs) * 1e3)
    (out / "times.json").write_text(json.dumps({"onnxruntime": ort.__version__, "times_ms": times}, indent=1))


def compare(first: Path, second: Path) -> None:
    a, b = (json.loads((d / "times.json").read_text()) for d in (first, second))
    print(f"| node and case | {first.name} (ORT {a['onnxruntime']}) ms | {second.name} (ORT {b['onnxruntime']}) ms "
          "| speed-up | outputs |\n|---|---|---|---|---|")  # fmt: skip
    for name, time_a in a["times_ms"].items():
        x, y = (np.load(d / f"{name.replace(' ', '_')}.npy") for d in (first, second))
        if x.shape != y.shape:
            outputs = f"shapes {x.shape} and {y.shape}"
        elif x.dtype.kind == "i":
            outputs = "identical" if np.array_equal(x, y) else "differ"
        else:
            outputs = f"max abs difference {float(np.max(np.abs(x.astype(np.float64) - y))):.2g}"
        time_b = b["times_ms"][name]
        print(f"| {name} | {time_a:.2f} | {time_b:.2f} | {time_a / time_b:.1f}x | {outputs} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
