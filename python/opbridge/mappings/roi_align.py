"""torchvision::roi_align at opsets 11-15: aligned=False as torchvision's rule; aligned=True fails loudly.

torchvision's own rule below opset 16 writes RoiAlign-10, which has no half-pixel mode, and only warns when
``aligned=True``: the model runs with a wrong result (max difference 1.07 on a 10x10 map with three boxes,
measured on torch 2.14.1 / torchvision 0.29.1 / ORT 1.31.1). Shifting the boxes by half a pixel would be exact
only for boxes of at least one feature pixel (RoiAlign-10 clamps smaller ones to 1), so this rule refuses
``aligned=True`` below opset 16 with an error that says what to do; from opset 16 torchvision's rule (RoiAlign
with ``coordinate_transformation_mode="half_pixel"``) is exact and applies.
"""

from __future__ import annotations

import math

import torch

from .. import specs
from ..specs import LoweringError


def _roi_align(b, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    if bool(b.value(aligned, "b")):
        raise LoweringError(
            "torchvision::roi_align with aligned=True needs opset >= 16 (RoiAlign's half_pixel mode); below that "
            "ONNX RoiAlign computes aligned=False's result (torchvision's own rule exports it with a warning and "
            "the model is wrong). Export with opset_version >= 16."
        )
    i64 = b.constant
    batch = b.op("Cast", b.op("Gather", rois, i64(0), axis=1), to=7)  # INT64
    boxes = b.op("Gather", rois, i64([1, 2, 3, 4]), axis=1)
    return b.op("RoiAlign", input, boxes, batch, spatial_scale=float(b.value(spatial_scale, "f")),
                output_height=int(b.value(pooled_height, "i")), output_width=int(b.value(pooled_width, "i")),
                sampling_ratio=max(int(b.value(sampling_ratio, "i")), 0))  # fmt: skip


class _RoiAlign(torch.nn.Module):
    def __init__(self, sampling_ratio: int, aligned: bool) -> None:
        super().__init__()
        self.sampling_ratio, self.aligned = sampling_ratio, aligned

    def forward(self, x, rois):
        import torchvision

        return torchvision.ops.roi_align(x, rois, (3, 2), 0.5, self.sampling_ratio, self.aligned)


_PATHS = {"fixed": (2, False), "adaptive": (0, False), "aligned": (2, True), "aligned_adaptive": (0, True)}


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 4, 10, 9, generator=generator, dtype=dtype)
    boxes = torch.tensor([[1.0, 1.0, 9.0, 13.0], [0.0, 2.0, 17.0, 7.0], [3.3, 4.1, 6.0, 9.5], [-4.0, 6.0, 30.0, 40.0]])
    index = torch.arange(len(boxes), dtype=torch.float32).remainder(batch)[:, None]
    return x, torch.cat([index, boxes], 1).to(dtype)


def _bilinear(plane, y, x):
    """torchvision's bilinear_interpolate: zero beyond one pixel outside, the border row/column inside it."""
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return plane.new_zeros(plane.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * plane[:, y0, x0] + (1 - ly) * lx * plane[:, y0, x1]
            + ly * (1 - lx) * plane[:, y1, x0] + ly * lx * plane[:, y1, x1])  # fmt: skip


def _reference(x, rois, path: str = "fixed"):
    """roi_align written from torchvision's definition, one bin and sample at a time."""
    sampling_ratio, aligned = _PATHS[path]
    pooled, scale = (3, 2), 0.5
    offset = 0.5 if aligned else 0.0
    data = x.double()
    out = torch.zeros(len(rois), x.shape[1], *pooled, dtype=torch.float64)
    for r, (index, x1, y1, x2, y2) in enumerate(rois.double().tolist()):
        start_w, start_h = x1 * scale - offset, y1 * scale - offset
        roi_w, roi_h = x2 * scale - offset - start_w, y2 * scale - offset - start_h
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled[0], roi_w / pooled[1]
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / pooled[0])
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pooled[1])
        count = max(grid_h * grid_w, 1)
        for ph in range(pooled[0]):
            for pw in range(pooled[1]):
                total = torch.zeros(x.shape[1], dtype=torch.float64)
                for iy in range(grid_h):
                    for ix in range(grid_w):
                        y = start_h + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                        xx = start_w + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        total += _bilinear(data[int(index)], y, xx)
                out[r, :, ph, pw] = total / count
    return out.to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.opset < 11:
        return "RoiAlign-10: torchvision's rule starts at opset 11"
    if cell.path.startswith("aligned") and cell.opset < 16:
        return "aligned=True needs RoiAlign's half_pixel mode (opset >= 16): the export raises, by design"
    return None


specs.register(
    specs.OpSpec(
        name="torchvision.roi_align",
        torch_op="torchvision::roi_align",
        doc="torchvision::roi_align at opsets 11-15 (aligned=True raises instead of exporting a wrong model)",
        lowerings=[
            specs.Lowering("standard", specs.half_storage(_roi_align), min_opset=11, max_opset=15, note="RoiAlign-10")
        ],
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        call_paths={name: (lambda sr=sr, al=al: _RoiAlign(sr, al)) for name, (sr, al) in _PATHS.items()},
        sample_inputs=_sample_inputs,
        input_names=("x", "rois"),
        reference=_reference,
        known_gaps=_known_gaps,
        available=specs.torchvision_op_loads("roi_align"),
    )
)
