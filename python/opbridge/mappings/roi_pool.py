"""torchvision::roi_pool -> ONNX MaxRoiPool, for the dynamo exporter too.

torchvision::roi_pool returns (output, argmax); argmax, the flat index of each bin's maximum, exists for the
backward and has no ONNX form. torchvision's TorchScript-exporter rule returns None for it; the dynamo exporter
(torch 2.14.1 / onnxscript 0.7.2) fails with a ConversionError (torchlib's rule takes other arguments than the
op has). This rule emits MaxRoiPool (whose Caffe semantics are torchvision's: rounded box corners, ``+ 1``
sizes, floor/ceil bins clipped to the map, 0 for empty bins) and, with the dynamo exporter, a placeholder for
argmax that the export removes when the model does not use it (torchvision.ops.roi_pool and RoIPool never
do) and that makes the export fail, naming it, when the model does.
"""

from __future__ import annotations

import torch

from .. import specs

_ARGMAX = (
    "torchvision::roi_pool's second output (argmax, which only its backward uses): ONNX MaxRoiPool has none. "
    "Use torchvision.ops.roi_pool / RoIPool, which discard it."
)


def _roi_pool(b, input, rois, spatial_scale, pooled_height, pooled_width):
    output = b.op("MaxRoiPool", input, rois, spatial_scale=float(b.value(spatial_scale, "f")),
                  pooled_shape=[int(b.value(pooled_height, "i")), int(b.value(pooled_width, "i"))])  # fmt: skip
    if b.exporter == "legacy":
        return output, None  # the TorchScript-based exporter fails by itself if the model uses argmax
    return output, b.unexported("RoiPoolArgmax", output, _ARGMAX)


class _RoiPool(torch.nn.Module):
    def __init__(self, output_size, spatial_scale: float) -> None:
        super().__init__()
        self.output_size, self.spatial_scale = output_size, spatial_scale

    def forward(self, x, rois):
        import torchvision

        return torchvision.ops.roi_pool(x, rois, self.output_size, self.spatial_scale)


_PATHS = {"scale_half": ((3, 2), 0.5), "scale_one": ((2, 4), 1.0)}


def sample_inputs(dtype: torch.dtype, operands: str, batch: int, channels: int = 4):
    """A feature map and boxes [index, x1, y1, x2, y2]: inside, across the border, tiny, and reversed."""
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, channels, 10, 9, generator=generator, dtype=dtype)
    boxes = torch.tensor([[1.0, 1.0, 9.0, 13.0], [0.0, 2.0, 17.0, 7.0], [3.3, 4.1, 6.0, 9.5], [-4.0, 6.0, 30.0, 40.0],
                          [5.0, 5.0, 5.4, 5.2], [8.0, 9.0, 2.0, 3.0]])  # fmt: skip
    index = torch.arange(len(boxes), dtype=torch.float32).remainder(batch)[:, None]
    return x, torch.cat([index, boxes], 1).to(dtype)


def round_half_away(value: float) -> int:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(abs(value) + 0.5) * (1 if value >= 0 else -1)


def pool_windows(box, scale: float, pooled, height: int, width: int, extra: int, clip_to_last: bool):
    """torchvision's integer bins of one box: [(hstart, hend, wstart, wend)] for each (ph, pw). ``extra``: 1 for
    roi_pool's inclusive box size, 0 for ps_roi_pool's; ``clip_to_last``: ps_roi_pool's forward clips to the last
    row/column (height - 1), roi_pool to height."""
    start_w, start_h = round_half_away(box[0] * scale), round_half_away(box[1] * scale)
    end_w, end_h = round_half_away(box[2] * scale), round_half_away(box[3] * scale)
    roi_w, roi_h = max(end_w - start_w + extra, 1), max(end_h - start_h + extra, 1)
    bin_h, bin_w = roi_h / pooled[0], roi_w / pooled[1]
    top_h, top_w = (height - 1, width - 1) if clip_to_last else (height, width)
    import math

    windows = {}
    for ph in range(pooled[0]):
        for pw in range(pooled[1]):
            hs = min(max(math.floor(ph * bin_h) + start_h, 0), top_h)
            he = min(max(math.ceil((ph + 1) * bin_h) + start_h, 0), top_h)
            ws = min(max(math.floor(pw * bin_w) + start_w, 0), top_w)
            we = min(max(math.ceil((pw + 1) * bin_w) + start_w, 0), top_w)
            windows[ph, pw] = (hs, he, ws, we)
    return windows


def _reference(x, rois, path: str = "scale_half"):
    """roi_pool from torchvision's definition: the maximum of each integer bin, 0 for an empty one."""
    pooled, scale = _PATHS[path]
    height, width = x.shape[-2:]
    out = torch.zeros(len(rois), x.shape[1], *pooled, dtype=x.dtype)
    for r, (index, *box) in enumerate(rois.double().tolist()):
        for (ph, pw), (hs, he, ws, we) in pool_windows(box, scale, pooled, height, width, 1, False).items():
            if he > hs and we > ws:
                out[r, :, ph, pw] = x[int(index), :, hs:he, ws:we].amax(dim=(-2, -1))
    return out


specs.register(
    specs.OpSpec(
        name="torchvision.roi_pool",
        torch_op="torchvision::roi_pool",
        doc="torchvision::roi_pool -> MaxRoiPool, with the dynamo exporter too (argmax: removed if unused)",
        lowerings=[
            specs.Lowering(
                "standard", specs.half_storage(_roi_pool, floating_output=(True, False)), min_opset=1, note="MaxRoiPool"
            )
        ],
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        call_paths={
            name: (lambda size=size, scale=scale: _RoiPool(size, scale)) for name, (size, scale) in _PATHS.items()
        },
        sample_inputs=sample_inputs,
        input_names=("x", "rois"),
        reference=_reference,
        known_gaps=lambda cell: specs.ORT_NO_OPSET22_ROI_KERNELS if cell.opset >= 22 else None,
        available=specs.torchvision_op_loads("roi_pool"),
        dynamo_overrides_torch=True,  # torch's dynamo rule fails
    )
)
