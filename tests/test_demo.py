"""The demo runs end to end on built-in data, and its data pieces behave."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from posenc.cli import demo
from posenc.seq.data import ByteWindows, pydoc_corpus, split_text
from posenc.seq.models import CausalLM


def _args(tmp_path, **over):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--steps", "3", "--eval-windows", "4", "--no-progress", "--out", str(tmp_path)])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_demo_trains_every_encoding_and_writes_results(tmp_path, capsys):
    assert demo.run(_args(tmp_path)) == 0
    out = capsys.readouterr().out
    for name in ("none", "sinusoidal", "rope", "alibi", "erpe"):
        assert f"\n{name} " in out
        assert f"\n  seq: {name} trained in " in out  # a progress line per model, with its time
    assert "\n  timeseries: tape+erpe trained in " in out and "depends on the machine's load" in out
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["seq"]
    assert [r["encoding"] for r in rows] == ["none", "sinusoidal", "rope", "alibi", "erpe"]
    assert {r["hook"] for r in rows} == {"-", "input", "qk", "score_bias", "post_softmax"}
    for r in rows:
        assert 0 < r["bits_per_byte@64"] < 9 and 0 < r["bits_per_byte@128"] < 9  # bits per byte of a barely trained model
    assert (tmp_path / "seq" / "rope" / "metrics.jsonl").is_file()


@pytest.mark.parametrize(
    "override,message",
    [
        ({"parts": "audio"}, "--parts: unknown part(s) audio; choose from seq"),
        ({"seq_encodings": "none,rotary"}, "--seq-encodings: unknown encoding 'rotary'"),
        ({"steps": 0}, "--steps must be positive, got 0"),
        ({"eval_windows": -1}, "--eval-windows must be positive, got -1"),
    ],
)
def test_demo_rejects_bad_arguments_before_training(tmp_path, capsys, override, message):
    assert demo.run(_args(tmp_path, **override)) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "seq").exists()  # nothing trained


def test_byte_windows_shift_by_one_and_cover_the_text():
    ds = ByteWindows("abcdefghij", 4)
    assert len(ds) == 2
    x, y = ds[1]
    assert bytes(x.tolist()) == b"efgh" and bytes(y.tolist()) == b"fghi"
    with pytest.raises(ValueError, match="seq_len=20 needs at least 21"):
        ByteWindows("short", 20)
    with pytest.raises(ValueError, match="the text has 0 bytes; seq_len=4 needs at least 5"):
        ByteWindows("", 4)
    train, valid = split_text(pydoc_corpus())
    assert len(train) > 100_000 and 0 < len(valid) < len(train)


def test_causal_lm_is_causal_and_validates_tokens():
    torch.manual_seed(0)
    model = CausalLM(256, dim=32, depth=2, num_heads=4, encoding="alibi").eval()
    tokens = torch.randint(0, 256, (1, 10))
    changed = tokens.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])  # the future does not leak into the past
    assert not torch.allclose(a[:, 7:], b[:, 7:])
    with pytest.raises(ValueError, match="tokens must be a \\[batch, length\\] long tensor"):
        model(tokens.float())
