"""The settings of ``posenc bench generate`` (see :mod:`.generate`): the defaults, the rows it may
time (the sequence encodings that decode with a KV cache, read from the registry's snapshot,
:mod:`posenc.cli.catalog`) and :class:`GenerateBenchConfig`, which checks a run's settings. No
torch: the command checks its arguments with these before torch loads."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..catalog import entries
from ..errors import unknown_name
from .devices import bench_device

DEFAULT_CONTEXTS = (512, 2048, 8192)
DEFAULT_BATCHES = (1, 8)
LONG_CONTEXT = 2048  # prefill above this many tokens gets at most --long-repeats timed rounds
REFERENCE = "rope"  # the posenc row every other row's tok/s is divided by
HF_ROW = "llama (rope)"
PEERS = {"transformers": "transformers", "x-transformers": "x-transformers"}  # impl -> distribution
XT_ENCODINGS = ("rope", "alibi")
DTYPE_NAMES = ("float32", "bfloat16")  # torch dtypes of these names (generate_rows.DTYPES)


@functools.cache
def causal_encodings() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(decodable, refused)``: registered sequence encodings that a :class:`posenc.seq.CausalLM`
    built with them decodes with a KV cache, and those that refuse one (they decode by
    recomputing the prefix). Read from the registry's snapshot (:mod:`posenc.cli.catalog`, which
    asked a built model: whether an encoding allows a cache can depend on its options), so the
    names are checked before torch loads."""
    ok, refused = [], []
    for info in entries("seq"):
        (ok if info.kv_cache else refused).append(info.name)
    return tuple(ok), tuple(refused)


def encoding_error(name: str) -> str | None:
    """Why ``name`` is not a row of the bench (one line, the closest names for a misspelt one), or None."""
    ok, refused = causal_encodings()
    if name in ok:
        return None
    if name in refused:
        return (f"{name!r} refuses a KV cache (its decoding recomputes the whole prefix at every step), and this bench "
                f"times cached decoding")
    other = next((e for e in entries() if e.name == name), None)
    if other is not None:
        return f"{name!r} is a {other.modality} encoding; the bench decodes a causal LM with a sequence encoding"
    return unknown_name("encoding", name, ok, listing="posenc list --modality seq")


@dataclass(frozen=True)
class GenerateBenchConfig:
    """Sizes and settings of one run. ``encodings`` None: every decodable sequence encoding."""

    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    dim: int = 256
    depth: int = 4
    heads: int = 4
    vocab: int = 256
    decode_tokens: int = 32
    repeats: int = 3
    long_repeats: int = 1
    warmup: int = 1
    encodings: tuple[str, ...] | None = None
    peers: bool = True
    dtype: str = "float32"
    seed: int = 0
    background_processes: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("dim", "depth", "heads", "vocab", "decode_tokens", "repeats", "long_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.warmup < 0 or self.background_processes < 0:
            raise ValueError(f"warmup and background_processes must be >= 0; got {self.warmup}, {self.background_processes}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        for name in ("contexts", "batches"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"{name} must be positive integers; got {values!r}")
        bench_device(self.device)
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}; got {self.dtype!r}")
        for name in self.encodings or ():
            error = encoding_error(name)
            if error is not None:
                raise ValueError(f"encodings: {error}")

    @property
    def rows(self) -> list[str]:
        return list(self.encodings) if self.encodings is not None else causal_encodings()[0]

    @property
    def max_len(self) -> int:
        return max(self.contexts) + self.decode_tokens


# --- command line -----------------------------------------------------------------------------


__all__ = [
    "DEFAULT_BATCHES", "DEFAULT_CONTEXTS", "DTYPE_NAMES", "GenerateBenchConfig", "LONG_CONTEXT", "REFERENCE",
    "causal_encodings", "encoding_error",
]
