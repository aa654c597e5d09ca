"""Layer schedules: a model whose layers use different position encodings, as today's models do.

A schedule is a plain dict (a model saves it with its arguments), the ``layer_schedule`` option
of :class:`~posenc.seq.models.CausalLM` and :class:`~posenc.seq.models.SequenceEncoder`
(``posenc train seq --layer-schedule NAME --schedule-option KEY=VALUE``). Two kinds:

``{"schedule": "irope", "interval": 4, ...}`` -- NoPE/RoPE interleaving (Llama 4's iRoPE,
    SmolLM3's ``no_rope_layer_interval``): layer ``i`` (0-based) has no position encoding when
    ``(i + 1) % interval == 0`` (or when listed in ``nope_layers``), the model's ``encoding`` (RoPE,
    a scaled RoPE, ...) otherwise. With ``temperature`` (default True, Llama 4; False for
    SmolLM3) the NoPE layers scale their queries by Llama 4's attention temperature
    (:mod:`.nope_temperature`, ``floor_scale``, ``attn_scale``).
``{"schedule": "local_global", "pattern": 6, "local": {...}, "global": {...}}`` -- per-layer-type
    encodings (Gemma 3 and 4): layer ``i`` is global (full attention) when ``(i + 1) % pattern == 0``
    (or when listed in ``global_layers``), local (sliding window) otherwise. Local layers build the
    model's ``encoding`` with ``local`` added to its options, global ones ``global_encoding``
    (default the same) with ``global`` added: Gemma 3 is ``encoding="rope"``, ``local={"base":
    10000}``, ``global={"base": 1e6}``; Gemma 4's global layers are ``global_encoding=
    "rope_proportional"``, ``global={"base": 1e6, "partial_rotary_factor": 0.25}``. (The sliding
    window itself is a mask, :class:`~posenc.AttentionMask`'s ``window``, not a position encoding.)

Layers of one kind share an instance where the model would share one (no learned parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..common.checks import check_bool, check_choice, check_int, check_number, is_int
from ..common.encoding import Hook, PositionEncoding
from ..common.registry import get

SCHEDULES = ("irope", "local_global")
_KEYS = {
    "irope": ("interval", "nope_layers", "temperature", "floor_scale", "attn_scale"),
    "local_global": ("pattern", "global_layers", "local", "global", "global_encoding"),
}
_DEFAULTS: dict[str, dict[str, Any]] = {
    "irope": {"interval": 4, "nope_layers": None, "temperature": True, "floor_scale": 8192.0, "attn_scale": 0.1},
    "local_global": {"pattern": 6, "global_layers": None, "local": {}, "global": {}, "global_encoding": None},
}


def irope_schedule(interval: int = 4, *, nope_layers: Sequence[int] | None = None, temperature: bool = True,
                   floor_scale: float = 8192.0, attn_scale: float = 0.1) -> dict[str, Any]:
    """The iRoPE schedule as a checked plain dict (see the module docstring)."""
    return check_schedule({"schedule": "irope", "interval": interval, "nope_layers": nope_layers,
                           "temperature": temperature, "floor_scale": floor_scale, "attn_scale": attn_scale})


def local_global_schedule(pattern: int = 6, *, local: Mapping[str, Any] | None = None,
                          global_: Mapping[str, Any] | None = None, global_encoding: str | None = None,
                          global_layers: Sequence[int] | None = None) -> dict[str, Any]:
    """The local/global schedule as a checked plain dict (``global_`` is the dict's ``"global"``)."""
    return check_schedule({"schedule": "local_global", "pattern": pattern, "global_layers": global_layers,
                           "local": dict(local or {}), "global": dict(global_ or {}),
                           "global_encoding": global_encoding})


def _layer_list(name: str, value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(is_int(v) and v >= 0 for v in value):
        raise TypeError(f"layer_schedule {name} must be a list of layer indices (ints >= 0); got {value!r}")
    return sorted({int(v) for v in value})


def check_schedule(schedule: Mapping[str, Any]) -> dict[str, Any]:
    """``schedule`` with its defaults filled in, every key checked (one error naming the key)."""
    if not isinstance(schedule, Mapping) or "schedule" not in schedule:
        raise TypeError(f"layer_schedule must be a dict with a 'schedule' key ({' or '.join(SCHEDULES)}); got "
                        f"{schedule!r}")
    kind = schedule["schedule"]
    check_choice("layer_schedule['schedule']", kind, SCHEDULES)
    unknown = sorted(set(schedule) - {"schedule", *_KEYS[kind]})
    if unknown:
        raise ValueError(f"layer_schedule {kind}: unknown key(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(_KEYS[kind])}")
    out = {"schedule": kind, **_DEFAULTS[kind], **{k: v for k, v in schedule.items() if k != "schedule"}}
    if kind == "irope":
        check_int("layer_schedule interval", out["interval"], minimum=1)
        out["nope_layers"] = _layer_list("nope_layers", out["nope_layers"])
        check_bool("layer_schedule temperature", out["temperature"])
        out["floor_scale"] = check_number("layer_schedule floor_scale", out["floor_scale"], minimum=0.0, strict=True)
        out["attn_scale"] = check_number("layer_schedule attn_scale", out["attn_scale"], minimum=0.0)
    else:
        check_int("layer_schedule pattern", out["pattern"], minimum=1)
        out["global_layers"] = _layer_list("global_layers", out["global_layers"])
        for key in ("local", "global"):
            if not isinstance(out[key], Mapping):
                raise TypeError(f"layer_schedule {key} must be a dict of encoding options; got {out[key]!r}")
            out[key] = dict(out[key])
        if out["global_encoding"] is not None and not isinstance(out["global_encoding"], str):
            raise TypeError(f"layer_schedule global_encoding must be a registered name or None; got "
                            f"{out['global_encoding']!r}")
    return out


def layer_kinds(schedule: Mapping[str, Any], depth: int) -> list[str]:
    """Each layer's kind: "rope" or "nope" (irope), "local" or "global" (local_global)."""
    schedule = check_schedule(schedule)
    check_int("depth", depth, minimum=1)
    listed = schedule["nope_layers"] if schedule["schedule"] == "irope" else schedule["global_layers"]
    every = schedule["interval"] if schedule["schedule"] == "irope" else schedule["pattern"]
    if listed is not None and listed and listed[-1] >= depth:
        raise ValueError(f"layer_schedule lists layer {listed[-1]}, outside 0..{depth - 1} (depth {depth})")
    special = set(listed) if listed is not None else {i for i in range(depth) if (i + 1) % every == 0}
    names = ("nope", "rope") if schedule["schedule"] == "irope" else ("global", "local")
    return [names[0] if i in special else names[1] for i in range(depth)]


def layer_specs(schedule: Mapping[str, Any], encoding: str, options: Mapping[str, Any],
                depth: int) -> list[tuple[str | None, dict[str, Any]]]:
    """``(registered name or None, constructor options)`` per layer."""
    schedule = check_schedule(schedule)
    specs = []
    for kind in layer_kinds(schedule, depth):
        if kind == "rope" or kind == "local":
            extra = schedule["local"] if kind == "local" else {}
            specs.append((encoding, {**options, **extra}))
        elif kind == "nope":
            temp = {"floor_scale": schedule["floor_scale"], "attn_scale": schedule["attn_scale"]}
            specs.append(("nope_temperature", temp) if schedule["temperature"] else (None, {}))
        else:
            name = schedule["global_encoding"] or encoding
            base = dict(options) if name == encoding else {}
            specs.append((name, {**base, **schedule["global"]}))
    return specs


def scheduled_encodings(
    schedule: Mapping[str, Any],
    encoding: str | PositionEncoding | None,
    *,
    depth: int,
    options: Mapping[str, Any],
    share: bool | None,
    build: Callable[[str, Mapping[str, Any]], PositionEncoding],
    shared_in_paper: frozenset[str],
) -> list[PositionEncoding | None]:
    """One encoding (or None) per layer for ``schedule``, built by ``build(name, options)``; layers of
    one spec share an instance when ``share`` says so, or (None) when it has no learned parameters
    or is shared in its paper."""
    if not isinstance(encoding, str):
        got = "None" if encoding is None else f"an instance of {type(encoding).__name__}"
        raise ValueError(f"layer_schedule needs encoding= by registered name (what its RoPE or local layers use); "
                         f"got {got}")
    schedule = check_schedule(schedule)
    for name in filter(None, (encoding, schedule.get("global_encoding"))):  # every name, used by a layer or not
        try:
            info = get(name)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        if Hook.INPUT in info.cls.hooks:
            raise ValueError(f"layer_schedule: {name!r} acts on the input, once before the first block; a schedule "
                             "needs encodings of the attention (q/k, score bias)")
    built: dict[tuple, PositionEncoding] = {}
    layers: list[PositionEncoding | None] = []
    for name, opts in layer_specs(schedule, encoding, options, depth):
        if name is None:
            layers.append(None)
            continue
        key = (name, repr(sorted(opts.items())))
        first = built.get(key)
        if first is None:
            first = built[key] = build(name, opts)
            layers.append(first)
            continue
        keep = share if share is not None else (not any(True for _ in first.parameters()) or name in shared_in_paper)
        layers.append(first if keep else build(name, opts))
    return layers


__all__ = ["SCHEDULES", "irope_schedule", "local_global_schedule", "check_schedule", "layer_kinds", "layer_specs",
           "scheduled_encodings"]
