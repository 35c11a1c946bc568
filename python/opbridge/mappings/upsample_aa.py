"""aten::_upsample_bicubic2d_aa and aten::_upsample_bilinear2d_aa (``F.interpolate(..., antialias=True)``) for the
TorchScript-based exporter, which has no rule for them at any opset ("Exporting the operator
'aten::_upsample_bicubic2d_aa' to ONNX opset version 17 is not supported").

transformers' RF-DETR (and DINOv2 with registers) resize their position embeddings with antialiased bicubic
interpolation to the image's patch grid, SigLIP 2 and SAM 2 with antialiased bilinear: none exported with
``dynamo=False``. ONNX's Resize has ``antialias`` only from opset 18, and the TorchScript exporter would not use it.

The rule is the definition of torch's antialiased resampling, separable: per axis a dense [out, in] weight matrix
built at run time from the sizes (so the image size may be dynamic), then ``W_h @ x @ W_w^T`` (MatMul):

- scale = in / out (1 / the scale factor where one is given; (in - 1) / (out - 1) with ``align_corners``);
- output i reads input p with weight filter((p + 0.5 - scale * (i + 0.5)) / max(scale, 1)), the filter a triangle
  (bilinear) or Keys' cubic with a = -0.5 (bicubic), widened by the scale when downsampling;
- each row of weights is normalized to sum 1 (inputs outside the image get no weight: no edge replication).

Memory is out x in per axis, negligible beside the image.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .. import specs
from ..onnx.builder import ONNX_TYPES

#: Keys' cubic convolution with a = -0.5 (torch's antialiased bicubic, as PIL's).
_A = -0.5


def _filter(b, x, mode: str, like):
    """The interpolation filter at the distances ``x`` (any shape)."""
    t = b.op("Abs", x)
    one = b.constant_like(1.0, like)
    if mode == "bilinear":
        return b.op("Relu", b.op("Sub", one, t))  # max(0, 1 - |x|)

    def poly(*coefficients):  # Horner: c0 t^n + ... + cn
        total = b.constant_like(coefficients[0], like)
        for c in coefficients[1:]:
            total = b.op("Add", b.op("Mul", total, t), b.constant_like(c, like))
        return total

    near = poly(_A + 2, -(_A + 3), 0.0, 1.0)  # |x| < 1
    far = poly(_A, -5 * _A, 8 * _A, -4 * _A)  # 1 <= |x| < 2
    zero = b.constant_like(0.0, like)
    return b.op(
        "Where", b.op("Less", t, one), near, b.op("Where", b.op("Less", t, b.constant_like(2.0, like)), far, zero)
    )


def _axis_weights(b, in_size, out_size, scale, mode: str, like):
    """[out, in] weights of one axis; sizes are 0-d int64, ``scale`` 0-d of like's type."""
    dtype = ONNX_TYPES[b.dtype(like)]
    half = b.constant_like(0.5, like)
    sources = b.op("Add", b.op("Cast", b.iota(in_size), to=dtype), half)  # p + 0.5
    centers = b.op("Mul", b.op("Add", b.op("Cast", b.iota(out_size), to=dtype), half), scale)  # scale * (i + 0.5)
    widen = b.op("Max", scale, b.constant_like(1.0, like))  # the filter widens by the scale when downsampling
    distances = b.op("Div", b.op("Sub", b.unsqueeze(sources, 0), b.unsqueeze(centers, 1)), widen)
    weights = _filter(b, distances, mode, like)
    total = b.reduce("Sum", weights, [1], keepdims=True)
    nonzero = b.op("Greater", b.op("Abs", total), b.constant_like(0.0, like))  # Equal takes floats from opset 11 only
    return b.op("Div", weights, b.op("Where", nonzero, total, b.constant_like(1.0, like)))


def _as_written(factor: float) -> float:
    """The scale factor the model passed: the TorchScript exporter keeps it as float32 (0.6 -> 0.60000002), eager
    torch uses the Python float; the shortest decimal that float32 rounds to the same value is what was written."""
    factor = float(factor)
    return float(str(np.float32(factor))) if float(np.float32(factor)) == factor else factor


def _scalar(b, value):
    """A 0-d int64 from a traced int (a 0-d or 1-element tensor)."""
    return b.op("Reshape", b.op("Cast", value, to=ONNX_TYPES[torch.int64]), b.constant([]))


