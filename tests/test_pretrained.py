"""save_pretrained / from_pretrained for the reference models, posenc.load for saved directories and
the run directories of ``posenc train`` and ``posenc extend``, and one-line errors for bad ones."""

from __future__ import annotations

import json

import pytest
import torch

import posenc
from posenc import cli
from posenc.graph.gps import GPS
from posenc.seq import CausalLM, SequenceEncoder, extend_context, rotary_layers
from posenc.seq.rope_scaling import YaRNScaling
from posenc.timeseries.convtran import ConvTranClassifier
from posenc.vision import ViT


def _graph_inputs():
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 4, 5], [1, 0, 2, 1, 3, 2, 5, 4]])
    return (torch.randn(6, 5), edge_index), {"batch": torch.tensor([0, 0, 0, 0, 1, 1]), "positions": torch.randn(6, 4)}


MODELS = {
    "causal_lm": (lambda: CausalLM(40, dim=16, depth=2, num_heads=2, encoding="alibi", max_len=32),
                  lambda: ((torch.randint(0, 40, (2, 9)),), {})),
    "sequence_encoder": (lambda: SequenceEncoder(40, 16, 1, 2, encoding="t5", pool="cls", num_outputs=3),
                         lambda: ((torch.randint(0, 40, (2, 9)),), {})),
    "vit": (lambda: ViT(img_size=(8, 12), patch_size=4, in_chans=1, num_classes=3, dim=16, depth=1, num_heads=2,
                        encoding="rope2d_mixed"),
            lambda: ((torch.randn(2, 1, 8, 12),), {})),
    "gps": (lambda: GPS(5, 2, dim=16, depth=1, num_heads=2, encoding="rwse", encoding_options={"walk_length": 4}),
            _graph_inputs),
    "convtran": (lambda: ConvTranClassifier(3, 2, 12, dim=16, num_heads=4, classes=["walk", "run"]),
                 lambda: ((torch.randn(2, 3, 12),), {})),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_gives_identical_outputs(name, tmp_path):
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    args, kwargs = inputs()
    want = model(*args, **kwargs)
    model.save_pretrained(tmp_path / name)
    torch.manual_seed(1)  # a fresh build differs: equality below comes from the loaded weights
    assert not torch.allclose(build().eval()(*args, **kwargs), want)
    for loaded in (type(model).from_pretrained(tmp_path / name), posenc.load(tmp_path / name)):
        assert type(loaded) is type(model) and not loaded.training
        assert loaded.model_config == json.loads(json.dumps(model.model_config))
        assert torch.equal(loaded(*args, **kwargs), want)
    config = json.loads((tmp_path / name / "config.json").read_text())
    assert config["format"] == 1 and config["model_class"] == type(model).__name__


def test_a_context_extension_is_saved_with_the_model(tmp_path):
    torch.manual_seed(0)
    model = CausalLM(40, dim=16, depth=2, num_heads=2, encoding="rope", share_encoding=False, max_len=32).eval()
    extend_context(model, "yarn", factor=4.0, original_max_len=8, beta_fast=16.0)
    tokens = torch.randint(0, 40, (1, 20))
    model.save_pretrained(tmp_path)
    loaded = CausalLM.from_pretrained(tmp_path)
    assert [layer.scaling for layer in rotary_layers(loaded)] == [YaRNScaling(8, 4.0, beta_fast=16.0)] * 2
    assert torch.equal(loaded(tokens), model(tokens))


def test_the_timeseries_classes_travel_with_the_model(tmp_path):
    ConvTranClassifier(2, 3, 8, dim=8, num_heads=2, classes=("a", "b", "c")).save_pretrained(tmp_path)
    assert posenc.load(tmp_path).classes == ["a", "b", "c"]
    with pytest.raises(ValueError, match="classes must name num_classes=3 classes; got 2"):
        ConvTranClassifier(2, 3, 8, dim=8, num_heads=2, classes=["a", "b"])


# ---- run directories of the command line ------------------------------------------------------


TRAIN_RUNS = {
    "seq": ["seq", "--encoding", "rope", "--seq-len", "16", "--steps", "2", "--eval-tokens", "64", "--dim", "16",
            "--depth", "1", "--heads", "2", "--batch-size", "4"],
    "vision": ["vision", "--encoding", "sincos2d", "--steps", "1", "--img-size", "16", "--digit-size", "8",
               "--eval-scales", "1", "--dim", "16", "--depth", "1", "--heads", "2",
               "--repeats", "1", "--batch-size", "32"],
    "graph": ["graph", "--dataset", "csl", "--encoding", "rwse", "--walk-length", "4", "--csl-per-class", "2",
              "--csl-test-per-class", "1", "--batch-size", "4", "--steps", "1", "--dim", "8", "--depth", "1", "--heads", "2"],
    "timeseries": ["timeseries", "--dataset", "BasicMotions", "--epochs", "1"],
}


@pytest.mark.parametrize("command", list(TRAIN_RUNS))
def test_posenc_load_reads_a_train_run_directory(command, tmp_path):
    out = tmp_path / command
    assert cli.main(["train", *TRAIN_RUNS[command], "--no-progress", "--out", str(out)]) == 0
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    model = posenc.load(out)
    assert type(model).__name__ == ckpt["model_class"] and not model.training
    state = model.state_dict()
    assert set(state) == set(ckpt["model"]) and all(torch.equal(state[k], ckpt["model"][k]) for k in state)
    if command == "timeseries":
        assert model.classes == ckpt["model_config"]["classes"]


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "rope"
    assert cli.main(["train", *TRAIN_RUNS["seq"], "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("finetune", [0, 1])
def test_posenc_load_reads_an_extend_output(seq_run, tmp_path, finetune):
    out = tmp_path / "ext"
    assert cli.main(["extend", str(seq_run), "--method", "linear", "--factor", "2", "--eval-lens", "16",
                     "--eval-tokens", "32", "--finetune-steps", str(finetune), "--batch-size", "2", "--out", str(out),
                     "--no-progress"]) == 0
    model = posenc.load(out)
    assert [layer.scaling.to_dict() for layer in rotary_layers(model)] == [{"method": "linear", "factor": 2.0}]
    base = posenc.load(seq_run)
    assert rotary_layers(base)[0].scaling is None
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    assert same == (finetune == 0)  # zero-shot: the run's weights; fine-tuned: the new checkpoint's


# ---- errors ---------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    CausalLM(40, dim=16, depth=1, num_heads=2, encoding="rope", max_len=32).save_pretrained(tmp_path / "lm")
    return tmp_path / "lm"


def _edit_config(directory, change):
    path = directory / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _one_line(exc_info):
    assert "\n" not in str(exc_info.value)
    return str(exc_info.value)


def test_an_unknown_config_key_is_one_line(saved):
    _edit_config(saved, lambda d: d["config"].update(width=3))
    with pytest.raises(ValueError) as exc:
        CausalLM.from_pretrained(saved)
    assert "config.json: unknown key(s) 'width' for CausalLM, which takes vocab_size, dim" in _one_line(exc)


def test_a_missing_file_is_one_line(saved, tmp_path):
    (saved / "model.pt").unlink()
    with pytest.raises(FileNotFoundError) as exc:
        posenc.load(saved)
    assert "model.pt is missing" in _one_line(exc)
    with pytest.raises(FileNotFoundError) as exc:
        CausalLM.from_pretrained(tmp_path)
    assert "config.json is missing" in _one_line(exc)
    with pytest.raises(FileNotFoundError) as exc:
        posenc.load(tmp_path / "nowhere")
    assert "is not a directory" in _one_line(exc)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as exc:
        posenc.load(tmp_path / "empty")
    assert "has neither config.json (save_pretrained) nor checkpoint.pt" in _one_line(exc)


def test_mismatched_weights_are_one_line(saved):
    _edit_config(saved, lambda d: d["config"].update(dim=32))  # the config now describes another model
    with pytest.raises(ValueError) as exc:
        CausalLM.from_pretrained(saved)
    message = _one_line(exc)
    assert "does not match the CausalLM of its config" in message
    assert "embed.weight: expected (40, 32), found (40, 16)" in message


def test_other_misuse_is_one_line(saved, tmp_path):
    with pytest.raises(ValueError) as exc:
        ViT.from_pretrained(saved)
    assert "holds a CausalLM, not a ViT; posenc.load(directory)" in _one_line(exc)
    (saved / "model.pt").write_bytes(b"not a pickle")
    with pytest.raises(ValueError) as exc:
        CausalLM.from_pretrained(saved)
    assert "is not a readable weights file" in _one_line(exc)
    _edit_config(saved, lambda d: d.update(model_class="Transformer"))
    with pytest.raises(ValueError) as exc:
        posenc.load(saved)
    assert "unknown model class 'Transformer'; posenc.load builds CausalLM" in _one_line(exc)
    model = CausalLM(40, dim=16, depth=1, num_heads=2, encoding=posenc.build("alibi", dims=posenc.ModelDims(16, 2, 32)))
    with pytest.raises(ValueError) as exc:
        model.save_pretrained(tmp_path / "instance")
    assert "save_pretrained: CausalLM's constructor arguments must hold only" in _one_line(exc)
    assert not (tmp_path / "instance").exists()  # refused before anything is written
