"""Argument checks of the Python wrappers and fake kernels, with messages that name the op, the argument
and what was expected. Wrappers run them only outside TorchScript (``torch.jit.is_scripting()``), where
the compiler itself enforces the annotated types."""

from __future__ import annotations

import operator

import torch


def tensor(op: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, torch.Tensor):
        expected = "a tensor or None" if optional else "a tensor"
        raise TypeError(f"{op}: {name} must be {expected}, got {type(value).__name__}")


def _is_int(value) -> bool:
    # Anything with __index__ (int, numpy integers, SymInt under torch.export / torch.compile) but a bool,
    # which is an int in Python and never a size; floats have no __index__.
    if isinstance(value, torch.SymInt):
        return True
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    if isinstance(value, int):
        return True
    if value is None or isinstance(value, (tuple, list, float, str, torch.Tensor)):
        # Decided without the exception below: torch.compile of torch 2.11 turns operator.index's TypeError on a
        # tuple into an internal error instead of letting the except clause take it.
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def int_pair(op: str, name: str, value, minimum: int) -> list[int]:
    """An int or a pair of ints (tuple or list), each >= ``minimum``, as a list of two Python ints."""
    values = [value, value] if _is_int(value) else value
    if not isinstance(values, (tuple, list)) or len(values) != 2 or not all(_is_int(v) for v in values):
        raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    values = [v if isinstance(v, torch.SymInt) else operator.index(v) for v in values]
    for v in values:
        if not isinstance(v, torch.SymInt) and v < minimum:
            raise ValueError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return values


def one_device(op: str, **tensors) -> None:
    """All tensors on one device (for fake kernels: a meta or fake call with mixed devices must fail, as the
    real kernel does, instead of producing an output on one of them)."""
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    torch._check(
        len(devices) <= 1,
        lambda: (
            f"{op}: expected all tensors on one device, got "
            + ", ".join(f"{name} on {t.device}" for name, t in present.items())
        ),
    )


def alert_not_deterministic(op: str, *tensors) -> None:
    """What torch's own CUDA kernels with atomic additions do under ``torch.use_deterministic_algorithms(True)``
    (raise, or warn with ``warn_only=True``), for a backward of ours that scatters with atomics on CUDA."""
    if not any(t is not None and t.is_cuda for t in tensors) or not torch.are_deterministic_algorithms_enabled():
        return
    message = (
        f"{op} on CUDA adds into its input gradient with atomic operations: the order of those additions, and so "
        "the result's last bits, can change between runs. torch.use_deterministic_algorithms(True) is set: run it "
        "on the CPU (deterministic at any thread count), or call torch.use_deterministic_algorithms(True, "
        "warn_only=True) to accept it."
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        import warnings

        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        raise RuntimeError(message)


#: The floating dtypes every op takes: float16 and bfloat16 are storage types (float32 arithmetic inside).
FLOAT_STORAGE = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALF = (torch.float16, torch.bfloat16)


def float_storage(op: str, name: str, value) -> None:
    """A fake kernel's check of the op's main floating input, as the C++ adapters word it."""
    torch._check(
        value.dtype in FLOAT_STORAGE,
        lambda: f"{op}: expected float32, float64, float16 or bfloat16 tensors, got {name} of dtype {value.dtype}",
    )


def same_dtype(op: str, main_name: str, main, name: str, value, precise: bool = False) -> None:
    """`value` in `main`'s dtype; a `precise` input (locations, offsets, masks, boxes) also float32 beside float16 or
    bfloat16 storage (cpp/torch/api.h, pairs_with)."""
    if value is None:
        return
    allowed = value.dtype == main.dtype or (precise and main.dtype in HALF and value.dtype == torch.float32)
    torch._check(
        allowed,
        lambda: (
            f"{op}: {name} must have the dtype of {main_name} ({main.dtype})"
            + (" or float32" if precise and main.dtype in HALF else "")
            + f", got {value.dtype}"
        ),
    )
