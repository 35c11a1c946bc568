"""Half precision and autocast (docs/api.md, "Precision and autocast").

- float16/bfloat16 storage: every op takes half inputs and returns half outputs that are the float64 value of the
  same (half) inputs rounded once: within one rounding (a half ulp) plus float32 arithmetic's error. Arithmetic in
  the half type, or a second rounding, breaks that bound on these inputs.
- precision-critical inputs (locations, offsets, masks, rois, boxes) may stay float32 beside half storage;
- gradients come back in each input's dtype, computed in float32 (checked against float64 autograd of the
  independent references);
- under torch.autocast (CPU bfloat16 and float16) no op fails, each follows its declared rule, and an AMP training
  step of a Deformable-DETR encoder layer and of a DCN block matches the float32 step and lowers the loss;
- torch.compile of an AMP training step.

Each check runs on the CPU and, where torch sees a GPU and opbridge's CUDA library is loaded, on CUDA too (the same
float64 references and tolerances: the CUDA kernels share the CPU kernels' arithmetic).
"""

from __future__ import annotations

import math

import pytest
import torch

import opbridge
from opbridge import _autocast, _extension
from opbridge.ops import box_iou_rotated as box_iou_module
from opbridge.ops import deform_conv2d as dcn_module
from opbridge.ops import ms_deform_attn as msda_module
from opbridge.ops import nms_rotated as nms_module
from opbridge.ops import roi_align_rotated as roi_module
from opbridge.ops import rotated_feature_align as rfa_module

HALF = [torch.float16, torch.bfloat16]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not (torch.cuda.is_available() and _extension.cuda_library is not None),
            reason="needs an NVIDIA GPU, a CUDA build of torch and opbridge's CUDA library (tests/run_on_gpu.sh)",
        ),
    ),
]
# Unit roundoff: the largest relative error of one rounding to nearest.
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _to(values, dtype, keep=()):
    """Floating tensors to `dtype`, except the positions in `keep` (left in float32)."""
    out = []
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.to(torch.float32 if i in keep else dtype)
        out.append(value)
    return out


def _on(values, device):
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _as_float64(values):
    return [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]


def assert_rounded_once(
    out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, terms: torch.Tensor | None = None
) -> None:
    """`out` (dtype) is float64's `expected` rounded once: |out - expected| <= u |expected| + float32's error. With
    `terms` (the sum of the absolute values of the products that make each element), one rounding more of every
    product's operand is allowed: u * terms (deform_conv2d's bfloat16 products)."""
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    assert out.shape == expected.shape
    error = (out.double() - expected).abs()
    slack = 2e-6 * expected.abs().max().clamp_min(1.0)  # float32 arithmetic before the rounding
    bound = UNIT[dtype] * expected.abs() + slack
    if terms is not None:
        bound = bound + UNIT[dtype] * terms
    worst = (error - bound).max()
    assert bool((error <= bound).all()), (
        f"{int((error > bound).sum())} of {error.numel()} elements are more than one {dtype} rounding from the "
        f"float64 value (worst excess {float(worst):.3g}, max error {float(error.max()):.3g})"
    )


# --- every op: half in, half out, one rounding ----------------------------------------------------------------------


def _msda_case(dtype, keep):
    inputs = _to(msda_module.sample_inputs(torch.float64, 2), dtype, keep)
    return opbridge.ms_deform_attn, inputs, lambda *a: msda_module.reference(*_as_float64(a))


def _dcn_case(dtype, keep):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 7, 9, generator=generator, dtype=torch.float64)
    offset = 2 * torch.randn(2, 2 * 2 * 9, 7, 9, generator=generator, dtype=torch.float64)
    weight = torch.randn(6, 2, 3, 3, generator=generator, dtype=torch.float64) / 3
    bias = torch.randn(6, generator=generator, dtype=torch.float64)
    mask = torch.rand(2, 2 * 9, 7, 9, generator=generator, dtype=torch.float64)
    # positions: input, offset, weight, bias, mask (keep names them in the op's own order)
    x, offset, weight, bias, mask = _to([x, offset, weight, bias, mask], dtype, keep)

    def op(x, offset, weight, bias, mask):
        return opbridge.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)

    def ref(x, offset, weight, bias, mask):
        x, offset, weight, bias, mask = _as_float64([x, offset, weight, bias, mask])
        return dcn_module.reference(x, offset, weight, bias, padding=(1, 1), mask=mask)

    return op, [x, offset, weight, bias, mask], ref


def _roi_case(dtype, keep):
    inputs = _to(roi_module._sample_inputs(torch.float64, "default", 2), dtype, keep)

    def op(x, rois):
        return opbridge.roi_align_rotated(x, rois, (2, 2), 1.0, 0, True, False)

    return op, inputs, lambda x, rois: roi_module.reference(*_as_float64([x, rois]), (2, 2), 1.0, 0, True, False)


def _rfa_case(dtype, keep):
    inputs = _to(rfa_module._sample_inputs(torch.float64, "default", 2), dtype, keep)

    def op(features, boxes):
        return opbridge.rotated_feature_align(features, boxes, 1 / 8, 1)

    return op, inputs, lambda f, b: rfa_module.reference(*_as_float64([f, b]), 1 / 8, 1)


def _my_add_case(dtype, keep):
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(3, 1, 37, generator=generator, dtype=torch.float64) * 100
    b = torch.randn(4, 37, generator=generator, dtype=torch.float64)
    return opbridge.my_add, _to([a, b], dtype), lambda a, b: 2 * a.double() + b.double()


