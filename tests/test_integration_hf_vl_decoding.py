"""Decoding a swapped Qwen-VL model past plain greedy steps (issue 47): beam search, a cache cut back,
the cache's row operations, a copied cache, and a ``torch.compile``'d text model. Tiny random float64
Qwen2-VL and Qwen3-VL models built from configs in code (no downloads), an image in every prompt and
rows left padded by different amounts, so each row's ``(t, h, w)`` positions differ and a grid cannot
be counted back from the last query.

The swapped model (``encoding="identity"``, ``attn_implementation="posenc"``) is compared with the same
weights under ``sdpa`` with float64 rotary angles (transformers computes them in float32; the model's own
recomposition of M-RoPE's sections), or with its own uncached forward, at 1e-10: the positions of the
cached keys must follow every cache operation (:class:`~posenc.integrations.transformers.axes.KeptAxes`).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from posenc.integrations import transformers as posenc_hf  # noqa: E402
from posenc.integrations.transformers.axes import CACHE_ATTR, FOLLOWED  # noqa: E402

TIGHT = 1e-10
VOCAB = 61
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, pad_token_id=0, eos_token_id=VOCAB - 1, bos_token_id=1, num_hidden_layers=2)
IMAGE = dict(image_token_id=59, video_token_id=58, vision_start_token_id=57, vision_end_token_id=56)
VISION = dict(depth=1, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=1)
FAMILIES = ("qwen2_vl", "qwen3_vl")
STATIC_LEN = 24


def _config(family: str):
    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig(
            text_config={**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [1, 1, 2]}},
            vision_config={**VISION, "embed_dim": 16, "hidden_size": 32, "mlp_ratio": 2}, **IMAGE)
    return transformers.Qwen3VLConfig(
        text_config={**TEXT, "head_dim": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
        vision_config={**VISION, "hidden_size": 16, "intermediate_size": 16, "out_hidden_size": 32,
                       "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}, **IMAGE)


class Float64MRoPE(nn.Module):
    """A Qwen-VL rotary embedding with float64 angles, its sections recomposed by the model's own module."""

    def __init__(self, own: nn.Module) -> None:
        super().__init__()
        self.own = own
        config = own.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theta = config.rope_parameters["rope_theta"]
        self.inv_freq64 = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * self.inv_freq64
        angles = angles.expand(3, *angles.shape[1:])
        return (self.own.recomposition_frequencies(angles.cos()).to(x.dtype),
                self.own.recomposition_frequencies(angles.sin()).to(x.dtype))


def _models(family: str):
    """``(reference, swapped)``: the sdpa model with float64 angles, and a copy swapped to posenc."""
    torch.manual_seed(0)
    cls = transformers.Qwen2VLForConditionalGeneration if family == "qwen2_vl" else \
        transformers.Qwen3VLForConditionalGeneration
    want = cls(_config(family)).to(torch.float64).eval()
    want.set_attn_implementation("sdpa")
    text_model = want.model.language_model
    text_model.rotary_emb = Float64MRoPE(text_model.rotary_emb)
    return want, posenc_hf.swap_position_encoding(copy.deepcopy(want), "identity")


def _inputs(rows: int = 3) -> dict:
    """Rows of text, a 4 x 4-patch image (2 x 2 tokens once merged), text; left padded by 2, 0, 1."""
    gen = torch.Generator().manual_seed(3)
    block = torch.tensor([57] + [59] * 4 + [56]).expand(rows, -1)
    ids = torch.cat([torch.randint(2, 50, (rows, 3), generator=gen), block,
                     torch.randint(2, 50, (rows, 2), generator=gen)], dim=1)
    types = torch.zeros_like(ids)
    types[:, 4:8] = 1
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    if rows > 2:
        mask[2, :1] = 0
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, mm_token_type_ids=types,
                pixel_values=torch.randn(rows * 16, 12, generator=gen, dtype=torch.float64),
                image_grid_thw=torch.tensor([[1, 4, 4]] * rows))


def _rows(inputs: dict, index: torch.Tensor) -> dict:
    """The rows ``index`` of a prompt (each row's image goes with it)."""
    picked = {k: inputs[k][index] for k in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw")}
    patches = inputs["pixel_values"].reshape(inputs["input_ids"].shape[0], 16, -1)[index]
    return {**picked, "pixel_values": patches.reshape(-1, patches.shape[-1])}


def _grow(inputs: dict, token: torch.Tensor) -> dict:
    return {**inputs, "input_ids": torch.cat([inputs["input_ids"], token], 1),
            "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1),
            "mm_token_type_ids": torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(token)], 1)}


def _positions(model, inputs: dict) -> torch.Tensor:
    """``[3, B, T]``, the model's own M-RoPE ids of a whole sequence (passed to every call: the model
    keeps one ``rope_deltas``, for the rows of its last prompt)."""
    pos, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                        image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"])
    return pos


def _prefill(model, inputs: dict, cache) -> torch.Tensor:
    return model(**inputs, position_ids=_positions(model, inputs), cache=cache, use_cache=True).logits[:, -1]


