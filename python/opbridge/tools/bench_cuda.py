"""``python -m opbridge.tools.bench_cuda``: opbridge's CUDA ops against their baselines on the GPU, in one run
(``nox -s bench`` runs it where torch sees a GPU).

Every row is the median of ``--repeat`` timed calls (CUDA events, after warm-up), each path's output checked
against its baseline's first. Ratios are against baselines timed in the same run:

- ``deform_conv2d``: opbridge's CUDA op against torchvision's CUDA kernels, forward and forward + backward
  (all five gradients), float32, 3x3 with mask (target 1.5x);
- ``ms_deform_attn``: opbridge's CUDA op against the ``grid_sample`` reference (the definition in plain PyTorch,
  :func:`opbridge.ops.ms_deform_attn.reference`) on the GPU, forward and forward + backward, on Deformable DETR's
  encoder at 512x512 and 800x1333 (target 10x); and as a share of the GPU's memory bandwidth, measured in the same
  run with a device-to-device copy (bytes read plus written): the op's least traffic (value, locations and weights
  read once, the output written once; the backward also reads the output gradient and writes three gradients)
  over its time.

Where onnxruntime has the CUDA execution provider and opbridge_ort's CUDA library is installed, the ORT nodes too
(``ort_rows``): each opbridge node on the CUDA execution provider (inputs and output bound in GPU memory, so no
copies are timed) against the same node on the CPU execution provider, and against torch's CUDA path on the same
inputs (opbridge's CUDA op for MSDA, torchvision's for deform_conv2d); forward only (ORT runs inference).

Then :mod:`opbridge.tools.bench_cuda_more`: decoder-sized calls and their host time, the half-precision kernels,
the rotated ops, and the ORT CUDA nodes against ONNX Runtime's own CUDA kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import opbridge

from .bench.ms_deform_attn import CASES, encoder_inputs

TARGET_DEFORM = 1.5
TARGET_MSDA = 10.0


def time_ms(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(repeat: int) -> float:
    """GB/s of a 1 GiB device-to-device copy, bytes read plus written."""
    source = torch.randn(1 << 28, device="cuda")
    target = torch.empty_like(source)
    ms = time_ms(lambda: target.copy_(source), repeat)
    return 2 * source.numel() * 4 / ms / 1e6


def _close(actual, expected, what: str, tolerance: float = 1e-3) -> None:
    error = ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()
    if not error < tolerance:
        raise AssertionError(f"{what}: relative error {error:.3g} against the baseline")


def deform_rows(repeat: int) -> list[dict]:
    import torchvision

    rows = []
    shapes = [(4, 128, 32, 32), (8, 256, 50, 68), (2, 256, 100, 136), (16, 64, 128, 128)]
    for n, c, h, w in shapes:
        generator = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n, c, h, w, device="cuda", generator=generator)
        offset = torch.randn(n, 18, h, w, device="cuda", generator=generator)
        mask = torch.rand(n, 9, h, w, device="cuda", generator=generator)
        weight = torch.randn(c, c, 3, 3, device="cuda", generator=generator) / (3 * c**0.5)
        bias = torch.randn(c, device="cuda", generator=generator)
        ops = {
            "opbridge": lambda *a: opbridge.deform_conv2d(*a[:4], padding=(1, 1), mask=a[4]),
            "torchvision": lambda *a: torchvision.ops.deform_conv2d(*a[:4], padding=(1, 1), mask=a[4]),
        }
        leaves = [t.clone().requires_grad_() for t in (x, offset, weight, bias, mask)]
        grad = torch.randn(n, c, h, w, device="cuda", generator=generator)
        outs = {name: op(x, offset, weight, bias, mask) for name, op in ops.items()}
        _close(outs["opbridge"], outs["torchvision"], "deform_conv2d forward")
        grads = {name: torch.autograd.grad(op(*leaves), leaves, grad) for name, op in ops.items()}
        for mine, theirs in zip(grads["opbridge"], grads["torchvision"], strict=True):
            _close(mine, theirs, "deform_conv2d backward")
        case = f"N{n} C{c} {h}x{w}"
        for name, op in ops.items():
            args = (x, offset, weight, bias, mask)
            forward = time_ms(lambda op=op, args=args: op(*args), repeat)
            training = time_ms(lambda op=op, leaves=leaves, grad=grad: torch.autograd.grad(op(*leaves), leaves, grad),
                               repeat)  # fmt: skip
            rows.append(dict(op="deform_conv2d", case=case, path=name, forward_ms=forward, training_ms=training))
    return rows


def msda_rows(repeat: int, bandwidth: float) -> list[dict]:
    from ..ops.ms_deform_attn import reference

    rows = []
    for label, levels in CASES.items():
        inputs = [t.cuda() for t in encoder_inputs(levels)]
        value, shapes, starts, locations, weights = inputs
        leaves = [value.clone().requires_grad_(), shapes, starts, locations.clone().requires_grad_(),
                  weights.clone().requires_grad_()]  # fmt: skip
        wrt = [leaves[0], leaves[3], leaves[4]]
        out = opbridge.ms_deform_attn(*inputs)
        grad = torch.randn_like(out)
        ops = {"opbridge": opbridge.ms_deform_attn, "grid_sample": reference}
        _close(out, reference(*inputs), "ms_deform_attn forward")
        mine = torch.autograd.grad(ops["opbridge"](*leaves), wrt, grad)
        theirs = torch.autograd.grad(reference(*leaves), wrt, grad)
        for a, b in zip(mine, theirs, strict=True):
            _close(a, b, "ms_deform_attn backward")
        forward_bytes = sum(t.numel() * t.element_size() for t in (value, locations, weights, out))
        backward_bytes = forward_bytes + sum(t.numel() * t.element_size() for t in (grad, value, locations, weights))
        for name, op in ops.items():
            forward = time_ms(lambda op=op, inputs=inputs: op(*inputs), repeat)

            def step(op=op, leaves=leaves, wrt=wrt, grad=grad):
                return torch.autograd.grad(op(*leaves), wrt, grad)

            training = time_ms(step, repeat)
            row = dict(op="ms_deform_attn", case=f"{label}, {value.shape[1]} keys", path=name,
                       forward_ms=forward, training_ms=training)  # fmt: skip
            if name == "opbridge":
                row["forward_bandwidth_share"] = forward_bytes / forward / 1e6 / bandwidth
                row["training_bandwidth_share"] = (forward_bytes + backward_bytes) / training / 1e6 / bandwidth
            rows.append(row)
    return rows


def _ort_session(model: bytes, provider: str):
    import onnxruntime as ort

    import opbridge_ort

    options = opbridge_ort.session_options()
    if provider == "CUDAExecutionProvider":
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(model, options, providers=[provider])


def _ort_timer(session, feeds: dict, out: torch.Tensor, repeat: int, warmup: int = 3) -> float:
    """Median ms of one run with inputs and output bound where they lie (GPU tensors for the CUDA EP)."""
    import time

    binding = session.io_binding()
    types = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64"}
    import numpy as np

    for name, tensor in feeds.items():
        device = "cuda" if tensor.is_cuda else "cpu"
        binding.bind_input(name, device, 0, np.dtype(types[tensor.dtype]), list(tensor.shape), tensor.data_ptr())
    binding.bind_output("out", "cuda" if out.is_cuda else "cpu", 0, np.dtype(types[out.dtype]), list(out.shape),
                        out.data_ptr())  # fmt: skip
    for _ in range(warmup):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run_with_iobinding(binding)  # synchronous: returns once the CUDA stream is done
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _one_node(op_type: str, domain: str, feeds: dict, attributes: dict | None = None) -> bytes:
    from onnx import TensorProto, helper

    element = {torch.float32: TensorProto.FLOAT, torch.int64: TensorProto.INT64}
    inputs = [helper.make_tensor_value_info(k, element[v.dtype], list(v.shape)) for k, v in feeds.items()]
    node = helper.make_node(op_type, list(feeds), ["out"], domain=domain, **(attributes or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def ort_rows(repeat: int) -> list[dict]:
    """ORT's CUDA execution provider running opbridge's nodes (see the module's docstring); [] where it cannot."""
    try:
        import onnxruntime as ort

        import opbridge_ort

        library = Path(opbridge_ort.library_path()).with_name("libopbridge_ort_cuda.so")
    except (ImportError, FileNotFoundError):
        return []
    if "CUDAExecutionProvider" not in ort.get_available_providers() or not library.is_file():
        return []
    import torchvision

    rows = []
    cases = []
    for label, levels in CASES.items():
        value, shapes, starts, locations, weights = encoder_inputs(levels)
        feeds = dict(value=value, spatial_shapes=shapes, level_start_index=starts, sampling_locations=locations,
                     attention_weights=weights)  # fmt: skip
        model = _one_node("MultiScaleDeformableAttention", "opbridge", feeds)
        # The level table stays in host memory for ORT (the node reads it there); the torch op takes it on the GPU.
        cuda_feeds = {k: v.cuda() if v.is_floating_point() else v for k, v in feeds.items()}
        torch_inputs = [v.cuda() for v in feeds.values()]
        cases.append(("ms_deform_attn", f"{label}, {value.shape[1]} keys", model, feeds, cuda_feeds,
                      lambda a=torch_inputs: opbridge.ms_deform_attn(*a), "torch CUDA op"))  # fmt: skip
    for n, c, h, w in [(1, 256, 100, 136), (8, 256, 50, 68)]:
        generator = torch.Generator().manual_seed(0)
        feeds = dict(X=torch.randn(n, c, h, w, generator=generator),
                     W=torch.randn(c, c, 3, 3, generator=generator) / (3 * c**0.5),
                     offset=torch.randn(n, 18, h, w, generator=generator), B=torch.randn(c, generator=generator),
                     mask=torch.rand(n, 9, h, w, generator=generator))  # fmt: skip
        model = _one_node("DeformConv2d", "opbridge", feeds, dict(pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
        cuda_feeds = {k: v.cuda() for k, v in feeds.items()}
        f = cuda_feeds
        cases.append(("deform_conv2d", f"N{n} C{c} {h}x{w}", model, feeds, cuda_feeds,
                      lambda f=f: torchvision.ops.deform_conv2d(f["X"], f["offset"], f["W"], f["B"], padding=(1, 1),
                                                                mask=f["mask"]), "torchvision CUDA"))  # fmt: skip
    for op, case, model, feeds, cuda_feeds, torch_path, torch_name in cases:
        expected = torch_path()
        out_gpu, out_cpu = torch.empty_like(expected), torch.empty_like(expected).cpu()
        times = {
            "ORT CUDA EP": _ort_timer(_ort_session(model, "CUDAExecutionProvider"), cuda_feeds, out_gpu, repeat),
            "ORT CPU EP": _ort_timer(_ort_session(model, "CPUExecutionProvider"), feeds, out_cpu, 3, warmup=1),
            torch_name: time_ms(torch_path, repeat),
        }
        _close(out_gpu, expected, f"ORT CUDA {op}")
        _close(out_cpu, expected.cpu(), f"ORT CPU {op}")
        if op == "deform_conv2d":  # the node's other path: its fused kernel instead of im2col + cuBLAS
            os.environ["OPBRIDGE_ORT_CUDA_DCN"] = "fused"
            try:
                fused = "ORT CUDA EP, fused kernel (OPBRIDGE_ORT_CUDA_DCN=fused)"
                times[fused] = _ort_timer(_ort_session(model, "CUDAExecutionProvider"), cuda_feeds, out_gpu, repeat)
                _close(out_gpu, expected, f"ORT CUDA {op}, fused kernel")
            finally:
                del os.environ["OPBRIDGE_ORT_CUDA_DCN"]
        for path, ms in times.items():
            rows.append(dict(op=op, case=case, path=path, forward_ms=ms))
    return rows


def ort_report(rows: list[dict]) -> str:
    if not rows:
        return ""
    title = "## ORT: opbridge's nodes on the CUDA execution provider (forward; GPU-bound inputs and output)"
    lines = ["", "", title, "",
             "| op | case | path | forward ms | CUDA EP speed-up over it |", "|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        cuda = next(r for r in rows if r["case"] == row["case"] and r["path"] == "ORT CUDA EP")
        ratio = "" if row is cuda else f"{row['forward_ms'] / cuda['forward_ms']:.2f}x"
        lines.append(f"| {row['op']} | {row['case']} | {row['path']} | {row['forward_ms']:.3f} | {ratio} |")
    return "\n".join(lines)


def report(rows: list[dict], bandwidth: float) -> str:
    lines = [
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; device-to-device copy: "
        f"{bandwidth:.0f} GB/s (read + written)",
        "",
        "| op | case | path | forward ms | forward + backward ms | forward ratio | training ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    baselines = {"deform_conv2d": ("torchvision", TARGET_DEFORM), "ms_deform_attn": ("grid_sample", TARGET_MSDA)}
    for row in rows:
        baseline_name, target = baselines[row["op"]]
        base = next(r for r in rows if r["op"] == row["op"] and r["case"] == row["case"] and r["path"] == baseline_name)
        ratios = ("", "", "")
        if row["path"] != baseline_name:
            fwd, trn = base["forward_ms"] / row["forward_ms"], base["training_ms"] / row["training_ms"]
            met = "met" if min(fwd, trn) >= target else "MISSED"
            ratios = (f"{fwd:.2f}x", f"{trn:.2f}x", f">= {target}x: {met}")
        lines.append(f"| {row['op']} | {row['case']} | {row['path']} | {row['forward_ms']:.3f} | "
                     f"{row['training_ms']:.3f} | {' | '.join(ratios)} |")  # fmt: skip
    for row in rows:
        if "forward_bandwidth_share" in row:
            lines.append(f"\nms_deform_attn {row['case']}: least traffic at {row['forward_bandwidth_share']:.1%} "
                         f"(forward) and {row['training_bandwidth_share']:.1%} (forward + backward) of the copy "
                         "bandwidth")  # fmt: skip
    return "\n".join(lines)


def profile_report(steps: int = 5) -> str:
    """Where each path's GPU time goes: the CUDA kernels of `steps` forward + backward calls on the largest case of
    each op, and MSDA's smaller one (torch.profiler, self CUDA time per kernel, top 8), opbridge's and the
    baseline's."""
    import torchvision
    from torch.profiler import ProfilerActivity, profile

    from ..ops.ms_deform_attn import reference

    def msda_leaves(case):
        inputs = [t.cuda() for t in encoder_inputs(CASES[case])]
        return [inputs[0].clone().requires_grad_(), inputs[1], inputs[2], inputs[3].clone().requires_grad_(),
                inputs[4].clone().requires_grad_()]  # fmt: skip

    large, small = msda_leaves("800x1333 enc"), msda_leaves("512x512 enc")
    generator = torch.Generator(device="cuda").manual_seed(0)
    n, c, h, w = 8, 256, 50, 68
    dcn = [torch.randn(n, c, h, w, device="cuda", generator=generator),
           torch.randn(n, 18, h, w, device="cuda", generator=generator),
           torch.randn(c, c, 3, 3, device="cuda", generator=generator) / (3 * c**0.5),
           torch.randn(c, device="cuda", generator=generator),
           torch.rand(n, 9, h, w, device="cuda", generator=generator)]  # fmt: skip
    dcn = [t.requires_grad_() for t in dcn]
    paths = {
        "ms_deform_attn 800x1333 enc, opbridge": lambda: opbridge.ms_deform_attn(*large),
        "ms_deform_attn 800x1333 enc, grid_sample": lambda: reference(*large),
        "ms_deform_attn 512x512 enc, opbridge": lambda: opbridge.ms_deform_attn(*small),
        "ms_deform_attn 512x512 enc, grid_sample": lambda: reference(*small),
        "deform_conv2d N8 C256 50x68, opbridge": lambda: opbridge.deform_conv2d(*dcn[:4], padding=(1, 1), mask=dcn[4]),
        "deform_conv2d N8 C256 50x68, torchvision": lambda: torchvision.ops.deform_conv2d(*dcn[:4], padding=(1, 1),
                                                                                          mask=dcn[4]),
    }  # fmt: skip
    sections, totals = [], {}
    for name, forward in paths.items():
        for _ in range(2):
            forward().sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                forward().sum().backward()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
        kernels.sort(key=lambda e: -e.self_device_time_total)
        total = totals[name] = sum(e.self_device_time_total for e in kernels) / steps / 1e3
        lines = [f"### {name}: {total:.3f} ms of kernels a training step", "", "| kernel | calls a step | ms a step |",
                 "|---|---|---|"]  # fmt: skip
        for e in kernels[:8]:
            lines.append(f"| `{e.key[:90]}` | {e.count / steps:g} | {e.self_device_time_total / steps / 1e3:.3f} |")
        sections.append("\n".join(lines))
    ratios = ["GPU time alone (the kernels of a training step, no host time between them):", ""]
    for name, total in totals.items():
        case, path = name.rsplit(", ", 1)
        if path == "opbridge":
            baseline = next(v for k, v in totals.items() if k.startswith(case + ", ") and k != name)
            ratios.append(f"- {case}: {baseline / total:.2f}x the baseline ({total:.3f} ms against {baseline:.3f} ms)")
    return ("\n\n## Where the GPU time goes (forward + backward, torch.profiler)\n\n" + "\n".join(ratios) + "\n\n"
            + "\n\n".join(sections))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--markdown", type=Path, help="write the report here")
    parser.add_argument("--no-profile", action="store_true", help="leave out the per-kernel breakdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or opbridge._extension.cuda_library is None:
        print("bench_cuda: no GPU, or no CUDA library in this opbridge: nothing to time", file=sys.stderr)
        return 0
    torch.backends.cudnn.benchmark = False
    bandwidth = copy_bandwidth(args.repeat)
    rows = msda_rows(args.repeat, bandwidth) + deform_rows(args.repeat)
    ort = ort_rows(args.repeat)
    from . import bench_cuda_more

    more_text, more = bench_cuda_more.report()
    text = report(rows, bandwidth) + ort_report(ort) + "\n" + more_text
    text += "" if args.no_profile else profile_report()
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps({"bandwidth_gbs": bandwidth, "rows": rows, "ort_rows": ort, "more": more}, indent=1)
        )
    if args.markdown:
        args.markdown.write_text("# opbridge's CUDA ops on the GPU\n\n`python -m opbridge.tools.bench_cuda`\n\n"
                                 + text + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