CASES = {
    "my_add": (_my_add_case, ()),
    "ms_deform_attn": (_msda_case, (3, 4)),
    "deform_conv2d": (_dcn_case, (1, 4)),
    "roi_align_rotated": (_roi_case, (1,)),
    "rotated_feature_align": (_rfa_case, (1,)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize(
    ("name", "mixed"),
    [(name, False) for name in CASES] + [(name, True) for name, (_, precise) in CASES.items() if precise],
    ids=lambda v: {False: "all-half", True: "precise-inputs-float32"}.get(v, v) if isinstance(v, bool) else v,
)
@pytest.mark.parametrize("device", DEVICES)
def test_half_storage_rounds_the_float64_value_once(name, dtype, mixed, device):
    build, precise = CASES[name]
    op, inputs, reference = build(dtype, precise if mixed else ())
    inputs = _on(inputs, device)
    out = op(*inputs)
    terms = None
    if name == "deform_conv2d" and dtype == torch.bfloat16 and device == "cpu" and dcn_module.cpu_bf16_products():
        terms = _dcn_product_terms(*_on(inputs, "cpu"))  # the columns rounded to bfloat16 before the products
    # The references are plain torch math on the CPU (float64).
    assert_rounded_once(out.cpu(), reference(*_on(inputs, "cpu")), dtype, terms)


def _dcn_product_terms(x, offset, weight, bias, mask):
    """Sum over (channel, tap) of |weight| x |sampled column| for each output element: the bilinear sample of |x|
    bounds the sample's magnitude (its weights are >= 0), times |mask|."""
    x, offset, weight, mask = _as_float64([x, offset, weight, mask])
    return dcn_module.reference(x.abs(), offset, weight.abs(), None, padding=(1, 1), mask=mask.abs())


_BF16_PATHS = """
import json, sys, torch, opbridge
from opbridge.ops import deform_conv2d as m
n, c, o, h, w, groups, offset_groups = json.loads(sys.argv[2])
g = torch.Generator().manual_seed(7)
x = torch.randn(n, c, h, w, generator=g).bfloat16()
offset = 2 * torch.randn(n, 2 * offset_groups * 9, h, w, generator=g)
weight = (torch.randn(o, c // groups, 3, 3, generator=g) / 12).bfloat16()
bias, mask = torch.randn(o, generator=g).bfloat16(), torch.rand(n, offset_groups * 9, h, w, generator=g)
out = opbridge.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)
wide = opbridge.deform_conv2d(x.float(), offset, weight.float(), bias.float(), padding=(1, 1), mask=mask)
torch.save(dict(out=out, wide=wide, chosen=m.cpu_bf16_products(), inputs=(x, offset, weight, bias, mask)), sys.argv[1])
"""


@pytest.mark.parametrize(
    "shape",
    [
        (2, 32, 40, 11, 13, 2, 2),  # groups and offset groups of 2: 16 channels each, 20 outputs a group
        (1, 21, 13, 9, 7, 1, 1),  # channels past a 16-channel vector, outputs and pixels past 8 x 8 tiles
        (3, 3, 5, 4, 6, 1, 1),  # fewer channels and outputs than one vector or tile
    ],
    ids=["groups", "tails", "small"],
)
@pytest.mark.parametrize("products", ["0", "1"])
def test_deform_conv2d_bfloat16_products_on_the_cpu_round_the_columns_once_more(products, shape, tmp_path):
    """OPBRIDGE_CPU_BF16_GEMM=0: the float32 path (bit for bit the float32 op on the widened values, rounded once);
    1 (the default on CPUs with AVX512-BF16): bfloat16 products, within one rounding more of each column. Both
    paths run on any CPU (1 without the instructions is slow, not wrong)."""
    import json
    import os
    import subprocess
    import sys

    saved = tmp_path / "out.pt"
    env = dict(os.environ, OPBRIDGE_CPU_BF16_GEMM=products)
    subprocess.run([sys.executable, "-c", _BF16_PATHS, str(saved), json.dumps(shape)], env=env, check=True, timeout=120)
    result = torch.load(saved)
    assert result["chosen"] == (products == "1")
    x, offset, weight, bias, mask = result["inputs"]
    exact = _as_float64([x, offset, weight, bias, mask])
    expected = dcn_module.reference(*exact[:4], padding=(1, 1), mask=exact[4])
    if products == "0":
        assert torch.equal(result["out"], result["wide"].bfloat16())
        assert_rounded_once(result["out"], expected, torch.bfloat16)
    else:
        assert not torch.equal(result["out"], result["wide"].bfloat16())  # the other path ran
        assert_rounded_once(result["out"], expected, torch.bfloat16, _dcn_product_terms(x, offset, weight, bias, mask))


@pytest.mark.parametrize(
    ("queries", "levels", "channels"),
    [
        (7, [(40, 50), (20, 25)], 32),  # a decoder: few queries on large maps (query-major, value read as stored)
        (2500, [(40, 50), (20, 25)], 32),  # an encoder: every pixel queries (head-major, value bfloat16 in its copy)
        (2500, [(40, 50), (20, 25)], 64),  # two whole 32-channel chunks (one AVX-512 register of words each)
        (3000, [(40, 50), (20, 25)], 33),  # channels past whole 16-channel chunks
        (9, [(30, 30)], 8),  # channels below one chunk
    ],
    ids=["decoder", "encoder", "channels-64", "channels-33", "channels-8"],
)
@pytest.mark.parametrize("inputs", ["float32", "half"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_ms_deform_attn_half_value_gives_the_float32_bits_on_the_widened_values(
    queries, levels, channels, dtype, inputs
):
    """The CPU op reads a bfloat16 value (and, on CPUs with AVX-512, a float16 one; elsewhere it widens it first)
    as stored, and half locations and weights too; the result must be bit for bit the float32 op on the same values
    widened, rounded once (non-contiguous value too)."""
    value, shapes, starts, loc, attn = msda_module.sample_inputs(torch.float32, 2, levels, queries, 4, channels, 4)
    value = value.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous
    loc, attn = (t.to(dtype if inputs == "half" else torch.float32) for t in (loc, attn))
    got = opbridge.ms_deform_attn(value, shapes, starts, loc, attn)
    want = opbridge.ms_deform_attn(value.float(), shapes, starts, loc.float(), attn.float()).to(dtype)
    assert got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_box_iou_and_nms_rotated_take_half_boxes(dtype, device):
    boxes1, boxes2 = box_iou_module._sample_inputs(torch.float64, "iou", 3)
    boxes1, boxes2 = boxes1.to(device, dtype), boxes2.to(device, dtype)
    ious = opbridge.box_iou_rotated(boxes1, boxes2)
    assert_rounded_once(ious.cpu(), box_iou_module.reference(boxes1.cpu().double(), boxes2.cpu().double()), dtype)
    boxes, scores = nms_module._sample_inputs(torch.float64, "plain", 3)[:2]
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    _, kept = opbridge.nms_rotated(boxes.to(device), scores.to(device), 0.3)
    assert kept.tolist() == nms_module.reference(boxes.double(), scores.double())[1].tolist()


@pytest.mark.parametrize("name", ["ms_deform_attn", "deform_conv2d", "roi_align_rotated", "rotated_feature_align"])
def test_precise_inputs_in_another_half_type_are_refused(name):
    build, precise = CASES[name]
    op, inputs, _ = build(torch.float16, ())
    inputs[precise[0]] = inputs[precise[0]].to(torch.bfloat16)
    with pytest.raises(
        RuntimeError, match=r"must have the dtype of .*\(torch.float16\) or float32, got torch.bfloat16"
    ):
        op(*inputs)


# --- gradients: each input's own dtype, float32 arithmetic -----------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["ms_deform_attn", "deform_conv2d", "roi_align_rotated", "rotated_feature_align"])
@pytest.mark.parametrize("device", DEVICES)
def test_half_gradients_match_float64_autograd_of_the_reference(name, dtype, device):
    build, precise = CASES[name]
    op, inputs, reference = build(dtype, precise)  # mixed: half storage, float32 precise inputs
    inputs = _on(inputs, device)
    # Only the inputs the op differentiates (rois and boxes get no gradient; the level table is integers).
    differentiable = {"ms_deform_attn": (0, 3, 4), "deform_conv2d": (0, 1, 2, 3, 4)}.get(name, (0,))
    leaves = [
        t.detach().requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for i, t in enumerate(inputs)
    ]
    generator = torch.Generator().manual_seed(11)
    out = op(*leaves)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(device, dtype)
    got = torch.autograd.grad(out, [leaves[i] for i in differentiable], grad)
    exact = [t.detach().cpu().double().requires_grad_(i in differentiable) if isinstance(t, torch.Tensor)
             and t.is_floating_point() else t for i, t in enumerate(_on(inputs, "cpu"))]  # fmt: skip
    expected = torch.autograd.grad(reference(*exact), [exact[i] for i in differentiable], grad.cpu().double())
    for i, g, e in zip(differentiable, got, expected, strict=True):
        assert g.dtype == inputs[i].dtype, f"gradient of input {i}: {g.dtype}, its input is {inputs[i].dtype}"
        assert g.device == inputs[i].device, f"gradient of input {i} on {g.device}, its input on {inputs[i].device}"
        g = g.cpu()
        # The location/offset gradients jump where a sample crosses a pixel border: compared with a tolerance of
        # the half type's rounding of the largest gradient, not element by element to one rounding.
        scale = e.abs().max().clamp_min(1e-3)
        unit = UNIT.get(g.dtype, 2.0**-24)
        assert float((g.double() - e).abs().max()) <= 4 * unit * float(scale) + 1e-4 * float(scale), (
            f"gradient of input {i} of {name}"
        )


# --- autocast --------------------------------------------------------------------------------------------------------

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
GRADIENT_TOLERANCE = {torch.float16: 0.02, torch.bfloat16: 0.15}


def _float32_inputs(name):
    build, _ = CASES[name]
    _, inputs, _ = build(torch.float32, ())
    return build, inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("name", [*CASES, "box_iou_rotated", "nms_rotated"])
def test_no_op_fails_under_autocast_and_each_follows_its_rule(name, dtype, device):
    if name == "box_iou_rotated":
        op, inputs = opbridge.box_iou_rotated, list(box_iou_module._sample_inputs(torch.float32, "iou", 2))
        inputs[1] = inputs[1].to(dtype)  # autocast's mixed dtypes
    elif name == "nms_rotated":
        boxes, scores = nms_module._sample_inputs(torch.float32, "plain", 2)[:2]
        op, inputs = (lambda b, s: opbridge.nms_rotated(b, s, 0.3)), [boxes, scores.to(dtype)]
    else:
        op, inputs, _ = CASES[name][0](torch.float32, ())
        inputs[0] = inputs[0].to(dtype)  # a projection's output under autocast
    inputs = _on(inputs, device)
    with torch.autocast(device, dtype=dtype):
        out = op(*inputs)
    rule = getattr(opbridge.ops, name).AUTOCAST
    if name == "nms_rotated":
        assert out[1].dtype == torch.int64
    elif rule.policy == "native":
        assert out.dtype == dtype
    elif rule.policy == "float32":
        assert out.dtype == inputs[rule.like].dtype
    else:  # promote
        assert out.dtype == torch.float32


def test_autocast_rules_cast_as_declared():
    """The casts themselves: native keeps precise inputs in float32, float64 is left alone, as autocast does."""
    rule = _autocast.Rule("native", precise=(1,))
    a, b = torch.randn(2), torch.randn(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast, back = _autocast.cast_arguments(rule, (a, b), "cpu")
        assert (cast[0].dtype, cast[1].dtype, back) == (torch.bfloat16, torch.float32, None)
        cast, _ = _autocast.cast_arguments(rule, (a.double(), b), "cpu")
        assert (cast[0].dtype, cast[1].dtype) == (torch.float64, torch.float32)
        cast, back = _autocast.cast_arguments(_autocast.Rule("float32", like=0), (a.bfloat16(), b), "cpu")
        assert (cast[0].dtype, back) == (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="native, float32 or promote"):
        _autocast.Rule("half")


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_gradients_reach_inputs_in_their_own_dtype(device):
    value, shapes, starts, locations, weights = _on(msda_module.sample_inputs(torch.float32, 2), device)
    leaves = [t.requires_grad_() for t in (value, locations, weights)]
    with torch.autocast(device, dtype=torch.bfloat16):
        out = opbridge.ms_deform_attn(leaves[0], shapes, starts, leaves[1], leaves[2])
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.dtype == torch.float32 and torch.isfinite(leaf.grad).all()


# --- AMP training steps: a Deformable-DETR encoder layer and a DCN block ----------------------------------------------


class _EncoderLayer(torch.nn.Module):
    """A Deformable-DETR encoder layer (the attention as transformers and Deformable DETR write it: value and
    offset projections, softmax over levels x points) and its feed-forward block."""

    def __init__(self, embed=32, heads=4, levels=2, points=4):
        super().__init__()
        self.heads, self.levels, self.points = heads, levels, points
        self.attention = opbridge.nn.MultiScaleDeformableAttention(embed, heads, levels, points)
        self.norm = torch.nn.LayerNorm(embed)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(embed, 64), torch.nn.ReLU(), torch.nn.Linear(64, embed))

    def forward(self, x, reference_points, shapes, starts):
        x = self.norm(x + self.attention(x, reference_points, x, shapes, starts))
        return x + self.ffn(x)


class _DcnBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dcn = opbridge.nn.ModulatedDeformConv2dPack(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.dcn(torch.relu(self.stem(x)))).mean((2, 3)))


def _encoder_batch():
    generator = torch.Generator().manual_seed(0)
    shapes = torch.tensor([[8, 10], [4, 5]])
    starts = torch.tensor([0, 80])
    x = torch.randn(2, 100, 32, generator=generator)
    ref = torch.rand(2, 100, 2, 2, generator=generator)
    target = torch.randn(2, 100, 32, generator=generator)
    return (x, ref, shapes, starts), target


def _dcn_batch():
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(4, 3, 12, 12, generator=generator),), torch.randn(4, 4, generator=generator)


def _train(model, batch, target, dtype, steps, compile=False, device="cpu"):
    torch.manual_seed(0)
    model, batch, target = model.to(device), _on(batch, device), target.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step():
        optimizer.zero_grad()
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.mse_loss(model(*batch).float(), target)
        loss.backward()
        return loss.detach()

    run = torch.compile(step) if compile else step
    losses, grads = [], None
    for i in range(steps):
        losses.append(float(run()))
        if i == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    return losses, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["encoder", "dcn"])
def test_amp_training_step_matches_float32_and_lowers_the_loss(kind, dtype, device):
    make, (batch, target) = {"encoder": (_EncoderLayer, _encoder_batch()), "dcn": (_DcnBlock, _dcn_batch())}[kind]
    torch.manual_seed(0)
    model = make()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reference_losses, reference_grads = _train(model, batch, target, None, 1, device=device)
    model.load_state_dict(state)
    losses, grads = _train(model, batch, target, dtype, 6, device=device)
    # Stated tolerance (docs/api.md): the first step's loss within 1% and every parameter's gradient within 2%
    # (float16) or 15% (bfloat16: 8 significant bits in every autocast product, the convolutions' and linear
    # layers' too) of its largest element of the float32 step. Measured 2026-11-27: 0.08% / 7.7% at most.
    tolerance = GRADIENT_TOLERANCE[dtype]
    assert math.isclose(losses[0], reference_losses[0], rel_tol=0.01), (losses[0], reference_losses[0])
    assert set(grads) == set(reference_grads)
    for name, grad in grads.items():
        expected = reference_grads[name]
        assert grad.dtype == torch.float32, name
        scale = float(expected.abs().max()) or 1.0
        assert float((grad - expected).abs().max()) <= tolerance * scale, name
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_of_an_amp_training_step(device):
    batch, target = _encoder_batch()
    torch.manual_seed(0)
    model = _EncoderLayer()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager, eager_grads = _train(model, batch, target, torch.bfloat16, 2, device=device)
    model.load_state_dict(state)
    compiled, compiled_grads = _train(model, batch, target, torch.bfloat16, 2, compile=True, device=device)
    assert math.isclose(compiled[0], eager[0], rel_tol=0.02), (compiled, eager)
    for name, grad in compiled_grads.items():
        scale = float(eager_grads[name].abs().max()) or 1.0
        assert float((grad - eager_grads[name]).abs().max()) <= GRADIENT_TOLERANCE[torch.bfloat16] * scale, name


# --- ONNX Runtime: the CPU library's float16 (and MyAdd's bfloat16) nodes, as other exporters write them -------------


def _ort_cases():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from ort_cases import deform_conv2d, grid_sampler, multi_scale_deformable_attention, my_add

    return deform_conv2d, grid_sampler, multi_scale_deformable_attention, my_add


def _ort_run(model: bytes, feeds: dict):
    import opbridge_ort

    return opbridge_ort.InferenceSession(model).run(None, feeds)[0]


def _f64(array) -> torch.Tensor:
    return torch.from_numpy(array).double()


@pytest.mark.parametrize(("op_type", "domain"), [("MultiScaleDeformableAttention", "opbridge"),
                                                 ("MMCVMultiScaleDeformableAttention", "mmdeploy")])  # fmt: skip
def test_ort_float16_msda_nodes_round_the_float64_value_once(op_type, domain):
    import numpy as np

    _, _, msda, _ = _ort_cases()
    feeds = msda.msda_case(np.random.default_rng(0), np.float16)
    out = _ort_run(msda.msda_model(np.float16, op_type, domain), feeds)
    expected = msda_module.reference(*(_f64(feeds[n]) if feeds[n].dtype == np.float16 else torch.from_numpy(feeds[n])
                                       for n in msda.NAMES))  # fmt: skip
    assert_rounded_once(torch.from_numpy(out), expected, torch.float16)


@pytest.mark.parametrize(("queries", "levels", "channels"), [(7, ((40, 50), (20, 25)), 32),  # decoder: query-major
                                                               (2500, ((40, 50), (20, 25)), 32),  # encoder: head-major
                                                               (2500, ((40, 50), (20, 25)), 24)],  # 16 + 8 channels
                         ids=["decoder", "encoder", "channels-24"])  # fmt: skip
def test_ort_float16_msda_node_is_its_float32_node_rounded_once(queries, levels, channels):
    """The CPU library's float16 MSDA node reads its inputs as stored where the CPU has AVX-512 (and widens them
    first elsewhere): either way, bit for bit the float32 node on the same values, rounded once."""
    import numpy as np

    _, _, msda, _ = _ort_cases()
    feeds = msda.msda_case(np.random.default_rng(1), np.float16, 2, levels, queries, 4, channels, 4)
    half = _ort_run(msda.msda_model(np.float16), feeds)
    widened = {n: a.astype(np.float32) if a.dtype == np.float16 else a for n, a in feeds.items()}
    want = _ort_run(msda.msda_model(np.float32), widened).astype(np.float16)
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("node", ["DeformConv2d", "mmcv::MMCVModulatedDeformConv2d",
                                  "mmdeploy::MMCVModulatedDeformConv2d", "mmcv::MMCVDeformConv2d"])  # fmt: skip
def test_ort_float16_deform_conv_nodes_round_the_float64_value_once(node):
    import numpy as np

    dcn, _, _, _ = _ort_cases()
    rng = np.random.default_rng(1)
    feeds, attributes = dcn.deform_case(rng, np.float16, stride=(1, 1), pads=(1, 1, 1, 1), k=(3, 3))
    x, w, offset, b, mask = (feeds[n] for n in ("X", "W", "offset", "B", "mask"))
    if node == "DeformConv2d":
        model, inputs = dcn.deform_model(np.float16, **attributes), feeds
    else:
        domain, op_type = node.split("::")
        common = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "deform_groups": 2}
        if op_type == "MMCVDeformConv2d":
            model, inputs = dcn.dcn_v1_model(domain, np.float16, **common), {"input": x, "offset": offset, "weight": w}
            b = mask = None
        else:
            model = dcn.mmcv_model(domain, np.float16, **common)
            inputs = {"input": x, "offset": offset, "mask": mask, "weight": w, "bias": b}
    out = _ort_run(model, inputs)
    expected = dcn_module.reference(_f64(x), _f64(offset), _f64(w), None if b is None else _f64(b), padding=(1, 1),
                                    mask=None if mask is None else _f64(mask))  # fmt: skip
    assert_rounded_once(torch.from_numpy(out), expected, torch.float16)


