"""Today's models in the Hugging Face bridge (issue 47): tiny random float64 models built from configs in
code (no downloads) of Qwen2-VL, Qwen2.5-VL and Qwen3-VL (M-RoPE; a one-block vision tower and an image in
the prompt, so the positions are a grid, not three equal rows), Gemma 3 (local and global bases, sliding
layers), Llama 4 text (NoPE layers with their temperature, interleaved pairs, chunked attention) and
SmolLM3 (NoPE layers). Batches are left padded, as for generation.

* ``attn_implementation="posenc"`` gives the logits of ``sdpa`` (1e-10) and the same greedy tokens;
* ``encoding="identity"`` reproduces the model layer by layer. transformers computes the rotary angles in
  float32 even in a float64 model (and Llama 4 rotates in float32); the tight comparisons give the
  reference float64 angles (:func:`_float64_rotary`, the model's own recomposition for M-RoPE), and one
  test compares with the untouched model at float32 accuracy;
* a named swap (ALiBi) generates with the cache as without one.

``parity_table()`` prints the table issue 47 asks for.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
llama4_module = pytest.importorskip("transformers.models.llama4.modeling_llama4")

from posenc.integrations import transformers as posenc_hf  # noqa: E402
from posenc.integrations.transformers.attention import _query_positions  # noqa: E402
from posenc.seq.mrope import MRoPE  # noqa: E402
from posenc.seq.nope_temperature import NoPETemperature  # noqa: E402

VOCAB = 61
TIGHT = 1e-10
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, pad_token_id=0, eos_token_id=VOCAB - 1, bos_token_id=1)
IMAGE_TOKENS = dict(image_token_id=59, video_token_id=58, vision_start_token_id=57, vision_end_token_id=56)
VISION = dict(depth=1, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=1)
QWEN_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
FAMILIES = (*QWEN_VL, "gemma3", "llama4", "smollm3")
CACHES = ("dynamic", "static")
NEW_TOKENS, STATIC_LEN = 5, 24


def _config(family: str, **extra):
    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig(
            text_config={**TEXT, "num_hidden_layers": 2, "rope_parameters": {
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}, **extra},
            vision_config={**VISION, "embed_dim": 16, "hidden_size": 32, "mlp_ratio": 2}, **IMAGE_TOKENS)
    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLConfig(
            text_config={**TEXT, "num_hidden_layers": 2, "rope_parameters": {
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}, **extra},
            vision_config={**VISION, "hidden_size": 16, "intermediate_size": 16, "out_hidden_size": 32,
                           "window_size": 4, "fullatt_block_indexes": [0]}, **IMAGE_TOKENS)
    if family == "qwen3_vl":
        return transformers.Qwen3VLConfig(
            text_config={**TEXT, "num_hidden_layers": 2, "head_dim": 8, "rope_parameters": {
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                **extra},
            vision_config={**VISION, "hidden_size": 16, "intermediate_size": 16, "out_hidden_size": 32,
                           "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}, **IMAGE_TOKENS)
    if family == "gemma3":
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}}
        return transformers.Gemma3TextConfig(**{**TEXT, "head_dim": 8, "num_hidden_layers": 3, "sliding_window": 4,
                                                "layer_types": ["sliding_attention"] * 2 + ["full_attention"],
                                                "rope_parameters": rope, **extra})
    if family == "llama4":  # use_qk_norm off: its L2 norm runs in float32 whatever the model's dtype
        return transformers.Llama4TextConfig(**{**TEXT, "head_dim": 8, "num_hidden_layers": 4, "intermediate_size_mlp": 48,
                                                "num_local_experts": 2, "num_experts_per_tok": 1,
                                                "interleave_moe_layer_step": 2, "attention_chunk_size": 4,
                                                "no_rope_layers": [1, 1, 1, 0], "use_qk_norm": False, **extra})
    return transformers.SmolLM3Config(**{**TEXT, "num_hidden_layers": 4, "no_rope_layer_interval": 2, **extra})


_CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
            "qwen3_vl": "Qwen3VLForConditionalGeneration", "gemma3": "Gemma3ForCausalLM",
            "llama4": "Llama4ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}


def _text_model(model):
    base = model.model
    return getattr(base, "language_model", base)


def _model(family: str, implementation: str = "sdpa", **extra):
    torch.manual_seed(0)
    model = getattr(transformers, _CLASSES[family])(_config(family, **extra)).to(torch.float64).eval()
    if implementation == "posenc":
        posenc_hf.register()
    model.set_attn_implementation(implementation)
    return model


def _inv_freq(head_dim: int, rope: dict) -> torch.Tensor:
    factor = rope.get("factor", 1.0) if rope.get("rope_type") == "linear" else 1.0
    return 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim) / factor


class Float64Rotary(nn.Module):
    """A model's rotary embedding with float64 angles: default or linear rope (per layer type for
    Gemma 3), complex for Llama 4, M-RoPE recomposed by the model's own rotary module."""

    def __init__(self, own: nn.Module, family: str) -> None:
        super().__init__()
        self.own, self.family, config = own, family, own.config
        self.head_dim = (config.head_dim if family in ("qwen3_vl", "gemma3", "llama4")
                         else config.hidden_size // config.num_attention_heads)

    def forward(self, x, position_ids, layer_type=None):
        rope = self.own.config.rope_parameters
        angles = position_ids[..., None].to(torch.float64) * _inv_freq(self.head_dim, rope[layer_type] if layer_type
                                                                        else rope)
        if self.family == "llama4":
            return torch.polar(torch.ones_like(angles), angles)
        if self.family in QWEN_VL:
            angles = angles.expand(3, *angles.shape[1:])
            return (self.own.recomposition_frequencies(angles.cos()).to(x.dtype),
                    self.own.recomposition_frequencies(angles.sin()).to(x.dtype))
        both = torch.cat([angles, angles], dim=-1)
        return both.cos().to(x.dtype), both.sin().to(x.dtype)


def _llama4_rotation_in_float64(xq, xk, freqs_cis):
    """Llama 4's complex rotation of neighbouring pairs, in float64 (its own casts q and k to float32)."""
    pairs = [torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2)) for x in (xq, xk)]
    return tuple(torch.view_as_real(p * freqs_cis[:, :, None, :]).flatten(3).type_as(x) for p, x in zip(pairs, (xq, xk)))


