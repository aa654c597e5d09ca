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

**Cache memory** (the last table): after a cell's last round, the bytes of every tensor storage its
cache holds (:func:`.memory.held_bytes`: keys, values, positions, posenc's decoding state, spare
capacity included), at ``T + --decode-tokens`` tokens. It does not depend on the load. posenc's
cache reserves the prompt and a round's tokens at the prefill, as ``generate`` does (without a
capacity its buffers double when full and may hold up to twice what they use); Hugging Face's
``DynamicCache`` concatenates every step and holds what it uses.

This module is the command: its arguments, their checks (the settings and the encoding names of
:mod:`.generate_config`, read from the registry's snapshot) and the size estimate, all before
torch is imported; the measuring is :mod:`.generate_rows`, the tables and the plot
:mod:`.generate_report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..argtypes import int_list, nonnegative_int, out_directory, positive_int, seed_value
from ..errors import usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import Work, add_allow_large, decoding, defaults_of, size_error, transformer
from .devices import device_arg, require_available
from .generate_config import DTYPE_NAMES, LONG_CONTEXT, GenerateBenchConfig, causal_encodings, encoding_error

PROG = "posenc bench generate"

_positive_ints = int_list(minimum=1)


def _increasing(text: str) -> tuple[int, ...]:
    values = _positive_ints(text)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers (e.g. 512,2048,8192), got {text!r}")
    return tuple(values)


def _encodings(text: str) -> tuple[str, ...]:
    """``--encodings``: comma-separated sequence encodings that decode with a KV cache."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"no encodings in {text!r}; name sequence encodings, e.g. rope,alibi")
    for name in names:
        error = encoding_error(name)
        if error is not None:
            raise argparse.ArgumentTypeError(error)
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
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=d.dtype, help="default: %(default)s")
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
    """Run, print the tables, write the outputs: 0, or 2 on bad input (refused before torch is
    imported, except a CUDA device that torch does not see)."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments)) or out_error(args.out, OUTPUTS)
    if error is not None:
        return usage_error(PROG, error)
    try:
        require_available(config.device)  # imports torch
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    from .generate_report import plot, render
    from .generate_rows import run_benchmark

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
    "DTYPE_NAMES", "GenerateBenchConfig", "add_arguments", "causal_encodings", "encoding_error", "estimate", "run",
]
