"""Sequence data that needs no network: a byte-level corpus that every Python installation ships
(the documentation topics in ``pydoc_data``), or the user's own text file."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset


def pydoc_corpus() -> str:
    """The text of CPython's ``pydoc_data.topics`` (about 700 KB of English and Python)."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # some distributions strip it
        raise RuntimeError("this Python installation has no pydoc_data; pass a text file instead") from exc
    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"text file {str(p)!r} does not exist")
    text = p.read_text(encoding="utf-8", errors="replace")
    if not text:
        raise ValueError(f"text file {str(p)!r} is empty")
    return text


class ByteWindows(Dataset):
    """Next-byte prediction windows over a text: item ``i`` is ``(x, y)`` of length ``seq_len``,
    ``y`` shifted by one. Vocabulary: the 256 byte values.

    Args:
        text: the corpus.
        seq_len: window length.
        stride: distance between window starts (default ``seq_len``: no overlap).
    """

    vocab_size = 256

    def __init__(self, text: str, seq_len: int, stride: int | None = None) -> None:
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        raw = text.encode("utf-8")
        if len(raw) < seq_len + 1:
            raise ValueError(f"the text has {len(raw)} bytes; seq_len={seq_len} needs at least {seq_len + 1}")
        self.data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        self.seq_len = seq_len
        self.stride = seq_len if stride is None else stride
        if self.stride <= 0:
            raise ValueError(f"stride must be positive, got {self.stride}")

    def __len__(self) -> int:
        return (len(self.data) - self.seq_len - 1) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        s = i * self.stride
        chunk = self.data[s : s + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def split_text(text: str, valid_fraction: float = 0.1) -> tuple[str, str]:
    """Split into a training head and a validation tail."""
    if not 0 < valid_fraction < 1:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    cut = int(len(text) * (1 - valid_fraction))
    return text[:cut], text[cut:]


def load_corpus(path: str | Path | None = None) -> str:
    """The user's text file at ``path``, or the pydoc corpus when None."""
    return pydoc_corpus() if path is None else read_text(path)


def eval_windows(text: str, seq_len: int, num_tokens: int) -> tuple[Tensor, Tensor]:
    """Evaluation batch of a fixed size in tokens: ``ceil(num_tokens / seq_len)`` consecutive
    non-overlapping windows from the start of ``text`` -> ``(x, y)``, each ``[N, seq_len]``.

    A fixed token budget per length (rather than a fixed number of windows) keeps evaluating
    long contexts affordable and every length scored on about the same text."""
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be positive, got {num_tokens}")
    ds = ByteWindows(text, seq_len)
    count = -(-num_tokens // seq_len)
    if count > len(ds):
        raise ValueError(
            f"the text holds {len(ds)} windows of {seq_len} bytes; {num_tokens} tokens need {count} (use less or a longer text)"
        )
    x = torch.stack([ds[i][0] for i in range(count)])
    y = torch.stack([ds[i][1] for i in range(count)])
    return x, y
