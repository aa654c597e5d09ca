"""Train a small AttentionSmithy encoder-decoder on a reverse task with posenc encodings.

The task is made in code: the source is ``L`` random tokens, the target the same tokens reversed,
after a start token. The model is AttentionSmithy's own ``Encoder`` and ``Decoder`` (its
``MultiheadAttention``, ``FeedForwardNetwork``, layers); positions come from four sources:

* ``t5``, ``fire``, ``kerple``: posenc encodings AttentionSmithy does not have, as strategies in
  its ``NumericEmbeddingManager`` (:func:`posenc.integrations.attention_smithy.strategies`; one
  manager for the encoder, bidirectional forms where they exist, and one for the decoder, causal),
  run by :class:`~posenc.integrations.attention_smithy.PosencAttentionMethod` (``--method posenc``,
  the default) or by AttentionSmithy's ``StandardAttentionMethod`` (``--method standard``);
* ``smithy rope``: AttentionSmithy's own ``RotaryPositionEmbedding`` with its standard method.

It prints the held-out loss at every ``--eval-every`` steps for each (the loss-curve table) and the
final token accuracy::

    python examples/smithy_copy_task.py                    # ~1 minute on a laptop CPU
    python examples/smithy_copy_task.py --steps 600 --length 16
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from typing import Sequence

import torch
from torch import Tensor, nn

from attention_smithy.attention import StandardAttentionMethod
from attention_smithy.components import Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForwardNetwork, MultiheadAttention
from attention_smithy.numeric_embeddings import NumericEmbeddingManager, RotaryPositionEmbedding

from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies

PAD, BOS = 0, 1  # token ids; the data tokens are 2 .. vocab-1
ENCODINGS = ("t5", "fire", "kerple", "smithy rope")


def reverse_batch(batch: int, length: int, vocab: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``(src [B, L], tgt_in [B, L+1], tgt_out [B, L+1])``: tgt_out is src reversed then PAD
    (ignored by the loss); tgt_in is BOS then tgt_out without its last token."""
    src = torch.randint(2, vocab, (batch, length), generator=generator)
    rev = src.flip(1)
    tgt_out = torch.cat([rev, torch.full((batch, 1), PAD)], dim=1)
    tgt_in = torch.cat([torch.full((batch, 1), BOS), rev], dim=1)
    return src, tgt_in, tgt_out


def managers(name: str, dim: int, heads: int) -> tuple[NumericEmbeddingManager, NumericEmbeddingManager]:
    """The encoder's and the decoder's managers for one encoding."""
    if name == "smithy rope":
        return (NumericEmbeddingManager([RotaryPositionEmbedding(dim // heads)]),
                NumericEmbeddingManager([RotaryPositionEmbedding(dim // heads)]))
    bidirectional = {"t5": {"bidirectional": True}, "kerple": {"symmetric": True}, "fire": {}}[name]
    # FIRE is causal-only: its strategy folds the causal mask in, so the encoder attends to the past.
    encoder = NumericEmbeddingManager(strategies(name, num_heads=heads, options=bidirectional))
    decoder = NumericEmbeddingManager(strategies(name, num_heads=heads))
    return encoder, decoder


class ReverseModel(nn.Module):
    """Token embedding, AttentionSmithy Encoder and Decoder, a linear head."""

    def __init__(self, name: str, vocab: int, dim: int, heads: int, layers: int, method: str) -> None:
        super().__init__()
        own = name == "smithy rope" or method == "standard"

        def attention_method(causal: bool):
            return StandardAttentionMethod(is_causal_masking=causal) if own else PosencAttentionMethod(is_causal_masking=causal)

        self.embed = nn.Embedding(vocab, dim)
        self.encoder_manager, self.decoder_manager = managers(name, dim, heads)
        ffn = FeedForwardNetwork(dim, 4 * dim, "gelu", dropout=0.0)
        self.encoder = Encoder(EncoderLayer(dim, MultiheadAttention(dim, heads, attention_method(False)), ffn, 0.0), layers)
        self.decoder = Decoder(DecoderLayer(dim, MultiheadAttention(dim, heads, attention_method(True)),
                                            MultiheadAttention(dim, heads, attention_method(False)), ffn, 0.0), layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """``src [B, L]``, ``tgt_in [B, L+1]`` -> logits ``[B, L+1, vocab]``."""
        x = self.embed(src)
        memory = self.encoder(x, src_padding_mask=None, numeric_embedding_manager=self.encoder_manager)
        y = self.embed(tgt_in)
        out = self.decoder(y, memory, tgt_padding_mask=None, src_padding_mask=None,
                           numeric_embedding_manager=self.decoder_manager)
        return self.head(out)


def _loss_and_accuracy(model: ReverseModel, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, float]:
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
    keep = tgt_out != PAD
    accuracy = (logits.argmax(-1) == tgt_out)[keep].float().mean().item()
    return loss, accuracy


def train(name: str, args: argparse.Namespace) -> tuple[list[float], float]:
    """Held-out losses at every ``eval_every`` steps and the final held-out token accuracy."""
    torch.manual_seed(args.seed)
    model = ReverseModel(name, args.vocab, args.dim, args.heads, args.layers, args.method)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed)
    held_out = reverse_batch(256, args.length, args.vocab, torch.Generator().manual_seed(args.seed + 1))
    losses, accuracy = [], 0.0
    for step in range(1, args.steps + 1):
        model.train()
        loss, _ = _loss_and_accuracy(model, reverse_batch(args.batch, args.length, args.vocab, data))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                val, accuracy = _loss_and_accuracy(model, held_out)
            losses.append(val.item())
    return losses, accuracy


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_at_least(1), default=300)
    parser.add_argument("--eval-every", type=_at_least(1), default=50)
    parser.add_argument("--dim", type=_at_least(2), default=64)
    parser.add_argument("--heads", type=_at_least(1), default=4)
    parser.add_argument("--layers", type=_at_least(1), default=2)
    parser.add_argument("--length", type=_at_least(1), default=10, help="source tokens")
    parser.add_argument("--vocab", type=_at_least(3), default=16, help="token ids, PAD and BOS included")
    parser.add_argument("--batch", type=_at_least(1), default=64)
    parser.add_argument("--lr", type=_positive_float, default=1e-3)
    parser.add_argument("--seed", type=_at_least(0), default=0)
    parser.add_argument("--method", choices=("posenc", "standard"), default="posenc",
                        help="attention method of the posenc rows (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        parser.error(f"--dim ({args.dim}) must be --heads ({args.heads}) times an even head width (rotary)")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Train one model per encoding; print the loss-curve table; return ``{name: losses}``."""
    args = parse_args(argv)
    curves, accuracies = {}, {}
    for name in ENCODINGS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # AttentionSmithy's rotary library warns on import paths
            curves[name], accuracies[name] = train(name, args)
    steps = [min(args.eval_every * (i + 1), args.steps) for i in range(len(next(iter(curves.values()))))]
    header = ["step"] + list(ENCODINGS)
    rows = [[str(s)] + [f"{curves[n][i]:.3f}" for n in ENCODINGS] for i, s in enumerate(steps)]
    rows.append(["accuracy"] + [f"{accuracies[n]:.3f}" for n in ENCODINGS])
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]
    print(f"reverse task, L={args.length}, vocab={args.vocab}: held-out cross-entropy (posenc rows: --method {args.method})")
    for r in [header] + rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return curves


if __name__ == "__main__":
    main()
    sys.exit(0)
