"""M-RoPE (``mrope``) and its position ids against the reference code installed here, on tiny configs
built in code: transformers' ``Qwen2VLRotaryEmbedding`` (sections) and ``Qwen3VLTextRotaryEmbedding``
(interleaved) with ``apply_rotary_pos_emb``, the ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL and
Qwen3-VL (images, videos, time scaling, left padding; packed rows against each segment alone), and
timm's ``RotaryEmbeddingMRope``; decoding with ``rope_deltas`` equals the full forward.

``_TABLE`` collects the max abs difference (tables, rotations, attention) or the count of unequal
ids of each case; ``test_print_the_difference_table`` prints it (``pytest -s``)."""

from __future__ import annotations

import functools
import types

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.common.attention import attend
from posenc.common.masks import AttentionMask
from posenc.seq import CausalLM
from posenc.seq.mrope import (
    MRoPE,
    apply_mrope,
    default_sections,
    mrope_axes,
    mrope_cos_sin,
)
from posenc.seq.mrope_positions import mrope_next_positions, mrope_position_ids

transformers = pytest.importorskip("transformers")
qwen2 = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
qwen25 = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
qwen3 = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
timm_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

_TABLE: dict[str, str] = {}


def _record(case: str, ours: torch.Tensor, theirs: torch.Tensor, tol: float) -> None:
    diff = (ours.double() - theirs.double()).abs().max().item()
    _TABLE[case] = f"{diff:.2e}"
    assert diff <= tol, f"{case}: max abs difference {diff:.3g} > {tol:.1g}"


