"""``posenc bench generate``: prefill time and cached decoding speed of a causal LM, per encoding.

::

    posenc bench generate                                       # contexts 512,2048,8192, batch 1 and 8
    posenc bench generate --contexts 512,2048 --batches 1 --out results/   # table, JSON, PNG
    posenc bench generate --encodings rope,alibi,t5 --background-load

Every row is one decoder-only model of the same sizes (``--dim``, ``--depth``, ``--heads``,
``--vocab``), built from the same seed, in eval mode under ``torch.no_grad()``:

``NAME`` (impl ``posenc``)
    :class:`posenc.seq.CausalLM` with that encoding, for every registered sequence encoding
    that decodes with a KV cache (by default all of them; the linear-only SPE kernels on linear
    attention with the ``elu`` feature map). Encodings that refuse a cache (they decode by
    recomputing the prefix) are listed in the notes, not timed.
``llama (rope)`` (impl ``transformers``)
    Hugging Face ``LlamaForCausalLM`` from a ``LlamaConfig`` built here: the same width, depth and
    heads, RoPE, ``attn_implementation="sdpa"``, tied embeddings, a SwiGLU MLP of width
    ``round(8 * dim / 3)`` (the parameter count of posenc's 4x GELU MLP), decoding with a
    ``DynamicCache``.
``x-transformers (rope)``, ``x-transformers (alibi)`` (impl ``x-transformers``)
    ``TransformerWrapper`` over a ``Decoder`` with rotary embeddings or ALiBi, flash (SDPA)
    attention, tied embeddings, no absolute positions, decoding with its ``LayerIntermediates``
    cache (``input_not_include_cache=True``: one new token per step).

For each context length ``T`` and batch ``B``: a random prompt ``[B, T]``; **prefill** is one
forward pass over it that fills an empty cache (median of ``--repeats`` rounds, of
``--long-repeats`` above ``LONG_CONTEXT`` tokens); **decode** is ``--decode-tokens`` greedy steps,
each one new token per sequence through the cached model (the loop of ``generate``: forward,
argmax, next step), median over ``--repeats`` rounds after ``--warmup`` untimed ones, every
round starting from the same prefilled cache. ``tok/s`` counts every sequence's tokens
(``B * decode_tokens / seconds``). The same loop runs for every library, so the figures compare
the models, not the sampling code.

At each context and batch the rows' decode rounds run round robin (round ``r`` of every row, then
round ``r + 1``), so that a machine that slows down for a minute slows every row alike: decoding at
batch 1 is a few milliseconds per step, and rows timed one after another moved by +-25% against
each other on a 2-core VM. That keeps every row's cache alive at once; where the estimate for all
rows together would not fit in half the memory available (8192 tokens at batch 8 is about 1 GB a
row), that cell's rows run one after another instead, and the notes say so. A context/batch that
would not fit for one row is skipped with a note. ``--background-load`` runs one busy
process for the whole run (see :mod:`.load`); the header and the JSON say so. ``x rope`` pairs the
rounds too: the median over rounds of RoPE's ms per step over the row's in the same round
(:func:`.timing.paired_ratio`; the ratio of the medians where the two did not run in the same rounds).
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from ..argtypes import int_list, nonnegative_int, out_directory, positive_int, seed_value
from ..outputs import out_error, save_figure, write_file, write_json_file
from ..sizes import Work, add_allow_large, decoding, defaults_of, size_error, transformer
from ...common.registry import available, get
from ...training.report import Progress, format_table
from .devices import bench_device, device_arg, require_available
from .load import background_load, describe, format_load_average, load_average
from .timing import error_text, paired_ratio

DEFAULT_CONTEXTS = (512, 2048, 8192)
DEFAULT_BATCHES = (1, 8)
LONG_CONTEXT = 2048  # prefill above this many tokens gets at most --long-repeats timed rounds
REFERENCE = "rope"  # the posenc row every other row's tok/s is divided by
HF_ROW = "llama (rope)"
PEERS = {"transformers": "transformers", "x-transformers": "x-transformers"}  # impl -> distribution
XT_ENCODINGS = ("rope", "alibi")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@functools.cache
def causal_encodings() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(decodable, refused)``: registered sequence encodings that a :class:`CausalLM` built with
    them (tiny, once) decodes with a KV cache, and those that refuse one (they decode by
    recomputing the prefix). Whether an encoding supports a cache can depend on its options, so
    the built instance is asked, not the class."""
    from ...seq.models import CausalLM

    ok, refused = [], []
    for info in available("seq"):
        model = CausalLM(8, 8, 1, 2, encoding=info.name, max_len=16, feature_map="elu" if info.cls.linear_only else None)
        (ok if model.supports_kv_cache else refused).append(info.name)
    return tuple(ok), tuple(refused)


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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.encodings is not None:
            ok, refused = causal_encodings()
            bad = [e for e in self.encodings if e not in ok]
            if bad:
                why = f"; {', '.join(b for b in bad if b in refused)} decode without a KV cache" if set(bad) & set(refused) else ""
                raise ValueError(f"encodings: unknown or not decodable with a cache: {', '.join(bad)}{why}; "
                                 f"choose from {', '.join(ok)}")

    @property
    def rows(self) -> list[str]:
        return list(self.encodings) if self.encodings is not None else causal_encodings()[0]

    @property
    def max_len(self) -> int:
        return max(self.contexts) + self.decode_tokens


