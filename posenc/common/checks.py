"""The one home of value rules shared by the whole package.

Every constructor argument, configuration field and position tensor is checked by one of these
functions, so a rule ("an int, not a bool", "finite", "positive") is written once and every
misuse reads the same way: ``NAME must be WHAT; got VALUE``. A wrong type raises ``TypeError``,
a wrong value ``ValueError``. The command line reuses them through :mod:`posenc.cli.argtypes`, which
turns the message into argparse's one line and exit status 2.

::

    check_int("num_heads", num_heads, minimum=1)
    check_number("scale", scale, minimum=0.0, strict=True)
    check_positions("positions", positions, integer=True, minimum=0)
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, Collection

if TYPE_CHECKING:  # torch is imported where a tensor is checked: the value rules serve the torch-free command line
    import torch
    from torch import Tensor

__all__ = [
    "is_int",
    "is_number",
    "is_real",
    "check_int",
    "check_number",
    "check_bool",
    "check_choice",
    "check_positions",
    "check_dtype",
    "check_tensor",
    "check_transform_backward_inputs",
    "check_sequence_positions",
]


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` is an ``int`` to Python, never a size to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number of any kind (NumPy's and ``fractions`` included, as read from a checkpoint or an
    array) that is not a ``bool``; :func:`is_number` is the narrower ``int``/``float`` test."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bound(minimum: float | None, maximum: float | None, strict: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"in {'(' if strict else '['}{minimum}, {maximum}]"
    if minimum is not None:
        if minimum == 0 and strict:
            return "positive"
        if minimum == 1 and not strict:
            return ">= 1"
        return f"{'>' if strict else '>='} {minimum}"
    return f"<= {maximum}"


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; ``bool`` and ``float`` are refused."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int; got {value!r} ({type(value).__name__})")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        what = "a positive int" if minimum == 1 and maximum is None else f"an int {_bound(minimum, maximum, False)}"
        raise ValueError(f"{name} must be {what}; got {value}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
) -> float:
    """``value`` as a finite ``float``, ``>= minimum`` (``> minimum`` when ``strict``) and ``<= maximum``."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number; got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value}")
    low_bad = minimum is not None and (value <= minimum if strict else value < minimum)
    if low_bad or (maximum is not None and value > maximum):
        bound = _bound(minimum, maximum, strict)
        what = "a positive number" if bound == "positive" else f"a number {bound}"
        raise ValueError(f"{name} must be {what}; got {value}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (``0``/``1`` or a string are refused: they hide mistakes)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return value


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def check_positions(
    name: str,
    positions: Any,
    *,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    ndim: Collection[int] | None = None,
) -> Tensor:
    """``positions`` if it is a tensor of real numbers (never ``bool``: ``True`` would be read as
    position 1), finite, of an integer dtype when ``integer``, within ``[minimum, maximum]`` and
    of one of the ranks ``ndim``.

    Reading the values (finite, range) synchronises with the device; callers on a hot path check
    once where positions enter, not in every layer. While ``torch.compile`` traces, only the
    static rules (type, dtype, rank) are checked: a value check would break the graph.
    """
    import torch

    check_static_positions(name, positions, integer=integer, ndim=ndim)
    if positions.numel() == 0 or torch.compiler.is_compiling():
        return positions
    if positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise ValueError(f"{name} must be finite; got {positions.flatten()[~torch.isfinite(positions.flatten())][0].item()}")
    if minimum is not None:
        low = positions.min().item()
        if low < minimum:
            raise ValueError(f"{name} must be >= {minimum}; got {low}")
    if maximum is not None:
        high = positions.max().item()
        if high > maximum:
            raise ValueError(f"{name} must be <= {maximum}; got {high}")
    return positions


def check_static_positions(
    name: str, positions: Any, *, integer: bool = False, ndim: Collection[int] | None = None
) -> Tensor:
    """The rules of :func:`check_positions` that read no value (type, dtype, rank): the check of
    the pure functions (:mod:`posenc.functional`), which must trace whole under ``torch.compile``
    and leave NaN to the caller."""
    import torch

    check_tensor(name, positions)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"{name} must hold integer or real positions; got dtype {positions.dtype}")
    if integer and positions.is_floating_point():
        raise TypeError(f"{name} must be an integer tensor; got dtype {positions.dtype}")
    _check_rank(name, positions, ndim)
    return positions


