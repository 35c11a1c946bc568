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
    assert models.parse_id(identifier) == ("torchvision.resnet18", True, "legacy", 17)
    with pytest.raises(ValueError, match="not a case id"):
        models.parse_id("resnet18")


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
        return _SizeAsNumber(), (torch.rand(1, 3, 8, 8),), (torch.rand(1, 3, 12, 12),)

    case = models.ModelCase("toy.size_as_number", "toy", "test", build, {0: {2: "height", 3: "width"}})
    monkeypatch.setitem(models.CASES, case.name, case)
    result = models.run_case(case.name, False, exporter, opset)
    assert result.outcome == "fixed size", result
    assert "matches at the exported size" in result.cause and "tests/test_models.py:" in result.cause, result.cause