# --- the models: prefill, one cached step, and a way back to the prefilled cache --------------


class Decoder:
    """One model behind a common decoding interface (all calls under ``torch.no_grad()``).

    ``prefill(tokens [B, T]) -> (cache, logits [B, V])``; ``step(token [B, 1], cache) -> (cache,
    logits [B, V])``; ``rewind(cache, length) -> cache``: the prefilled cache again (``length``
    tokens), so that every timed round decodes from the same state."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model.eval()

    def prefill(self, tokens: Tensor):
        raise NotImplementedError

    def step(self, token: Tensor, cache):
        raise NotImplementedError

    def rewind(self, cache, length: int):
        raise NotImplementedError


class PosencDecoder(Decoder):
    """:class:`posenc.seq.CausalLM` with its :class:`~posenc.KVCache`, rewound by ``crop`` (the
    conditional modules' token rows included)."""

    def prefill(self, tokens: Tensor):
        cache = self.model.new_cache()
        return cache, self.model(tokens, cache=cache)[:, -1]

    def step(self, token: Tensor, cache):
        return cache, self.model(token, cache=cache)[:, -1]

    def rewind(self, cache, length: int):
        cache.crop(length)
        return cache


class LlamaDecoder(Decoder):
    """Hugging Face ``LlamaForCausalLM`` with a ``DynamicCache`` (rewound by ``crop``)."""

    def prefill(self, tokens: Tensor):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=tokens, cache=cache, use_cache=True)
        return cache, out.logits[:, -1]

    def step(self, token: Tensor, cache):
        return cache, self.model(input_ids=token, cache=cache, use_cache=True).logits[:, -1]

    def rewind(self, cache, length: int):
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)
        return cache


class XTransformersDecoder(Decoder):
    """x-transformers ``TransformerWrapper``; its cache is returned anew by every call, so the
    prefilled one is kept as it was."""

    def prefill(self, tokens: Tensor):
        logits, cache = self.model(tokens, return_intermediates=True)
        self._prefilled = cache
        return cache, logits[:, -1]

    def step(self, token: Tensor, cache):
        logits, cache = self.model(token, return_intermediates=True, cache=cache, input_not_include_cache=True)
        return cache, logits[:, -1]

    def rewind(self, cache, length: int):
        return self._prefilled


def build_posenc(config: GenerateBenchConfig, encoding: str) -> Decoder:
    from ...seq.models import CausalLM

    linear = get(encoding).cls.linear_only
    model = CausalLM(config.vocab, config.dim, config.depth, config.heads, encoding=encoding, max_len=config.max_len,
                     feature_map="elu" if linear else None)
    return PosencDecoder(model)


def build_llama(config: GenerateBenchConfig) -> Decoder:
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=config.vocab, hidden_size=config.dim, intermediate_size=round(8 * config.dim / 3),
        num_hidden_layers=config.depth, num_attention_heads=config.heads, num_key_value_heads=config.heads,
        max_position_embeddings=config.max_len, attn_implementation="sdpa", tie_word_embeddings=True,
    )
    return LlamaDecoder(LlamaForCausalLM(hf))