@pytest.mark.parametrize("domain", ["mmcv", "mmdeploy"])
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
def test_ort_float16_grid_sampler_rounds_the_float64_value_once(interpolation, domain):
    import numpy as np

    _, grid_sampler, _, _ = _ort_cases()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 9)).astype(np.float16)
    grid = rng.uniform(-1.3, 1.3, (2, 5, 7, 2)).astype(np.float16)
    attributes = grid_sampler.as_symbolic(interpolation, "zeros", False)
    out = _ort_run(grid_sampler.grid_model(np.float16, domain, **attributes), {"input": x, "grid": grid})
    expected = torch.nn.functional.grid_sample(_f64(x), _f64(grid), interpolation, "zeros", False)
    assert_rounded_once(torch.from_numpy(out), expected, torch.float16)


def test_ort_bfloat16_my_add():
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper

    import opbridge_ort

    a = torch.randn(4, 37, dtype=torch.float64).to(torch.bfloat16)
    b = torch.randn(37, dtype=torch.float64).to(torch.bfloat16)
    node = helper.make_node("MyAdd", ["A", "B"], ["C"], domain="opbridge")
    info = lambda name: helper.make_tensor_value_info(name, TensorProto.BFLOAT16, None)  # noqa: E731
    graph = helper.make_graph([node], "g", [info("A"), info("B")], [info("C")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    session = opbridge_ort.InferenceSession(model.SerializeToString())
    as_ort = lambda t: onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(  # noqa: E731
        t.view(torch.int16).numpy().view(np.uint16), TensorProto.BFLOAT16
    )
    # numpy has no bfloat16: the output goes into a uint16 buffer bound as bfloat16 (ORT writes it in place).
    result = np.zeros((4, 37), dtype=np.uint16)
    binding = session.io_binding()
    binding.bind_ortvalue_input("A", as_ort(a))
    binding.bind_ortvalue_input("B", as_ort(b))
    binding.bind_ortvalue_output(
        "C", onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(result, TensorProto.BFLOAT16)
    )
    session.run_with_iobinding(binding)
    bits = torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
    assert torch.equal(bits, opbridge.my_add(a, b))  # both: float32 arithmetic, one rounding, the same bits
    assert_rounded_once(bits, 2 * a.double() + b.double(), torch.bfloat16)


def _float16_node_cases():
    """(name, model builder taking a dtype, feeds of float16-representable values) for every other node of the CPU
    library that other exporters write (mmcv, mmdeploy) and opbridge's rotated nodes."""
    import numpy as np

    from ort_cases import (
        box_iou_rotated,
        carafe,
        cummax,
        masked_conv2d,
        nms,
        nms_match,
        nms_rotated,
        psa_mask,
        roi_align,
        roi_align_rotated,
        rotated_feature_align,
    )

    rng = np.random.default_rng(7)
    half = lambda a: np.asarray(a).astype(np.float16).astype(np.float64)  # noqa: E731
    x = half(rng.standard_normal((2, 3, 9, 11)))
    boxes, scores = nms.random_clusters(rng, 30)
    rois = np.concatenate([rng.integers(0, 2, (6, 1)), rng.uniform(-4, 10, (6, 2)), np.zeros((6, 2))], axis=1)
    rois[:, 3:5] = rois[:, 1:3] + rng.uniform(0, 14, (6, 2))
    rotated = np.concatenate([rng.integers(0, 2, (5, 1)), rng.uniform(0, 10, (5, 2)), rng.uniform(1, 6, (5, 2)),
                              rng.uniform(-3, 3, (5, 1))], axis=1)  # fmt: skip
    rboxes = np.concatenate([rng.uniform(0, 9, (5, 2)), rng.uniform(1, 5, (5, 2)), rng.uniform(-3, 3, (5, 1))], 1)
    align_boxes = np.concatenate([rng.uniform(-2, 30, (2, 5, 6, 2)), rng.uniform(0, 16, (2, 5, 6, 2)),
                                  rng.uniform(-2, 2, (2, 5, 6, 1))], axis=3)  # fmt: skip
    weight, bias = rng.standard_normal((6, 3, 3, 3)), rng.standard_normal(6)
    score = rng.random((1, 9, 11)) - 0.4
    batched_boxes = np.concatenate([rboxes[None], rboxes[None] + 0.5], 1)
    return [
        ("mmcv::MMCVRoiAlign",
         lambda d: roi_align.roi_align_model(d, **roi_align.as_symbolic((3, 2), 0.5, 2, "avg", 1)),
         {"input": x, "rois": half(rois)}),
        ("mmcv::NonMaxSuppression", lambda d: nms.nms_model(d, iou_threshold=0.45, offset=0),
         {"boxes": half(boxes), "scores": half(scores)}),
        ("mmcv::SoftNonMaxSuppression", lambda d: nms.soft_nms_model(d, **nms.soft_symbolic(0.3, 0.5, 0.05, 2, 0)),
         {"boxes": half(boxes), "scores": half(scores)}),
        ("mmdeploy::NMSMatch", lambda d: nms_match.nms_match_model(d),
         {"boxes": half(boxes)[None], "scores": half(scores)[None, None], "iou_threshold": np.array([0.5]),
          "score_threshold": np.array([0.25])}),
        ("mmcv::cummax", lambda d: cummax.cumulative_model("cummax", d, dim=2), {"input": x}),
        ("mmcv::cummin", lambda d: cummax.cumulative_model("cummin", d, dim=-1), {"input": x}),
        ("mmcv::MMCVCornerPool", lambda d: cummax.cumulative_model("MMCVCornerPool", d, mode=2), {"input": x}),
        ("mmcv::MMCVPSAMask", lambda d: psa_mask.psa_mask_model(d, psa_type=1, mask_size=[3, 3]),
         {"input": half(rng.standard_normal((2, 9, 5, 7)))}),
        ("mmcv::MMCVCARAFE", lambda d: carafe.carafe_model("MMCVCARAFE", d, **carafe.as_symbolic(3, 1, 2)),
         {"features": half(rng.standard_normal((2, 4, 5, 6))), "masks": half(rng.random((2, 9, 10, 12)))}),
        ("mmcv::MMCVMaskedConv2d", lambda d: masked_conv2d.masked_conv_model(d, d, True, padding=[1, 1], stride=[1, 1]),
         {"features": x[:1], "mask": half(score), "weight": half(weight), "bias": half(bias)}),
        ("mmcv::MMCVMaskedConv2d (bool mask)",
         lambda d: masked_conv2d.masked_conv_model(d, bool, True, padding=[1, 1], stride=[1, 1]),
         {"features": x[:1], "mask": score > 0, "weight": half(weight), "bias": half(bias)}),
        *[(f"{domain}::{op}", lambda d, op=op, domain=domain: roi_align_rotated.roi_model(
            d, op, domain, **roi_align_rotated.as_symbolic(2, 3, 0.5, 0, True, False)),
           {"input": x, "rois": half(rotated)})
          for op, domain in (("RoiAlignRotated", "opbridge"), ("MMCVRoIAlignRotated", "mmcv"),
                             ("MMCVRoIAlignRotated", "mmdeploy"))],
        *[(f"{domain}::{op}", lambda d, op=op, domain=domain: rotated_feature_align.align_model(
            d, op, domain, spatial_scale=0.125, points=5),
           {"features": half(rng.standard_normal((2, 3, 5, 6))), "best_rboxes": half(align_boxes)})
          for op, domain in (("RotatedFeatureAlign", "opbridge"), ("MMCVRotatedFeatureAlign", "mmcv"))],
        ("opbridge::BoxIouRotated", lambda d: box_iou_rotated.iou_model(d, mode=0, aligned=0, clockwise=1),
         {"boxes1": half(rboxes), "boxes2": half(rboxes[::-1] + 0.3)}),
        ("opbridge::NmsRotated", lambda d: nms_rotated.nms_model(d, iou_threshold=0.2),
         {"boxes": half(np.concatenate([rboxes, rboxes + 0.4])), "scores": half(rng.random(10))}),
        ("mmdeploy::NMSRotated", lambda d: nms_rotated.mmdeploy_model(d, iou_threshold=0.2, score_threshold=0.1),
         {"boxes": half(batched_boxes), "scores": half(rng.random((1, 2, 10)))}),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(19))
def test_ort_float16_node_is_its_float32_node_rounded_once(index):
    """A float16 node computes what its float32 node computes on the same values, rounded once (bit for bit: the
    same float32 kernel); integer outputs (indices) are equal."""
    import numpy as np

    _ort_cases()  # puts tests/ on the path
    cases = _float16_node_cases()
    assert len(cases) == 19, "update the parametrization's range to the number of cases"
    name, build, feeds = cases[index]

    def typed(dtype):
        return {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in feeds.items()}

    wide = _ort_run_all(build(np.float32), typed(np.float32))
    half = _ort_run_all(build(np.float16), typed(np.float16))
    for got, want in zip(half, wide, strict=True):
        if want.dtype == np.float32:
            assert got.dtype == np.float16, name
            np.testing.assert_array_equal(got, want.astype(np.float16), err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert want.size > 0 or name.endswith("NMSMatch"), f"{name}: an empty output checks nothing"


def _as_bfloat16(model: bytes) -> bytes:
    """The float16 model with bfloat16 in its place, fed and read in float32 (numpy has no bfloat16): each float16
    graph input is cast to bfloat16 inside the graph, each float16 output cast back to float32 (both exact)."""
    import onnx
    from onnx import TensorProto, helper

    proto = onnx.load_from_string(model)
    graph = proto.graph
    head, tail = [], []
    for value, at_input in [*((v, True) for v in graph.input), *((v, False) for v in graph.output)]:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        value.type.tensor_type.elem_type = TensorProto.FLOAT
        inner = value.name + "_bfloat16"
        for node in graph.node:
            names = node.input if at_input else node.output
            names[:] = [inner if name == value.name else name for name in names]
        if at_input:
            head.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.BFLOAT16))
        else:
            tail.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT))
    nodes = [*head, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)
    return proto.SerializeToString()