@pytest.fixture
def llama4_in_float64(monkeypatch):
    """Llama 4's own rotation in float64, for the models :func:`_float64_rotary` gives float64 angles."""
    monkeypatch.setattr(llama4_module, "apply_rotary_emb", _llama4_rotation_in_float64)


def _float64_rotary(model, family: str):
    owner = _text_model(model)
    owner.rotary_emb = Float64Rotary(owner.rotary_emb, family)
    return model


def _inputs(family: str, image: bool = True, grid: tuple[int, int] = (4, 4)) -> dict:
    """Three left-padded rows; for Qwen-VL with ``image``, each holds an image of ``grid`` patches
    (a quarter as many tokens once merged) between text, so its positions are a grid."""
    gen = torch.Generator().manual_seed(3)
    if family in QWEN_VL and image:
        batch, tokens = 3, grid[0] * grid[1] // 4
        block = torch.tensor([57] + [59] * tokens + [56]).expand(batch, -1)
        ids = torch.cat([torch.randint(2, 50, (batch, 3), generator=gen), block,
                         torch.randint(2, 50, (batch, 2), generator=gen)], dim=1)
        types = torch.zeros_like(ids)
        types[:, 4:4 + tokens] = 1
        extra = dict(pixel_values=torch.randn(batch * grid[0] * grid[1], 12, generator=gen, dtype=torch.float64),
                     image_grid_thw=torch.tensor([[1, *grid]] * batch), mm_token_type_ids=types)
    else:
        ids, extra = torch.randint(2, 50, (3, 8), generator=gen), {}
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :1] = 0
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, **extra)


def _generate(model, family: str, cache: str | None, image: bool = True):
    args = dict(_inputs(family, image), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, output_logits=True,
                return_dict_in_generate=True)
    if cache is None:
        args["use_cache"] = False
    else:
        args["cache_implementation"] = cache
        if cache == "static":
            args["max_cache_len"] = STATIC_LEN
    with torch.no_grad():
        out = model.generate(**args)
    return out.sequences, torch.stack(out.logits, dim=1)