def build_x_transformers(config: GenerateBenchConfig, encoding: str) -> Decoder:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its import warns about torch.jit.script
        from x_transformers import Decoder as XDecoder, TransformerWrapper
    kind = {"rope": {"rotary_pos_emb": True}, "alibi": {"alibi_pos_bias": True}}[encoding]
    net = TransformerWrapper(
        num_tokens=config.vocab, max_seq_len=config.max_len, use_abs_pos_emb=False, tie_embedding=True,
        attn_layers=XDecoder(dim=config.dim, depth=config.depth, heads=config.heads,
                             attn_dim_head=config.dim // config.heads, attn_flash=True, **kind),
    )
    return XTransformersDecoder(net)


@dataclass
class Candidate:
    name: str
    impl: str
    factory: Callable[[], Decoder]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def candidates(config: GenerateBenchConfig, notes: list[str]) -> list[Candidate]:
    """The rows: the posenc encodings, then the peers that are installed (missing ones noted)."""
    out = [Candidate(name, "posenc", lambda name=name: build_posenc(config, name)) for name in config.rows]
    if not config.peers:
        return out
    if _installed("transformers"):
        out.append(Candidate(HF_ROW, "transformers", lambda: build_llama(config)))
    else:
        notes.append("transformers is not installed: no Hugging Face Llama row (pip install 'posenc[hf]')")
    if _installed("x-transformers"):
        out += [Candidate(f"x-transformers ({e})", "x-transformers", lambda e=e: build_x_transformers(config, e))
                for e in XT_ENCODINGS]
    else:
        notes.append("x-transformers is not installed: no x-transformers rows (pip install 'posenc[bench]')")
    return out


# --- measuring --------------------------------------------------------------------------------


def estimate_bytes(config: GenerateBenchConfig, context: int, batch: int) -> int:
    """A generous estimate of the memory one row needs at ``context`` tokens and ``batch``: the
    KV cache of every layer (held twice: the prefilled one and the one being decoded), the
    widest activations of the prefill (MLP hidden, logits) and a per-batch relative table of
    ``heads x 512 x T`` (DeBERTa's p2c), all in float32."""
    t = context + config.decode_tokens
    cache = 2 * 2 * config.depth * batch * t * config.dim
    activations = batch * context * (4 * config.dim * 3 + config.vocab + 8 * config.dim)
    tables = batch * config.heads * 512 * t
    return 4 * (cache + activations + tables)


def available_bytes(device: torch.device | None = None) -> int | None:
    """Memory available now on ``device``: the free memory of a CUDA device, else ``MemAvailable`` of
    ``/proc/meminfo`` (else free pages), or None."""
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass
class Cell:
    """One row at one context and batch; None where it failed or was skipped."""

    context: int
    batch: int
    prefill_ms: float | None = None
    step_ms: float | None = None  # one decode step (B new tokens)
    tokens_per_s: float | None = None
    prefill_times_ms: list[float] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    error: str | None = None
    round_robin: bool = True  # decoded in the same rounds as the other rows of its context and batch


@dataclass
class Row:
    name: str
    impl: str
    cells: list[Cell] = field(default_factory=list)
    error: str | None = None

    def cell(self, context: int, batch: int) -> Cell | None:
        return next((c for c in self.cells if c.context == context and c.batch == batch), None)


@dataclass
class GenerateResult:
    config: dict
    rows: list[Row]
    notes: list[str]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [asdict(r) for r in self.rows], "notes": self.notes,
                "ratios": ratios(self)}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: a clock read waits for them
        torch.cuda.synchronize(device)


def prefill_cell(decoder: Decoder, tokens: Tensor, config: GenerateBenchConfig) -> tuple[Cell, object, Tensor]:
    """Time the prefill of ``tokens [B, T]`` (see the module docstring): the cell with its prefill
    times, the prefilled cache and the first greedy token ``[B, 1]``."""
    b, t = tokens.shape
    device = tokens.device
    cell = Cell(t, b)
    rounds = config.repeats if t <= LONG_CONTEXT else min(config.repeats, config.long_repeats)
    cache = logits = None
    for _ in range(rounds):
        cache = logits = None
        gc.collect()
        _sync(device)
        start = time.perf_counter()
        cache, logits = decoder.prefill(tokens)
        _sync(device)
        cell.prefill_times_ms.append((time.perf_counter() - start) * 1e3)
    return cell, cache, logits.argmax(-1, keepdim=True)


