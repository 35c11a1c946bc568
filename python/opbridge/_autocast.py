"""How opbridge's ops run under ``torch.autocast`` (CPU and CUDA): one rule per op, declared in its module.

Without a rule an op would meet autocast's mixed dtypes (a bfloat16 projection beside float32 locations) and refuse
them. Each rule is one of (docs/api.md, "Precision and autocast"):

* ``native``: the op runs in the autocast dtype (float16 or bfloat16 storage; the kernels compute and accumulate in
  float32 and round once). The ``precise`` arguments (sampling locations, offsets, masks, boxes) are cast to float32
  instead: a bfloat16 location on a 1333-pixel map is off by up to 2.6 pixels. The output has the autocast dtype.
* ``float32``: every floating argument is cast to float32; the output is cast back to the dtype argument ``like``
  came with (torchvision's rule for ``roi_align`` and ``deform_conv2d`` on CUDA).
* ``promote``: the floating arguments are cast to the widest of their dtypes (autocast's rule for ``add``).

As autocast itself, a rule leaves float64 alone: with a float64 argument the op runs as called. The casts are
ordinary differentiable ``Tensor.to`` calls, so every input's gradient comes back in its own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Rule", "register"]

_DEVICES = ("cpu", "cuda")
_LIBRARIES: list[torch.library.Library] = []


@dataclass(frozen=True)
class Rule:
    policy: str  # "native", "float32" or "promote"
    precise: tuple[int, ...] = ()  # "native": the positions of arguments kept in float32
    like: int | None = None  # "float32": the position whose dtype the output returns to

    def __post_init__(self):
        if self.policy not in ("native", "float32", "promote"):
            raise ValueError(f"autocast policy must be native, float32 or promote, got {self.policy!r}")

    def describe(self) -> str:
        """One line for docs and docstrings."""
        if self.policy == "native":
            return "runs in the autocast dtype (float32 arithmetic inside)" + (
                ", its precision-critical inputs in float32" if self.precise else ""
            )
        if self.policy == "float32":
            return "computes in float32" + (", returns its input's dtype" if self.like is not None else "")
        return "runs in the widest dtype of its inputs"


def _eligible(value, device_type: str) -> bool:
    # autocast's own test (aten/src/ATen/autocast_mode.h, is_eligible): floating, not float64, on the device.
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == device_type
    )


def _autocast_dtype(device_type: str) -> torch.dtype:
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def cast_arguments(rule: Rule, args: tuple, device_type: str) -> tuple[tuple, torch.dtype | None]:
    """The arguments as the op receives them under autocast on `device_type`, and the dtype its (floating) output
    returns to (None: as the op gives it)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if any(t.dtype == torch.float64 for t in tensors) or not any(_eligible(a, device_type) for a in args):
        return args, None
    if rule.policy == "promote":
        target = tensors[0].dtype
        for t in tensors[1:]:
            target = torch.promote_types(target, t.dtype)
        return tuple(a.to(target) if _eligible(a, device_type) else a for a in args), None
    if rule.policy == "float32":
        back = args[rule.like].dtype if rule.like is not None and _eligible(args[rule.like], device_type) else None
        return tuple(a.to(torch.float32) if _eligible(a, device_type) else a for a in args), back
    target = _autocast_dtype(device_type)
    return tuple(
        (a.to(torch.float32 if i in rule.precise else target) if _eligible(a, device_type) else a)
        for i, a in enumerate(args)
    ), None


def _positional(op, args: tuple, kwargs: dict) -> tuple:
    """The call's arguments by position (keywords placed by the schema; defaults filled where a later one is
    given)."""
    if not kwargs:
        return args
    schema = op._schema.arguments
    values = list(args)
    for index in range(len(args), len(schema)):
        argument = schema[index]
        if argument.name in kwargs:
            values.extend(a.default_value if a.has_default_value() else None for a in schema[len(values) : index])
            values.append(kwargs[argument.name])
    return tuple(values)


def register(qualname: str, rule: Rule) -> None:
    """Registers `rule` as the autocast kernel of `qualname` ("opbridge::op") on the CPU and CUDA."""
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    library = torch.library.Library(namespace, "IMPL")
    _LIBRARIES.append(library)  # a registration lives as long as its Library object
    for device_type in _DEVICES:
        key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        key = getattr(torch._C.DispatchKey, key_name)

        def run(*args, _device_type=device_type, _key=key, **kwargs):
            args = _positional(op, args, kwargs)
            cast, back = cast_arguments(rule, args, _device_type)
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_key)):
                out = op(*cast)
            if back is None:
                return out
            if isinstance(out, torch.Tensor):
                return out.to(back) if out.is_floating_point() else out
            return type(out)(o.to(back) if o.is_floating_point() else o for o in out)

        # The Python kernel serves torch.compile's and torch.export's tracing; the dispatcher's, eager calls.
        op.py_kernels.pop(key, None)
        op.py_impl(key)(run)
        library.impl(name, lambda _keyset, *args, _run=run: _run(*args), key_name, with_keyset=True)
