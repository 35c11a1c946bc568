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


@needs_torchvision
def test_roi_pool_argmax_used_fails_the_dynamo_export_loudly():
    """roi_pool's argmax has no ONNX form: unused (torchvision.ops.roi_pool), the export drops its placeholder;
    used, the export fails naming it, instead of a model that computes something else."""
    import torchvision  # noqa: F401

    class UsesArgmax(torch.nn.Module):
        def forward(self, x, rois):
            output, argmax = torch.ops.torchvision.roi_pool(x, rois, 0.5, 3, 2)
            return output, argmax

    class DropsArgmax(torch.nn.Module):
        def forward(self, x, rois):
            return torch.ops.torchvision.roi_pool(x, rois, 0.5, 3, 2)[0] * 2

    x, rois = torch.randn(1, 4, 10, 9), torch.tensor([[0, 1.0, 1.0, 9.0, 13.0]])
    with pytest.raises(specs.LoweringError, match="argmax"):
        torch.onnx.export(UsesArgmax().eval(), (x, rois), dynamo=True, opset_version=18)
    program = torch.onnx.export(DropsArgmax().eval(), (x, rois), dynamo=True, opset_version=18, optimize=False)
    domains = {node.domain for node in program.model_proto.graph.node}
    assert "opbridge.unexported" not in domains and "opbridge.unexported" not in {
        o.domain for o in program.model_proto.opset_import
    }


@needs_torchvision
@pytest.mark.parametrize("name", ["ps_roi_align", "ps_roi_pool"])
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_ps_roi_ops_both_outputs_match_torchvision(name, exporter):
    """Both outputs, channel_mapping included (int32, exactly), at the exported size and at other box counts."""
    import io

    import numpy as np
    import onnxruntime
    import torchvision  # noqa: F401

    op = getattr(torch.ops.torchvision, name)
    extra = (2,) if name == "ps_roi_align" else ()

    class Model(torch.nn.Module):
        def forward(self, x, rois):
            return op(x, rois, 0.5, 3, 2, *extra)

    from opbridge.mappings.roi_pool import sample_inputs

    x, rois = sample_inputs(torch.float32, "default", 2, channels=12)
    dynamic = {"x": {0: "batch"}, "rois": {0: "boxes"}}
    if exporter == "legacy":
        buffer = io.BytesIO()
        torch.onnx.export(Model().eval(), (x, rois), buffer, dynamo=False, opset_version=17, input_names=["x", "rois"],
                          dynamic_axes=dynamic)  # fmt: skip
        model = buffer.getvalue()
    else:
        shapes = {"x": {0: torch.export.Dim("batch")}, "rois": {0: torch.export.Dim("boxes")}}
        model = torch.onnx.export(Model().eval(), (x, rois), dynamo=True, opset_version=18, dynamic_shapes=shapes)
        model = model.model_proto.SerializeToString()
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    for count in (6, 1, 0):
        feeds = dict(zip([i.name for i in session.get_inputs()], [x.numpy(), rois[:count].numpy()], strict=True))
        got = session.run(None, feeds)
        want = op(x, rois[:count], 0.5, 3, 2, *extra)
        np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-5, atol=1e-6)
        assert got[1].dtype == np.int32
        np.testing.assert_array_equal(got[1], want[1].numpy())
