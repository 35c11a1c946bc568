"""The GPU benchmark's second half (``python -m opbridge.tools.bench_cuda`` prints it after the first): what issue
45 and 44 measure beyond the encoder-sized calls, each against a baseline timed in the same run.

- ``decoder_rows``: multi-scale deformable attention at the issue's anchor shapes, a DETR decoder's call (300
  queries, batch 2, 4 levels of an 800x1333 image), where host time decides, and the encoder's (800x1333, batch
  2): ``opbridge.ms_deform_attn`` against a bare ``torch.autograd.Function`` over the same two kernels (what the
  original Deformable-DETR extension is), forward, training step and host microseconds per call (calls issued back
  to back, then one wait).
- ``half_rows``: the float16 and bfloat16 kernels against the same op in float32 (forward, training step), with the
  output's error against the float64 op on the same rounded inputs.
- ``rotated_rows``: the rotated ops' CUDA kernels against torchvision's CUDA ``roi_align``/``nms``/``box_iou`` on the
  same boxes at angle 0 (equal work for roi_align; the axis-aligned IoU is cheaper than polygon clipping), and
  against the same op on the CPU.
- ``rotated_torch_rows``: the rotated ops at any angle against the CPU benchmark's tensor versions of them, run on
  the same GPU (Green's theorem over clipped edges, greedy NMS as a fixed point, gathers), outputs compared.
- ``ort_standard_rows``: opbridge's ORT CUDA nodes for mmcv/mmdeploy's ``grid_sampler``, ``NonMaxSuppression`` and
  ``MMCVRoiAlign`` against ONNX Runtime's own ``GridSample``, ``NonMaxSuppression`` and ``RoiAlign`` on the CUDA
  execution provider, same inputs.
- ``ort_node_rows``: the CUDA nodes of 2026-11-28 (mmdeploy's ``NMSRotated`` and ``NMSMatch``, mmcv's ``cummax``,
  ``MMCVCornerPool``, ``MMCVPSAMask``, ``MMCVCARAFE``, ``MMCVMaskedConv2d``), which ONNX Runtime has no kernel of
  its own for, against the same node on the CPU provider (where they ran before), with the outputs compared.

A section that fails reports its error instead of its rows, so one run on a borrowed GPU gives every other number.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable

import torch

import opbridge

from .bench.ms_deform_attn import CASES, HEADS, POINTS, encoder_inputs


def _time_ms(fn: Callable[[], object], repeat: int) -> float:
    from .bench_cuda import time_ms

    return time_ms(fn, repeat)


def _host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Microseconds of host time per call: `calls` calls issued back to back, then one wait."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


class _BareFunction(torch.autograd.Function):
    """The original extension's shape: an autograd.Function calling the forward and backward kernels directly."""

    @staticmethod
    def forward(ctx, value, shapes, starts, locations, weights):
        ctx.save_for_backward(value, shapes, starts, locations, weights)
        return torch.ops.opbridge.ms_deform_attn(value, shapes, starts, locations, weights)

    @staticmethod
    def backward(ctx, grad):
        value, shapes, starts, locations, weights = ctx.saved_tensors
        grads = torch.ops.opbridge.ms_deform_attn_backward(grad.contiguous(), value, shapes, starts, locations,
                                                             weights)  # fmt: skip
        return grads[0], None, None, grads[1], grads[2]


def decoder_inputs(batch: int = 2, queries: int = 300, levels=None):
    levels = levels or CASES["800x1333 enc"]
    generator = torch.Generator().manual_seed(1)
    value, shapes, starts = encoder_inputs(levels)[:3]
    value = value.expand(batch, -1, -1, -1).contiguous()
    locations = torch.rand(batch, queries, HEADS, len(levels), POINTS, 2, generator=generator)
    weights = torch.randn(batch, queries, HEADS, len(levels), POINTS, generator=generator)
    weights = weights.flatten(-2).softmax(-1).view_as(weights)
    return [t.cuda() for t in (value, shapes, starts, locations, weights)]