def parity(family: str, cache: str | None, swap: str | None, image: bool = True) -> tuple[float, bool]:
    """``(max |logits difference|, tokens equal)``: posenc attention against sdpa (``swap`` None); the
    identity swap against the model with float64 angles, the same cache class; a named swap with
    ``cache`` against itself without one."""
    if swap is None:
        want, got = _model(family, "sdpa"), _model(family, "posenc")
    elif swap == "identity":
        want = _float64_rotary(_model(family), family)
        got = posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")
    else:
        want = got = posenc_hf.swap_position_encoding(_model(family), swap)
    want_tokens, want_logits = _generate(want, family, None if swap not in (None, "identity") else cache, image)
    got_tokens, got_logits = _generate(got, family, cache, image)
    return float((got_logits - want_logits).abs().max()), bool(torch.equal(got_tokens, want_tokens))


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("family", FAMILIES)
def test_posenc_attention_equals_sdpa(family, cache):
    difference, same_tokens = parity(family, cache, None)
    assert difference <= TIGHT and same_tokens, (family, cache, difference)


@pytest.mark.parametrize("cache", [*CACHES, None])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_identity_swap_reproduces_the_model(family, cache, llama4_in_float64):
    difference, same_tokens = parity(family, cache, "identity")
    assert difference <= TIGHT and same_tokens, (family, cache, difference)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_the_identity_swap_reproduces_a_qwen_vl_model_on_text(family):
    """Text alone: the three rows are equal, Qwen2-VL's rope deltas zero."""
    difference, same_tokens = parity(family, "dynamic", "identity", image=False)
    assert difference <= TIGHT and same_tokens, difference


@pytest.mark.parametrize("family", FAMILIES)
def test_a_named_swap_generates_with_the_cache_as_without(family):
    difference, same_tokens = parity(family, "dynamic", "alibi")
    assert difference <= TIGHT and same_tokens, (family, difference)


def test_each_layer_gets_the_model_own_encoding():
    layers = {family: [getattr(layer.self_attn, posenc_hf.ATTACHED, None) for layer in
                       _text_model(posenc_hf.swap_position_encoding(_model(family), "identity")).layers]
              for family in FAMILIES}
    for family in QWEN_VL:
        assert all(isinstance(e, MRoPE) for e in layers[family])
    assert [e.layout for e in layers["qwen3_vl"]] == ["interleaved"] * 2 and layers["qwen2_vl"][0].sections == (1, 1, 2)
    assert [(e.base, e.scaling and e.scaling.name) for e in layers["gemma3"]] == [(100.0, None)] * 2 + [(1000.0, "linear")]
    assert [type(e).__name__ for e in layers["llama4"]] == ["RotaryEncoding"] * 3 + ["NoPETemperature"]
    assert layers["llama4"][0].pairing == "interleaved"
    assert [e is None for e in layers["smollm3"]] == [False, True, False, True]
    assert len({id(e) for e in layers["gemma3"]}) == 3  # one instance a layer


@pytest.mark.parametrize("family", FAMILIES)
def test_the_identity_swap_follows_the_untouched_model(family):
    """Against transformers' own rotary (float32 angles; Llama 4 with llama3 scaling and its float32 qk norm)."""
    extra = {}
    if family == "llama4":
        extra = dict(use_qk_norm=True, rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8})
    reference = _model(family, **extra)
    model = posenc_hf.swap_position_encoding(copy.deepcopy(reference), "identity")
    args = {k: v for k, v in _inputs(family).items()}
    with torch.no_grad():
        want, got = reference(**args).logits, model(**args).logits
    valid = args["attention_mask"].bool()
    torch.testing.assert_close(got[valid], want[valid], atol=1e-6, rtol=0)