def check_dtype(name: str, dtype: Any) -> torch.dtype:
    """``dtype`` if it is a floating-point ``torch.dtype`` (a table or a cos/sin cache in ``long``
    would hold truncated 0s and 1s)."""
    import torch

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype; got {dtype!r} ({type(dtype).__name__})")
    if not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point dtype; got {dtype}")
    return dtype


def check_tensor(
    name: str,
    value: Any,
    *,
    floating: bool = False,
    ndim: Collection[int] | None = None,
    min_ndim: int | None = None,
) -> Tensor:
    """``value`` if it is a tensor (of a floating-point dtype when ``floating``) of one of the ranks
    ``ndim`` (or at least ``min_ndim``). Reads no value: safe under ``torch.compile``."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {value.dtype}")
    _check_rank(name, value, ndim)
    if min_ndim is not None and value.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions; got shape {tuple(value.shape)}")
    return value


def _check_rank(name: str, value: Tensor, ndim: Collection[int] | None) -> None:
    if ndim is not None and value.dim() not in ndim:
        ranks = " or ".join(str(n) for n in ndim)
        raise ValueError(f"{name} must have {ranks} dimensions; got shape {tuple(value.shape)}")


def check_transform_backward_inputs(
    scores: Tensor, centered_grad: Tensor, allowed: Tensor | None, *, heads: int | None = None
) -> None:
    """The block a :meth:`~posenc.common.encoding.PositionEncoding.transform_softmax_backward`
    takes: ``scores`` and ``centered_grad`` floating-point ``[B, H, rows, keys]`` of one shape
    (``H = heads`` when given) and ``allowed`` None or a bool mask ``[B or 1, 1, rows, keys]``.
    One line naming the argument and the shapes otherwise. Reads no value."""
    import torch

    check_tensor("scores", scores, floating=True, ndim=(4,))
    check_tensor("centered_grad", centered_grad, floating=True, ndim=(4,))
    if centered_grad.shape != scores.shape or (heads is not None and scores.shape[1] != heads):
        raise ValueError(f"scores and centered_grad must both be [B, {'H' if heads is None else f'{heads} heads'}, "
                         f"queries, keys]; got {tuple(scores.shape)} and {tuple(centered_grad.shape)}")
    if allowed is not None:
        check_tensor("allowed", allowed, ndim=(4,))
        if (allowed.dtype != torch.bool or allowed.shape[1] != 1 or allowed.shape[2:] != scores.shape[2:]
                or allowed.shape[0] not in (1, scores.shape[0])):
            raise ValueError(f"allowed must be a bool mask [B or 1, 1, {scores.shape[2]}, {scores.shape[3]}] or None; "
                             f"got {allowed.dtype} {tuple(allowed.shape)}")


def check_sequence_positions(q_pos: Tensor, kv_pos: Tensor, *, integer_for: str | None = None) -> None:
    """Query and key positions of a sequence encoding's hook: ``q_pos [B or 1, Tq]`` and
    ``kv_pos [B or 1, Tk]``; with ``integer_for`` (the encoding's name, for the message) of an
    integer dtype too. A ``ValueError`` names both shapes (and dtypes) otherwise. Static checks
    only (rank, dtype): no device synchronisation on the hot path."""
    if integer_for is not None:
        if q_pos.dim() != 2 or kv_pos.dim() != 2 or q_pos.dtype.is_floating_point or kv_pos.dtype.is_floating_point:
            raise ValueError(
                f"{integer_for} needs integer positions [batch or 1, tokens]; got {tuple(q_pos.shape)} {q_pos.dtype} "
                f"and {tuple(kv_pos.shape)} {kv_pos.dtype}"
            )
    elif q_pos.dim() != 2 or kv_pos.dim() != 2:
        raise ValueError(f"positions must be [batch or 1, tokens]; got {tuple(q_pos.shape)} and {tuple(kv_pos.shape)}")
