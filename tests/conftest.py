from __future__ import annotations

import pytest
import torch

import opbridge  # noqa: F401  (registers the ops, fake kernels, autograd and export rules)

TOLERANCES = {torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12), torch.float16: (1e-3, 1e-3)}


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def randn(shape, dtype=torch.float32, generator=None) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