def _resample(b, input, output_size, align_corners, scales, mode: str):
    shape = b.static_shape(input)
    if shape is None or len(shape) != 4:
        raise specs.UnknownToExporter(f"antialiased {mode} export needs a 4-D input of known rank")
    dtype = b.dtype(input, "input")
    if dtype not in (torch.float32, torch.float64):  # half inputs arrive as float32 (specs.half_storage)
        raise specs.LoweringError(f"antialiased {mode} export: input is {dtype}; floating inputs are supported")
    align = bool(b.value(align_corners, "b")) if not b.is_none(align_corners) else False
    factors = [None, None]
    if len(scales) == 1 and not b.is_none(scales[0]):  # the .vec overload: scale_factors
        factors = [_as_written(f) for f in b.value(scales[0], "fs")]
    elif len(scales) == 2:  # the default overload: scales_h, scales_w
        factors = [None if b.is_none(s) else _as_written(b.value(s, "f")) for s in scales]
    in_sizes = [_scalar(b, b.op("Gather", b.op("Shape", input), b.constant([axis]), axis=0)) for axis in (2, 3)]
    if output_size is not None and not b.is_none(output_size):
        sizes = b.value(output_size, "is")
        if not isinstance(sizes, (list, tuple)):  # sizes computed from traced shapes
            sizes = b.values(output_size)
        out_sizes = [b.constant(s) if isinstance(s, int) else _scalar(b, s) for s in sizes]
    elif all(f is not None for f in factors):  # torch: floor(in * factor)
        as_double = ONNX_TYPES[torch.float64]
        out_sizes = [
            _scalar(
                b,
                b.op(
                    "Floor",
                    b.op("Mul", b.op("Cast", n, to=as_double), b.tensor(torch.tensor(float(f), dtype=torch.float64))),
                ),
            )
            for n, f in zip(in_sizes, factors, strict=True)
        ]
    else:
        raise specs.LoweringError(f"antialiased {mode} export: neither an output size nor scale factors are given")
    if b.opset >= 18 and dtype == torch.float32 and not align and factors == [None, None]:
        # ONNX Resize with antialias (opset 18) computes the same where the scale is in / out: one node, and
        # the cost of a filter instead of a dense product. (Not for float64: ONNX Runtime has no such kernel; not
        # with align_corners or scale factors, where torch's scale is not ONNX's: torch's own dynamo rule gets
        # those wrong.)
        batch_channels = b.op("Gather", b.op("Shape", input), b.constant([0, 1]), axis=0)
        target = b.op("Concat", batch_channels, *[b.op("Reshape", n, b.constant([1])) for n in out_sizes], axis=0)
        empty = b.tensor(torch.zeros(0, dtype=torch.float32))
        kind = "cubic" if mode == "bicubic" else "linear"
        return b.op(
            "Resize", input, empty, empty, target, mode=kind, antialias=1, cubic_coeff_a=_A, exclude_outside=1,
            coordinate_transformation_mode="half_pixel",
        )  # fmt: skip
    weights = []
    for n_in, n_out, factor in zip(in_sizes, out_sizes, factors, strict=True):
        # 1-element 1-D, not 0-d: the TorchScript exporter's scalar type analysis computes arithmetic between 0-d
        # tensors in the default dtype (float32), which would cost float64 its precision.
        as_float = [b.op("Cast", b.op("Reshape", n, b.constant([1])), to=ONNX_TYPES[dtype]) for n in (n_in, n_out)]
        if align:  # (in - 1) / (out - 1), 0 for one output
            one = b.constant_like(1.0, input)
            minus = [b.op("Sub", n, one) for n in as_float]
            several = b.op("Greater", as_float[1], one)
            scale = b.op(
                "Where", several, b.op("Div", minus[0], b.op("Max", minus[1], one)), b.constant_like(0.0, input)
            )
        elif factor is not None and factor > 0:
            scale = b.tensor(torch.tensor([1.0 / factor], dtype=dtype))
        else:
            scale = b.op("Div", *as_float)
        weights.append(_axis_weights(b, n_in, n_out, scale, mode, input))
    rows = b.op("MatMul", weights[0], input)  # [N, C, out_h, W]
    return b.op("MatMul", rows, b.op("Transpose", weights[1], perm=[1, 0]))  # [N, C, out_h, out_w]


def _bicubic(b, input, output_size, align_corners, *scales):
    return _resample(b, input, output_size, align_corners, scales, "bicubic")