def decode_round(decoder: Decoder, cache, first: Tensor, context: int, config: GenerateBenchConfig):
    """One round of ``--decode-tokens`` greedy steps from the prefilled ``cache`` (rewound to
    ``context`` first): ``(ms per step, cache)``."""
    device = first.device
    cache = decoder.rewind(cache, context)
    token = first
    _sync(device)
    start = time.perf_counter()
    for _ in range(config.decode_tokens):
        cache, step_logits = decoder.step(token, cache)
        token = step_logits.argmax(-1, keepdim=True)
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / config.decode_tokens, cache


def finish_cell(cell: Cell) -> Cell:
    """Medians and tokens/s from the cell's recorded times."""
    cell.prefill_ms, cell.step_ms = _median(cell.prefill_times_ms), _median(cell.step_times_ms)
    cell.tokens_per_s = cell.batch * 1e3 / cell.step_ms if cell.step_ms else None
    cell.prefill_times_ms = [round(v, 3) for v in cell.prefill_times_ms]
    cell.step_times_ms = [round(v, 4) for v in cell.step_times_ms]
    return cell


def measure_cells_round_robin(decoders: dict[str, Decoder], tokens: Tensor, config: GenerateBenchConfig) -> dict:
    """Every decoder at ``tokens [B, T]`` (see the module docstring): prefills one after another,
    then the decode rounds round robin (every decoder's round ``r`` before any round ``r + 1``).
    ``{name: Cell}``; a decoder that fails gets a cell with its error and leaves the rounds. With
    one decoder this is that decoder's cell alone."""
    t = tokens.shape[1]
    cells, state = {}, {}
    for name, decoder in decoders.items():
        try:
            cell, cache, first = prefill_cell(decoder, tokens, config)
            cells[name], state[name] = cell, (cache, first)
        except Exception as exc:
            cells[name] = Cell(t, tokens.shape[0], error=error_text(exc))
    for r in range(config.warmup + config.repeats):
        for name in list(state):
            cache, first = state[name]
            try:
                ms, cache = decode_round(decoders[name], cache, first, t, config)
            except Exception as exc:
                cells[name] = Cell(t, tokens.shape[0], error=error_text(exc))
                del state[name]
                continue
            state[name] = (cache, first)
            if r >= config.warmup:
                cells[name].step_times_ms.append(ms)
    return {name: cell if cell.error else finish_cell(cell) for name, cell in cells.items()}


