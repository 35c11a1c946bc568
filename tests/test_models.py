"""The model sweep's fast subset (the full sweep: `nox -s models`): real models exported without and with opbridge,
each case in a fresh process; opbridge must never make a case worse."""

from __future__ import annotations

import pytest

from opbridge.tools import models

pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")
pytest.importorskip("torchvision", reason="torchvision is not installed")

FAST = [case.name for case in models.select(None, fast=True)]


@pytest.mark.parametrize("model", FAST)
def test_fast_models_no_worse_with_opbridge(model):
    results = models.sweep([models.CASES[model]], exports=(("legacy", 17), ("dynamo", 18)), timeout=300)
    assert not models.regressions(results), models.regressions(results)
    without = {(r.exporter, r.opset): r for r in results if not r.opbridge}
    for result in results:
        if result.opbridge and without[(result.exporter, result.opset)].outcome == "ok":
            assert result.outcome == "ok", result


def test_case_ids_round_trip():
    identifier = models.case_id("torchvision.resnet18", True, "legacy", 17)
    assert identifier == "with:torchvision.resnet18:legacy17"
    assert models.parse_id(identifier) == ("torchvision.resnet18", True, "legacy", 17, "float32")
    half = models.case_id("transformers.Mask2FormerModel", False, "dynamo", 18, "float16")
    assert half == "without:transformers.Mask2FormerModel:dynamo18:float16"
    assert models.parse_id(half) == ("transformers.Mask2FormerModel", False, "dynamo", 18, "float16")
    for wrong in ("resnet18", "with:torchvision.resnet18:legacy17:float8", "maybe:torchvision.resnet18:legacy17"):
        with pytest.raises(ValueError, match="not a case id"):
            models.parse_id(wrong)


def test_regressions_are_found():
    base = dict(model="m", exporter="legacy", opset=17, cause="")
    before = models.Result(id="a", opbridge=False, outcome="ok", **base)
    after = models.Result(id="b", opbridge=True, outcome="export fails", **base)
    assert models.regressions([before, after])
    assert not models.regressions([before, models.Result(id="c", opbridge=True, outcome="ok", **base)])


class _SizeAsNumber(__import__("torch").nn.Module):
    """Module code that turns its input's height into a number: the exported graph holds the example's size."""

    def forward(self, x):
        import torch

        height = int(x.shape[2])
        return x.mean(dim=(2, 3)) * torch.tensor(float(height))


@pytest.mark.parametrize("exporter, opset", [("legacy", 17), ("dynamo", 18)])
def test_a_graph_fixed_to_the_exported_size_is_named(exporter, opset, monkeypatch):
    import torch

    def build():
        return _SizeAsNumber(), (torch.rand(2, 3, 8, 8),), (torch.rand(2, 3, 12, 12),), (torch.rand(3, 3, 8, 8),)

    case = models.ModelCase("toy.size_as_number", "toy", "test", build, {0: {2: "height", 3: "width"}})
    monkeypatch.setitem(models.CASES, case.name, case)
    result = models.run_case(case.name, False, exporter, opset)
    assert result.outcome == "fixed size", result
    assert "matches at the exported size" in result.cause and "tests/test_models.py:" in result.cause, result.cause


class _BatchAsNumber(__import__("torch").nn.Module):
    """Module code that turns its input's batch into a number (right at any image size, not at another batch)."""

    def forward(self, x):
        batch = int(x.shape[0])
        return x.mean(dim=(2, 3)).reshape(batch, -1) * float(batch)