def encoder_batch_inputs(batch: int = 2):
    """Deformable DETR's encoder at 800x1333 with `batch` images (the issue's anchor shape)."""
    value, shapes, starts, locations, weights = encoder_inputs(CASES["800x1333 enc"])
    value, locations, weights = (t.expand(batch, *t.shape[1:]).contiguous() for t in (value, locations, weights))
    return [t.cuda() for t in (value, shapes, starts, locations, weights)]


def decoder_rows(repeat: int) -> list[dict]:
    cases = {"decoder: 300 queries, batch 2, 4 levels": decoder_inputs(),
             "encoder 800x1333, batch 2": encoder_batch_inputs()}  # fmt: skip
    return [row for case, inputs in cases.items() for row in _anchor_rows(case, inputs, repeat)]


def _anchor_rows(case: str, inputs: list, repeat: int) -> list[dict]:
    leaves = [inputs[0].clone().requires_grad_(), inputs[1], inputs[2], inputs[3].clone().requires_grad_(),
              inputs[4].clone().requires_grad_()]  # fmt: skip
    wrt = [leaves[0], leaves[3], leaves[4]]
    paths = {"opbridge.ms_deform_attn": opbridge.ms_deform_attn, "bare autograd.Function": _BareFunction.apply}
    grad = torch.randn_like(opbridge.ms_deform_attn(*inputs))
    expected = torch.autograd.grad(_BareFunction.apply(*leaves), wrt, grad)
    got = torch.autograd.grad(opbridge.ms_deform_attn(*leaves), wrt, grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    rows = []
    for name, op in paths.items():
        with torch.no_grad():
            forward = _time_ms(lambda op=op: op(*inputs), repeat)
            host = _host_us(lambda op=op: op(*inputs))
        recording = _host_us(lambda op=op: op(*leaves))
        training = _time_ms(lambda op=op: torch.autograd.grad(op(*leaves), wrt, grad), repeat)
        training_host = _host_us(lambda op=op: torch.autograd.grad(op(*leaves), wrt, grad))
        rows.append(dict(op="ms_deform_attn", case=case, path=name,
                         forward_ms=forward, training_ms=training, forward_host_us=host,
                         forward_recording_host_us=recording, training_host_us=training_host))  # fmt: skip
    return rows


def _dcn_inputs(n=8, c=256, h=50, w=68):
    generator = torch.Generator().manual_seed(0)
    tensors = (torch.randn(n, c, h, w, generator=generator), torch.randn(n, 18, h, w, generator=generator),
               torch.randn(c, c, 3, 3, generator=generator) / (3 * c**0.5), torch.randn(c, generator=generator),
               torch.rand(n, 9, h, w, generator=generator))  # fmt: skip
    return [t.cuda() for t in tensors]


def half_rows(repeat: int) -> list[dict]:
    msda = [t.cuda() for t in encoder_inputs(CASES["800x1333 enc"])]
    cases = {
        "ms_deform_attn 800x1333 enc": (msda, (0, 3, 4), lambda *a: opbridge.ms_deform_attn(*a), (3,)),
        "deform_conv2d N8 C256 50x68": (_dcn_inputs(), (0, 1, 2, 3, 4),
                                        lambda *a: opbridge.deform_conv2d(*a[:4], padding=(1, 1), mask=a[4]), (1, 4)),
    }  # fmt: skip
    rows = []
    for case, (inputs, differentiable, op, precise) in cases.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            # Half storage for the features and weights; locations, offsets and masks stay float32 (the precise
            # inputs, as autocast's native rule leaves them).
            cast = [t.to(dtype) if t.is_floating_point() and i not in precise else t for i, t in enumerate(inputs)]
            exact = op(*[t.double() if t.is_floating_point() else t for t in cast])
            out = op(*cast)
            error = float((out.double() - exact).abs().max() / exact.abs().max())
            leaves = [t.clone().requires_grad_(i in differentiable) if t.is_floating_point() else t
                      for i, t in enumerate(cast)]  # fmt: skip
            wrt = [leaves[i] for i in differentiable]
            grad = torch.randn_like(out)
            forward = _time_ms(lambda op=op, cast=cast: op(*cast), repeat)
            training = _time_ms(lambda op=op, leaves=leaves, wrt=wrt, grad=grad: torch.autograd.grad(op(*leaves),
                                                                                                      wrt, grad),
                                repeat)  # fmt: skip
            rows.append(dict(op=case.split()[0], case=case, path=str(dtype).replace("torch.", ""), forward_ms=forward,
                             training_ms=training, error=error))  # fmt: skip
    return rows


def _axis_aligned_boxes(count: int, generator, spread: float = 200.0) -> torch.Tensor:
    centres = torch.rand(max(count // 8, 1), 2, generator=generator) * spread
    centres = centres[torch.arange(count) % centres.shape[0]] + torch.randn(count, 2, generator=generator) * 4
    sizes = torch.rand(count, 2, generator=generator) * 30 + 4
    return torch.cat([centres, sizes, torch.zeros(count, 1)], 1)  # (cx, cy, w, h, angle 0)


def _corners(rotated: torch.Tensor) -> torch.Tensor:
    centre, size = rotated[:, :2], rotated[:, 2:4]
    return torch.cat([centre - size / 2, centre + size / 2], 1)


def rotated_rows(repeat: int) -> list[dict]:
    import torchvision

    generator = torch.Generator().manual_seed(2)
    rows = []
    # roi_align_rotated at angle 0 is roi_align (aligned, with its half-pixel shift): the same samples and weights.
    features = torch.randn(2, 256, 100, 136, generator=generator).cuda()
    boxes = _axis_aligned_boxes(1000, generator, 100.0)
    rois = torch.cat([torch.randint(0, 2, (1000, 1), generator=generator).float(), boxes], 1).cuda()
    corner_rois = torch.cat([rois[:, :1], _corners(rois[:, 1:])], 1)
    leaf = features.clone().requires_grad_()
    paths = {
        "opbridge CUDA": lambda x: opbridge.roi_align_rotated(x, rois, (7, 7), 0.5, 2, True, False),
        "torchvision roi_align CUDA": lambda x: torchvision.ops.roi_align(x, corner_rois, (7, 7), 0.5, 2, True),
        "opbridge CPU": lambda x: opbridge.roi_align_rotated(x.cpu(), rois.cpu(), (7, 7), 0.5, 2, True, False),
    }
    expected = paths["torchvision roi_align CUDA"](features)
    difference = float((paths["opbridge CUDA"](features) - expected).abs().max())
    grad = torch.randn_like(expected)
    for name, op in paths.items():
        count = repeat if "CUDA" in name else 3

        def step(op=op):
            out = op(leaf)
            return torch.autograd.grad(out, leaf, grad.to(out.device))

        rows.append(dict(op="roi_align_rotated", case="N2 C256 100x136, 1000 rois, 7x7", path=name,
                         forward_ms=_time_ms(lambda op=op: op(features), count), training_ms=_time_ms(step, count),
                         max_difference=difference))  # fmt: skip
    for count in (1000, 5000):
        boxes_cpu = _axis_aligned_boxes(count, generator)
        scores_cpu = torch.rand(count, generator=generator)
        boxes, scores = boxes_cpu.cuda(), scores_cpu.cuda()
        kept = opbridge.nms_rotated(boxes, scores, 0.5)[1]
        theirs = torchvision.ops.nms(_corners(boxes), scores, 0.5)
        same = kept.tolist() == theirs.tolist()
        for name, op in {
            "opbridge CUDA": lambda b=boxes, s=scores: opbridge.nms_rotated(b, s, 0.5),
            "torchvision nms CUDA": lambda b=boxes, s=scores: torchvision.ops.nms(_corners(b), s, 0.5),
            "opbridge CPU": lambda b=boxes_cpu, s=scores_cpu: opbridge.nms_rotated(b, s, 0.5),
        }.items():
            rows.append(dict(op="nms_rotated", case=f"{count} boxes", path=name,
                             forward_ms=_time_ms(op, repeat if "CUDA" in name else 3), same_kept=same))  # fmt: skip
        ious = opbridge.box_iou_rotated(boxes, boxes)
        difference = float((ious - torchvision.ops.box_iou(_corners(boxes), _corners(boxes))).abs().max())
        for name, op in {
            "opbridge CUDA": lambda b=boxes: opbridge.box_iou_rotated(b, b),
            "torchvision box_iou CUDA": lambda b=boxes: torchvision.ops.box_iou(_corners(b), _corners(b)),
            "opbridge CPU": lambda b=boxes_cpu: opbridge.box_iou_rotated(b, b),
        }.items():
            rows.append(dict(op="box_iou_rotated", case=f"{count} x {count} boxes", path=name,
                             forward_ms=_time_ms(op, repeat if "CUDA" in name else 3),
                             max_difference=difference))  # fmt: skip
    return rows


def _rotated_boxes(count: int, generator, spread: float = 200.0) -> torch.Tensor:
    boxes = _axis_aligned_boxes(count, generator, spread)
    boxes[:, 4] = (torch.rand(count, generator=generator) - 0.5) * 2 * math.pi
    return boxes


def rotated_torch_rows(repeat: int, device: str = "cuda") -> list[dict]:
    """The rotated ops at any angle against the CPU benchmark's tensor versions of them on the same device
    (tools/bench: ``vectorized_iou``, ``fixed_point_nms``, the roi_align_rotated ``vectorized``; those check their
    outputs against the references in tests/test_bench_baselines.py): what a user without a kernel would run."""
    from .bench import roi_align_rotated as roi_bench
    from .bench.box_iou_rotated import vectorized_iou
    from .bench.nms_rotated import fixed_point_nms

    generator = torch.Generator().manual_seed(4)
    rows = []
    features = torch.randn(2, 256, 100, 136, generator=generator).to(device)
    boxes = _rotated_boxes(1000, generator, 100.0)
    boxes[:, :4] /= roi_bench.SCALE  # image coordinates of the 1/8-scale map
    rois = torch.cat([torch.randint(0, 2, (1000, 1), generator=generator).float(), boxes], 1).to(device)
    leaf = features.clone().requires_grad_()
    size, scale, ratio = roi_bench.SIZE, roi_bench.SCALE, roi_bench.RATIO
    paths = {
        "opbridge": lambda x: opbridge.roi_align_rotated(x, rois, size, scale, ratio, True, False),
        "vectorized torch": lambda x: roi_bench.vectorized(x, rois),
    }
    expected = paths["vectorized torch"](features)
    difference = float((paths["opbridge"](features) - expected).abs().max())
    grad = torch.randn(expected.shape, generator=generator).to(device)
    for name, op in paths.items():

        def step(op=op):
            return torch.autograd.grad(op(leaf), leaf, grad)

        rows.append(dict(op="roi_align_rotated", case="N2 C256 100x136, 1000 rotated rois, 7x7", path=name,
                         forward_ms=_time_ms(lambda op=op: op(features), repeat), training_ms=_time_ms(step, repeat),
                         max_difference=difference))  # fmt: skip
    for count in (1000, 5000):
        boxes = _rotated_boxes(count, generator).to(device)
        scores = torch.rand(count, generator=generator).to(device)
        difference = float((opbridge.box_iou_rotated(boxes, boxes) - vectorized_iou(boxes, boxes)).abs().max())
        for name, op in {
            "opbridge": lambda b=boxes: opbridge.box_iou_rotated(b, b),
            "vectorized torch": lambda b=boxes: vectorized_iou(b, b),
        }.items():
            rows.append(dict(op="box_iou_rotated", case=f"{count} x {count} rotated boxes", path=name,
                             forward_ms=_time_ms(op, repeat), max_difference=difference))  # fmt: skip
        kept = opbridge.nms_rotated(boxes, scores, 0.5)[1]
        same = kept.tolist() == fixed_point_nms(boxes, scores, 0.5).tolist()
        for name, op in {
            "opbridge": lambda b=boxes, s=scores: opbridge.nms_rotated(b, s, 0.5),
            "vectorized torch": lambda b=boxes, s=scores: fixed_point_nms(b, s, 0.5),
        }.items():
            rows.append(dict(op="nms_rotated", case=f"{count} rotated boxes", path=name,
                             forward_ms=_time_ms(op, repeat), same_kept=same))  # fmt: skip
    return rows


def _model(nodes, inputs: dict, outputs: list[tuple[str, int]], opsets: dict) -> bytes:
    from onnx import TensorProto, helper

    element = {torch.float32: TensorProto.FLOAT, torch.int64: TensorProto.INT64}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, element[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                             ir_version=8).SerializeToString()  # fmt: skip


def _ort_gpu(model: bytes, feeds: dict, repeat: int):
    """(median ms, first output as a torch tensor) of a CUDA-EP session, inputs bound in GPU memory and outputs
    left on the GPU (allocated by ORT: their sizes may depend on the data)."""
    import numpy as np

    from .bench_cuda import _ort_session

    session = _ort_session(model, "CUDAExecutionProvider")
    binding = session.io_binding()
    for name, tensor in feeds.items():
        tensor = tensor.cuda().contiguous()
        feeds[name] = tensor
        binding.bind_input(name, "cuda", 0, np.dtype(str(tensor.dtype).replace("torch.", "")), list(tensor.shape),
                           tensor.data_ptr())  # fmt: skip
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")
    for _ in range(3):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append((time.perf_counter() - start) * 1e3)
    first = torch.from_numpy(binding.copy_outputs_to_cpu()[0])
    return sorted(times)[len(times) // 2], first


def _has_ort_cuda() -> bool:
    """onnxruntime with the CUDA provider, and opbridge's ORT CUDA library."""
    try:
        import onnxruntime as ort

        import opbridge_ort

        return "CUDAExecutionProvider" in ort.get_available_providers() and bool(opbridge_ort.cuda_library_path())
    except (ImportError, FileNotFoundError):
        return False


def ort_standard_rows(repeat: int) -> list[dict]:
    if not _has_ort_cuda():
        return []
    from onnx import TensorProto, helper

    generator = torch.Generator().manual_seed(3)
    rows = []
    # grid_sampler (mmdeploy; bilinear, zeros, align_corners 0) against ONNX GridSample (opset 16).
    x = torch.randn(2, 256, 100, 136, generator=generator)
    grid = torch.rand(2, 100, 136, 2, generator=generator) * 2.2 - 1.1
    attributes = dict(interpolation_mode=0, padding_mode=0, align_corners=0)
    ours = _model([helper.make_node("grid_sampler", ["input", "grid"], ["out"], domain="mmdeploy", **attributes)],
                  {"input": x, "grid": grid}, [("out", TensorProto.FLOAT)], {"": 16, "mmdeploy": 1})  # fmt: skip
    theirs = _model([helper.make_node("GridSample", ["input", "grid"], ["out"], mode="bilinear", padding_mode="zeros",
                                      align_corners=0)],
                    {"input": x, "grid": grid}, [("out", TensorProto.FLOAT)], {"": 16})  # fmt: skip
    cases = [("grid_sampler", "N2 C256 100x136, grid 100x136", ours, {"input": x, "grid": grid}, theirs,
              {"input": x, "grid": grid}, "ORT GridSample CUDA")]  # fmt: skip
    # mmcv NonMaxSuppression against ONNX NonMaxSuppression (kept indices compared).
    boxes = _corners(_axis_aligned_boxes(5000, generator))
    scores = torch.rand(5000, generator=generator)
    ours = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["out"], domain="mmcv", iou_threshold=0.5,
                                    offset=0)],
                  {"boxes": boxes, "scores": scores}, [("out", TensorProto.INT64)], {"": 16, "mmcv": 1})  # fmt: skip
    their_feeds = {"boxes": boxes[None], "scores": scores[None, None], "max": torch.tensor([5000]),
                   "threshold": torch.tensor([0.5]), "column": torch.tensor(2)}  # fmt: skip
    theirs = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "threshold"], ["selected"]),
                     helper.make_node("Gather", ["selected", "column"], ["out"], axis=1)],
                    their_feeds, [("out", TensorProto.INT64)], {"": 16})  # fmt: skip
    cases.append(("NonMaxSuppression", "5000 boxes", ours, {"boxes": boxes, "scores": scores}, theirs, their_feeds,
                  "ORT NonMaxSuppression CUDA"))  # fmt: skip
    # MMCVRoiAlign (avg, aligned) against ONNX RoiAlign (opset 16, half_pixel).
    features = torch.randn(2, 256, 100, 136, generator=generator)
    batch = torch.randint(0, 2, (1000,), generator=generator)
    corners = _corners(_axis_aligned_boxes(1000, generator, 100.0))
    rois = torch.cat([batch[:, None].float(), corners], 1)
    ours = _model([helper.make_node("MMCVRoiAlign", ["input", "rois"], ["out"], domain="mmcv", output_height=7,
                                    output_width=7, spatial_scale=0.5, sampling_ratio=2, mode="avg", aligned=1)],
                  {"input": features, "rois": rois}, [("out", TensorProto.FLOAT)], {"": 16, "mmcv": 1})  # fmt: skip
    their_feeds = {"input": features, "boxes": corners, "batch": batch}
    theirs = _model([helper.make_node("RoiAlign", ["input", "boxes", "batch"], ["out"], output_height=7,
                                      output_width=7, spatial_scale=0.5, sampling_ratio=2, mode="avg",
                                      coordinate_transformation_mode="half_pixel")],
                    their_feeds, [("out", TensorProto.FLOAT)], {"": 16})  # fmt: skip
    cases.append(("MMCVRoiAlign", "N2 C256 100x136, 1000 rois, 7x7", ours, {"input": features, "rois": rois}, theirs,
                  their_feeds, "ORT RoiAlign CUDA"))  # fmt: skip
    for op, case, ours, our_feeds, theirs, their_feeds, their_name in cases:
        our_ms, our_out = _ort_gpu(ours, dict(our_feeds), repeat)
        their_ms, their_out = _ort_gpu(theirs, dict(their_feeds), repeat)
        if op == "NonMaxSuppression":
            agreement = dict(same_kept=our_out.tolist() == their_out.tolist())
        else:
            agreement = dict(max_difference=float((our_out - their_out).abs().max()))
        rows.append(dict(op=op, case=case, path="opbridge ORT CUDA node", forward_ms=our_ms, **agreement))
        rows.append(dict(op=op, case=case, path=their_name, forward_ms=their_ms, **agreement))
    return rows


