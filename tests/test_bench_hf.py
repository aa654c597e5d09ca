"""``posenc bench hf``: a tiny smoke run writes its files; bad arguments exit 2 with one line."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("transformers")

from posenc.cli.bench import hf  # noqa: E402


def _args(tmp_path, **over) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    hf.add_arguments(parser)
    args = parser.parse_args(["--steps", "2", "--dim", "16", "--depth", "1", "--heads", "2", "--train-len", "8",
                              "--eval-tokens", "16", "--gen-tokens", "2", "--gen-batch", "1", "--batch-size", "2",
                              "--variants", "hf,identity,alibi", "--no-progress", "--out", str(tmp_path)])
    for key, value in over.items():
        setattr(args, key, value)
    return args


def test_a_tiny_run_writes_the_table_json_and_plot(tmp_path, capsys):
    assert hf.run(_args(tmp_path)) == 0
    result = json.loads((tmp_path / "hf.json").read_text())
    rows = {r["variant"]: r for r in result["results"]}
    assert set(rows) == {"hf", "identity", "alibi"}
    assert rows["hf"]["attn_implementation"] == "sdpa" and rows["alibi"]["attn_implementation"] == "posenc"
    assert set(rows["alibi"]["bits_per_byte"]) == {"8", "16", "32"}
    # the identity swap is Hugging Face's own model in posenc: same seed, same data, the same numbers
    assert rows["identity"]["bits_per_byte"] == pytest.approx(rows["hf"]["bits_per_byte"], abs=2e-3)
    assert (tmp_path / "hf.txt").read_text().count("\n") >= 5
    assert (tmp_path / "hf.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("over, message", [
    ({"variants": ["rope2d_axial"]}, "not 'hf', 'identity' or a registered sequence encoding"),
    ({"variants": ["hf", "hf"]}, "repeated"),
    ({"dim": 18, "heads": 4}, "must be divisible by --heads"),
    ({"dtype": "bfloat16", "device": "cpu"}, "CUDA only"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, over, message):
    assert hf.run(_args(tmp_path, **over)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and err.startswith("posenc bench hf: error:")
