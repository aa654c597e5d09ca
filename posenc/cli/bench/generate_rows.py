"""The measuring of ``posenc bench generate`` (see :mod:`.generate` for what it times and how):
the models behind one decoding interface, the prefill and the decode rounds, round robin across
the rows at each context and batch. Imported when the command runs, after its arguments passed."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from ...common.decoding_state import DecodingState
from ...training.report import Progress
from .devices import require_available
from .generate_config import HF_ROW, LONG_CONTEXT, PEERS, XT_ENCODINGS, GenerateBenchConfig, causal_encodings
from .generate_report import Cell, GenerateResult, Row
from .load import background_load, describe, load_average
from .memory import MB, held_bytes
from .peers import installed, versions
from .timing import error_text

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    """:class:`posenc.seq.CausalLM` with its :class:`~posenc.KVCache` and
    :class:`~posenc.DecodingState`, as ``generate`` runs it (the cache reserving the prompt and the
    ``decode_tokens`` steps of a round), rewound by the cache's ``crop`` (the conditional modules'
    token rows included; the state keeps what the crop left)."""

    def __init__(self, model: nn.Module, decode_tokens: int) -> None:
        super().__init__(model)
        self.decode_tokens = decode_tokens

    def prefill(self, tokens: Tensor):
        cache = self.model.new_cache(capacity=tokens.shape[1] + self.decode_tokens)
        state = DecodingState(len(cache))
        return (cache, state), self.model(tokens, cache=cache, decoding_state=state)[:, -1]

    def step(self, token: Tensor, cache):
        kv, state = cache
        return cache, self.model(token, cache=kv, decoding_state=state)[:, -1]

    def rewind(self, cache, length: int):
        cache[0].crop(length)
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
    from ...common.registry import get
    from ...seq.models import CausalLM

    linear = get(encoding).cls.linear_only
    model = CausalLM(config.vocab, config.dim, config.depth, config.heads, encoding=encoding, max_len=config.max_len,
                     feature_map="elu" if linear else None)
    return PosencDecoder(model, config.decode_tokens)


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


def candidates(config: GenerateBenchConfig, notes: list[str]) -> list[Candidate]:
    """The rows: the posenc encodings, then the peers that are installed (missing ones noted)."""
    out = [Candidate(name, "posenc", lambda name=name: build_posenc(config, name)) for name in config.rows]
    if not config.peers:
        return out
    if installed("transformers"):
        out.append(Candidate(HF_ROW, "transformers", lambda: build_llama(config)))
    else:
        notes.append("transformers is not installed: no Hugging Face Llama row (pip install 'posenc[hf]')")
    if installed("x-transformers"):
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
    for name, (cache, _) in state.items():
        cells[name].cache_mb = held_bytes(cache) / MB
    return {name: cell if cell.error else finish_cell(cell) for name, cell in cells.items()}


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
        cfg["peer_versions"] = versions(PEERS)
    return GenerateResult(cfg, rows, notes)


def run_benchmark(config: GenerateBenchConfig, *, progress: bool = True) -> GenerateResult:
    """Measure every row of ``config`` (under background load when ``config.background_processes``)."""
    n = config.background_processes
    with background_load(n > 0, max(n, 1)):
        return _measure(config, progress=progress)


__all__ = [
    "DTYPES", "Decoder", "available_bytes", "candidates", "estimate_bytes", "measure_cells_round_robin", "run_benchmark",
]