def ort_node_cases(scale: int = 1) -> list[tuple[str, str, bytes, dict]]:
    """(op, case, one-node model, feeds) of the CUDA nodes ORT has no kernel of its own for; ``scale`` divides the
    sizes (the tests build them small to check the models)."""
    from onnx import TensorProto, helper

    generator = torch.Generator().manual_seed(5)
    float32, int64 = TensorProto.FLOAT, TensorProto.INT64
    cases = []

    def add(case, op_type, domain, feeds, outputs, **attributes):
        node = helper.make_node(op_type, list(feeds), [name for name, _ in outputs], domain=domain, **attributes)
        cases.append((op_type, case, _model([node], feeds, outputs, {"": 17, domain: 1}), feeds))

    def rand(*shape, low=0.0, high=1.0):
        return torch.rand(*shape, generator=generator) * (high - low) + low

    n, m = max(2000 // scale, 8), max(1000 // scale, 8)
    rotated = torch.cat([rand(1, n, 2, high=800), rand(1, n, 2, low=4, high=64), rand(1, n, 1, low=-1.5, high=1.5)], 2)
    add(
        f"mmdeploy, 1 x 15 classes x {n} boxes",
        "NMSRotated",
        "mmdeploy",
        {"boxes": rotated, "scores": rand(1, 15, n)},
        [("out", int64)],
        iou_threshold=0.1,
        score_threshold=0.05,
    )
    add(
        f"mmdeploy, 1 x 20 classes x {m} boxes",
        "NMSMatch",
        "mmdeploy",
        {
            "boxes": _corners(_axis_aligned_boxes(m, generator, 400.0))[None],
            "scores": rand(1, 20, m),
            "iou_threshold": torch.tensor([0.5]),
            "score_threshold": torch.tensor([0.05]),
        },
        [("out", int64)],
    )
    side = max(128 // scale, 4)
    x = torch.randn(2, 64, side, side, generator=generator)
    add(
        f"[2, 64, {side}, {side}], dim 2",
        "cummax",
        "mmcv",
        {"input": x},
        [("values", float32), ("indices", int64)],
        dim=2,
    )
    add(f"[2, 64, {side}, {side}], top", "MMCVCornerPool", "mmcv", {"input": x}, [("out", float32)], mode=0)
    side = max(48 // scale, 4)
    add(
        f"[2, 9 x 9, {side}, {side}], collect",
        "MMCVPSAMask",
        "mmcv",
        {"input": torch.randn(2, 81, side, side, generator=generator)},
        [("out", float32)],
        psa_type=0,
        mask_size=[9, 9],
    )
    c, h, w = max(256 // scale, 4), max(50 // scale, 4), max(68 // scale, 4)
    add(
        f"[2, {c}, {h}, {w}], kernel 5, scale 2",
        "MMCVCARAFE",
        "mmcv",
        {"features": torch.randn(2, c, h, w, generator=generator), "masks": rand(2, 25, 2 * h, 2 * w)},
        [("out", float32)],
        kernel_size=5,
        group_size=1,
        scale_factor=2.0,
    )
    add(f"[1, {c}, {h}, {w}], 3x3, 30% of positions", "MMCVMaskedConv2d", "mmcv",
        {"features": torch.randn(1, c, h, w, generator=generator), "mask": (rand(1, h, w) < 0.3).float(),
         "weight": torch.randn(c, c, 3, 3, generator=generator) * 0.05, "bias": torch.randn(c, generator=generator)},
        [("out", float32)], padding=[1, 1], stride=[1, 1])  # fmt: skip
    return cases


def _ort_cpu(model: bytes, feeds: dict, repeat: int):
    """(median ms, first output as a torch tensor) of a CPU-provider session on the host's numpy inputs."""
    from .bench_cuda import _ort_session

    session = _ort_session(model, "CPUExecutionProvider")
    arrays = {name: tensor.numpy() for name, tensor in feeds.items()}
    session.run(None, arrays)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = session.run(None, arrays)[0]
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2], torch.from_numpy(out)


def ort_node_rows(repeat: int) -> list[dict]:
    if not _has_ort_cuda():
        return []
    rows = []
    for op, case, model, feeds in ort_node_cases():
        gpu_ms, gpu_out = _ort_gpu(model, dict(feeds), repeat)
        cpu_ms, cpu_out = _ort_cpu(model, feeds, min(repeat, 5))
        if gpu_out.dtype == torch.int64:
            agreement = dict(same_kept=torch.equal(gpu_out, cpu_out))
        else:
            agreement = dict(max_difference=float((gpu_out - cpu_out).abs().max()) if gpu_out.numel() else 0.0)
        rows.append(dict(op=op, case=case, path="opbridge ORT CUDA node", forward_ms=gpu_ms, **agreement))
        rows.append(dict(op=op, case=case, path="the same node on the CPU provider", forward_ms=cpu_ms, **agreement))
    return rows


def _table(rows: list[dict], baseline: Callable[[dict], bool], columns: list[tuple[str, str, str]]) -> list[str]:
    header = "| op | case | path | " + " | ".join(title for _, title, _ in columns) + " | speed-up over the baseline |"
    lines = [header, "|" + "---|" * (4 + len(columns))]
    for row in rows:
        base = next((r for r in rows if r["case"] == row["case"] and baseline(r)), None)
        ratio = "" if base is None or base is row else f"{base['forward_ms'] / row['forward_ms']:.2f}x"
        if base is not None and base is not row and "training_ms" in row and "training_ms" in base:
            ratio += f" (training {base['training_ms'] / row['training_ms']:.2f}x)"
        cells = [format(row[key], spec) if key in row else "" for key, _, spec in columns]
        lines.append(f"| {row['op']} | {row['case']} | {row['path']} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def report() -> tuple[str, dict]:
    """Runs every section (20 timed calls a row) and returns (markdown, rows by section)."""
    sections = {
        "The issue's anchor shapes: decoder- and encoder-sized calls at batch 2, and their host time": (decoder_rows,
            lambda r: r["path"] == "bare autograd.Function",
            [("forward_ms", "forward ms", ".3f"), ("training_ms", "training step ms", ".3f"),
             ("forward_host_us", "host µs, forward (no grad)", ".1f"),
             ("forward_recording_host_us", "host µs, forward recording autograd", ".1f"),
             ("training_host_us", "host µs, training step", ".1f")]),
        "Half precision (float16/bfloat16 storage, float32 arithmetic)": (half_rows, lambda r: r["path"] == "float32",
            [("forward_ms", "forward ms", ".3f"), ("training_ms", "training step ms", ".3f"),
             ("error", "max error / max |float64 output|", ".2e")]),
        "Rotated ops on CUDA (baselines: torchvision at angle 0, and the CPU op)": (rotated_rows,
            lambda r: r["path"].startswith("torchvision"),
            [("forward_ms", "forward ms", ".3f"), ("training_ms", "training step ms", ".3f"),
             ("max_difference", "max difference to torchvision", ".2e"), ("same_kept", "same kept boxes", "")]),
        "Rotated ops at any angle on CUDA against the same ops as vectorized torch on the GPU": (rotated_torch_rows,
            lambda r: r["path"] == "vectorized torch",
            [("forward_ms", "forward ms", ".3f"), ("training_ms", "training step ms", ".3f"),
             ("max_difference", "max difference", ".2e"), ("same_kept", "same kept boxes", "")]),
        "ORT CUDA nodes against ONNX Runtime's own CUDA kernels": (ort_standard_rows,
            lambda r: not r["path"].startswith("opbridge"),
            [("forward_ms", "forward ms", ".3f"), ("max_difference", "max difference", ".2e"),
             ("same_kept", "same kept boxes", "")]),
        "ORT CUDA nodes that ONNX Runtime has no kernel for, against the same node on the CPU provider": (
            ort_node_rows, lambda r: r["path"].endswith("CPU provider"),
            [("forward_ms", "forward ms", ".3f"), ("max_difference", "max difference", ".2e"),
             ("same_kept", "same output", "")]),
    }  # fmt: skip
    text, found = [], {}
    for title, (measure, baseline, columns) in sections.items():
        text += ["", f"## {title}", ""]
        try:
            rows = found[title] = measure(20)
        except Exception:  # a borrowed GPU's one run: report the failure, keep the other sections
            text.append("This section failed:\n\n```text\n" + traceback.format_exc()[-3000:] + "```")
            continue
        text += _table(rows, baseline, columns) if rows else ["(not run here: no CUDA execution provider)"]
    return "\n".join(text), found
