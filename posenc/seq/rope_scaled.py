"""The registered RoPE context extensions: ``rope_linear`` (:class:`LinearRoPE`), ``rope_ntk``
(:class:`NTKRoPE`), ``rope_dynamic_ntk`` (:class:`DynamicNTKRoPE`), ``rope_yarn``
(:class:`YaRNRoPE`), ``rope_llama3`` (:class:`Llama3RoPE`), ``rope_longrope`` (:class:`LongRoPE`) and
``rope_proportional`` (:class:`ProportionalRoPE`, Gemma 4's full-attention layers).

Each is a plain :class:`~.rope.RotaryEncoding` holding its scaling's dataclass, so
``posenc.build("rope_yarn", dims=..., factor=4.0)`` and ``RotaryEncoding(head_dim,
scaling=YaRNScaling(...))`` compute the same thing. The classes exist for ``posenc.build`` and
for users who import them by name; all seven are made by :func:`_scaled_rope` from the table of
:mod:`.rope_scaling`, so their arguments are the dataclass's fields, in order:
``(head_dim, [max_len,] factor, [original_max_len,] <options>, base, rotary_dim, pairing)``.
The scalings that read the training length take ``max_len`` and ``original_max_len`` (``L0``):
``L0`` defaults to ``max_len // factor``, so that a model built for ``max_len`` (what
``posenc.build`` passes from ``ModelDims``) is the extended one. LongRoPE's lists default to
ones and to the NTK-aware factors ``s^(2k/(r-2))`` (:func:`~.rope_scaling.ntk_long_factors`).

Shapes, as for :class:`~.rope.RotaryEncoding`: ``q [B, Hq, Tq, D]``, ``k [B, Hkv, Tk, D]``,
positions ``[B or 1, T]``; hook q/k transform; kernel SDPA.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ..common.checks import check_int, check_number
from ..common.registry import register
from .context import make_scaling
from .rope import RotaryEncoding, check_rotary_dims
from .rope_scaling import ROPE_SCALING_ENTRIES, RopeScalingEntry


def _original_max_len(max_len: int | None, original_max_len: int | None, factor: float, name: str) -> int:
    """``original_max_len``, or ``max_len // factor`` when it is not given (``factor`` checked first,
    before it divides anything)."""
    check_number("factor", factor, minimum=1.0)
    if max_len is not None:
        check_int("max_len", max_len, minimum=1)
    if original_max_len is not None:
        return check_int("original_max_len", original_max_len, minimum=1)
    if max_len is None:
        raise ValueError(f"{name}: give original_max_len, or max_len (then original_max_len = max_len // factor)")
    out = int(max_len // factor)
    if out < 1:
        raise ValueError(f"{name}: max_len // factor = {max_len} // {factor} is 0; give original_max_len")
    return out


def _signature(entry: RopeScalingEntry) -> inspect.Signature:
    """The constructor's: ``self, head_dim``, the dataclass's fields (``max_len`` before ``factor``
    and ``original_max_len`` defaulting to None where the scaling reads ``L0``; a required option
    defaulting to None, filled from the width), then ``base, rotary_dim, pairing``."""
    fields = {f.name: f for f in dataclasses.fields(entry.config)}
    names = ["factor", *entry.options]
    if entry.needs_original_length:
        names[1:1] = ["original_max_len"]
    defaults = [(n, None if n == "original_max_len" or fields[n].default is dataclasses.MISSING else fields[n].default)
                for n in names]
    if entry.needs_original_length:
        defaults.insert(0, ("max_len", None))
    defaults += [("base", 10000.0), ("rotary_dim", None), ("pairing", "half_split")]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter("self", kind), inspect.Parameter("head_dim", kind),
                              *(inspect.Parameter(n, kind, default=d) for n, d in defaults)])


def _scaled_rope(class_name: str, scaling: str) -> type[RotaryEncoding]:
    """The registered encoding class of ``scaling``'s table row, named ``class_name``."""
    entry = ROPE_SCALING_ENTRIES[scaling]
    signature = _signature(entry)

    def __init__(self: RotaryEncoding, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{class_name}: {error}") from None
        bound.apply_defaults()
        given = bound.arguments
        l0 = None
        if entry.needs_original_length:
            l0 = _original_max_len(given["max_len"], given["original_max_len"], given["factor"], entry.encoding)
        r = check_rotary_dims(given["head_dim"], given["rotary_dim"])  # before the width-dependent defaults read it
        scaling_params = make_scaling(scaling, rotary_dim=r, factor=given["factor"], original_max_len=l0,
                                      **{name: given[name] for name in entry.options})
        RotaryEncoding.__init__(self, given["head_dim"], given["base"], given["rotary_dim"], given["pairing"],
                                scaling=scaling_params)

    __init__.__signature__ = signature  # what posenc.build and help() read
    __init__.__qualname__ = f"{class_name}.__init__"
    config = entry.config.__name__
    doc = (f"{entry.summary} ({entry.paper}): ``RotaryEncoding(head_dim, scaling={config}(...))``.\n\n"
           f"    Arguments: ``head_dim``; the fields of :class:`~.rope_scaling.{config}`; ``base``, ``rotary_dim`` "
           f"and ``pairing`` as for :class:`~.rope.RotaryEncoding`.\n    ")
    cls = type(class_name, (RotaryEncoding,), {
        "__init__": __init__, "__doc__": doc, "__module__": __name__, "__qualname__": class_name,
        "scaling_name": scaling,
    })
    return register(entry.encoding, modality="seq", paper=entry.paper, summary=entry.summary)(cls)


LinearRoPE = _scaled_rope("LinearRoPE", "linear")
NTKRoPE = _scaled_rope("NTKRoPE", "ntk")
DynamicNTKRoPE = _scaled_rope("DynamicNTKRoPE", "dynamic_ntk")
YaRNRoPE = _scaled_rope("YaRNRoPE", "yarn")
Llama3RoPE = _scaled_rope("Llama3RoPE", "llama3")
LongRoPE = _scaled_rope("LongRoPE", "longrope")
ProportionalRoPE = _scaled_rope("ProportionalRoPE", "proportional")

#: Each scaling's registered encoding class, by scaling name.
SCALED_ROPE_CLASSES: dict[str, type[RotaryEncoding]] = {
    cls.scaling_name: cls
    for cls in (LinearRoPE, NTKRoPE, DynamicNTKRoPE, YaRNRoPE, Llama3RoPE, LongRoPE, ProportionalRoPE)
}

__all__ = ["LinearRoPE", "NTKRoPE", "DynamicNTKRoPE", "YaRNRoPE", "Llama3RoPE", "LongRoPE", "ProportionalRoPE",
           "SCALED_ROPE_CLASSES"]
