"""Exports the tutorial's models with their custom lowerings, plus inputs and PyTorch's outputs, so that
``nox -s ort_versions`` can run real exported models on old ONNX Runtimes (whose venvs have no torch).

    python tests/export_reference_models.py OUT_DIR      (run by nox -s parity)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch

import opbridge


class Deformable(torch.nn.Module):
    """The tutorial's model: a Conv2d predicts offsets and a mask for a deformable conv."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.offsets = torch.nn.Conv2d(3, 27, 3, padding=1)
        self.deform = opbridge.nn.DeformConv2d(3, 8, 3, padding=1)

    def forward(self, x):
        predicted = self.offsets(x)
        return self.deform(x, predicted[:, :18], torch.sigmoid(predicted[:, 18:]))


class MyAddModel(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(opbridge.my_add(a, b))


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    cases = {
        "deformable": (Deformable().eval(), (torch.randn(2, 3, 12, 10),), ["x"]),
        "my_add": (MyAddModel().eval(), (torch.randn(4, 3), torch.randn(3)), ["a", "b"]),
    }
    for name, (model, inputs, names) in cases.items():
        with torch.no_grad():
            expected = model(*inputs).numpy()
        for dynamo, opset in ((False, 17), (True, 18)):
            stem = f"{name}-{'dynamo' if dynamo else 'legacy'}-{opset}-custom"
            opbridge.onnx.export(
                model, inputs, out / f"{stem}.onnx", opset_version=opset, dynamo=dynamo, lowering="custom",
                input_names=names,
            )  # fmt: skip
            np.savez(
                out / f"{stem}.npz", expected=expected, **{n: t.numpy() for n, t in zip(names, inputs, strict=True)}
            )
            print(f"exported {stem}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