def test_a_multimodal_gemma3_swaps_its_language_model():
    """Gemma3ForConditionalGeneration: the swap reaches the text model under ``language_model``."""
    config = transformers.Gemma3Config(
        text_config=_config("gemma3").to_dict(), mm_tokens_per_image=4, image_token_index=59, boi_token_index=57,
        eoi_token_index=56, vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=8, patch_size=4))
    torch.manual_seed(0)
    want = transformers.Gemma3ForConditionalGeneration(config).to(torch.float64).eval()
    want.set_attn_implementation("sdpa")
    _float64_rotary(want, "gemma3")
    got = posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")
    assert [e.base for e in (layer.self_attn.position_encoding for layer in _text_model(got).layers)] == [100.0] * 2 + [1000.0]
    args = _inputs("gemma3")
    with torch.no_grad():
        torch.testing.assert_close(got(**args).logits, want(**args).logits, atol=TIGHT, rtol=0)


def test_llama4_temperature_reads_the_index_in_the_sequence(llama4_in_float64):
    """floor_scale 2: the temperature changes every other token. transformers computes it from the cache's
    length (the index, not the left-padded position id; Llama 4's layers pass the attention function no
    position ids, so the bridge reads the index too), in float32: float32 accuracy. The model's own
    temperature is off after the swap (twice would not match)."""
    want = _float64_rotary(_model("llama4", floor_scale=2, attn_scale=0.5), "llama4")
    got = posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")
    assert isinstance(_text_model(got).layers[3].self_attn.position_encoding, NoPETemperature)
    want_tokens, want_logits = _generate(want, "llama4", "dynamic")
    got_tokens, got_logits = _generate(got, "llama4", "dynamic")
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logits, want_logits, atol=1e-8, rtol=0)


def _qwen_positions(batch: int, length: int) -> torch.Tensor:
    """``[3, B, T]``: text, a 2 x 2 grid at positions 3-6, text after it from the grid's largest index + 1."""
    pos = torch.arange(length).expand(3, batch, length).clone()
    pos[:, :, 3:7] = torch.tensor([[3, 3, 3, 3], [3, 3, 4, 4], [3, 4, 3, 4]])[:, None, :]
    pos[:, :, 7:] = torch.arange(5, 5 + length - 7)
    return pos


@pytest.mark.parametrize("rows", [3, 4])
def test_position_ids_of_three_or_four_rows_reach_the_encoding(rows):
    """Image-like positions passed to the model: [3, B, T], or Qwen3-VL's [4, B, T] with the text row first."""
    want = _float64_rotary(_model("qwen2_vl"), "qwen2_vl")
    got = posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")
    ids = torch.randint(2, 50, (2, 10), generator=torch.Generator().manual_seed(4))
    pos = _qwen_positions(2, 10)
    if rows == 4:
        pos = torch.cat([torch.arange(10).expand(1, 2, 10), pos])
    with torch.no_grad():
        torch.testing.assert_close(got(input_ids=ids, position_ids=pos).logits,
                                   want(input_ids=ids, position_ids=pos).logits, atol=TIGHT, rtol=0)
        text = got(input_ids=ids).logits
    assert (text - got(input_ids=ids, position_ids=pos).logits).abs().max() > 1e-6  # the grid changed something


