"""Benchmarks, run from the command line as ``posenc bench NAME``.

:data:`BENCHMARKS` is the table the command line reads: benchmark name -> (module, one-line
help). Each module defines ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status)
and is imported only when its subcommand runs. A new benchmark is a module here plus a line in
the table.

The command line imports that module to build the parser, so it imports nothing that imports
torch at its top: its arguments, their checks (names against the registry's snapshot,
:mod:`posenc.cli.catalog`) and its size estimate answer before torch loads, and ``run`` imports
the torch work from a sibling module (``generate_rows``, ``models_units``, ``hf_variants``,
``length_train``, ...) once they passed.

Shared pieces: :mod:`.timing` (interleaved timing), :mod:`.memory` (peak memory of one step,
including a CPU tracker), :mod:`.load` (busy processes for a run under background load, and the
load average to report with it); tables, progress and results files come from
:mod:`posenc.training.report`, which the train commands use too.
"""

from __future__ import annotations

BENCHMARKS: dict[str, tuple[str, str]] = {
    "attention": (
        "posenc.cli.bench.attention",
        "forward+backward causal self-attention per encoding, against bare SDPA (time, ratio, peak memory; "
        "growth with --seq-lens)",
    ),
    "generate": (
        "posenc.cli.bench.generate",
        "prefill time and cached decoding tokens/s of a causal LM per encoding at growing contexts, against HF Llama "
        "and x-transformers (table, plot, JSON)",
    ),
    "extrapolation": (
        "posenc.cli.bench.extrapolation",
        "train one small LM per sequence encoding at one length, evaluate at longer ones (table, plot, JSON)",
    ),
    "length-generalization": (
        "posenc.cli.bench.length_generalization",
        "every causal sequence encoding on the NoPE and CoPE papers' length-generalisation tasks (flip-flop, "
        "selective copy, counting, parity, summation, copy, ...) and byte LMs scored long; seeds, heat map, claims table",
    ),
    "context-extension": (
        "posenc.cli.bench.context_extension",
        "extend a RoPE LM trained at 128 bytes with PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE: zero-shot and "
        "fine-tuned bits per byte (table, plot, JSON)",
    ),
    "resolution": (
        "posenc.cli.bench.resolution",
        "train a ViT per vision encoding at one canvas size, evaluate at larger ones (table, plot, JSON)",
    ),
    "models": (
        "posenc.cli.bench.models",
        "training steps/s and peak memory of posenc's reference models against x-transformers, timm, PyG and "
        "the ConvTran authors' modules, "
        "with torch.compile graph breaks and speed-up (table, JSON)",
    ),
    "graph-pe": (
        "posenc.cli.bench.graph_pe",
        "time Laplacian and random-walk encodings against PyG's transforms (table, JSON)",
    ),
    "spline": (
        "posenc.cli.bench.spline",
        "Spline-based Transformer vs ALiBi and sinusoidal autoencoders on synthetic 2D curves: reconstruction MSE "
        "at the training length and at longer / finer sampling (table, plot, JSON)",
    ),
    "hf": (
        "posenc.cli.bench.hf",
        "a Hugging Face Llama with its own RoPE (sdpa), RoPE through posenc, ALiBi, FIRE, KERPLE, T5: training and "
        "cached-generation tokens/s against sdpa, bits per byte at 1x/2x/4x the training length (table, plot, JSON)",
    ),
    "timeseries": (
        "posenc.cli.bench.timeseries",
        "encoding ablation of the ConvTran-style classifier on the bundled UEA datasets (table, plot, JSON)",
    ),
}

__all__ = ["BENCHMARKS"]
