"""Llama 4 multimodal (``Llama4ForConditionalGeneration``) in the Hugging Face bridge (issue 47): a tiny
random float64 model built from a config in code (no downloads), a one-layer vision tower whose four
image tokens sit in every prompt, and the Llama 4 text model the bridge already swaps (RoPE layers with
interleaved pairs, a NoPE layer with its temperature, chunked attention). Rows are left padded.

Two things of transformers 5.24 are worked around here, the same for every model compared:

* ``Llama4ForConditionalGeneration.forward`` reads ``image_outputs`` from its language model's output,
  which has no such field, so every call raises AttributeError (:func:`_with_image_outputs` adds it);
* ``.to(torch.float64)`` casts the vision tower's complex rotary table to real numbers (its imaginary
  part dropped, with a warning); the table is rebuilt.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")

from posenc.integrations import transformers as posenc_hf  # noqa: E402
from posenc.seq.nope_temperature import NoPETemperature  # noqa: E402

TIGHT = 1e-10
VOCAB = 61
IMAGE_TOKEN = 59
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, intermediate_size_mlp=48, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, num_hidden_layers=4, max_position_embeddings=64, num_local_experts=2,
            num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=4, no_rope_layers=[1, 1, 1, 0],
            use_qk_norm=False, pad_token_id=0, eos_token_id=VOCAB - 1, bos_token_id=1)  # qk norm: float32 always
VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=8,
              patch_size=2, vision_output_dim=16, projector_input_dim=16, projector_output_dim=16,
              pixel_shuffle_ratio=0.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
CACHES = ("dynamic", "static")
pytestmark = pytest.mark.filterwarnings("ignore:Casting complex values to real")  # the cast the table is rebuilt for


def _config():
    return transformers.Llama4Config(text_config=TEXT, vision_config=VISION, image_token_index=IMAGE_TOKEN,
                                     boi_token_index=57, eoi_token_index=56)


def _with_image_outputs(module, args, output):
    output.image_outputs = None


def _model(implementation: str = "sdpa"):
    torch.manual_seed(0)
    config = _config()
    model = transformers.Llama4ForConditionalGeneration(config).to(torch.float64).eval()
    model.vision_model.rotary_embedding.freqs_ci = llama4.Llama4VisionRotaryEmbedding._compute_freqs_ci(
        config.vision_config)
    model.language_model.register_forward_hook(_with_image_outputs)
    if implementation == "posenc":
        posenc_hf.register()
    model.set_attn_implementation(implementation)
    return model


class Float64ComplexRotary(nn.Module):
    """Llama 4's text rotary with float64 angles (its own computes them in float32)."""

    def __init__(self, config) -> None:
        super().__init__()
        theta = config.rope_parameters["rope_theta"]
        self.inv_freq64 = 1.0 / theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * self.inv_freq64
        return torch.polar(torch.ones_like(angles), angles)


def _rotation_in_float64(xq, xk, freqs_cis):
    """Llama 4's complex rotation of neighbouring pairs, in float64 (its own casts q and k to float32)."""
    pairs = [torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2)) for x in (xq, xk)]
    return tuple(torch.view_as_real(p * freqs_cis[:, :, None, :]).flatten(3).type_as(x) for p, x in zip(pairs, (xq, xk)))


def _reference():
    """The sdpa model with float64 angles and rotation (the identity swap's float64 reference)."""
    model = _model()
    text_model = model.language_model.model
    text_model.rotary_emb = Float64ComplexRotary(text_model.config)
    return model


def _inputs() -> dict:
    """Three rows: text, an image (begin, 4 image tokens, end), text; left padded by 2, 0, 1."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.cat([torch.randint(2, 50, (3, 3), generator=gen), torch.tensor([[57] + [IMAGE_TOKEN] * 4 + [56]] * 3),
                     torch.randint(2, 50, (3, 2), generator=gen)], dim=1)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :1] = 0
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask,
                pixel_values=torch.randn(3, 3, 8, 8, generator=gen, dtype=torch.float64))


def _generate(model, cache: str):
    extra = {"max_cache_len": 24} if cache == "static" else {}
    with torch.no_grad():
        out = model.generate(**_inputs(), max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True, cache_implementation=cache, **extra)
    return out.sequences, torch.stack(out.logits, dim=1)


def parity(cache: str, swap: bool) -> tuple[float, bool]:
    """``(max |logits difference|, greedy tokens equal)``: posenc attention against sdpa, or the identity
    swap against the float64-angle model."""
    if swap:
        want = _reference()
        got = posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")
    else:
        want, got = _model("sdpa"), _model("posenc")
    (want_tokens, want_logits), (got_tokens, got_logits) = _generate(want, cache), _generate(got, cache)
    return float((got_logits - want_logits).abs().max()), bool(torch.equal(got_tokens, want_tokens))


@pytest.fixture
def rotation_in_float64(monkeypatch):
    monkeypatch.setattr(llama4, "apply_rotary_emb", _rotation_in_float64)


@pytest.mark.parametrize("cache", CACHES)
def test_posenc_attention_equals_sdpa(cache):
    difference, same_tokens = parity(cache, swap=False)
    assert difference <= TIGHT and same_tokens, difference


@pytest.mark.parametrize("cache", CACHES)
def test_the_identity_swap_reproduces_the_model(cache, rotation_in_float64):
    difference, same_tokens = parity(cache, swap=True)
    assert difference <= TIGHT and same_tokens, difference


def test_the_swap_reaches_the_text_model_only():
    model = posenc_hf.swap_position_encoding(_model(), "identity")
    layers = [layer.self_attn for layer in model.language_model.model.layers]
    assert [type(getattr(a, posenc_hf.ATTACHED)).__name__ for a in layers[:3]] == ["RotaryEncoding"] * 3
    assert isinstance(getattr(layers[3], posenc_hf.ATTACHED), NoPETemperature)
    assert all(a.position_encoding.pairing == "interleaved" for a in layers[:3])
    assert all(not a.use_rope and not a.attn_temperature_tuning for a in layers)
    assert isinstance(model.language_model.model.rotary_emb, posenc_hf.NoComplexRotary)
    assert not any(hasattr(m, posenc_hf.ATTACHED) for m in model.vision_model.modules())
    args = _inputs()
    with torch.no_grad():  # the image reaches the text model
        other = model(**{**args, "pixel_values": args["pixel_values"].flip(0)}).logits
        assert (model(**args).logits - other).abs().max() > 1e-3


def test_save_and_from_pretrained_rebuild_the_swap():
    model = posenc_hf.swap_position_encoding(_model(), "identity")
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        again = transformers.Llama4ForConditionalGeneration.from_pretrained(path, dtype=torch.float64).eval()
    again.language_model.register_forward_hook(_with_image_outputs)
    assert again.config.posenc["encoding"] == "identity"
    assert isinstance(again.language_model.model.rotary_emb, posenc_hf.NoComplexRotary)
    with torch.no_grad():
        torch.testing.assert_close(again(**_inputs()).logits, model(**_inputs()).logits, atol=TIGHT, rtol=0)


if __name__ == "__main__":
    llama4.apply_rotary_emb = _rotation_in_float64  # the float64 reference (see rotation_in_float64)
    for cache in CACHES:
        for swap in (False, True):
            print(cache, "identity swap" if swap else "posenc vs sdpa", *parity(cache, swap))
