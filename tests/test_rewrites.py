"""The export-time rewrites (python/opbridge/rewrites.py): SizeAwareTorch is torch for numbers (bit for bit), keeps
sizes symbolic under torch.export and traced under the TorchScript tracer (the values at other sizes equal torch's
own), is applied by patch_model only to modules whose torch is torch, and is undone by the Patch; a patched
Deformable DETR exports with a dynamic image size and batch with torch's default exporter and runs in ONNX Runtime
at another size and batch as in eager."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings

import pytest
import torch

import opbridge
from opbridge import rewrites
from opbridge.integrations import Patch

pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")


def test_size_aware_as_tensor_is_torchs_for_numbers():
    shim = rewrites.SizeAwareTorch()
    for data, kwargs in (([(3, 4), (5, 6)], dict(dtype=torch.long)), ([(3, 4)], {}), ([1.5, 2.0], {}), (7, {})):
        expected = torch.as_tensor(data, **kwargs)
        found = shim.as_tensor(data, **kwargs)
        assert found.dtype == expected.dtype and torch.equal(found, expected)
    assert shim.cat is torch.cat and shim.nn is torch.nn


class _SpatialShapes(torch.nn.Module):
    """A level table built as the DETR family builds it: a list of (height, width) of feature maps."""

    def forward(self, x):
        maps = [x, x[:, :, ::2, ::2]]
        as_tensor = rewrites.SizeAwareTorch().as_tensor
        shapes = as_tensor([tuple(m.shape[2:]) for m in maps], dtype=torch.long, device=x.device)
        return shapes * 1


def test_size_aware_as_tensor_keeps_sizes_symbolic_under_torch_export():
    size = {2: torch.export.Dim("height", min=4, max=256), 3: torch.export.Dim("width", min=4, max=256)}
    program = torch.export.export(_SpatialShapes(), (torch.randn(1, 2, 12, 20),), dynamic_shapes=({**size},))
    out = program.module()(torch.randn(1, 2, 30, 18))
    assert out.tolist() == [[30, 18], [15, 9]]


def test_size_aware_as_tensor_keeps_sizes_traced_under_the_torchscript_tracer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_SpatialShapes(), (torch.randn(1, 2, 12, 20),))
    assert traced(torch.randn(1, 2, 30, 18)).tolist() == [[30, 18], [15, 9]]


def test_size_aware_tensor_is_torchs_for_numbers():
    shim = rewrites.SizeAwareTorch()
    for data, kwargs in (([3, 4, 3, 4], dict(dtype=torch.float32)), ([3, 4], {}), ([1.5, 2], {}), ([[1, 2]], {}),
                         (7, dict(dtype=torch.float64)), ([], {}), ([True, False], {})):  # fmt: skip
        expected = torch.tensor(data, **kwargs)
        found = shim.tensor(data, **kwargs)
        assert found.dtype == expected.dtype and torch.equal(found, expected)
    # Tensors in eager mode are numbers too: torch's own call (a copy of their values).
    found = shim.tensor([torch.tensor(2.5), 3])
    assert found.dtype == torch.tensor([2.5, 3]).dtype and found.tolist() == [2.5, 3.0]


class _BoxNorm(torch.nn.Module):
    """Boxes in pixels normalized by the map's size, as PP-DocLayout v3's mask_to_box_coordinate does."""

    def forward(self, x):
        height, width = x.shape[-2:]
        boxes = x.flatten(1)[:, :4]
        return boxes / rewrites.SizeAwareTorch().tensor([width, height, width, height], device=x.device, dtype=x.dtype)


def test_size_aware_tensor_follows_the_size_under_both_exporters():
    def expected(x):
        return x.flatten(1)[:, :4] / torch.tensor([x.shape[3], x.shape[2], x.shape[3], x.shape[2]], dtype=x.dtype)

    size = {2: torch.export.Dim("height", min=2, max=256), 3: torch.export.Dim("width", min=4, max=256)}
    program = torch.export.export(_BoxNorm(), (torch.randn(1, 2, 12, 20),), dynamic_shapes=({**size},))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(_BoxNorm(), (torch.randn(1, 2, 12, 20),))
    # torch.tensor of the traced sizes would have warned that it turned them into Python numbers (constants).
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)], [str(w.message) for w in caught]
    for h, w in ((30, 18), (3, 5)):
        x = torch.randn(1, 2, h, w)
        assert torch.equal(program.module()(x), expected(x))
        assert torch.equal(traced(x), expected(x))


def test_size_aware_linspace_is_torchs_for_numbers():
    shim = rewrites.SizeAwareTorch()
    for start, end, steps, dtype in ((0.5, 6.5, 7, torch.float32), (0, 12, 13, torch.float64), (0.5, 0.5, 1, None),
                                     (-1.0, 1.0, 5, torch.float16), (0, 1, 0, torch.float32)):  # fmt: skip
        expected = torch.linspace(start, end, steps, dtype=dtype)
        found = shim.linspace(start, end, steps, dtype=dtype)
        assert found.dtype == expected.dtype and torch.equal(found, expected)


class _Grids(torch.nn.Module):
    """Cell centres and corners of a feature map, as the DETR family's reference points and proposals make them."""

    def forward(self, x):
        height, width = x.shape[-2:]
        shim = rewrites.SizeAwareTorch()
        centres = shim.linspace(0.5, height - 0.5, height, dtype=x.dtype, device=x.device)
        corners = shim.linspace(0, width - 1, width, dtype=x.dtype, device=x.device)
        counts = shim.linspace(0, width - 1, width, dtype=torch.long, device=x.device)
        return torch.cat([centres, corners, counts.to(x.dtype)]) * 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_size_aware_linspace_follows_the_size_under_both_exporters(dtype):
    def expected(h, w):
        counts = torch.linspace(0, w - 1, w, dtype=torch.long).to(dtype)
        return torch.cat(
            [torch.linspace(0.5, h - 0.5, h, dtype=dtype), torch.linspace(0, w - 1, w, dtype=dtype), counts]
        )

    size = {2: torch.export.Dim("height", min=2, max=256), 3: torch.export.Dim("width", min=2, max=256)}
    program = torch.export.export(_Grids(), (torch.randn(1, 2, 12, 20, dtype=dtype),), dynamic_shapes=({**size},))
    for h, w in ((30, 18), (2, 3), (12, 20)):
        assert torch.equal(program.module()(torch.randn(1, 2, h, w, dtype=dtype)), expected(h, w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_Grids(), (torch.randn(1, 2, 12, 20, dtype=dtype),))
    for h, w in ((30, 18), (2, 3)):
        assert torch.equal(traced(torch.randn(1, 2, h, w, dtype=dtype)), expected(h, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_size_aware_linspace_of_a_half_model_exports_with_the_torchscript_exporter(tmp_path, dtype):
    """A half model's grids (patch_model on a model after .half()): the TorchScript exporter has no arange of a
    traced count in a half type, so the shim counts in int64; ONNX Runtime at another size gives torch's own half
    linspace (computed in float32, rounded once)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    path = tmp_path / "grids.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Grids(), (torch.randn(1, 2, 12, 20, dtype=dtype),), str(path), dynamo=False,
                          opset_version=17, input_names=["x"], dynamic_axes={"x": {2: "h", 3: "w"}})  # fmt: skip
    import onnx

    (output,) = onnx.load(str(path)).graph.output
    assert output.type.tensor_type.elem_type == {torch.float16: onnx.TensorProto.FLOAT16,
                                                 torch.bfloat16: onnx.TensorProto.BFLOAT16}[dtype]  # fmt: skip
    h, w = 30, 18
    expected = torch.cat([torch.linspace(0.5, h - 0.5, h, dtype=dtype), torch.linspace(0, w - 1, w, dtype=dtype),
                          torch.arange(w).to(dtype)])  # fmt: skip
    with warnings.catch_warnings():  # the traced graph the exporter translated, at another size
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_Grids(), (torch.randn(1, 2, 12, 20, dtype=dtype),))
    assert torch.equal(traced(torch.randn(1, 2, h, w, dtype=dtype)), expected)
    if dtype == torch.float16:  # numpy has no bfloat16 to feed ONNX Runtime with
        session = onnxruntime.InferenceSession(str(path))
        (found,) = session.run(None, {"x": torch.randn(1, 2, h, w, dtype=dtype).numpy()})
        assert torch.equal(torch.from_numpy(found), expected)


def test_modules_whose_torch_is_not_torch_are_left_alone(monkeypatch):
    module = types.ModuleType("transformers.models.opbridge_test.modeling_opbridge_test")
    module.torch = types.SimpleNamespace(linspace=torch.linspace)  # another library's shim
    monkeypatch.setitem(sys.modules, module.__name__, module)
    patch = Patch()
    rewrites.apply({module.__name__}, patch)
    assert not patch and not isinstance(module.torch, rewrites.SizeAwareTorch)


def test_size_aware_int_is_int_for_numbers_and_keeps_sizes_under_both_exporters(monkeypatch, tmp_path):
    size_int = rewrites._size_aware_builtin_int
    for args in ((3.7,), ("12",), ("ff", 16), (True,), (-2.5,), ()):
        assert size_int(*args) == int(*args) and type(size_int(*args)) is int
    assert size_int(torch.tensor(5)) == 5 and type(size_int(torch.tensor(5))) is int  # eager: a number

    def truncated(x):  # int() of a traced float is not a size: it still truncates (a constant, as without opbridge)
        return torch.full((), size_int(x.sum() * 0 + 2.7))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.jit.trace(truncated, (torch.ones(2),))(torch.ones(3)).item() == 2

    # A module that builds a grid from int() of its sizes, as OmDet-Turbo's position embedding does; apply() gives
    # it the size-aware int (its source has the line), restore() takes it back.
    source = tmp_path / "modeling_opbridge_int_test.py"
    source.write_text(
        "import torch\n\n"
        "def grid(x):\n"
        "    height, width = x.shape[-2:]\n"
        "    rows = torch.arange(int(height), dtype=x.dtype)\n"
        "    return torch.arange(int(width), dtype=x.dtype)[None, :] + rows[:, None]\n"
    )
    spec = importlib.util.spec_from_file_location(
        "transformers.models.opbridge_test.modeling_opbridge_int_test", source
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    patch = Patch()
    rewrites.apply({module.__name__}, patch)
    assert vars(module)["int"] is size_int, patch.swapped

    class Grid(torch.nn.Module):
        def forward(self, x):
            return module.grid(x) * 1

    def expected(x):
        return torch.arange(x.shape[3], dtype=x.dtype)[None, :] + torch.arange(x.shape[2], dtype=x.dtype)[:, None]

    size = {2: torch.export.Dim("height", min=2, max=64), 3: torch.export.Dim("width", min=2, max=64)}
    program = torch.export.export(Grid(), (torch.randn(1, 1, 6, 9),), dynamic_shapes=({**size},))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Grid(), (torch.randn(1, 1, 6, 9),))
    for h, w in ((7, 4), (12, 30)):
        x = torch.randn(1, 1, h, w)
        assert torch.equal(program.module()(x), expected(x))
        assert torch.equal(traced(x), expected(x))
    patch.restore()
    assert "int" not in vars(module)


def _tiny(name: str = "transformers.DeformableDetrModel"):
    from opbridge.tools.models import CASES

    model, inputs = CASES[name].build()[:2]
    return model, inputs


def test_size_aware_torch_int_is_the_librarys_for_numbers_and_keeps_symbolic_sizes():
    from transformers.utils.generic import torch_int as library

    wrapped = rewrites._size_aware_int(library)
    assert wrapped(7) == library(7) == 7 and wrapped(torch.tensor(5)) == library(torch.tensor(5)) == 5
    assert wrapped(3.9) == library(3.9) == 3

    class Positions(torch.nn.Module):
        def forward(self, x):
            return torch.arange(wrapped(x.shape[-1])) * 1

    program = torch.export.export(Positions(), (torch.randn(1, 12),), dynamic_shapes=({1: torch.export.Dim("w")},))
    assert program.module()(torch.randn(1, 5)).tolist() == [0, 1, 2, 3, 4]


def test_patch_model_rewrites_deformable_detr_and_restore_undoes_it():
    model, _ = _tiny()
    module = sys.modules["transformers.models.deformable_detr.modeling_deformable_detr"]
    before = module.torch  # torch, or the SizeAwareTorch of a patch another test left active
    with opbridge.patch_model(model) as patch:
        assert isinstance(module.torch, rewrites.SizeAwareTorch)
        # Rewritten once: a module a patch already rewrote is left to that patch.
        label = f"{module.__name__}.torch (as_tensor, tensor, linspace)"
        assert (label in patch.swapped) == (before is torch), patch.swapped
    assert module.torch is before


@pytest.mark.parametrize("name", ["transformers.DeformableDetrModel", "transformers.RTDetrModel"])
def test_patched_detr_exports_a_dynamic_size_and_batch_with_the_default_exporter(tmp_path, name):
    """torch.onnx.export (dynamo) of a patched Deformable DETR and RT-DETR (random weights, small configs): ONNX
    Runtime at another image size and batch matches eager (without the rewrites both graphs keep the exported
    size: docs/models.md)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    import opbridge_ort

    model, inputs = _tiny(name)
    (pixels,) = inputs
    pixels = pixels.expand(2, -1, -1, -1).contiguous()  # a batch of 2: torch.export fixes a dimension of size 1
    other = torch.rand(3, 3, pixels.shape[2] + 32, pixels.shape[3] - 32, generator=torch.Generator().manual_seed(1))
    dims = {0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}
    path = tmp_path / "detr.onnx"
    with opbridge.patch_model(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (pixels,), str(path), dynamic_shapes=(dims,), input_names=["pixel_values"])
        expected = model(other)
    session = onnxruntime.InferenceSession(str(path), opbridge_ort.session_options())
    (found, *_) = session.run(None, {"pixel_values": other.numpy()})
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-3, atol=1e-4)


def test_a_patched_model_still_compiles_without_graph_breaks():
    """torch.compile (dynamic shapes) of a patched Deformable DETR traces through SizeAwareTorch without a graph
    break and computes what eager computes, at two image sizes."""
    import torch._dynamo

    model, (pixels,) = _tiny()
    other = torch.rand(1, 3, pixels.shape[2] - 32, pixels.shape[3] + 32, generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad(), opbridge.patch_model(model):
        compiled = torch.compile(model, backend="eager", dynamic=True)
        found = [compiled(pixels), compiled(other)]
        expected = [model(pixels), model(other)]
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    for f, e in zip(found, expected, strict=True):
        torch.testing.assert_close(f, e, rtol=1e-5, atol=1e-5)


def test_jit_is_tracing_is_true_under_torch_export_only():
    """The models' export branches ("always interpolate when tracing") are taken under torch.export too; eager
    mode and torch.compile keep the library's own branch."""
    shim = rewrites.SizeAwareTorch()

    class Branch(torch.nn.Module):
        def forward(self, x):
            return x + (1.0 if shim.jit.is_tracing() else 0.0)

    x = torch.zeros(2)
    assert not shim.jit.is_tracing() and Branch()(x).tolist() == [0.0, 0.0]
    assert torch.export.export(Branch(), (x,)).module()(x).tolist() == [1.0, 1.0]
    assert torch.compile(Branch(), backend="eager")(x).tolist() == [0.0, 0.0]
    assert shim.jit.script is torch.jit.script


class _AnchorCachingHead(torch.nn.Module):
    """An Ultralytics-style head (its class's module is named ultralytics.*): anchors built for the last input's
    size, rebuilt when the size changes."""

    def __init__(self) -> None:
        super().__init__()
        self.shape = None
        self.anchors = torch.empty(0)

    def forward(self, x):
        shape = x.shape
        if self.shape != shape:
            self.anchors = torch.arange(x.shape[-1], dtype=x.dtype) / x.shape[-1]
            self.shape = shape
        return x + self.anchors


_first_line = vars(_AnchorCachingHead).get("__firstlineno__")
_AnchorCachingHead.__module__ = "ultralytics.opbridge_test"
if _first_line is not None:  # CPython 3.13 drops a class's __firstlineno__ with its __module__; getsource needs it
    _AnchorCachingHead.__firstlineno__ = _first_line


def _export_and_run_at_another_width(head):
    example, other = torch.rand(2, 3, 8), torch.rand(2, 3, 12)
    head(example)  # an eager call at the example's size: what the export meets in the cache
    dims = {0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(head, (example,), dynamic_shapes=(dims,))
    return program.module()(other), other + torch.arange(12, dtype=other.dtype) / 12


def test_ultralytics_heads_build_anchors_from_the_sizes_under_torch_export(monkeypatch):
    source_module = types.ModuleType("ultralytics.opbridge_test")
    source_module.__file__ = __file__  # where inspect finds the head's source
    monkeypatch.setitem(sys.modules, source_module.__name__, source_module)
    # Without the rewrite the cached anchors of width 8 are a constant of the program (it fails at width 12).
    with pytest.raises(Exception):  # noqa: B017 (torch.export's message varies by release)
        _export_and_run_at_another_width(_AnchorCachingHead())
    head = _AnchorCachingHead()
    patch = Patch()
    rewrites.apply_to_layers(head, patch)
    assert patch.swapped == ["ultralytics.opbridge_test._AnchorCachingHead (anchors from the sizes under torch.export)"]
    got, want = _export_and_run_at_another_width(head)
    torch.testing.assert_close(got, want)
    assert head.shape == (2, 3, 8)  # the eager cache as the export found it, nothing symbolic left in it
    # eager is the class's own forward, and a deep copy (Ultralytics' exporter makes one) runs its own layer
    x = torch.rand(1, 3, 5)
    torch.testing.assert_close(head(x), x + torch.arange(5.0) / 5)
    import copy

    twin = copy.deepcopy(head)
    twin(torch.rand(1, 3, 7))
    assert twin.shape == (1, 3, 7) and head.shape == (1, 3, 5)
    patch.restore()
    assert "forward" not in vars(head)


def _regrouped_by_loop(embeddings: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The reference: group b's rows in column b, zero rows past its size, one group at a time."""
    out = torch.zeros(max(sizes), len(sizes), embeddings.shape[1], dtype=embeddings.dtype)
    start = 0
    for b, size in enumerate(sizes):
        out[:size, b] = embeddings[start : start + size]
        start += size
    return out


@pytest.mark.parametrize("sizes", [[3, 3], [2, 3, 1], [1], [4, 0, 2]])
def test_regroup_by_size_is_the_loop_and_follows_the_sizes_under_both_exporters(sizes):
    embeddings = torch.randn(sum(sizes), 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = _regrouped_by_loop(embeddings, sizes)
    assert torch.equal(rewrites.regroup_by_size(embeddings, torch.tensor(sizes)), expected)

    class Regroup(torch.nn.Module):
        def forward(self, embeddings, sizes):
            return rewrites.regroup_by_size(embeddings, sizes)

    # Traced with other sizes, the graph follows the sizes it is given (the tracer records the gather, no loop).
    traced = torch.jit.trace(Regroup(), (torch.randn(5, 5, dtype=torch.float64), torch.tensor([2, 3])))
    assert torch.equal(traced(embeddings, torch.tensor(sizes)), expected)


def _omdet_inputs(model, sizes: list[int], batch_seed: int = 0):
    generator = torch.Generator().manual_seed(batch_seed)
    classes = torch.randint(3, 99, (sum(sizes), 7), generator=generator)  # the tiny CLIP: 99 tokens, 8 positions
    tasks = torch.randint(3, 99, (len(sizes), 8), generator=generator)
    task_mask = torch.ones_like(tasks)
    task_mask[:, 6:] = 0  # shorter prompts: the task embeddings are cut to the longest one
    task_mask[0, 4:] = 0
    return classes, torch.ones_like(classes), tasks, task_mask, torch.tensor(sizes)


def test_omdet_turbo_language_embedding_rewrite_computes_the_librarys_values(monkeypatch):
    """Under an exporter the rewrite computes OmDet-Turbo's text embeddings without its caches and loops; the
    values equal the library's method (fresh caches, float64, groups of different sizes). In eager mode the
    library's own method runs, caches and all."""
    model, _ = _tiny("transformers.OmDetTurboForObjectDetection")
    model = model.double()
    inner = next(m for m in model.modules() if "get_language_embedding" in dir(type(m)))
    inputs = _omdet_inputs(model, [2, 3, 1])

    def fresh_caches():
        for name in ("language_cache_class", "language_cache_prompt"):
            setattr(inner, name, type(getattr(inner, name))(inner.config.cache_size))

    with torch.no_grad():
        fresh_caches()
        expected = type(inner).get_language_embedding(inner, *inputs)
        with opbridge.patch_model(model) as patch:
            assert any("get_language_embedding" in label for label in patch.swapped), patch.swapped
            assert "get_language_embedding" in vars(inner)
            monkeypatch.setattr(rewrites, "_exporting", lambda: True)
            fresh_caches()
            found = inner.get_language_embedding(*inputs)
            assert len(inner.language_cache_class.cache) == 0  # no cache was read or filled
            monkeypatch.setattr(rewrites, "_exporting", lambda: False)
            eager = inner.get_language_embedding(*inputs)
            assert len(inner.language_cache_class.cache) > 0  # the library's method, caches and all
        assert "get_language_embedding" not in vars(inner)
    for f, e, g in zip(found, expected, eager, strict=True):
        assert torch.equal(f, e) and torch.equal(g, e)


def test_omdet_turbo_rewrite_is_skipped_with_a_warning_where_the_installed_code_differs(monkeypatch):
    model, _ = _tiny("transformers.OmDetTurboForObjectDetection")
    inner = next(m for m in model.modules() if "get_language_embedding" in dir(type(m)))
    owner = next(k for k in type(inner).__mro__ if "get_language_embedding" in vars(k))

    def get_language_embedding(self, *args):  # another release's method: not the code the rewrite serves
        return None

    monkeypatch.setattr(owner, "get_language_embedding", get_language_embedding)
    rewrites._language_embedding_rewrite.cache_clear()
    try:
        with (
            pytest.warns(UserWarning, match="get_language_embedding is not the code"),
            opbridge.patch_model(model) as patch,
        ):
            assert not any("get_language_embedding" in label for label in patch.swapped)
            assert "get_language_embedding" not in vars(inner)
    finally:
        rewrites._language_embedding_rewrite.cache_clear()


def test_omdet_turbo_exports_a_dynamic_batch_and_size_with_the_torchscript_exporter():
    """The sweep's case (random weights, tiny config): exported at batch 2 with the batch and image size dynamic,
    ONNX Runtime at batch 3 and another image size matches eager. Without the rewrites (the caches' loops, the
    class regrouping, the decoder's ``len()`` of the batch) the batch was fixed."""
    pytest.importorskip("onnxruntime")
    from opbridge.tools.models import run_case

    result = run_case("transformers.OmDetTurboForObjectDetection", True, "legacy", 17)
    assert (result.outcome, result.batch) == ("ok", "dynamic"), result.cause


def test_task_embeddings_cut_to_the_longest_prompt_in_the_graph():
    """OmDet-Turbo's task prompts are cut to the longest one; traced with prompts of 5 tokens, the graph cuts
    prompts of 8 (and 2) tokens where eager does (the library's ``.item()`` would be the number 5 in the trace)."""

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(20, 3)

        def forward(self, ids):
            return (self.embed(ids).double(),)

    class Tasks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = Text()

        def forward(self, ids, mask):
            return rewrites.task_embeddings(self.text, ids, mask)

    def prompts(lengths):
        ids = torch.randint(0, 20, (len(lengths), 9), generator=torch.Generator().manual_seed(len(lengths)))
        return ids, (torch.arange(9)[None, :] < torch.tensor(lengths)[:, None]).long()

    module = Tasks()
    with torch.no_grad():
        traced = torch.jit.trace(module, prompts([5, 3]))
        for lengths in ([5, 3], [8, 2, 4], [2]):
            ids, mask = prompts(lengths)
            pooled = module.text(ids)[0]
            width = max(lengths)  # the library's cut: the longest prompt
            expected = (pooled[:, :width].transpose(0, 1), mask[:, :width])
            for found in (module(ids, mask), traced(ids, mask)):
                assert all(torch.equal(f, e) for f, e in zip(found, expected, strict=True)), lengths


def test_omdet_turbo_with_its_prompts_as_inputs_exports_a_dynamic_batch_class_count_and_prompt_length(tmp_path):
    """Prompts as graph inputs (the deployment where the classes change per call), TorchScript exporter: exported
    at batch 2 with 3 classes an image and 5-token tasks, ONNX Runtime at batch 3 with 4 classes and 7-token tasks
    matches eager."""
    onnxruntime = pytest.importorskip("onnxruntime")
    import opbridge_ort

    model, _ = _tiny("transformers.OmDetTurboForObjectDetection")
    inner = next(m for m in model.modules() if "get_language_embedding" in dir(type(m)))

    class Prompted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, pixel_values, classes, tasks, task_mask, structure):
            for name in ("language_cache_class", "language_cache_prompt"):  # eager calls fill them
                setattr(self.model, name, type(getattr(self.model, name))(self.model.config.cache_size))
            out = self.model(pixel_values=pixel_values, classes_input_ids=classes,
                             classes_attention_mask=torch.ones_like(classes), tasks_input_ids=tasks,
                             tasks_attention_mask=task_mask, classes_structure=structure)  # fmt: skip
            return out.decoder_class_logits

    def feeds(batch, classes, task_length, seed):
        generator = torch.Generator().manual_seed(seed)
        tasks = torch.randint(3, 99, (batch, 8), generator=generator)
        return (
            torch.rand(batch, 3, 224, 224, generator=generator),
            torch.randint(3, 99, (batch * classes, 7), generator=generator),
            tasks,
            (torch.arange(8)[None, :] < task_length).long().expand(batch, -1).contiguous(),
            torch.full((batch,), classes),
        )

    names = ["pixel_values", "classes", "tasks", "task_mask", "structure"]
    dims = {name: {0: "classes" if name == "classes" else "batch"} for name in names}
    wrapper, other = Prompted().eval(), feeds(3, 4, 7, 1)
    path = tmp_path / "omdet.onnx"
    with opbridge.patch_model(inner), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = wrapper(*other)
        torch.onnx.export(wrapper, feeds(2, 3, 5, 0), str(path), dynamo=False, opset_version=17, input_names=names,
                          dynamic_axes=dims)  # fmt: skip
    session = onnxruntime.InferenceSession(str(path), opbridge_ort.session_options())
    graph_inputs = {i.name for i in session.get_inputs()}
    (found,) = session.run(None, {n: v.numpy() for n, v in zip(names, other, strict=True) if n in graph_inputs})
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-3, atol=1e-4)