def _peer_versions() -> dict[str, str]:
    out = {}
    for impl, dist in PEERS.items():
        try:
            out[impl] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _measure(config: GenerateBenchConfig, *, progress: bool) -> GenerateResult:
    dtype, device = DTYPES[config.dtype], require_available(config.device)
    notes: list[str] = []
    _, refused = causal_encodings()
    if config.encodings is None and refused:
        notes.append(f"not timed: {', '.join(refused)} refuse a KV cache (their decoding recomputes the whole prefix)")
    todo = candidates(config, notes)
    shapes = [(t, b) for t in config.contexts for b in config.batches]
    free = available_bytes(device)
    fits = {}
    for t, b in shapes:
        need = estimate_bytes(config, t, b)
        fits[(t, b)] = free is None or need <= free // 2
        if not fits[(t, b)]:
            notes.append(f"skipped context {t} batch {b}: a row needs about {need / 2**30:.1f} GiB, "
                         f"{free / 2**30:.1f} GiB available (at most half is used)")
    gen = torch.Generator().manual_seed(config.seed)
    prompts = {(t, b): torch.randint(0, config.vocab, (b, t), generator=gen).to(device)
               for t, b in shapes if fits[(t, b)]}
    rows: list[Row] = []
    decoders: dict[str, Decoder] = {}
    with torch.no_grad():
        for cand in todo:
            row = Row(cand.name, cand.impl)
            rows.append(row)
            try:
                torch.manual_seed(config.seed)
                decoder = cand.factory()
                decoder.model.to(device=device, dtype=dtype)
                decoders[cand.name] = decoder
            except Exception as exc:  # reported in the table
                row.error = error_text(exc)
    by_name = {row.name: row for row in rows}
    bar = Progress(len(decoders) * len(prompts), "decoding", enabled=progress)
    with torch.no_grad():
        for (t, b), tokens in prompts.items():
            together = free is None or estimate_bytes(config, t, b) * len(decoders) <= free // 2
            if together:
                for name, cell in measure_cells_round_robin(decoders, tokens, config).items():
                    by_name[name].cells.append(cell)
                bar.update(len(decoders), note=f"T={t} B={b}, rows round robin")
            else:
                notes.append(f"context {t} batch {b}: rows one after another (their caches together would not fit "
                             "in half the memory available)")
                for name, decoder in decoders.items():
                    cell = measure_cells_round_robin({name: decoder}, tokens, config)[name]
                    cell.round_robin = False
                    by_name[name].cells.append(cell)
                    gc.collect()
                    bar.update(note=f"{name} T={t} B={b}")
            gc.collect()
    decoders.clear()
    gc.collect()
    bar.close()
    cfg = asdict(config)
    cfg.update(
        encodings=config.rows, llama_intermediate_size=round(8 * config.dim / 3), torch=torch.__version__,
        threads=torch.get_num_threads(), cpu_count=os.cpu_count(), machine=platform.processor() or platform.machine(),
        background_load=describe(config.background_processes), load_average=load_average(),
        timing="decode rounds round robin across the rows at each context and batch (one after another where "
               "the notes say so); prefill: median of repeats (long_repeats above "
               f"{LONG_CONTEXT} tokens); decode: median ms per step of repeats rounds after warmup",
    )
    if config.peers:
        cfg["peer_versions"] = _peer_versions()
    return GenerateResult(cfg, rows, notes)


def run_benchmark(config: GenerateBenchConfig, *, progress: bool = True) -> GenerateResult:
    """Measure every row of ``config`` (under background load when ``config.background_processes``)."""
    n = config.background_processes
    with background_load(n > 0, max(n, 1)):
        return _measure(config, progress=progress)


def ratios(result: GenerateResult) -> dict[str, dict[str, float | None]]:
    """Per row, ``"T/B"`` -> its tok/s over posenc RoPE's at the same context and batch."""
    ref = next((r for r in result.rows if r.name == REFERENCE and r.impl == "posenc"), None)
    out: dict[str, dict[str, float | None]] = {}
    for row in result.rows:
        per = {}
        for cell in row.cells:
            base = ref.cell(cell.context, cell.batch) if ref is not None else None
            if not (cell.tokens_per_s and base is not None and base.tokens_per_s):
                per[f"{cell.context}/{cell.batch}"] = None
            elif cell.round_robin and base.round_robin:  # tok/s over rope's: rope's step over the row's
                per[f"{cell.context}/{cell.batch}"] = paired_ratio(base.step_times_ms, cell.step_times_ms)
            else:
                per[f"{cell.context}/{cell.batch}"] = cell.tokens_per_s / base.tokens_per_s
        out[f"{row.impl}:{row.name}"] = per
    return out


