"""Per-layer encodings of today's models, against the reference code installed here (configs built in
code): Llama 4's iRoPE (which layers have no RoPE, and the attention temperature of those layers,
through transformers' own ``Llama4TextAttention``), SmolLM3's ``no_rope_layer_interval``, Gemma 3's
local and global layer types, and proportional RoPE (Gemma 4's global layers) against
``ROPE_INIT_FUNCTIONS["proportional"]``; the schedules in posenc's sequence models (cached decoding,
saving, the command line)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.common.attention import attend
from posenc.common.masks import AttentionMask
from posenc.seq import CausalLM, SequenceEncoder, irope_schedule, local_global_schedule
from posenc.seq.layer_schedule import check_schedule, layer_kinds
from posenc.seq.nope_temperature import NoPETemperature, attention_temperature
from posenc.seq.rope import RotaryEncoding

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")


# ---- which layers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth, interval", [(8, 4), (6, 2), (5, 3)])
def test_irope_layers_are_llama4s_and_smollm3s(depth, interval):
    kinds = layer_kinds(irope_schedule(interval), depth)
    for config in (transformers.Llama4TextConfig(num_hidden_layers=depth, no_rope_layer_interval=interval),
                   transformers.SmolLM3Config(num_hidden_layers=depth, no_rope_layer_interval=interval)):
        assert [("rope" if flag else "nope") for flag in config.no_rope_layers] == kinds
    explicit = layer_kinds(irope_schedule(nope_layers=[0, 2]), 4)
    assert explicit == ["nope", "rope", "nope", "rope"]


@pytest.mark.parametrize("depth, pattern", [(12, 6), (7, 2)])
def test_local_global_layers_are_gemma3s(depth, pattern):
    config = transformers.Gemma3TextConfig(num_hidden_layers=depth, sliding_window_pattern=pattern)
    expected = ["local" if t == "sliding_attention" else "global" for t in config.layer_types]
    assert layer_kinds(local_global_schedule(pattern), depth) == expected


# ---- Llama 4's temperature -------------------------------------------------------------------------------------


def test_temperature_known_values():
    tau = attention_temperature(torch.tensor([0, 8190, 8191, 16382, 16383, 10**6]))
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3),
                1 + 0.1 * math.log(1 + (10**6 + 1) // 8192)]
    torch.testing.assert_close(tau, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)
    assert attention_temperature(torch.tensor([-5.0, 2.5]), floor_scale=2).tolist() == [1.0, 1 + 0.1 * math.log(2)]


@pytest.mark.parametrize("floor_scale, attn_scale", [(4, 0.1), (3, 0.5)])
def test_the_nope_layer_equals_transformers_llama4_attention(floor_scale, attn_scale):
    torch.manual_seed(0)
    heads, kv_heads, head_dim, t = 4, 2, 8, 14
    config = transformers.Llama4TextConfig(hidden_size=heads * head_dim, num_attention_heads=heads,
                                           num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=4,
                                           floor_scale=floor_scale, attn_scale=attn_scale, attn_temperature_tuning=True)
    config._attn_implementation = "eager"
    layer = llama4.Llama4TextAttention(config, layer_idx=3).double().eval()  # layer 3: no RoPE
    assert not layer.use_rope
    x = torch.randn(2, t, heads * head_dim, dtype=torch.float64)
    causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        theirs, _ = layer(x, position_embeddings=None, attention_mask=causal)
        q = layer.q_proj(x).view(2, t, heads, head_dim).transpose(1, 2)
        k = layer.k_proj(x).view(2, t, kv_heads, head_dim).transpose(1, 2)
        v = layer.v_proj(x).view(2, t, kv_heads, head_dim).transpose(1, 2)
        enc = posenc.build("nope_temperature", floor_scale=float(floor_scale), attn_scale=attn_scale)
        pos = torch.arange(t)
        out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=AttentionMask(causal=True))
        ours = layer.o_proj(out.transpose(1, 2).reshape(2, t, -1))
    diff = (ours - theirs).abs().max().item()
    print(f"\nLlama 4 NoPE layer (floor_scale {floor_scale}, attn_scale {attn_scale}): max abs difference {diff:.2e}")
    assert diff < 1e-6  # transformers computes the factor in float32


def test_the_temperature_scales_queries_only_at_their_positions():
    enc = NoPETemperature(floor_scale=2.0, attn_scale=1.0)
    q, k = torch.ones(1, 1, 4, 2), torch.ones(1, 1, 4, 2)
    q_out, k_out = enc.transform_qk(q, k, torch.tensor([[0, 1, 3, 5]]), torch.tensor([[0, 1, 3, 5]]))
    assert k_out is k
    torch.testing.assert_close(q_out[0, 0, :, 0], torch.tensor([1.0, 1 + math.log(2), 1 + math.log(3),
                                                                1 + math.log(4)]))


# ---- proportional RoPE (Gemma 4) --------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, proportion, factor, theta", [(64, 0.25, 1.0, 1e6), (32, 0.5, 2.0, 1e4),
                                                                   (48, 0.3, 1.0, 1e4), (16, 1.0, 1.0, 100.0)])
def test_proportional_equals_rope_init_functions(head_dim, proportion, factor, theta):
    config = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                      rope_parameters={"rope_type": "proportional", "rope_theta": theta,
                                                       "partial_rotary_factor": proportion, "factor": factor})
    theirs, their_factor = rope_utils.ROPE_INIT_FUNCTIONS["proportional"](config, None)
    enc = posenc.build("rope_proportional", head_dim=head_dim, partial_rotary_factor=proportion, factor=factor,
                       base=theta)
    ours, our_factor = enc.frequencies()
    diff = (ours - theirs.double()).abs().max().item()
    print(f"\nproportional head {head_dim} p={proportion} factor {factor}: inv_freq max abs difference {diff:.2e}")
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0.0)
    assert our_factor == their_factor == 1.0
    turning = int(proportion * head_dim // 2)
    assert (ours[turning:] == 0).all() and (ours[:turning] > 0).all()


def test_proportional_rotates_over_the_whole_head_unlike_partial_rope():
    torch.manual_seed(0)
    q = torch.randn(1, 1, 6, 16, dtype=torch.float64)
    pos = torch.arange(6)[None]
    prop = posenc.build("rope_proportional", head_dim=16, partial_rotary_factor=0.5)
    rotated, _ = prop.transform_qk(q, q, pos, pos)
    # the half-split pairs (k, k + 8) for k >= 4 do not turn: features 4..7 and 12..15 pass through
    torch.testing.assert_close(rotated[..., 4:8], q[..., 4:8], rtol=0, atol=0)
    torch.testing.assert_close(rotated[..., 12:], q[..., 12:], rtol=0, atol=0)
    # and the turning pairs have RoPE's exponents over 16, not over the 8 of partial rotary
    full = RotaryEncoding(16).inv_freq
    torch.testing.assert_close(prop.inv_freq[:4], full[:4])
    assert not torch.allclose(RotaryEncoding(16, rotary_dim=8).inv_freq, full[:4])


def test_gemma4_rotary_embedding_global_layers_equal_rope_proportional():
    config = transformers.Gemma4TextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                           global_head_dim=32, num_hidden_layers=6, intermediate_size=64,
                                           vocab_size=32, vocab_size_per_layer_input=32, hidden_size_per_layer_input=8)
    gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    rotary = gemma4.Gemma4TextRotaryEmbedding(config)
    params = config.rope_parameters["full_attention"]
    enc = posenc.build("rope_proportional", head_dim=32, base=params["rope_theta"],
                       partial_rotary_factor=params["partial_rotary_factor"])
    torch.testing.assert_close(enc.inv_freq.float(), rotary.full_attention_inv_freq, rtol=1e-6, atol=0.0)
    local = config.rope_parameters["sliding_attention"]
    torch.testing.assert_close(RotaryEncoding(16, base=local["rope_theta"]).inv_freq.float(),
                               rotary.sliding_attention_inv_freq, rtol=1e-6, atol=0.0)


# ---- in posenc's models -------------------------------------------------------------------------------------


def _lm(**kw) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(40, dim=32, depth=4, num_heads=2, max_len=64, **kw).eval()


def test_irope_model_layers_and_cached_decoding():
    model = _lm(encoding="rope_llama3", encoding_options={"factor": 8.0, "original_max_len": 16},
                layer_schedule=irope_schedule(2, floor_scale=4.0))
    encs = [block.attn.encoding for block in model.encoder.blocks]
    assert [type(e).__name__ for e in encs] == ["Llama3RoPE", "NoPETemperature"] * 2
    assert encs[0] is encs[2] and encs[1] is encs[3]  # parameter-free: one instance per kind
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    smol = _lm(encoding="rope", layer_schedule=irope_schedule(4, temperature=False))
    assert [block.attn.encoding is None for block in smol.encoder.blocks] == [False, False, False, True]


def test_local_global_model_bases_and_gemma4_globals():
    gemma3 = _lm(encoding="rope", layer_schedule=local_global_schedule(2, local={"base": 10000.0},
                                                                        global_={"base": 1e6}))
    assert [block.attn.encoding.base for block in gemma3.encoder.blocks] == [1e4, 1e6, 1e4, 1e6]
    gemma4 = _lm(encoding="rope", layer_schedule=local_global_schedule(
        2, global_encoding="rope_proportional", global_={"base": 1e6, "partial_rotary_factor": 0.25}))
    kinds = [type(block.attn.encoding).__name__ for block in gemma4.encoder.blocks]
    assert kinds == ["RotaryEncoding", "ProportionalRoPE"] * 2


def test_a_scheduled_model_saves_and_reloads(tmp_path):
    model = _lm(encoding="rope", layer_schedule={"schedule": "irope", "interval": 2})
    model.save_pretrained(tmp_path)
    again = posenc.load(tmp_path)
    tokens = torch.randint(0, 40, (1, 9))
    torch.testing.assert_close(again(tokens), model(tokens))
    assert again.model_config["layer_schedule"] == {"schedule": "irope", "interval": 2}


def test_a_bidirectional_encoder_takes_a_schedule():
    torch.manual_seed(0)
    model = SequenceEncoder(40, dim=32, depth=2, num_heads=2, encoding="rope",
                            layer_schedule=local_global_schedule(2, global_={"base": 500.0}))
    assert model(torch.randint(0, 40, (2, 7))).shape == (2, 2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"encoding": None, "layer_schedule": {"schedule": "irope"}}, ValueError, "needs encoding= by registered name"),
    ({"encoding": "rope", "layer_schedule": {"schedule": "spiral"}}, ValueError, "layer_schedule\\['schedule'\\]"),
    ({"encoding": "rope", "layer_schedule": {"schedule": "irope", "every": 2}}, ValueError,
     "unknown key\\(s\\) every; it takes interval"),
    ({"encoding": "rope", "layer_schedule": {"schedule": "irope", "interval": 0}}, ValueError, "interval"),
    ({"encoding": "rope", "layer_schedule": {"schedule": "irope", "nope_layers": [7]}}, ValueError,
     "lists layer 7, outside 0..3"),
    ({"encoding": "sinusoidal", "layer_schedule": {"schedule": "irope"}}, ValueError, "acts on the input"),
    ({"encoding": "rope", "layer_schedule": {"schedule": "local_global", "global_encoding": "spin"}}, ValueError,
     "unknown encoding 'spin'"),
    ({"encoding": "rope", "layer_schedule": "irope"}, TypeError, "must be a dict with a 'schedule' key"),
])
def test_bad_schedules_are_one_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        _lm(**kwargs)


def test_check_schedule_fills_the_defaults():
    assert check_schedule({"schedule": "irope"}) == {"schedule": "irope", "interval": 4, "nope_layers": None,
                                                     "temperature": True, "floor_scale": 8192.0, "attn_scale": 0.1}


# ---- the command line --------------------------------------------------------------------------------------

CLI_TINY = ["--dim", "16", "--depth", "4", "--heads", "2", "--batch-size", "4", "--no-progress", "--steps", "1",
            "--task", "copy", "--length", "4", "--eval-examples", "4"]


def test_train_seq_takes_a_layer_schedule(tmp_path, capsys):
    import json

    from posenc import cli

    out = tmp_path / "run"
    argv = ["train", "seq", "--encoding", "rope", "--layer-schedule", "irope", "--schedule-option", "interval=2",
            "--out", str(out), *CLI_TINY]
    assert cli.main(argv) == 0, capsys.readouterr().err
    saved = json.loads((out / "results.json").read_text())["model_config"]["layer_schedule"]
    assert saved == {"schedule": "irope", "interval": 2}
    model = posenc.load(out)
    assert [type(b.attn.encoding).__name__ for b in model.encoder.blocks] == ["RotaryEncoding", "NoPETemperature"] * 2


@pytest.mark.parametrize("extra, message", [
    (["--schedule-option", "interval=2"], "--schedule-option needs --layer-schedule"),
    (["--layer-schedule", "irope", "--schedule-option", "every=2"],
     "--schedule-option every: irope takes interval, nope_layers"),
    (["--layer-schedule", "irope", "--schedule-option", "interval=0"], "interval must be"),
    (["--layer-schedule", "local_global", "--schedule-option", "global_layers=[9]"], "lists layer 9, outside 0..3"),
])
def test_train_seq_refuses_a_bad_schedule_in_one_line(extra, message, capsys):
    from posenc import cli

    assert cli.main(["train", "seq", "--encoding", "rope", *extra, *CLI_TINY]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