def _bfloat16_node_cases():
    """(name, model builder taking a dtype, feeds) for the nodes of the CPU library that _float16_node_cases leaves
    to tests of their own: the deformable convolutions, MSDA (query- and head-major), grid_sampler, MyAdd."""
    import numpy as np

    dcn, grid_sampler, msda, my_add = _ort_cases()
    rng = np.random.default_rng(3)
    feeds, attributes = dcn.deform_case(rng, np.float32, stride=(1, 1), pads=(1, 1, 1, 1), k=(3, 3))
    common = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "deform_groups": 2}
    mmcv = {"input": feeds["X"], "offset": feeds["offset"], "mask": feeds["mask"], "weight": feeds["W"],
            "bias": feeds["B"]}  # fmt: skip
    cases = [
        ("opbridge::DeformConv2d", lambda d: dcn.deform_model(d, **attributes), feeds),
        *[(f"{domain}::MMCVModulatedDeformConv2d", lambda d, domain=domain: dcn.mmcv_model(domain, d, **common), mmcv)
          for domain in ("mmcv", "mmdeploy")],
        ("mmcv::MMCVDeformConv2d", lambda d: dcn.dcn_v1_model("mmcv", d, **common),
         {k: mmcv[k] for k in ("input", "offset", "weight")}),
        ("opbridge::MyAdd", lambda d: my_add.my_add_model(d), {"A": rng.standard_normal((3, 5)),
                                                              "B": rng.standard_normal((3, 5))}),
    ]  # fmt: skip
    for queries in (7, 2500):  # the decoder's query-major order, the encoder's head-major one
        msda_feeds = msda.msda_case(rng, np.float32, 2, ((40, 50), (20, 25)), queries, 4, 24, 4)
        for op_type, domain in (("MultiScaleDeformableAttention", "opbridge"),
                                ("MMCVMultiScaleDeformableAttention", "mmdeploy")):  # fmt: skip
            cases.append((f"{domain}::{op_type} ({queries} queries)",
                          lambda d, o=op_type, m=domain: msda.msda_model(d, o, m), msda_feeds))  # fmt: skip
    x, grid = rng.standard_normal((2, 3, 6, 9)), rng.uniform(-1.3, 1.3, (2, 5, 7, 2))
    for interpolation in ("bilinear", "nearest", "bicubic"):
        symbolic = grid_sampler.as_symbolic(interpolation, "zeros", False)
        build = lambda d, a=symbolic: grid_sampler.grid_model(d, "mmcv", **a)  # noqa: E731
        cases.append((f"mmcv::grid_sampler ({interpolation})", build, {"input": x, "grid": grid}))
    return cases