@pytest.mark.parametrize("exporter, opset", [("legacy", 17), ("dynamo", 18)])
def test_a_graph_fixed_to_the_exported_batch_is_named(exporter, opset, monkeypatch):
    import torch

    def build():
        return _BatchAsNumber(), (torch.rand(2, 3, 8, 8),), (torch.rand(2, 3, 12, 12),), (torch.rand(3, 3, 8, 8),)

    case = models.ModelCase("toy.batch_as_number", "toy", "test", build, {0: {2: "height", 3: "width"}})
    monkeypatch.setitem(models.CASES, case.name, case)
    result = models.run_case(case.name, False, exporter, opset)
    assert (result.outcome, result.batch) == ("fixed batch", "fixed"), result
    assert f"at batch {models.OTHER_BATCH}" in result.cause, result.cause
    if exporter == "legacy":  # the tracer's note names the line (torch.export here keeps the input's batch symbolic
        # and bakes the number into the view: nothing in the program names it)
        assert "tests/test_models.py:" in result.cause, result.cause


def test_a_dynamic_batch_and_the_graph_size_are_reported(monkeypatch):
    import torch

    def build():
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1)).eval()
        return model, (torch.rand(2, 3, 8, 8),), (torch.rand(2, 3, 12, 12),), (torch.rand(3, 3, 8, 8),)

    case = models.ModelCase("toy.convolution", "toy", "test", build, {0: {2: "height", 3: "width"}})
    monkeypatch.setitem(models.CASES, case.name, case)
    result = models.run_case(case.name, False, "legacy", 17)
    assert (result.outcome, result.batch) == ("ok", "dynamic"), result
    assert result.nodes == 2 and result.load_ms > 0, result  # Conv and GlobalAveragePool


def test_a_missing_library_is_unavailable_not_a_failure(monkeypatch):
    def build():
        import opbridge_no_such_library  # noqa: F401

    case = models.ModelCase("toy.missing", "opbridge_no_such_library", "test", build, {})
    monkeypatch.setitem(models.CASES, case.name, case)
    result = models.run_case(case.name, True, "legacy", 17)
    assert result.outcome == "unavailable" and "not installed" in result.cause, result


def test_node_count_takes_subgraphs_and_functions():
    onnx = pytest.importorskip("onnx")
    helper = onnx.helper
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "branch", [], [])
    branch_if = helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)
    function = onnx.helper.make_function(
        "local",
        "f",
        ["a"],
        ["b"],
        [helper.make_node("Neg", ["a"], ["t"]), helper.make_node("Abs", ["t"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph([branch_if, helper.make_node("f", ["z"], ["w"], domain="local")], "g", [], [])
    model = helper.make_model(graph, functions=[function])
    assert models.count_nodes(model) == 2 + 2 + 2  # If and the call, each branch's Identity, the function's two


def test_graph_growth_is_named_in_the_report():
    base = dict(model="m", exporter="legacy", opset=17, cause="", outcome="ok")
    before = models.Result(id="without:m:legacy17", opbridge=False, nodes=100, load_ms=10.0, **base)
    small = models.Result(id="with:m:legacy17", opbridge=True, nodes=100 + models.GROWTH, load_ms=11.0, **base)
    text = "\n".join(models.graph_size_markdown([before, small]))
    assert f"No graph grew by more than {models.GROWTH} nodes" in text and "| `m` | legacy 17 | 100 → 120 |" in text
    grown = models.Result(id="with:m:legacy17", opbridge=True, nodes=101 + models.GROWTH, load_ms=11.0, **base)
    text = "\n".join(models.graph_size_markdown([before, grown]))
    assert f"Grown by more than {models.GROWTH} nodes: `with:m:legacy17` (100 → 121)" in text


def test_graph_growth_counts_like_for_like_only():
    """A graph that follows the sizes (ok with opbridge, fixed size without) holds as nodes what the other holds as
    constants: named with both outcomes, not counted as growth."""
    base = dict(model="m", exporter="dynamo", opset=18, cause="", load_ms=1.0)
    before = models.Result(id="without:m:dynamo18", opbridge=False, outcome="fixed size", nodes=100, **base)
    after = models.Result(id="with:m:dynamo18", opbridge=True, outcome="ok", nodes=300, **base)
    text = "\n".join(models.graph_size_markdown([before, after]))
    assert "| `m` | dynamo 18 | 100 → 300 (fixed size → ok) |" in text and "No graph grew" in text