# --- output -----------------------------------------------------------------------------------


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: GenerateResult) -> str:
    cfg = result.config
    contexts, batches = cfg["contexts"], cfg["batches"]
    lines = [
        f"cached decoding: dim={cfg['dim']} depth={cfg['depth']} heads={cfg['heads']} vocab={cfg['vocab']}, "
        f"{cfg['dtype']} on {cfg['device']} ({cfg['threads']} CPU threads); {cfg['decode_tokens']} greedy tokens per round, "
        f"{cfg['repeats']} rounds after {cfg['warmup']} warm-up",
        f"background load: {cfg['background_load']}; load average at the end: {format_load_average(cfg['load_average'])}",
        "prefill: ms for the prompt; tok/s: decoded tokens per second over the batch; x rope: tok/s over posenc rope's "
        "(median over rounds of the two rows' ratio in the same round); "
        f"ms/step {contexts[-1]}/{contexts[0]}: growth of one step's cost with the context",
    ]
    rel = ratios(result)
    for b in batches:
        lines += ["", f"batch {b}"]
        headers = ["name", "impl"]
        for t in contexts:
            headers += [f"prefill ms@{t}", f"tok/s@{t}", f"x rope@{t}"]
        headers.append(f"ms/step {contexts[-1]}/{contexts[0]}")
        body = []
        for row in result.rows:
            cells = [row.name, row.impl]
            for t in contexts:
                c = row.cell(t, b)
                if c is None or c.error:
                    cells += ["-", "-", "-"]
                    continue
                cells += [_num(c.prefill_ms, ".1f"), _num(c.tokens_per_s, ".1f"),
                          _num(rel[f"{row.impl}:{row.name}"].get(f"{t}/{b}"), ".2f")]
            a, z = row.cell(contexts[0], b), row.cell(contexts[-1], b)
            growth = z.step_ms / a.step_ms if a and z and a.step_ms and z.step_ms and len(contexts) > 1 else None
            cells.append(_num(growth, ".2f"))
            body.append(cells)
        lines.append(format_table(headers, body, align="ll" + "r" * (len(headers) - 2)))
    errors = [(r.name, r.error) for r in result.rows if r.error]
    errors += [(f"{r.name} T={c.context} B={c.batch}", c.error) for r in result.rows for c in r.cells if c.error]
    if errors:
        lines += ["", "errors:"] + [f"  {name}: {err}" for name, err in errors]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


