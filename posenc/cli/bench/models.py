"""``posenc bench models``: training steps/s and peak memory of posenc's reference models against
their peers, and what ``torch.compile`` makes of them.

::

    posenc bench models                       # every pair, eager and compiled (inductor on CPU)
    posenc bench models --no-compile          # eager only (compiling takes most of the run)
    posenc bench models --models lm,vit --out results/

Pairs (same sizes, same data, same optimizer: AdamW, one step = forward, loss, backward, step):

``lm``
    :class:`posenc.seq.CausalLM` against x-transformers' ``TransformerWrapper`` over a ``Decoder``
    (tied embeddings, flash attention), with ``rope``, ``alibi`` and ``none`` (x-transformers:
    ``rotary_pos_emb``, ``alibi_pos_bias``, no position signal); next-token cross-entropy on
    random tokens ``[B, T]``. ``--lm-encodings`` picks other encodings (``all``: every
    registered sequence and time-series encoding of softmax attention); those x-transformers
    lacks have the posenc row alone, for its speed, graph breaks and compiled speed-up.
``vit``
    :class:`posenc.vision.ViT` against timm: ``learned2d`` against ``VisionTransformer`` (learned
    absolute table, class token), ``rope2d_axial`` / ``rope2d_mixed`` against timm's
    ``vit_small_patch16_rope_224`` / ``..._rope_mixed_224`` architectures (EVA blocks with axial
    or mixed RoPE) rebuilt at the same width, depth, heads, patch and image size (no
    pretrained weights); cross-entropy on random images. ``--vit-encodings`` picks other
    encodings (``all``: none and every registered image encoding of softmax attention); those timm
    lacks have the posenc row alone.
``gps``
    :class:`posenc.graph.GPS` (RWSE input encoding, GINE local layer, mean pool) against a model
    written here from PyG's ``GPSConv`` (``GINEConv`` local, multi-head attention global) with the
    same RWSE features through a linear layer; random graphs batched as PyG does.
    ``--gps-encodings`` picks other encodings (``all``: none and every registered graph encoding),
    each with its structure precomputed per graph before the timing (as a dataset transform does;
    spd's distances read from the batch once); only RWSE has the PyG row.

``convtran``
    :class:`posenc.timeseries.ConvTranClassifier` (``tape+erpe``, ConvTran's sizes: width 16, 8
    heads, feed-forward 256) against the authors' ``ConvTran`` module (Foumani et al. 2023,
    github.com/Navidfoumani/ConvTran, MIT) with ``Fix_pos_encode="tAPE"`` and
    ``Rel_pos_encode="eRPE"``; cross-entropy on random series ``[B, C, T]``. No package ships
    the authors' modules, so the peer row needs ``--convtran-repo DIR``, a checkout of that
    repository: its ``Models/model.py`` is imported from there (the repository's own code runs;
    name only a checkout you trust). Without it the pair has the posenc row alone.

Each row: median ms per training step over ``--repeats`` rounds after ``--warmup`` (every row of
one model, the lm's, the vit's or the gps's, interleaved round robin, see :mod:`.timing`), steps/s, peak
memory of one step (see :mod:`.memory`), the posenc row's time over its peer's round by round
(the median over rounds of the two rows' ratio in each round, :func:`.timing.paired_ratio`), and
likewise over posenc's ``none`` row of the same model where the run has one (``vs none``). ``--device cuda`` runs every model and
its batch there; ``--dtype bfloat16`` runs each step's forward pass and loss under
``torch.autocast`` in bfloat16 (float32 weights and optimizer: mixed precision, as models are
trained), the same for every row. With compiling on (the default) each row
is also compiled with ``torch.compile`` (default inductor backend): ``graph breaks`` counts
``torch._dynamo.explain`` over the forward pass, and ``compiled x`` is eager ms over compiled ms.

This module is the command: its arguments, their checks (the settings and the encoding names of
:mod:`.models_config`, read from the registry's snapshot) and the size estimate, all before torch
is imported; the models of each pair are :mod:`.models_units`, the timing and the table
:mod:`.models_run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..argtypes import nonnegative_int, out_directory, positive_int, seed_value
from ..errors import unknown_name, usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import CALL_SECONDS, Work, add_allow_large, defaults_of, size_error, transformer
from .devices import device_arg, require_available
from .models_config import (
    ALL, DEFAULT_MODELS, DTYPES, GPS_ENCODINGS, LM_ENCODINGS, MODELS, PROG, VIT_ENCODINGS, XT_LM, ModelsBenchConfig,
    convtran_repo_error, gps_encoding_error, gps_encoding_names, lm_encoding_error, lm_encoding_names,
    vit_encoding_error, vit_encoding_names,
)


def _models(text: str) -> tuple[str, ...]:
    """``--models``: comma-separated pairs of :data:`MODELS`."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"no pairs in {text!r}; choose some of {', '.join(MODELS)}")
    for name in names:
        if name not in MODELS:
            raise argparse.ArgumentTypeError(unknown_name("pair", name, MODELS))
    return names


