"""opbridge's rules for torchvision's ops where torchvision's own TorchScript-exporter rules are wrong, whichever
package is imported first (torchvision registers its rules when torchvision.ops is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import opbridge
from opbridge import specs

needs_torchvision = pytest.mark.skipif(
    not specs.get("torchvision.roi_align").is_available(),
    reason="torchvision's compiled ops do not load with this torch (e.g. the CPU-only build)",
)

_SCRIPT = """
import warnings; warnings.simplefilter("ignore")
{imports}
class M(torch.nn.Module):
    def forward(self, x, rois):
        return torchvision.ops.roi_align(x, rois, (3, 2), 0.5, 2, True)
x, rois = torch.randn(1, 4, 10, 9), torch.tensor([[0, 1.0, 1.0, 9.0, 13.0]])
try:
    opbridge.onnx.export(M(), (x, rois), None, opset_version={opset}, dynamo=False)
    print("EXPORTED")
except Exception as error:
    print("REFUSED", error)
"""


@needs_torchvision
@pytest.mark.parametrize("opset", [11, 15])
@pytest.mark.parametrize("order", ["torchvision first", "opbridge first"])
def test_roi_align_aligned_below_opset_16_is_refused_not_wrong(order, opset):
    imports = (
        "import torch, torchvision, opbridge"
        if order == "torchvision first"
        else "import torch, opbridge\nimport torchvision"
    )
    result = subprocess.run([sys.executable, "-c", _SCRIPT.format(imports=imports, opset=opset)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "REFUSED" in result.stdout and "opset_version >= 16" in result.stdout, result.stdout + result.stderr[-2000:]


@needs_torchvision
def test_roi_align_aligned_at_opset_16_matches_torchvision():
    import numpy as np
    import onnxruntime
    import torchvision

    class Model(torch.nn.Module):
        def forward(self, x, rois):
            return torchvision.ops.roi_align(x, rois, (3, 2), 0.5, 0, True)

    from opbridge.mappings.roi_align import _reference, _sample_inputs

    x, rois = _sample_inputs(torch.float32, "default", 2)
    proto = opbridge.onnx.export(Model(), (x, rois), None, opset_version=16, dynamo=False)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), (x, rois), strict=True)})
    np.testing.assert_allclose(got, _reference(x, rois, "aligned_adaptive").numpy(), rtol=1e-5, atol=1e-5)