def _step(model, inputs: dict, token: torch.Tensor, cache) -> tuple[dict, torch.Tensor]:
    """One cached decoding step of ``token``: the grown inputs and the step's logits."""
    grown = _grow(inputs, token)
    logits = model(input_ids=token, attention_mask=grown["attention_mask"],
                   position_ids=_positions(model, grown)[:, :, -1:], cache=cache, use_cache=True).logits[:, -1]
    return grown, logits


def _whole(model, inputs: dict) -> torch.Tensor:
    """The last logits of an uncached forward over the whole sequence."""
    return model(**inputs, position_ids=_positions(model, inputs), use_cache=False).logits[:, -1]


@pytest.mark.parametrize("family, returned", [("qwen2_vl", 2), ("qwen3_vl", 3)])
def test_beam_search_with_an_image_equals_sdpa(family, returned):
    """generate(num_beams=3): every step reorders the cache's rows (reorder_cache), and the kept
    positions with them. (The beams of one prompt share their positions, so this guards the plumbing;
    test_the_cache_row_operations_move_the_positions checks a reorder across rows that differ.)"""
    want, got = _models(family)
    args = dict(_inputs(), max_new_tokens=4, num_beams=3, num_return_sequences=returned, do_sample=False,
                pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        a, b = want.generate(**args), got.generate(**args)
    assert a.sequences.shape[0] == 3 * returned and torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(b.sequences_scores, a.sequences_scores, atol=TIGHT, rtol=0)
    torch.testing.assert_close(torch.stack(b.scores), torch.stack(a.scores), atol=TIGHT, rtol=0)


def _greedy_steps_agree(want, got, caches, rows, token, steps: int = 2) -> None:
    """``steps`` cached steps from ``token`` on: posenc's logits equal sdpa's (``want``, its own
    cache) and the uncached forward of the rows so far, each step feeding the greedy token."""
    for _ in range(steps):
        _, want_logits = _step(want, rows, token, caches[0])
        rows, got_logits = _step(got, rows, token, caches[1])
        torch.testing.assert_close(got_logits, want_logits, atol=TIGHT, rtol=0)
        torch.testing.assert_close(got_logits, _whole(got, rows), atol=TIGHT, rtol=0)
        token = got_logits.argmax(-1, keepdim=True)


@pytest.mark.parametrize("operation", ["reorder_cache", "batch_select_indices", "batch_repeat_interleave"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_cache_row_operations_move_the_positions(family, operation):
    """A prompt of three rows, the cache's rows reordered, selected or repeated, then two decoding
    steps of the new rows: each equals sdpa with the same cache operation, and the uncached forward."""
    want, got = _models(family)
    inputs = _inputs()
    index = {"reorder_cache": torch.tensor([2, 0, 1]), "batch_select_indices": torch.tensor([2, 0]),
             "batch_repeat_interleave": torch.tensor([0, 0, 1, 1, 2, 2])}[operation]
    argument = 2 if operation == "batch_repeat_interleave" else index
    caches = [transformers.DynamicCache(config=m.config) for m in (want, got)]
    with torch.no_grad():
        for model, cache in zip((want, got), caches):
            _prefill(model, inputs, cache)
            getattr(cache, operation)(argument)
        assert getattr(caches[1], CACHE_ATTR).positions.shape[0] == len(index)
        rows = _rows(inputs, index)
        _greedy_steps_agree(want, got, caches, rows, torch.arange(3, 3 + len(index)).unsqueeze(1))


@pytest.mark.parametrize("cache_class", ["dynamic", "static"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_cropped_back_decodes_as_the_uncropped_path(family, cache_class):
    """Three greedy steps, ``cache.crop(-2)`` (transformers 5: a count of tokens to drop), then other
    tokens from there: each step equals sdpa after the same crop and the uncached forward."""
    want, got = _models(family)
    inputs = _inputs()

    def cache_for(model):
        if cache_class == "static":
            return transformers.StaticCache(config=model.config, max_cache_len=STATIC_LEN)
        return transformers.DynamicCache(config=model.config)

    caches = [cache_for(want), cache_for(got)]
    with torch.no_grad():
        token = _prefill(want, inputs, caches[0]).argmax(-1, keepdim=True)
        _prefill(got, inputs, caches[1])
        history = [inputs]
        for _ in range(3):
            _step(want, history[-1], token, caches[0])
            grown, logits = _step(got, history[-1], token, caches[1])
            history.append(grown)
            token = logits.argmax(-1, keepdim=True)
        for cache in caches:
            cache.crop(-2)
        rows = history[-3]
        assert caches[1].get_seq_length() == rows["input_ids"].shape[1]
        assert getattr(caches[1], CACHE_ATTR).positions.shape[1] == rows["input_ids"].shape[1]
        _greedy_steps_agree(want, got, caches, rows, torch.full((3, 1), 7))


def test_prompt_lookup_decoding_crops_the_cache_and_equals_sdpa():
    """generate(prompt_lookup_num_tokens=...) drafts tokens from the prompt and crops the rejected ones
    off the cache (``cache.crop``) inside generate."""
    want, got = _models("qwen2_vl")
    prompt = _rows(_inputs(), torch.tensor([1]))
    for key in ("input_ids", "attention_mask", "mm_token_type_ids"):  # the last two text tokens twice more:
        prompt[key] = torch.cat([prompt[key]] + [prompt[key][:, -2:]] * 2, 1)  # text drafts to look up
    args = dict(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, prompt_lookup_num_tokens=3,
                output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a, b = want.generate(**args), got.generate(**args)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(b.logits), torch.stack(a.logits), atol=TIGHT, rtol=0)


def test_a_copied_cache_decodes_on_its_own():
    """The prompt-reuse pattern: a cache after the prompt, deep-copied and decoded two ways; the copy's
    operations act on the copy's positions, the original's on the original's. It pickles."""
    _, got = _models("qwen2_vl")
    inputs = _inputs()
    cache = transformers.DynamicCache(config=got.config)
    with torch.no_grad():
        _prefill(got, inputs, cache)
        copied = copy.deepcopy(cache)
        assert getattr(copied, CACHE_ATTR) is not getattr(cache, CACHE_ATTR)
        copied.crop(-1)
        assert getattr(cache, CACHE_ATTR).positions.shape[1] == cache.get_seq_length() == inputs["input_ids"].shape[1]
        assert getattr(copied, CACHE_ATTR).positions.shape[1] == copied.get_seq_length() == cache.get_seq_length() - 1
        again = pickle.loads(pickle.dumps(cache))
        for tokens, used in ((3, cache), (5, copy.deepcopy(cache)), (9, again)):
            token = torch.full((3, 1), tokens)
            rows, logits = _step(got, inputs, token, used)
            torch.testing.assert_close(logits, _whole(got, rows), atol=TIGHT, rtol=0)


def test_only_the_caches_a_swapped_model_sees_are_changed():
    """The followed methods are set on the cache object, never on transformers' classes."""
    _, got = _models("qwen2_vl")
    seen, other = transformers.DynamicCache(config=got.config), transformers.DynamicCache(config=got.config)
    with torch.no_grad():
        _prefill(got, _inputs(), seen)
    assert all(name in vars(seen) for name in FOLLOWED)
    assert not any(name in vars(other) for name in FOLLOWED) and not hasattr(other, CACHE_ATTR)
    assert all(name not in vars(transformers.DynamicCache) for name in FOLLOWED)
    with pytest.raises(ValueError, match="positive value"):  # the class's own refusal comes first
        seen.crop(3)


def test_a_compiled_text_model_decodes_as_eager_sdpa():
    """The text model compiled (its forward hooks included; backend "eager": dynamo traces, the ops
    run as they are, so float64 stays exact to rounding): a prefill with an image, three cached
    steps, ``crop(-2)`` and a step from there, each equal to the eager sdpa model. The text model's
    attention calls must all have run inside compiled graphs (where the mask records no cache
    layout), none in an eager fallback; the vision tower is not compiled."""
    from transformers.modeling_utils import AttentionInterface

    want, got = _models("qwen2_vl")
    calls = torch.zeros(2, 2, dtype=torch.long)  # [vision or text, eager or compiled]; a tensor adds no guard

    def spy(module, *args, **kwargs):
        calls[int(hasattr(module, posenc_hf.ATTACHED)), int(torch.compiler.is_compiling())] += 1
        return posenc_hf.posenc_attention(module, *args, **kwargs)

    AttentionInterface.register("posenc", spy)
    torch._dynamo.reset()
    try:
        got.model.language_model.compile(backend="eager")
        inputs = _inputs()
        caches = [transformers.DynamicCache(config=m.config) for m in (want, got)]
        with torch.no_grad():
            want_logits = _prefill(want, inputs, caches[0])
            torch.testing.assert_close(_prefill(got, inputs, caches[1]), want_logits, atol=TIGHT, rtol=0)
            history = [inputs]
            for _ in range(3):
                token = want_logits.argmax(-1, keepdim=True)
                _, want_logits = _step(want, history[-1], token, caches[0])
                grown, got_logits = _step(got, history[-1], token, caches[1])
                history.append(grown)
                torch.testing.assert_close(got_logits, want_logits, atol=TIGHT, rtol=0)
            for cache in caches:
                cache.crop(-2)
            token = torch.full((3, 1), 7)
            _, want_logits = _step(want, history[-3], token, caches[0])
            _, got_logits = _step(got, history[-3], token, caches[1])
            torch.testing.assert_close(got_logits, want_logits, atol=TIGHT, rtol=0)
    finally:
        AttentionInterface.register("posenc", posenc_hf.posenc_attention)
        torch._dynamo.reset()
    assert calls[1].tolist() == [0, 10], calls  # the text model's: the prefill and four steps, two layers each