def _encoding_list(text: str, names: Callable[[], tuple[str, ...]], error_of: Callable[[str], str | None],
                   example: str) -> tuple[str, ...]:
    """``all`` (every name of ``names()``), or comma-separated names, each checked by ``error_of``."""
    if text.strip() == ALL:
        return names()
    chosen = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not chosen:
        raise argparse.ArgumentTypeError(f"no encodings in {text!r}; name some (e.g. {example}) or {ALL}")
    for name in chosen:
        error = error_of(name)
        if error is not None:
            raise argparse.ArgumentTypeError(error)
    return chosen


def _lm_encodings(text: str) -> tuple[str, ...]:
    """``--lm-encodings``: ``all``, or comma-separated encodings a CausalLM trains with."""
    return _encoding_list(text, lm_encoding_names, lm_encoding_error, "rope,alibi")


def _vit_encodings(text: str) -> tuple[str, ...]:
    """``--vit-encodings``: ``all``, or comma-separated image encodings a ViT trains with."""
    return _encoding_list(text, vit_encoding_names, vit_encoding_error, "sincos2d,peg")


def _gps_encodings(text: str) -> tuple[str, ...]:
    """``--gps-encodings``: ``all``, or comma-separated graph encodings a GPS trains with."""
    return _encoding_list(text, gps_encoding_names, gps_encoding_error, "lap,spd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ModelsBenchConfig()
    parser.add_argument("--models", type=_models, default=d.models, metavar="A,B",
                        help=f"pairs to run, of {','.join(MODELS)} (default: {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--lm-encodings", type=_lm_encodings, default=d.lm_encodings, metavar="A,B|all",
                        help=f"encodings of the lm pair ({ALL}: every sequence and time-series encoding of softmax "
                             f"attention; x-transformers rows for {', '.join(XT_LM)}) (default: "
                             f"{','.join(LM_ENCODINGS)})")
    parser.add_argument("--vit-encodings", type=_vit_encodings, default=d.vit_encodings, metavar="A,B|all",
                        help=f"encodings of the vit pair ({ALL}: none and every image encoding of softmax attention; "
                             f"timm rows for {', '.join(VIT_ENCODINGS)}) (default: {','.join(VIT_ENCODINGS)})")
    parser.add_argument("--gps-encodings", type=_gps_encodings, default=d.gps_encodings, metavar="A,B|all",
                        help=f"encodings of the gps pair ({ALL}: none and every graph encoding; the PyG row for "
                             f"{', '.join(GPS_ENCODINGS)}) (default: {','.join(GPS_ENCODINGS)})")
    parser.add_argument("--batch", type=positive_int, default=d.batch, help="LM sequences / images per step (default: %(default)s)")
    parser.add_argument("--seq-len", type=positive_int, default=d.seq_len, help="LM tokens (default: %(default)s)")
    parser.add_argument("--graphs", type=positive_int, default=d.graphs, help="graphs per GPS batch (default: %(default)s)")
    parser.add_argument("--convtran-repo", default=None, metavar="DIR",
                        help="a checkout of github.com/Navidfoumani/ConvTran: the convtran pair's peer row imports "
                             "its Models/model.py (that repository's code runs; default: no peer row)")
    parser.add_argument("--device", type=device_arg, default=d.device, help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                        help="bfloat16: each step's forward pass and loss under torch.autocast (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=d.repeats, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=nonnegative_int, default=d.warmup, help="untimed rounds (default: %(default)s)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip torch.compile (graph breaks and compiled speed-up): the slow part of the run")
    parser.add_argument("--background-load", dest="background_processes", action="store_const", const=1, default=0,
                        help="run one busy process for the whole run; noted in the header and JSON")
    parser.add_argument("--out", type=out_directory, default=None, metavar="DIR", help="write models.txt and models.json into DIR")
    parser.add_argument("--seed", type=seed_value, default=d.seed, help="default: %(default)s")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("batch", "seq_len", "graphs", "repeats", "warmup")
COMPILE_SECONDS = 60.0  # torch.compile and dynamo's explain of one model, about


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per row, the checked step, the warm-up and timed rounds,
    the memory step, and with compiling its explain, compile and rounds again; the GPS batch's
    graphs are made one by one in Python first."""
    d = ModelsBenchConfig()
    rounds = 2 + args.warmup + args.repeats + (1 + max(1, args.warmup) + args.repeats if args.compile else 0)
    compiling = Work(calls=COMPILE_SECONDS / CALL_SECONDS) if args.compile else Work()
    models = tuple(args.models)
    work = Work()
    if "lm" in models:
        rows = len(args.lm_encodings) + len(set(args.lm_encodings) & set(XT_LM))
        step = transformer(args.batch, args.seq_len, d.lm_dim, d.lm_depth, vocab=d.vocab)
        work = work + (step * rounds + compiling) * rows
    if "vit" in models:
        step = transformer(args.batch, (d.img_size // d.patch) ** 2 + 1, d.vit_dim, d.vit_depth)
        rows = len(args.vit_encodings) + len(set(args.vit_encodings) & set(VIT_ENCODINGS))
        work = work + (step * rounds + compiling) * rows
    if "gps" in models:
        making = Work(calls=0.2 * args.graphs, bytes=4 * args.graphs * d.nodes * (16 + d.rwse_steps + 4 * 8))
        step = transformer(args.graphs, d.nodes, d.gps_dim, d.gps_depth)
        rows = len(args.gps_encodings) + len(set(args.gps_encodings) & set(GPS_ENCODINGS))
        work = work + (making + step * rounds + compiling) * rows
    if "convtran" in models:
        step = transformer(d.series, d.series_len, 16, 1)
        work = work + (step * rounds + compiling) * 2
    return work


def run(args: argparse.Namespace) -> int:
    """Run, print the table, write the outputs: 0, or 2 on bad input (refused before torch is
    imported, except a CUDA device that torch does not see)."""
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is None:
        error = out_error(args.out, ["models.txt", "models.json"])
    if error is None:
        problem = convtran_repo_error(args.convtran_repo)
        error = None if problem is None else f"--convtran-repo: {problem}"  # named by its flag
    if error is not None:
        return usage_error(PROG, error)
    try:
        cfg = ModelsBenchConfig(models=tuple(args.models), lm_encodings=tuple(args.lm_encodings),
                                vit_encodings=tuple(args.vit_encodings), gps_encodings=tuple(args.gps_encodings),
                                batch=args.batch,
                                seq_len=args.seq_len, graphs=args.graphs, repeats=args.repeats, warmup=args.warmup,
                                compile=args.compile, seed=args.seed, background_processes=args.background_processes,
                                convtran_repo=args.convtran_repo, device=args.device, dtype=args.dtype)
        require_available(cfg.device)  # imports torch
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    from .models_run import render, run_benchmark

    result = run_benchmark(cfg, progress=args.progress)
    text = render(result)
    print(text)
    if args.out:
        paths = [write_json_file(args.out, "models.json", result.to_json()),
                 write_file(args.out, "models.txt", text + "\n")]
        print(f"\nwrote {', '.join(map(str, paths))}")
    return 0


__all__ = ["ModelsBenchConfig", "add_arguments", "estimate", "lm_encoding_names", "run"]