def _bilinear(b, input, output_size, align_corners, *scales):
    return _resample(b, input, output_size, align_corners, scales, "bilinear")


class _Interpolate(torch.nn.Module):
    def __init__(self, mode: str, how: str) -> None:
        super().__init__()
        self.mode, self.how = mode, how

    def forward(self, x):
        if self.how == "scale":
            return F.interpolate(x, scale_factor=0.6, mode=self.mode, antialias=True)
        if self.how == "from shape":  # sizes computed from the traced shape, as RF-DETR's position embeddings
            size = (x.shape[2] // 2, x.shape[3] * 3 // 2)
            return F.interpolate(x, size=size, mode=self.mode, antialias=True)
        align = self.how == "align_corners"
        return F.interpolate(x, size=(5, 14), mode=self.mode, align_corners=align, antialias=True)


_PATHS = ("size", "scale", "from shape", "align_corners")


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    return (torch.randn(batch, 2, 9, 11, generator=generator, dtype=torch.float64).to(dtype),)


def _reference(x, mode: str, path: str):
    """Windowed resampling written from torch's definition, one output at a time, over numpy arrays."""
    data = x.numpy().astype(np.float64)
    height, width = data.shape[2:]
    if path == "scale":
        sizes, scales = (math.floor(height * 0.6), math.floor(width * 0.6)), (1 / 0.6, 1 / 0.6)
    else:
        sizes = (height // 2, width * 3 // 2) if path == "from shape" else (5, 14)
        if path == "align_corners":
            scales = tuple((n - 1) / (m - 1) if m > 1 else 0.0 for n, m in zip((height, width), sizes, strict=True))
        else:
            scales = tuple(n / m for n, m in zip((height, width), sizes, strict=True))

    def kernel(t):
        t = abs(t)
        if mode == "bilinear":
            return max(0.0, 1.0 - t)
        if t < 1:
            return (_A + 2) * t**3 - (_A + 3) * t**2 + 1
        return _A * t**3 - 5 * _A * t**2 + 8 * _A * t - 4 * _A if t < 2 else 0.0

    def matrix(n_in, n_out, scale):
        support = (2.0 if mode == "bilinear" else 4.0) * 0.5 * max(scale, 1.0)
        result = np.zeros((n_out, n_in))
        for i in range(n_out):
            center = scale * (i + 0.5)
            low, high = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
            row = [kernel((p - center + 0.5) / max(scale, 1.0)) for p in range(low, high)]
            total = sum(row)
            result[i, low:high] = [w / total for w in row] if total else row
        return result

    rows = matrix(height, sizes[0], scales[0])
    cols = matrix(width, sizes[1], scales[1])
    return torch.from_numpy(np.einsum("ih,nchw,jw->ncij", rows, data, cols))


for _mode, _build in (("bicubic", _bicubic), ("bilinear", _bilinear)):
    specs.register(
        specs.OpSpec(
            name=f"_upsample_{_mode}2d_aa",
            torch_op=f"aten::_upsample_{_mode}2d_aa",
            doc=f"aten::_upsample_{_mode}2d_aa (interpolate with antialias=True) -> per-axis weight matrices built "
            "at run time, MatMul (torch's TorchScript exporter has no rule)",
            lowerings=[
                specs.Lowering(
                    "standard",
                    # float16/bfloat16: computed in float32 and rounded once (as torch's own dynamo rule for them
                    # was, which this rule replaces: without the cast the rule refused them)
                    specs.half_storage(_build),
                    min_opset=9,
                    note="weights from the sizes, MatMul (opset >= 18, float32, sizes given: Resize with antialias)",
                )
            ],
            dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
            call_paths={how: lambda _mode=_mode, how=how: _Interpolate(_mode, how) for how in _PATHS},
            sample_inputs=_sample_inputs,
            input_names=("x",),
            reference=lambda x, path, _mode=_mode: _reference(x, _mode, path),
            # torch's dynamo rule is wrong with align_corners or scale factors (its Resize takes ONNX's scale,
            # out / in, not torch's) and has no float64 kernel in ONNX Runtime
            dynamo_overrides_torch=True,
            # torch 2.6's exporter translates the .vec overload (scale_factors) itself, undecomposed: without this
            # entry its own (wrong) rule applied there
            extra={"dynamo_overloads": ("vec",)},
        )
    )
