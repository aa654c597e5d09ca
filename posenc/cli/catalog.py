"""The registry's table of contents, readable without torch: ``posenc list`` and the command
line's checks of encoding names answer from it before anything imports torch.

The live registry (:mod:`posenc.common.registry`) is filled by importing the modalities, which
import torch; this module reads a snapshot of it, ``_catalog_data.py``, written by
``python -m posenc.cli.catalog`` and checked against the live registry by the tests
(``tests/test_cli_light.py``), so a new or changed encoding without a fresh snapshot fails there.
Encodings registered at run time by user code are in the live registry only.

Each entry holds what the command line decides from an encoding name before it builds anything:
the modality, whether it is causal-only, the constructor's argument names (what
``--encoding-option`` may name, the names :func:`posenc.build` accepts), the rank of a vision
encoding's grid, the answers of the attention-kind rule
(:func:`posenc.common.planning.check_attention_kind`) for softmax and for linear attention, and
whether a sequence encoding decodes with a KV cache (``posenc bench generate`` times those).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..common.registry import MODALITIES

DATA_FILE = Path(__file__).with_name("_catalog_data.py")


@dataclass(frozen=True)
class CatalogEntry:
    """What the command line needs to know of a registered encoding without its class."""

    name: str
    modality: str
    hooks: tuple[str, ...]
    between_blocks: bool
    causal_only: bool
    linear_only: bool
    paper: str
    summary: str
    options: tuple[str, ...] = ()  # the constructor's argument names, as posenc.build accepts them
    grid_ndim: int = 0  # vision: 2 (images) or 3 (video); 0 for the other modalities
    softmax_error: str | None = None  # why softmax attention cannot run it (check_attention_kind), or None
    linear_error: str | None = None  # why linear attention cannot run it, or None
    # seq: whether a CausalLM built with it (its defaults; linear-only ones on linear attention)
    # decodes with a KV cache, else it recomputes the prefix at every step; None for the other modalities
    kv_cache: bool | None = None


def entries(modality: str | None = None) -> list[CatalogEntry]:
    """The snapshot's encodings, sorted by modality then name (as :func:`posenc.available`);
    optionally of one modality."""
    from ._catalog_data import ENTRIES

    if modality is not None and modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES} or None; got {modality!r}")
    return [CatalogEntry(*row) for row in ENTRIES if modality is None or row[1] == modality]


def entry(name: str) -> CatalogEntry | None:
    """The snapshot's entry of ``name``, or None when it is not registered."""
    return next((e for e in entries() if e.name == name), None)


def option_error(name: str, keys: Sequence[str]) -> str | None:
    """Why the encoding ``name`` takes no constructor argument among ``keys`` (one line with the
    closest names), or None; None as well for a name the snapshot lacks (the live registry answers)."""
    found = entry(name)
    if found is None:
        return None
    for key in keys:
        if key not in found.options:
            hint = suggest(key, found.options)
            if hint:
                return f"{name!r} takes no option {key!r}{hint}"
            return f"{name!r} takes no option {key!r}; it takes {', '.join(found.options) or 'none'}"
    return None


def names(modalities: Sequence[str] | None = None) -> list[str]:
    """The registered names (of ``modalities`` when given), sorted."""
    return sorted(e.name for e in entries() if modalities is None or e.modality in modalities)


def suggest(name: str, choices: Sequence[str], *, count: int = 3) -> str:
    """``" (did you mean 'rope'?)"`` for the closest names in ``choices``, or ``""`` when none is
    close: a misspelt name gets a hint instead of the list of every name."""
    close = difflib.get_close_matches(name, list(choices), n=count, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)"


def live_rows() -> list[tuple]:
    """The rows of the live registry (imports every modality, hence torch)."""
    import inspect

    from ..common.encoding import class_needs
    from ..common.planning import check_attention_kind
    from ..common.registry import available
    from ..seq.models import CausalLM

    def refusal(cls, feature_map: str | None, name: str) -> str | None:
        try:
            check_attention_kind(class_needs(cls), feature_map, name)
        except ValueError as exc:
            return str(exc.args[0])
        return None

    def kv_cache(info) -> bool | None:
        if info.modality != "seq":
            return None
        # the built model is asked, not the class: some encodings refuse a cache for some options only
        model = CausalLM(8, 8, 1, 2, encoding=info.name, max_len=16, feature_map="elu" if info.cls.linear_only else None)
        return bool(model.supports_kv_cache)

    rows = []
    for i in available():
        options = tuple(p for p in inspect.signature(i.cls.__init__).parameters if p != "self")
        grid = int(getattr(i.cls, "grid_ndim", 2)) if i.modality == "vision" else 0
        rows.append((i.name, i.modality, tuple(i.hooks), bool(i.cls.between_blocks), bool(i.causal_only),
                     bool(i.cls.linear_only), i.paper, i.summary, options, grid, refusal(i.cls, None, i.name),
                     refusal(i.cls, "elu", i.name), kv_cache(i)))
    return rows


def render(rows: Sequence[tuple]) -> str:
    """The text of ``_catalog_data.py`` holding ``rows``."""
    lines = ['"""Generated by ``python -m posenc.cli.catalog`` from the live registry; do not edit."""', "",
             "# (name, modality, hooks, between_blocks, causal_only, linear_only, paper, summary, options, grid_ndim,",
             "#  softmax_error, linear_error, kv_cache)", "ENTRIES = ("]
    lines += [f"    {row!r}," for row in rows]
    lines += [")", ""]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - the regeneration command
    DATA_FILE.write_text(render(live_rows()))
    print(f"wrote {DATA_FILE} ({len(live_rows())} encodings)")