@pytest.mark.parametrize("index", range(19 + 12))
def test_ort_bfloat16_node_is_its_float32_node_rounded_once(index):
    """Every node of the CPU library takes bfloat16 (a model another tool wrote in bfloat16): it computes what its
    float32 node computes on the same values, rounded once to bfloat16 (bit for bit), except the deformable
    convolutions where this process multiplies in bfloat16 (one rounding more of each column); integer outputs are
    equal."""

    _ort_cases()  # puts tests/ on the path
    cases = _float16_node_cases() + _bfloat16_node_cases()
    assert len(cases) == 19 + 12, "update the parametrization's range to the number of cases"
    name, build, feeds = cases[index]
    if "DeformConv2d" in name and dcn_module.cpu_bf16_products():  # bfloat16 products: two roundings
        _check_dcn_bfloat16_products(name, feeds, *_bfloat16_node_outputs(build, feeds))
        return
    _check_bfloat16_node(build, feeds, name)


def _check_bfloat16_node(build, feeds, name):
    import numpy as np

    wide, narrow = _bfloat16_node_outputs(build, feeds)
    for got, want in zip(narrow, wide, strict=True):
        if want.dtype == np.float32:
            rounded = torch.from_numpy(want).bfloat16().float().numpy()
            np.testing.assert_array_equal(got.view(np.uint32), rounded.view(np.uint32), err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert want.size > 0 or name.endswith("NMSMatch"), f"{name}: an empty output checks nothing"


def _bfloat16_node_outputs(build, feeds):
    """The float32 node's outputs and the bfloat16 node's (as float32) on the same bfloat16 values."""
    import numpy as np

    # bfloat16 values, held in float32 (what the model's casts give the node).
    feeds = {k: torch.from_numpy(np.asarray(v, np.float32)).bfloat16().float().numpy() if v.dtype.kind == "f" else v
             for k, v in feeds.items()}  # fmt: skip
    return _ort_run_all(build(np.float32), feeds), _ort_run_all(_as_bfloat16(build(np.float16)), feeds)


_ORT_BF16_PATHS = """
import pickle, sys
sys.path.insert(0, sys.argv[2])
import test_mixed_precision as t
cases = [c for c in t._bfloat16_node_cases() if "DeformConv2d" in c[0]]
results = [(name, feeds, *t._bfloat16_node_outputs(build, feeds)) for name, build, feeds in cases]
with open(sys.argv[1], "wb") as f:
    pickle.dump(results, f)
"""


@pytest.mark.parametrize("products", ["0", "1"])
def test_ort_bfloat16_deform_conv_nodes_take_either_path(products, tmp_path):
    """The ORT library's bfloat16 deformable convolution nodes (opbridge's, mmcv's DCNv2 and DCNv1, mmdeploy's), as
    the torch op: OPBRIDGE_CPU_BF16_GEMM=0, the float32 node on the widened values rounded once (bit for bit); 1 (the
    default on CPUs with AVX512-BF16), the columns rounded to bfloat16 and multiplied by kernels/linear_bf16.h: within
    one rounding more of each product's column of the float64 value. Both run on any CPU."""
    import os
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    saved = tmp_path / "out.pickle"
    env = dict(os.environ, OPBRIDGE_CPU_BF16_GEMM=products)
    script = [sys.executable, "-c", _ORT_BF16_PATHS, str(saved), str(Path(__file__).parent)]
    subprocess.run(script, env=env, check=True, timeout=300)
    results = pickle.loads(saved.read_bytes())
    assert len(results) == 4
    for name, feeds, wide, narrow in results:
        if products == "0":
            ((want,), (got,)) = wide, narrow
            assert np.array_equal(
                got.view(np.uint32), torch.from_numpy(want).bfloat16().float().numpy().view(np.uint32)
            ), name
            continue
        _check_dcn_bfloat16_products(name, feeds, wide, narrow)


def _cpu_has_avx512_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in info)
    except OSError:
        return False