def test_the_attention_function_takes_mrope_position_ids_itself():
    """A caller passing [3, B, T] or [4, B, T] straight to the attention function."""
    enc = MRoPE(8, sections=(1, 1, 2))
    module = nn.Module()
    setattr(module, posenc_hf.ATTACHED, enc)
    q, k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    pos = _qwen_positions(2, 9)
    want = torch.nn.functional.scaled_dot_product_attention(*enc.transform_qk(q, k, pos.permute(1, 2, 0),
                                                                                pos.permute(1, 2, 0)), v, is_causal=True)
    for given in (pos, torch.cat([torch.arange(9).expand(1, 2, 9), pos])):
        out, _ = posenc_hf.posenc_attention(module, q, k, v, None, position_ids=given)
        torch.testing.assert_close(out.transpose(1, 2), want, atol=TIGHT, rtol=0)


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(2, 2, 6, dtype=torch.long), r"3D position_ids must be M-RoPE's \[3 \(t, h, w\) or 4"),
    (torch.zeros(3, 5, 6, dtype=torch.long), r"batch=2 or 1, 6\]; got \(3, 5, 6\)"),
    (torch.zeros(3, 2, 5, dtype=torch.long), r"got \(3, 2, 5\)"),
    (torch.zeros(1, 3, 2, 6, dtype=torch.long), r"\[3 or 4, batch, 6\]; got \(1, 3, 2, 6\)"),
])
def test_bad_mrope_position_ids_are_one_line(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        _query_positions(bad, 2, 6, 0, "cpu")
    assert "\n" not in str(info.value)


def test_the_cached_positions_travel_with_their_cache():
    """Two prompts with images of other grids decoded in turns, each with its own cache (the second made
    inside the forward): every step equals the full forward of its own sequence. (Positions are passed:
    the model itself keeps one ``rope_deltas``, its last prompt's.)"""
    model = posenc_hf.swap_position_encoding(_model("qwen2_vl"), "identity")
    runs = []
    with torch.no_grad():
        for grid, cache in (((4, 4), transformers.DynamicCache(config=model.config)), ((4, 8), None)):
            inputs = _inputs("qwen2_vl", grid=grid)
            out = model(**inputs, cache=cache, use_cache=True)
            runs.append((inputs, out.cache, out.logits[:, -1].argmax(-1, keepdim=True)))
        for _ in range(2):
            for index, (inputs, cache, token) in enumerate(runs):
                grown = {**inputs, "input_ids": torch.cat([inputs["input_ids"], token], 1),
                         "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1),
                         "mm_token_type_ids": torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(token)], 1)}
                pos, _ = model.model.get_rope_index(grown["input_ids"], grown["mm_token_type_ids"],
                                                    image_grid_thw=grown["image_grid_thw"],
                                                    attention_mask=grown["attention_mask"])
                step = model(input_ids=token, attention_mask=grown["attention_mask"], position_ids=pos[:, :, -1:],
                             cache=cache, use_cache=True).logits[:, -1]
                whole = model(**grown, position_ids=pos, use_cache=False).logits[:, -1]
                torch.testing.assert_close(step, whole, atol=TIGHT, rtol=0)
                runs[index] = (grown, cache, step.argmax(-1, keepdim=True))


@pytest.mark.parametrize("family", ["qwen2_vl", "llama4"])
def test_save_and_from_pretrained_rebuild_the_swap(family):
    model = posenc_hf.swap_position_encoding(_model(family), "identity")
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        again = type(model).from_pretrained(path, dtype=torch.float64).eval()
    assert type(_text_model(again).rotary_emb) is type(_text_model(model).rotary_emb)
    args = _inputs(family)
    with torch.no_grad():
        torch.testing.assert_close(again(**args).logits, model(**args).logits, atol=TIGHT, rtol=0)


def test_a_swapped_qwen_vl_model_trains_with_gradient_checkpointing():
    """The layers run again in the backward pass read the positions of their own forward."""
    model = posenc_hf.swap_position_encoding(_model("qwen2_vl"), "identity").train()
    args = _inputs("qwen2_vl")
    plain = model(**args, labels=args["input_ids"]).loss
    plain.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.activation_checkpointing_enable()
    checkpointed = model(**args, labels=args["input_ids"], use_cache=False).loss
    checkpointed.backward()
    torch.testing.assert_close(checkpointed, plain, atol=TIGHT, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, atol=1e-9, rtol=1e-7, msg=name)


def parity_table() -> str:
    """Issue 47's table: family x cache x swap -> max logits difference, greedy tokens equal."""
    rows = ["| family | cache | swap | max difference | tokens equal |", "|---|---|---|---|---|"]
    for family in FAMILIES:
        for cache in CACHES:
            for swap, label in ((None, "none (posenc vs sdpa)"), ("identity", "identity (vs float64-angle model)"),
                                ("alibi", "alibi (cached vs uncached)")):
                try:
                    difference, same = parity(family, cache, swap)
                    rows.append(f"| {family} | {cache} | {label} | {difference:.1e} | {same} |")
                except Exception as exc:  # noqa: BLE001 (the table reports it)
                    rows.append(f"| {family} | {cache} | {label} | error: {exc} | |")
    return "\n".join(rows)


if __name__ == "__main__":
    llama4_module.apply_rotary_emb = _llama4_rotation_in_float64  # the float64 reference (see llama4_in_float64)
    print(parity_table())