def plot(result: GenerateResult, path: str | os.PathLike) -> bool:
    """tok/s against the context length (log-log), one panel per batch; False without matplotlib."""
    from ...training.report import pyplot

    plt = pyplot()
    if plt is None:
        return False
    cfg = result.config
    batches = cfg["batches"]
    from ..plots import legend_outside, plain_log_axis, series_style

    fig, axes = plt.subplots(1, len(batches), figsize=(6.0 * len(batches) + 2.2, 4.8), squeeze=False,
                             layout="constrained")
    colors = plt.get_cmap("tab10").colors + plt.get_cmap("tab20").colors[1::2]  # neighbours in distinct hues
    for ax, b in zip(axes[0], batches):
        for i, row in enumerate(result.rows):
            pts = [(c.context, c.tokens_per_s) for c in row.cells if c.batch == b and c.tokens_per_s]
            if not pts:
                continue
            peer = row.impl != "posenc"
            style = dict(color="black", linestyle="--" if row.impl == "transformers" else ":", linewidth=2.0,
                         marker="o", markersize=3) if peer else dict(color=colors[i % len(colors)], **series_style(i))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=row.name if ax is axes[0][0] else None, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["contexts"], [str(t) for t in cfg["contexts"]])
        ax.set_xlabel("context length (tokens in the cache)")
        plain_log_axis(ax, "decoded tokens / s (log scale)")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
    legend_outside(fig, [axes[0][0]])
    fig.suptitle(f"cached greedy decoding, dim={cfg['dim']} depth={cfg['depth']} heads={cfg['heads']}, "
                 f"{cfg['dtype']}, background load: {cfg['background_load']}")
    save_figure(fig, Path(path).parent, Path(path).name, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


# --- command line -----------------------------------------------------------------------------

_positive_ints = int_list(minimum=1)


def _increasing(text: str) -> tuple[int, ...]:
    values = _positive_ints(text)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers (e.g. 512,2048,8192), got {text!r}")
    return tuple(values)


def _encodings(text: str) -> tuple[str, ...]:
    ok, refused = causal_encodings()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in ok]
    if not names or bad:
        why = f" ({', '.join(b for b in bad if b in refused)}: no KV cache)" if set(bad) & set(refused) else ""
        raise argparse.ArgumentTypeError(f"unknown or not decodable with a cache: {', '.join(bad) or text!r}{why}; "
                                         f"choose from {', '.join(ok)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``posenc bench generate``."""
    d = GenerateBenchConfig()
    parser.add_argument("--contexts", type=_increasing, default=d.contexts, metavar="T1,T2,...",
                        help=f"prompt lengths (default: {','.join(map(str, d.contexts))})")
    parser.add_argument("--batches", type=_increasing, default=d.batches, metavar="B1,B2,...",
                        help=f"batch sizes (default: {','.join(map(str, d.batches))})")
    for name, what in (("dim", "model width"), ("depth", "layers"), ("heads", "attention heads"), ("vocab", "vocabulary")):
        parser.add_argument(f"--{name}", type=positive_int, default=getattr(d, name), help=f"{what} (default: %(default)s)")
    parser.add_argument("--decode-tokens", type=positive_int, default=d.decode_tokens, metavar="N",
                        help="greedy tokens per timed round (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=d.repeats, metavar="N", help="timed rounds (default: %(default)s)")
    parser.add_argument("--long-repeats", type=positive_int, default=d.long_repeats, metavar="N",
                        help=f"prefill rounds above {LONG_CONTEXT} tokens, at most --repeats (default: %(default)s)")
    parser.add_argument("--warmup", type=nonnegative_int, default=d.warmup, metavar="N",
                        help="untimed decode rounds first (default: %(default)s)")
    parser.add_argument("--encodings", type=_encodings, default=None, metavar="A,B,...",
                        help="posenc rows (default: every sequence encoding that decodes with a KV cache)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="leave out the transformers and x-transformers rows")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=d.dtype, help="default: %(default)s")
    parser.add_argument("--device", type=device_arg, default=d.device, help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--background-load", dest="background_processes", action="store_const", const=1, default=0,
                        help="run one busy process (a Python loop on one core) for the whole run; noted in the header and JSON")
    parser.add_argument("--out", type=out_directory, default=None, metavar="DIR",
                        help="write generate.txt, generate.json and generate.png into DIR")
    parser.add_argument("--seed", type=seed_value, default=d.seed, help="default: %(default)s")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("contexts", "batches", "decode_tokens", "repeats", "long_repeats", "warmup", "dim", "depth", "vocab")
OUTPUTS = ("generate.txt", "generate.json", "generate.png")
PEER_ROWS = 3  # Hugging Face's Llama and x-transformers' two rows


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): for every row at every context and batch, the timed
    prefills and ``--warmup`` + ``--repeats`` rounds of ``--decode-tokens`` cached steps."""
    rows = len(args.encodings or causal_encodings()[0]) + (PEER_ROWS if args.peers else 0)
    work = Work()
    for t in args.contexts:
        prefills = args.repeats if t <= LONG_CONTEXT else min(args.repeats, args.long_repeats)
        for b in args.batches:
            prefill = transformer(b, t, args.dim, args.depth, vocab=args.vocab, train=False, steps=prefills)
            rounds = decoding(b, t, args.decode_tokens, args.dim, args.depth, vocab=args.vocab)
            work = work + (prefill + rounds * (args.warmup + args.repeats)) * rows
    return work


def config_from_args(args: argparse.Namespace) -> GenerateBenchConfig:
    return GenerateBenchConfig(
        contexts=tuple(args.contexts), batches=tuple(args.batches), dim=args.dim, depth=args.depth, heads=args.heads,
        vocab=args.vocab, decode_tokens=args.decode_tokens, repeats=args.repeats, long_repeats=args.long_repeats,
        warmup=args.warmup, encodings=args.encodings, peers=args.peers, dtype=args.dtype, seed=args.seed,
        background_processes=args.background_processes, device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    """Run, print the tables, write the outputs: 0, or 2 on bad input."""
    try:
        config = config_from_args(args)
        require_available(config.device)
    except ValueError as exc:
        print(f"posenc bench generate: error: {exc}", file=sys.stderr)
        return 2
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)
    if error is not None:
        print(f"posenc bench generate: error: {error}", file=sys.stderr)
        return 2
    result = run_benchmark(config, progress=args.progress)
    text = render(result)
    print(text)
    if args.out:
        out = Path(args.out)
        written = [str(write_json_file(out, "generate.json", result.to_json()))]
        written.append(str(write_file(out, "generate.txt", text + "\n")))
        if plot(result, out / "generate.png"):
            written.append(str(out / "generate.png"))
        print(f"\nwrote {', '.join(written)}")
    return 0


__all__ = [
    "GenerateBenchConfig", "GenerateResult", "add_arguments", "causal_encodings", "estimate_bytes", "render", "run",
    "run_benchmark",
]