_NO_AVX512_BF16 = ("needs a CPU with AVX512-BF16: elsewhere the torch op's bfloat16 products run on oneDNN and the "
                   "node's on the portable loop (OPBRIDGE_CPU_BF16_GEMM=1)")  # fmt: skip


@pytest.mark.skipif(not _cpu_has_avx512_bf16(), reason=_NO_AVX512_BF16)
def test_ort_bfloat16_deform_conv_node_gives_the_torch_ops_bits():
    """On a CPU with AVX512-BF16 the torch op and the ORT library's bfloat16 DeformConv2d node multiply with one GEMM
    (kernels/linear_bf16.h: AMX tiles where the CPU has them, else vdpbf16ps): the same bits. A shape with tails of
    everything: 460 pixels (blocks of 32 rows and a rest), 48 outputs (a pair of 16-output panels and one panel),
    k = 40 x 9 = 360 (chunks of 32 and a rest of 8), two offset groups."""
    import numpy as np

    assert dcn_module.cpu_bf16_products(), "AVX512-BF16: the bfloat16 products are the default"
    dcn = _ort_cases()[0]
    rng = np.random.default_rng(7)
    feeds, attributes = dcn.deform_case(rng, np.float32, n=1, c=40, h=20, w=23, c_out=48, k=(3, 3), stride=(1, 1),
                                        pads=(1, 1, 1, 1), groups=1, offset_groups=2)  # fmt: skip
    feeds = {k: torch.from_numpy(v).bfloat16().float().numpy() for k, v in feeds.items()}  # bfloat16 values
    (node,) = _ort_run_all(_as_bfloat16(dcn.deform_model(np.float16, **attributes)), feeds)
    x, weight, offset, bias, mask = (torch.from_numpy(feeds[k]) for k in ("X", "W", "offset", "B", "mask"))
    op = opbridge.deform_conv2d(x.bfloat16(), offset, weight.bfloat16(), bias.bfloat16(), padding=(1, 1), mask=mask)
    assert op.dtype == torch.bfloat16
    assert torch.equal(torch.from_numpy(node).bfloat16(), op)