def _record_ids(case: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    unequal = int((ours != theirs).sum())
    _TABLE[case] = f"{unequal} of {ours.numel()} ids differ"
    assert unequal == 0, f"{case}:\n{ours}\n{theirs}"


# ---- the tables and the rotation ----------------------------------------------------------------------

HEAD_DIM = 32


def _positions(batch: int, length: int, seed: int) -> torch.Tensor:
    """Random (t, h, w) ids ``[B, L, 3]``, text stretches among them."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 60, (batch, length, 3), generator=g)
    pos[:, : length // 3] = torch.arange(length // 3)[:, None]  # a text run: all axes equal
    return pos


def _hf_rotary(kind: str, sections, theta: float = 10000.0):
    params = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(sections)}
    if kind == "qwen2":
        config = transformers.Qwen2VLTextConfig(hidden_size=2 * HEAD_DIM, num_attention_heads=2,
                                                rope_parameters=params)
        return qwen2.Qwen2VLRotaryEmbedding(config), qwen2.apply_rotary_pos_emb
    config = transformers.Qwen3VLTextConfig(hidden_size=2 * HEAD_DIM, num_attention_heads=2, head_dim=HEAD_DIM,
                                            rope_parameters=params)
    return qwen3.Qwen3VLTextRotaryEmbedding(config), qwen3.apply_rotary_pos_emb


CASES = [  # (reference, layout, sections)
    ("qwen2", "sections", (4, 6, 6)),
    ("qwen2", "sections", (8, 4, 4)),
    ("qwen3", "interleaved", (6, 5, 5)),
    ("qwen3", "interleaved", (8, 4, 4)),
    ("qwen3", "interleaved", (2, 6, 6)),  # strides past the last pair: clamped, as Qwen3-VL's slices
]


@pytest.mark.parametrize("kind, layout, sections", CASES)
def test_cos_sin_rotation_and_attention_equal_transformers(kind, layout, sections):
    torch.manual_seed(0)
    module, apply = _hf_rotary(kind, sections)
    pos = _positions(2, 12, seed=1)
    x = torch.zeros(1, dtype=torch.float64)
    cos, sin = module(x, pos.permute(2, 0, 1))  # transformers' (3, B, L)
    enc = MRoPE(HEAD_DIM, sections=sections, layout=layout)
    our_cos, our_sin = mrope_cos_sin(pos, enc.inv_freq, enc.axes)
    name = f"{kind} {layout} {sections}"
    # transformers computes the angles in float32: positions up to 60 round by up to 60 * 2^-24 rad
    _record(f"{name}: cos/sin", torch.cat((our_cos, our_cos, our_sin, our_sin), -1), torch.cat((cos, sin), -1), 1e-5)
    q, k, v = (torch.randn(2, 2, 12, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    hf_q, hf_k = apply(q, k, cos, sin)
    ours = enc.transform_qk(q, k, pos, pos)
    _record(f"{name}: rotated q/k", torch.cat(ours), torch.cat((hf_q, hf_k)), 5e-5)
    out = attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=AttentionMask(causal=True))
    _record(f"{name}: attention", out, F.scaled_dot_product_attention(hf_q, hf_k, v, is_causal=True), 5e-5)
    func = apply_mrope(q, k, pos, sections=sections, layout=layout)
    torch.testing.assert_close(torch.cat(func), torch.cat(ours), rtol=0, atol=0)


@pytest.mark.parametrize("sections", [(6, 5, 5), (2, 6, 6)])
def test_image_tables_equal_timm(sections):
    rows, cols = 3, 5
    rope = timm_sincos.RotaryEmbeddingMRope(HEAD_DIM, mrope_section=sections, temperature=10000.0)
    embed = rope.get_embed([rows, cols]).double()
    q = torch.randn(1, 2, rows * cols, HEAD_DIM, dtype=torch.float64)
    theirs = timm_sincos.apply_rot_embed_cat(q, embed, half=True)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    pos = torch.stack((torch.zeros_like(r), r, c), -1).reshape(1, -1, 3)  # an image of one frame at t = 0
    ours, _ = MRoPE(HEAD_DIM, sections=sections, layout="interleaved").transform_qk(q, q, pos, pos)
    _record(f"timm image {rows}x{cols} {sections}", ours, theirs, 1e-5)


def test_text_is_plain_rope_and_the_pairs_split_as_named():
    torch.manual_seed(0)
    q, k = (torch.randn(2, 2, 9, HEAD_DIM, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(9)[None]
    rope = posenc.build("rope", head_dim=HEAD_DIM)
    for layout in ("sections", "interleaved"):
        three = pos[..., None].expand(-1, -1, 3)
        enc = MRoPE(HEAD_DIM, layout=layout)
        expected = torch.cat(rope.transform_qk(q, k, pos, pos))
        torch.testing.assert_close(torch.cat(enc.transform_qk(q, k, pos, pos)), expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.cat(enc.transform_qk(q, k, three, three)), expected, rtol=0, atol=1e-12)
    assert mrope_axes((2, 3, 3), 8).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert mrope_axes((4, 2, 2), 8, "interleaved").tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    assert default_sections(64) == (16, 24, 24) and default_sections(64, "interleaved") == (24, 20, 20)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"head_dim": 32, "sections": (4, 4, 4)}, ValueError, "must add up to the 16 rotary pairs"),
    ({"head_dim": 32, "sections": (4, 6)}, TypeError, "sections must be three ints"),
    ({"head_dim": 32, "sections": (8, -1, 9)}, ValueError, "sections must be >= 0"),
    ({"head_dim": 32, "layout": "stacked"}, ValueError, "layout"),
    ({"head_dim": 32, "scaling": posenc.seq.DynamicNTKScaling(64)}, ValueError, "static scaling"),
])
def test_bad_arguments_are_one_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        MRoPE(**kwargs)


def test_positions_of_another_shape_are_refused():
    enc = MRoPE(HEAD_DIM)
    q = torch.randn(1, 2, 4, HEAD_DIM)
    with pytest.raises(ValueError, match=r"M-RoPE q_pos must be \[batch or 1, 4\] \(text\) or \[batch or 1, 4, 3\]"):
        enc.transform_qk(q, q, torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))


# ---- the position ids --------------------------------------------------------------------------------------


def _hf_index(module, merge: int, tokens_per_second: int | None = None):
    """``get_rope_index`` of ``module``'s model class, on a stand-in for the model (it reads the vision
    config and its own position helper, nothing else)."""
    cls = {qwen2: qwen2.Qwen2VLModel, qwen25: qwen25.Qwen2_5_VLModel, qwen3: qwen3.Qwen3VLModel}[module]
    vision = types.SimpleNamespace(spatial_merge_size=merge, tokens_per_second=tokens_per_second)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, fake)
    return functools.partial(cls.get_rope_index, fake)


def _types(*runs: tuple[int, int]) -> list[int]:
    return [kind for kind, n in runs for _ in range(n)]


def _batch(rows: list[list[int]], left_pad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """token types ``[B, L]`` (padded on the left with text) and the attention mask."""
    length = max(map(len, rows))
    types_ = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):
        span = slice(length - len(row), length) if left_pad else slice(0, len(row))
        types_[b, span], mask[b, span] = torch.tensor(row), 1
    return types_, mask


ID_CASES = {
    # one image (t=1, 4x6 patches, merged 2 -> 2x3 tokens) between text
    "image": {"rows": [_types((0, 3), (1, 6), (0, 4))], "images": [[1, 4, 6]], "videos": None, "merge": 2},
    # two rows, left padding, two images and a video of 3 frames across the batch
    "images+video, left padding": {
        "rows": [_types((0, 2), (1, 4), (0, 3)), _types((0, 1), (1, 6), (0, 2), (2, 12), (0, 3))],
        "images": [[1, 4, 4], [1, 4, 6]], "videos": [[3, 4, 4]], "merge": 2},
}


@pytest.mark.parametrize("case", list(ID_CASES))
@pytest.mark.parametrize("module", [qwen2, qwen3], ids=["qwen2-vl", "qwen3-vl"])
def test_position_ids_equal_get_rope_index(case, module):
    spec = ID_CASES[case]
    types_, mask = _batch(spec["rows"])
    images = None if spec["images"] is None else torch.tensor(spec["images"])
    videos = None if spec["videos"] is None else torch.tensor(spec["videos"])
    if module is qwen3 and videos is not None:
        # Qwen3-VL's frames are blocks of their own, separated by timestamp text
        rows = [_types((0, 2), (1, 4), (0, 3)), _types((0, 1), (1, 6), (0, 2), (2, 4), (0, 1), (2, 4), (0, 1),
                                                        (2, 4), (0, 3))]
        types_, mask = _batch(rows)
    hf_ids, hf_deltas = _hf_index(module, spec["merge"])(
        types_.clone(), mm_token_type_ids=types_, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask)
    ours = mrope_position_ids(types_, image_grids=images, video_grids=videos, spatial_merge_size=spec["merge"],
                              attention_mask=mask, split_video_frames=module is qwen3, text_after="spatial")
    name = f"{'qwen3-vl' if module is qwen3 else 'qwen2-vl'} {case}"
    _record_ids(f"{name}: ids", ours.ids, hf_ids)
    _record_ids(f"{name}: rope_deltas", ours.rope_deltas, hf_deltas)


def test_back_to_back_blocks_take_one_grid_each():
    # a run of vision tokens holding several grids (transformers reads one grid per run): each block in turn,
    # the next starting one past the previous block's largest index
    images = torch.tensor([[1, 4, 4], [1, 4, 4]])
    ours = mrope_position_ids(torch.tensor([_types((0, 2), (1, 8), (0, 2))]), image_grids=images,
                              spatial_merge_size=2)
    assert ours.ids[0, 0].tolist() == [0, 1, 2, 2, 2, 2, 4, 4, 4, 4, 6, 7]  # time: one block at 2, the next at 4
    assert ours.ids[1, 0].tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7]


@pytest.mark.parametrize("seconds", [None, [1.0, 0.5]])
def test_qwen25_time_scaling_equals_get_rope_index(seconds):
    rows = [_types((0, 2), (2, 12), (0, 3), (2, 8), (0, 2))]
    types_, mask = _batch(rows)
    videos = torch.tensor([[3, 4, 4], [2, 4, 4]])
    second = None if seconds is None else torch.tensor(seconds)
    hf_ids, hf_deltas = _hf_index(qwen25, 2, tokens_per_second=4)(
        types_.clone(), mm_token_type_ids=types_, video_grid_thw=videos, second_per_grid_ts=second,
        attention_mask=mask)
    ours = mrope_position_ids(types_, video_grids=videos, spatial_merge_size=2, tokens_per_second=4,
                              seconds_per_grid=second, attention_mask=mask, text_after="spatial")
    _record_ids(f"qwen2.5-vl time scaling seconds={seconds}: ids", ours.ids, hf_ids)
    _record_ids(f"qwen2.5-vl time scaling seconds={seconds}: rope_deltas", ours.rope_deltas, hf_deltas)
    assert ours.ids[0, 0, 2:14].tolist() == [2] * 4 + [6] * 4 + [10] * 4  # frames 4 apart (4 tokens a second)


def test_text_after_largest_continues_past_the_video_frames():
    # a video of 3 frames 4 apart, 2x2 tokens each: frames at 1, 5, 9 after one text token; "largest"
    # (Qwen2-VL's code) resumes text at 10, "spatial" (transformers 5) at 1 + 2 = 3
    types_ = torch.tensor([_types((0, 1), (2, 12), (0, 2))])
    kwargs = {"video_grids": [[3, 4, 4]], "spatial_merge_size": 2, "tokens_per_second": 4}
    largest = mrope_position_ids(types_, **kwargs)
    spatial = mrope_position_ids(types_, **kwargs, text_after="spatial")
    assert largest.ids[:, 0, -2:].tolist() == [[10, 11]] * 3 and spatial.ids[:, 0, -2:].tolist() == [[3, 4]] * 3
    assert largest.ids[0, 0, 1:13:4].tolist() == [1, 5, 9]
    assert largest.rope_deltas.item() == 12 - 15 and spatial.rope_deltas.item() == 10 - 15  # max + 1 - tokens


def test_packed_rows_equal_each_segment_alone():
    seg_a = _types((0, 2), (1, 4), (0, 1))
    seg_b = _types((0, 3), (1, 6), (0, 2))
    images = torch.tensor([[1, 4, 4], [1, 4, 6]])
    packed = torch.tensor([seg_a + seg_b])
    segments = torch.tensor([[0] * len(seg_a) + [1] * len(seg_b)])
    ours = mrope_position_ids(packed, image_grids=images, spatial_merge_size=2, segments=segments)
    alone_a = mrope_position_ids(torch.tensor([seg_a]), image_grids=images[:1], spatial_merge_size=2)
    alone_b = mrope_position_ids(torch.tensor([seg_b]), image_grids=images[1:], spatial_merge_size=2)
    _record_ids("packed row = segments alone: ids", ours.ids, torch.cat((alone_a.ids, alone_b.ids), dim=2))
    # decoding continues the last segment: tokens seen (the whole row) + delta = its next position
    next_b = alone_b.ids[:, 0].max() + 1
    assert int(mrope_next_positions(ours.rope_deltas, len(seg_a) + len(seg_b))[0, 0, 0]) == next_b


def test_cached_decoding_after_a_multimodal_prompt_equals_the_full_forward():
    torch.manual_seed(0)
    model = CausalLM(50, dim=64, depth=2, num_heads=2, encoding="mrope",
                     encoding_options={"sections": (4, 6, 6)}).eval()
    types_ = torch.tensor([_types((0, 2), (1, 6), (0, 3))] * 2)
    prompt = mrope_position_ids(types_, image_grids=[[1, 4, 6]] * 2, spatial_merge_size=2)
    tokens = torch.randint(0, 50, (2, 11 + 4))
    steps = mrope_next_positions(prompt.rope_deltas, 11, steps=4)
    full_positions = torch.cat((prompt.positions, steps), dim=1)
    with torch.no_grad():
        full = model(tokens, positions=full_positions)
        cache = model.new_cache()
        pieces = [model(tokens[:, :11], positions=prompt.positions, cache=cache)]
        for i in range(4):
            pieces.append(model(tokens[:, 11 + i: 12 + i], positions=mrope_next_positions(prompt.rope_deltas, 11 + i),
                                cache=cache))
    _record("cached decoding = full forward (logits)", torch.cat(pieces, dim=1), full, 1e-4)
    assert steps[0, :, 0].tolist() == [8, 9, 10, 11]  # text resumes at 2 + max(2, 3) = 5, 3 tokens, then 8


@pytest.mark.parametrize("call, error, match", [
    (lambda: mrope_position_ids(torch.tensor([[0, 3]])), ValueError, r"0 \(text\), 1 \(image\) or 2 \(video\); got \[3\]"),
    (lambda: mrope_position_ids(torch.tensor([[0, 1, 1]]), image_grids=[[1, 2, 2]], spatial_merge_size=2),
     ValueError, "need more image grids than the 1 given"),
    (lambda: mrope_position_ids(torch.tensor([[0, 1, 1]]), image_grids=[[1, 4, 4]], spatial_merge_size=2),
     ValueError, "gives 4 tokens but its run at 1..2 has 2 left"),
    (lambda: mrope_position_ids(torch.tensor([[0, 0]]), image_grids=[[1, 2, 2]]), ValueError,
     "1 image blocks were given but the token types hold 0"),
    (lambda: mrope_position_ids(torch.tensor([[0, 1]]), image_grids=[[1, 3, 2]], spatial_merge_size=2),
     ValueError, "not divisible by spatial_merge_size=2"),
    (lambda: mrope_position_ids(torch.tensor([[0.0, 1.0]])), TypeError, "integer tensor"),
    (lambda: mrope_position_ids(torch.tensor([[0, 0]]), attention_mask=torch.ones(1, 3)), ValueError,
     "attention_mask must be a"),
    (lambda: mrope_position_ids(torch.tensor([[0, 2]]), video_grids=[[1, 1, 1]], seconds_per_grid=[1.0, 2.0],
                                tokens_per_second=2), ValueError, "one number per video"),
    (lambda: mrope_position_ids(torch.tensor([[0, 0]]), text_after="middle"), ValueError, "text_after"),
])
def test_bad_position_inputs_are_one_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_print_the_difference_table():
    if not _TABLE:
        pytest.skip("run with the other tests of this file")
    width = max(map(len, _TABLE))
    print("\n" + "\n".join(f"{case:<{width}}  {value}" for case, value in _TABLE.items()))