def _check_dcn_bfloat16_products(name, feeds, wide, narrow):
    """A bfloat16 deformable convolution node that multiplies in bfloat16: within one rounding more of each product's
    column of the float64 value, and not the float32 path's result."""
    ((want,), (got,)) = wide, narrow
    got = torch.from_numpy(got).bfloat16()  # exact: the model casts bfloat16 to float32
    assert not torch.equal(got, torch.from_numpy(want).bfloat16()), f"{name}: the float32 path ran"
    values = {k: torch.from_numpy(v).bfloat16().double() for k, v in feeds.items()}
    x, offset, mask = values.get("X", values.get("input")), values["offset"], values.get("mask")
    weight, bias = values.get("W", values.get("weight")), values.get("B", values.get("bias"))
    if mask is None:
        mask = torch.ones(offset.shape[0], offset.shape[1] // 2, *offset.shape[2:], dtype=torch.float64)
    expected = dcn_module.reference(x, offset, weight, bias, padding=(1, 1), mask=mask)
    assert_rounded_once(got, expected, torch.bfloat16, _dcn_product_terms(x, offset, weight, bias, mask))


def _ort_run_all(model: bytes, feeds: dict):
    import opbridge_ort

    options = opbridge_ort.session_options()
    options.intra_op_num_threads = 1
    return opbridge_ort.InferenceSession(model, options).run(None, feeds)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["model.bfloat16()", "autocast"])
def test_patch_model_serves_half_precision_layers_at_the_librarys_accuracy_or_better(mode, device, monkeypatch):
    """A transformers Deformable DETR in bfloat16 (or under CPU autocast): patch_model runs its attention on
    opbridge's op instead of handing it back, and the output is as close to the float32 model's as the library's
    own bfloat16 path is, or closer."""
    import contextlib

    pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")
    from opbridge.tools import models

    calls = []
    original = msda_module.ms_deform_attn
    monkeypatch.setattr(msda_module, "ms_deform_attn", lambda *a: calls.append(a[0].dtype) or original(*a))
    config, extra = models.TRANSFORMERS_MSDA["DeformableDetrModel"]
    torch.manual_seed(0)
    import transformers

    model = models._HuggingFaceWrapper(transformers.DeformableDetrModel(config()).eval(), extra)
    pixels = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    models._unit_scale_convolutions(model, (pixels,))
    model, pixels = model.to(device), pixels.to(device)
    with torch.no_grad():
        reference = model(pixels).double()
        if mode == "autocast":
            context, inputs = torch.autocast(device, dtype=torch.bfloat16), pixels
        else:
            context, inputs = contextlib.nullcontext(), pixels.bfloat16()
            model = model.bfloat16()
        with context:
            library = model(inputs).double()
            with opbridge.patch_model(model):
                ours = model(inputs).double()
    assert calls and all(dtype == torch.bfloat16 for dtype in calls), calls
    library_error = float((library - reference).abs().max())
    our_error = float((ours - reference).abs().max())
    assert our_error <= 1.5 * library_error + 1e-3, (our_error, library_error)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_patch_model_training_step_under_autocast_is_as_close_to_float32_as_the_librarys(dtype, device, monkeypatch):
    """A transformers Deformable DETR training step (forward, loss, backward) under autocast, with patch_model: the
    attention runs on opbridge's op in the autocast dtype, every parameter the float32 step gives a gradient gets
    one, and the gradients are as close to the float32 step's as the library's own autocast step (its grid_sample
    loop) is, or closer: overall, and for the attention's own projections (sampling offsets, attention weights,
    value), whose gradients come through the op's backward."""
    import contextlib
    import copy

    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")
    from opbridge.tools import models

    calls = []
    original = msda_module.ms_deform_attn
    monkeypatch.setattr(msda_module, "ms_deform_attn", lambda *a: calls.append(a[0].dtype) or original(*a))
    config, _ = models.TRANSFORMERS_MSDA["DeformableDetrModel"]
    torch.manual_seed(0)
    base = transformers.DeformableDetrModel(config()).eval()  # eval: no dropout, so the three steps are comparable
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # the initial offsets put samples on pixel centres, where bilinear sampling has a kink
        for name, parameter in base.named_parameters():
            if "sampling_offsets.bias" in name:
                parameter.add_(torch.rand(parameter.shape, generator=generator) * 0.3)
    pixels = torch.rand(2, 3, 96, 128, generator=generator).to(device)
    # A loss of a random projection of the output: the decoder's output is layer-normed, so the mean of its squares
    # hardly depends on the parameters, and its gradients would be float32 rounding noise.
    projection = torch.randn(2, 10, 32, generator=generator).to(device)

    def step(autocast: bool, patched: bool) -> dict[str, torch.Tensor]:
        model = copy.deepcopy(base).to(device)
        context = torch.autocast(device, dtype=dtype) if autocast else contextlib.nullcontext()
        with context, opbridge.patch_model(model) if patched else contextlib.nullcontext():
            loss = (model(pixel_values=pixels).last_hidden_state.float() * projection).mean()
        loss.backward()
        return {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}

    reference = step(autocast=False, patched=False)
    library = step(autocast=True, patched=False)
    assert not calls
    ours = step(autocast=True, patched=True)
    assert calls and all(d == dtype for d in calls), calls
    assert set(ours) == set(reference), "parameters that lost (or gained) their gradient under patch_model"

    def error(grads, names):
        difference = torch.cat([(grads[n] - reference[n]).flatten() for n in names])
        return float(difference.norm() / torch.cat([reference[n].flatten() for n in names]).norm())

    attention = [n for n in reference if any(k in n for k in ("sampling_offsets", "attention_weights", "value_proj"))]
    assert attention
    for names in (list(reference), attention):
        our_error, library_error = error(ours, names), error(library, names)
        assert our_error <= 1.5 * library_error + 1e-4, (len(names), our_error, library_error)


# --- opcheck: fake kernels, autograd and the dispatcher agree on half and mixed dtypes ------------------------------

_OPCHECK = {
    "ms_deform_attn": (torch.ops.opbridge.ms_deform_attn.default, (0, 3, 4)),
    "deform_conv2d": (torch.ops.opbridge.deform_conv2d.default, (0, 1, 2, 3, 7)),
    "roi_align_rotated": (torch.ops.opbridge.roi_align_rotated.default, (0,)),
    "rotated_feature_align": (torch.ops.opbridge.rotated_feature_align.default, (0,)),
    "my_add": (torch.ops.opbridge.my_add.default, (0, 1)),
}


def _opcheck_arguments(name, dtype, mixed):
    build, precise = CASES[name]
    _, inputs, _ = build(dtype, precise if mixed else ())
    if name == "deform_conv2d":
        x, offset, weight, bias, mask = inputs
        return [x, offset, weight, bias, [1, 1], [1, 1], [1, 1], mask]
    if name == "roi_align_rotated":
        return [*inputs, 2, 2, 1.0, 0, True, False]
    if name == "rotated_feature_align":
        return [*inputs, 1 / 8, 1]
    return inputs


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("mixed", [False, True], ids=["all-half", "precise-inputs-float32"])
@pytest.mark.parametrize("name", list(_OPCHECK))
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_half_inputs(name, mixed, dtype, device):
    op, differentiable = _OPCHECK[name]
    arguments = _on(_opcheck_arguments(name, dtype, mixed), device)
    leaves = [a.detach().clone().requires_grad_(i in differentiable) if isinstance(a, torch.Tensor) else a
              for i, a in enumerate(arguments)]  # fmt: skip
    for inputs in (arguments, leaves):
        torch.library.opcheck(op, inputs)


# torch ops whose export rules opbridge replaces (opbridge/mappings): a half model that exports without opbridge
# exports with it too, computed in float32 inside and rounded once (specs.half_storage), and runs in ONNX Runtime.
def _interpolate_aa(mode):
    return lambda x: torch.nn.functional.interpolate(x, size=(3, 4), mode=mode, antialias=True)


_MAPPED_HALF = {
    "interpolate antialias bilinear": (_interpolate_aa("bilinear"), lambda g: (torch.randn(1, 3, 8, 9, generator=g),)),
    "interpolate antialias bicubic": (_interpolate_aa("bicubic"), lambda g: (torch.randn(1, 3, 8, 9, generator=g),)),
    "scatter_reduce mean": (
        lambda x, s: x.scatter_reduce(1, torch.tensor([[0, 1, 0, 2]] * 3), s, "mean"),
        lambda g: (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)),
    ),
    "grid_sample bilinear": (
        lambda x, grid: torch.nn.functional.grid_sample(x, grid, align_corners=False),
        lambda g: (torch.randn(1, 3, 6, 7, generator=g), torch.rand(1, 4, 5, 2, generator=g) * 2.2 - 1.1),
    ),
}


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize("case", sorted(_MAPPED_HALF))
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 13), (False, 17), (True, 18)])
def test_half_exports_of_torch_ops_with_opbridge_rules_run_in_float32_inside(case, dynamo, opset, tmp_path):
    import numpy as np
    import onnxruntime

    if case.startswith("scatter_reduce") and opset < 16:
        pytest.skip("ScatterElements has reductions from opset 16 (no rule below it, with or without opbridge)")
    if case.startswith("interpolate") and not dynamo:
        pytest.skip("torch's CPU kernel of antialiased interpolation takes no half inputs, and the TorchScript "
                    "exporter runs the model (the dynamo exporter traces it without running)")  # fmt: skip
    fn, make = _MAPPED_HALF[case]
    inputs = make(torch.Generator().manual_seed(5))
    model = _Lambda(fn).eval()
    for dtype in HALF:
        half = tuple(t.to(dtype) for t in inputs)
        path = tmp_path / f"{dtype}.onnx"
        torch.onnx.export(model, half, path, dynamo=dynamo, opset_version=opset)  # bfloat16: exports too
        if dtype is torch.bfloat16:
            continue  # ONNX Runtime's CPU kernels of these nodes take no bfloat16
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), half, strict=True)}
        (got,) = session.run(None, feeds)
        assert got.dtype == np.float16
        want = fn(*(t.double() for t in half))  # the float64 value of the same half inputs
        # One rounding of the float64 value, plus float32 arithmetic: a half ulp of each output and a little more;
        # half arithmetic inside (a rounding per node) is several times that on these inputs.
        error = (torch.from_numpy(got).double() - want).abs()
        bound = UNIT[dtype] * want.abs() + 1e-3 * UNIT[dtype] * want.abs().max()
        assert (error <= bound).all(), f"{case}: max error {error.max():.3g} (bound {bound.max():.3g})"


# Real DETR-family models (transformers, random weights, small configs: the model sweep's cases) after
# `model.half()`, exported with opbridge (the standard lowering, or the custom one: the library's float16 node) and run
# in ONNX Runtime's CPU provider: as close to the float64 value of the same half weights and inputs as torch's own
# float16 forward is. Mask2Former's and OneFormer's sine position embeddings call `torch.arange(n, dtype=x.dtype)`,
# which torch's TorchScript rule exported as a float16 Range no runtime loads (opbridge.mappings.arange); Deformable
# DETR's `pixel_mask.cumsum(1, dtype=float16)` was a float16 CumSum at opset 11, which ONNX has from opset 14
# (opbridge.mappings.cumsum). GroundingDINO's TorchScript export is left out: torch writes a float32 bias into its
# float16 text encoder's LayerNormalization there, with or without opbridge.
_HALF_MODELS = [
    ("transformers.DeformableDetrModel", False, "standard", 11),  # its position embedding's cumsum: float32 inside
    ("transformers.DeformableDetrModel", True, "custom", 18),
    ("transformers.Mask2FormerModel", False, "standard", 17),
    ("transformers.Mask2FormerModel", True, "custom", 18),
    ("transformers.OneFormerModel", False, "standard", 17),
    ("transformers.GroundingDinoModel", True, "standard", 18),
]


@pytest.mark.parametrize(
    ("name", "dynamo", "lowering", "opset"),
    _HALF_MODELS,
    ids=[f"{n.split('.')[1]}-{'dynamo' if d else 'legacy'}{o}-{lw}" for n, d, lw, o in _HALF_MODELS],
)
def test_float16_detr_models_export_and_run_as_close_to_float64_as_torchs_float16(name, dynamo, lowering, opset):
    import copy
    import io
    import warnings

    import onnxruntime

    import opbridge_ort

    pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")
    from opbridge.tools import models

    module, inputs, _, _ = models.CASES[name].build()
    module.eval()
    wide = copy.deepcopy(module).to(torch.float64)
    module.half()
    inputs = tuple(t.half() if t.is_floating_point() else t for t in inputs)
    opbridge.patch_model(module)
    opbridge.patch_model(wide)
    with torch.no_grad():
        want = [
            t.double() for t in models._flatten(wide(*(t.double() if t.is_floating_point() else t for t in inputs)))
        ]
        eager = models._flatten(module(*inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = opbridge.onnx.export(module, inputs, io.BytesIO(), dynamo=dynamo, opset_version=opset,
                                     lowering=lowering)  # fmt: skip
    custom = [n for n in proto.graph.node if n.op_type == "MultiScaleDeformableAttention"]
    assert bool(custom) == (lowering == "custom"), "the custom lowering writes the library's node, float16 in and out"
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # ORT warns that it cannot constant-fold float16 nodes on the CPU
    session = opbridge_ort.InferenceSession(proto.SerializeToString(), options)
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (t.numpy() for t in models._flatten(inputs)), strict=True)))
    assert len(got) == len(want)
    for g, e, w in zip(got, eager, want, strict=True):
        assert g.dtype == e.numpy().dtype, "a half model's outputs come back half"
        scale = w.abs().max()
        ort_error = (torch.from_numpy(g).double() - w).abs().max() / scale
        eager_error = (e.double() - w).abs().max() / scale
        # Measured 2026-11-29: ORT 0.86-0.89x torch's float16 error (8.6e-4 to 1.5e-3 of the output's scale).
        assert ort_error <= 1.5 * eager_error + 1e-4, f"ORT {ort_error:.3g}, torch float16 {eager_error:.3g}"
