"""Hostile and broken input: no silent wrong answer, one clear error for every misuse.

Each area of the library is fed what an adversarial user would feed it (NaN in padding, bool and
NaN positions, bools and NaN as sizes, shifted positions, sizes that cannot fit, broken files) and
every test asserts the error type AND that the message names the argument and the value. The
constructor test walks the registry, so a new encoding must say what its arguments accept
(:data:`PARAM_KINDS`) or this file fails.
"""

from __future__ import annotations

import inspect
import math
import re
import shutil
import warnings

import pytest
import torch
from torch import nn

import posenc
from posenc.common import registry
from posenc.common.attention import attend
from posenc.common.checks import check_number
from posenc.common.encoding import Hook
from posenc.common.linear_attention import EluFeatureMap, FavorFeatureMap, linear_attention
from posenc.common.masks import AttentionMask
from posenc.common.multihead import MultiheadAttention
from posenc.common.registry import ModelDims, build
from posenc.primitives.budget import check_allocation

B, H, T, D = 2, 2, 8, 16
PAD = 3  # the last PAD keys of every row are padding


# ---- NaN in padding never reaches a real row --------------------------------------------------


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g) for _ in range(3))


def _padded(k, v, fill):
    k, v = k.clone(), v.clone()
    k[:, :, -PAD:], v[:, :, -PAD:] = fill, fill
    return k, v


PADDING_CASES = [  # (encoding name or None, options, causal, backends)
    (None, {}, False, ["auto", "sdpa", "dense", "math", "flex"]),
    (None, {}, True, ["auto", "sdpa", "dense", "math"]),
    ("alibi", {"symmetric": True}, False, ["auto", "dense", "math", "flex"]),
    ("rope", {}, True, ["auto", "sdpa", "math"]),
    ("erpe", {}, False, ["auto", "sdpa", "dense", "math"]),
    ("shaw", {}, True, ["auto", "math"]),
    ("t5", {"bidirectional": True}, False, ["auto", "dense", "math"]),
    ("cape", {}, True, ["math"]),
    ("cope", {}, True, ["math"]),
]


@pytest.mark.parametrize("name, options, causal, backends", PADDING_CASES, ids=lambda v: str(v) if not isinstance(v, (dict, list)) else None)
@pytest.mark.parametrize("fill", [float("nan"), float("inf"), 1e30])
def test_padded_keys_and_values_never_reach_real_rows(name, options, causal, backends, fill):
    q, k, v = _qkv()
    enc = None if name is None else build(name, dims=ModelDims(H * D, H, T), **options)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[:, -PAD:] = False
    mask = AttentionMask(causal=causal, key_valid=valid)
    pos = torch.arange(T)
    for backend in backends:
        clean_k, clean_v = _padded(k, v, 0.0)
        ref = attend(q, clean_k, clean_v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
        bad_k, bad_v = _padded(k, v, fill)
        bad_k.requires_grad_(backend != "flex")  # CPU flex has no backward
        bad_v.requires_grad_(backend != "flex")
        out = attend(q, bad_k, bad_v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask, backend=backend)
        torch.testing.assert_close(out, ref, msg=lambda m: f"{name} {backend} fill={fill}: {m}")
        if backend != "flex":
            out.sum().backward()
            assert torch.isfinite(bad_k.grad).all() and torch.isfinite(bad_v.grad).all(), backend
            assert (bad_k.grad[:, :, -PAD:] == 0).all() and (bad_v.grad[:, :, -PAD:] == 0).all(), backend


def test_fully_masked_rows_stay_zero_with_finite_gradients_when_padding_holds_nan():
    q, k, v = _qkv()
    k, v = _padded(k, v, float("nan"))
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0] = False  # batch row 0: no real key at all
    valid[1, -PAD:] = False
    for backend in ("sdpa", "dense", "math"):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = attend(qq, kk, vv, q_pos=torch.arange(T), kv_pos=torch.arange(T), mask=AttentionMask(key_valid=valid),
                     backend=backend)
        assert (out[0] == 0).all() and torch.isfinite(out).all(), backend
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (qq, kk, vv)), backend


@pytest.mark.parametrize("feature_map", [EluFeatureMap(), FavorFeatureMap(D, seed=0)], ids=["elu", "favor"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_ignores_nan_in_padding(feature_map, causal):
    q, k, v = _qkv()
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[:, -PAD:] = False
    mask = AttentionMask(causal=causal, key_valid=valid)
    ref = linear_attention(q, *_padded(k, v, 0.0), feature_map, mask)
    out = linear_attention(q, *_padded(k, v, float("nan")), feature_map, mask)
    torch.testing.assert_close(out, ref)
    via_core = attend(q, *_padded(k, v, float("nan")), q_pos=torch.arange(T), kv_pos=torch.arange(T), mask=mask,
                      feature_map=feature_map)
    torch.testing.assert_close(via_core, ref)


# ---- the attention API refuses wrong types in one line ----------------------------------------


@pytest.mark.parametrize(
    "call, error, pieces",
    [
        (lambda: AttentionMask(key_valid=[True, False]), TypeError, ["key_valid", "list"]),
        (lambda: AttentionMask(q_segments=[0, 1], kv_segments=[0, 1]), TypeError, ["q_segments", "list"]),
        (lambda: AttentionMask(window=True), TypeError, ["window", "True"]),
        (lambda: AttentionMask(window=2.5), TypeError, ["window", "2.5"]),
        (lambda: AttentionMask(window=0), ValueError, ["window", "0"]),
        (lambda: AttentionMask(causal=1), TypeError, ["causal", "1"]),
        (lambda: AttentionMask(key_valid=torch.ones(2, 3)), ValueError, ["key_valid", "float32"]),
        (lambda: attend(*_qkv(), q_pos=None, kv_pos=None, mask=torch.ones(B, T, dtype=torch.bool)), TypeError,
         ["mask", "Tensor"]),
        (lambda: attend(*_qkv(), q_pos=None, kv_pos=None, encoding="rope"), TypeError, ["encoding", "str"]),
        (lambda: MultiheadAttention(32, 4)(torch.randn(1, T, 32), mask=torch.ones(1, T, dtype=torch.bool)), TypeError,
         ["mask", "Tensor"]),
        (lambda: MultiheadAttention(32, True), TypeError, ["num_heads", "True"]),
        (lambda: MultiheadAttention(32, 4, scale=float("nan")), ValueError, ["scale", "nan"]),
        (lambda: MultiheadAttention(32, 4, encoding="rope"), TypeError, ["encoding", "str"]),
    ],
)
def test_attention_api_misuse_is_one_clear_error(call, error, pieces):
    with pytest.raises(error) as info:
        call()
    for piece in pieces:
        assert piece in str(info.value), (piece, str(info.value))


# ---- positions: bool and non-finite positions are refused where they enter ----------------------

DIMS = ModelDims(dim=32, num_heads=2, max_len=16)
GRID_OPTIONS = {"axial": {"grid_size": 4}, "learned2d": {"grid_size": 4}, "relbias2d": {"grid_size": 4},
                "axial3d": {"grid_size": 4}}
NODE_FEATURES = {"lap": 16, "rwse": 20, "landmark": 8}  # per-node features F of the default options


def _positions(info, kind):
    base = torch.arange(16)
    if info.modality == "vision" and getattr(info.cls, "grid_ndim", 2) == 3:  # video: (t, row, col)
        base = torch.stack((base // 8, base // 4 % 2, base % 4), dim=-1)
    elif info.modality == "vision":
        base = torch.stack((base // 4, base % 4), dim=-1)
    base = base.unsqueeze(0)
    if info.name in NODE_FEATURES:  # per-node features [1, T, F]
        base = torch.rand(1, 16, NODE_FEATURES[info.name])
    if info.name == "spd":
        base = torch.cat((torch.zeros(1, 16, 1), torch.arange(16).view(1, 16, 1), torch.ones(1, 16, 16)), -1).long()
    if kind == "bool":
        return (base % 2).bool()
    p = base.double()
    p.view(-1)[3] = float(kind)
    return p


def _feed(info, enc, positions):
    x = torch.randn(1, 16, 32)
    if Hook.INPUT in enc.hooks:
        return enc.encode_input(x, positions)
    q = torch.randn(1, 2, 16, 16)
    fm = EluFeatureMap() if info.cls.linear_only else None
    return attend(q, q, q, q_pos=positions, kv_pos=positions, encoding=enc, mask=AttentionMask(causal=True), feature_map=fm)


@pytest.mark.parametrize("info", registry.available(), ids=lambda i: i.name)
def test_bool_and_non_finite_positions_are_refused_by_every_encoding(info):
    enc = build(info.name, dims=DIMS, **GRID_OPTIONS.get(info.name, {}))
    with pytest.raises(TypeError, match=r"(q_pos|kv_pos|positions).*bool"):
        _feed(info, enc, _positions(info, "bool"))
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(ValueError, match=rf"(q_pos|kv_pos|positions) must be finite; got {bad}"):
            _feed(info, enc, _positions(info, bad))


@pytest.mark.parametrize(
    "name, call, error, pieces",
    [
        ("learned", lambda e: e.encode_input(torch.randn(1, 2, 32), torch.tensor([[0, -1]])), ValueError,
         ["positions", "-1"]),
        ("learned", lambda e: e.encode_input(torch.randn(1, 2, 32), torch.tensor([[0, 99]])), ValueError,
         ["position 99", "max_len=16"]),
        ("spd", lambda e: e.score_bias(None, None, *(2 * [torch.tensor([[[0, 0, 0, 1], [0, -1, 1, 0]]])])), ValueError,
         ["q_pos", "local index -1"]),
    ],
)
def test_positions_outside_a_table_are_refused(name, call, error, pieces):
    enc = build(name, dims=DIMS)
    with pytest.raises(error) as info:
        call(enc)
    for piece in pieces:
        assert piece in str(info.value)


@pytest.mark.parametrize("name, shift", [("axial", 10**12), ("learned2d", 10**9)])
def test_a_grid_from_huge_positions_is_refused_before_allocating_it(name, shift):
    enc = build(name, dims=DIMS, grid_size=4)
    pos = torch.stack((torch.arange(16) // 4, torch.arange(16) % 4), -1).unsqueeze(0) + shift
    with pytest.raises(ValueError, match=rf"{name}'s table resampled to the grid \({shift // 10}.*would need .*B \(shape"):
        enc.encode_input(torch.randn(1, 16, 32), pos)


@pytest.mark.parametrize("name", ["peg", "relbias2d", "conv_spe2d"])
def test_spread_out_2d_positions_are_refused_before_allocating_their_box(name):
    enc = build(name, dims=DIMS, **GRID_OPTIONS.get(name, {}))
    pos = torch.tensor([[[0, 0], [10**8, 10**8]]])
    if name == "peg":
        call = lambda: enc.encode_input(torch.randn(1, 2, 32), pos)  # noqa: E731
    else:
        q = torch.randn(1, 2, 2, 16)
        call = lambda: attend(q, q, q, q_pos=pos, kv_pos=pos, encoding=enc,  # noqa: E731
                              feature_map=EluFeatureMap() if enc.linear_only else None)
    with pytest.raises(ValueError, match=r"would need .* more than the"):
        call()


# ---- xPos: exact inside its range, refused outside it -----------------------------------------


def test_xpos_is_shift_invariant_inside_its_range_and_refuses_outside():
    torch.manual_seed(0)
    enc = build("xpos", head_dim=D)
    limit = enc.position_limit(torch.float32)
    assert limit == int(512 * 0.5 * math.log(torch.finfo(torch.float32).max) / math.log(3.5)) == 18130
    assert enc.position_limit(torch.float16) == 2266 and enc.position_limit(torch.float64) > 100_000
    q, k, v = _qkv()
    mask = AttentionMask(causal=True)
    ref = attend(q, k, v, q_pos=torch.arange(T), kv_pos=torch.arange(T), encoding=enc, mask=mask)
    inside = torch.arange(T) + limit - T + 1  # the last position is exactly at the limit
    torch.testing.assert_close(attend(q, k, v, q_pos=inside, kv_pos=inside, encoding=enc, mask=mask), ref)
    for shift in (limit - T + 2, 10**6, 10**9):
        pos = torch.arange(T) + shift
        with pytest.raises(ValueError, match=rf"q_pos holds position {shift + T - 1}, .*centre 0.*\+- {limit}"):
            attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=mask)
    # a centre near the positions makes them exact again
    far = build("xpos", head_dim=D, center=10**9)
    pos = torch.arange(T) + 10**9
    torch.testing.assert_close(attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=far, mask=mask), ref)


# ---- constructors: every registered encoding refuses bool, NaN and negative numbers -------------

# What each constructor argument accepts. "int+" positive int, "int0" int >= 0, "int" any int,
# "num+" positive finite number (>= 1 or > 1 for factors and bases: -1 is refused either way),
# "bool", "choice" one of some strings, "seq" a sequence of numbers, "obj" a typed object.
PARAM_KINDS = {
    "dim": "int+", "num_heads": "int+", "head_dim": "int+", "max_len": "int+", "rotary_dim": "int+",
    "original_max_len": "int+", "hidden": "int+", "mlp_width": "int+", "kernel_size": "int+",
    "num_realizations": "int+", "num_sines": "int+", "max_relative": "int+", "num_buckets": "int+",
    "max_distance": "int0", "span": "int+", "max_position": "int+", "npos_max": "int+", "grid_size": "int+",
    "row_dim": "int+", "k": "int+", "signnet_hidden": "int+", "walk_length": "int+", "time_dim": "int+",
    "num_prefix_tokens": "int0", "seed": "int", "center": "int",
    "base": "num+", "scale": "num+", "factor": "num+", "init_std": "num+", "init_c": "num+",
    "init_threshold": "num+", "init_distance_scale": "num+", "scale_base": "num+", "beta_fast": "num+", "beta_slow": "num+",
    "attention_factor": "num+", "mscale": "num+", "mscale_all_dim": "num+", "low_freq_factor": "num+",
    "high_freq_factor": "num+",
    "symmetric": "bool", "gated": "bool", "log_buckets": "bool", "values": "bool", "bidirectional": "bool",
    "untie_cls": "bool", "prefix_bias": "bool", "use_eigenvalues": "bool", "per_head": "bool", "truncate": "bool",
    "causal": "bool",
    "pairing": "choice", "mode": "choice", "new_grid": "choice", "layout": "choice", "variant": "choice",
    "beyond": "choice", "sign": "choice", "select": "choice", "gate_init": "choice",
    "short_factor": "seq", "long_factor": "seq", "axis_dims": "seq", "axis_pairs": "seq",
    "scaling": "obj", "base_options": "obj",
    # issue 47: proportional RoPE, DINOv3's RoPE, M-RoPE, Llama 4's NoPE temperature
    "partial_rotary_factor": "num+", "normalize": "choice", "coordinates": "choice", "shift": "num+",
    "jitter": "num+", "rescale": "num+", "sections": "seq", "floor_scale": "num+", "attn_scale": "num+",
}
KIND_OVERRIDES = {("cape", "base"): "choice"}  # CAPE's base is the name of its static bias

BAD_VALUES = {  # kind -> [(value, error type)]
    "int+": [(True, TypeError), (1.5, TypeError), (float("nan"), TypeError), (-1, ValueError), (0, ValueError)],
    "int0": [(True, TypeError), (1.5, TypeError), (float("nan"), TypeError), (-1, ValueError)],
    "int": [(True, TypeError), (1.5, TypeError), (float("nan"), TypeError)],
    "num+": [(True, TypeError), ("2", TypeError), (float("nan"), ValueError), (float("inf"), ValueError),
             (-1.0, ValueError)],
    "bool": [(1, TypeError), (None, TypeError), ("yes", TypeError)],
    "choice": [("bogus", ValueError), (True, ValueError)],
    "seq": [(True, TypeError), (1.5, TypeError)],
    "obj": [(True, TypeError), (1.5, TypeError)],
}


def _constructor_cases():
    for info in registry.available():
        params = inspect.signature(info.cls.__init__).parameters
        for pname, p in params.items():
            if pname == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            kind = KIND_OVERRIDES.get((info.name, pname), PARAM_KINDS.get(pname))
            for value, error in BAD_VALUES.get(kind, [(None, None)]):
                yield pytest.param(info.name, pname, kind, value, error, id=f"{info.name}-{pname}-{value!r}")


@pytest.mark.parametrize("name, pname, kind, value, error", list(_constructor_cases()))
def test_every_registered_constructor_refuses_bad_numbers_naming_the_argument(name, pname, kind, value, error):
    assert kind is not None, f"{name}({pname}=...): add the argument to PARAM_KINDS so that it is tested"
    with pytest.raises(error) as info:
        build(name, dims=DIMS, **{**GRID_OPTIONS.get(name, {}), pname: value})
    msg = str(info.value)
    assert pname in msg and str(value) in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "call, error, pieces",
    [
        (lambda: build("sinusoidal", dim=32, scale=float("nan")), ValueError, ["scale", "nan"]),
        (lambda: build("alibi", num_heads=True), TypeError, ["num_heads", "True"]),
        (lambda: build("xpos", head_dim=16, max_len=-4), ValueError, ["max_len", "-4"]),
        (lambda: build("rope", head_dim=7), ValueError, ["head_dim", "7"]),
        (lambda: build("rope", head_dim=-2), ValueError, ["head_dim", "-2"]),
        (lambda: build("rope_linear", head_dim=16, factor=0), ValueError, ["factor", "0"]),
        (lambda: build("rope_dynamic_ntk", head_dim=16, max_len=64, factor=0), ValueError, ["factor", "0"]),
        (lambda: build("rope_yarn", head_dim=16, max_len=64, factor=float("nan")), ValueError, ["factor", "nan"]),
        (lambda: build("rope_llama3", head_dim=16, max_len=64, factor=float("nan")), ValueError, ["factor", "nan"]),
        (lambda: build("rope_longrope", head_dim=16, max_len=64, factor=0.0), ValueError, ["factor", "0.0"]),
        (lambda: posenc.seq.rope_scaling.LinearScaling(float("nan")), ValueError, ["factor", "nan"]),
        (lambda: posenc.seq.rope_scaling.YaRNScaling(64, 2.0, truncate=1), TypeError, ["truncate", "1"]),
    ],
)
def test_the_reported_constructor_findings(call, error, pieces):
    with pytest.raises(error) as info:
        call()
    for piece in pieces:
        assert piece in str(info.value), str(info.value)


# ---- sizes: checked before allocation, with the estimate --------------------------------------


def test_graph_sizes_are_checked_before_allocation():
    from posenc.graph import laplacian_pe, random_walk_se, shortest_path_distances

    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"laplacian_pe\(num_nodes=10, k=1000000000000\).* would need 80.0 TB"):
        laplacian_pe(ei, 10, 10**12)
    with pytest.raises(ValueError, match=r"laplacian_pe\(num_nodes=10000000, method='dense'\).*would need .*PB"):
        laplacian_pe(ei, 10**7, 4, method="dense")
    with pytest.raises(ValueError, match=r"random_walk_se\(num_nodes=10, walk_length=1000000000000\).*would need 40.0 TB"):
        random_walk_se(ei, 10, 10**12)
    with pytest.raises(ValueError, match=r"shortest_path_distances\(num_nodes=100000000\).*would need 80000.0 TB|PB"):
        shortest_path_distances(ei, 10**8)
    with pytest.raises(TypeError, match="k must be an int; got True"):
        laplacian_pe(ei, 2, True)


def test_check_allocation_and_number_phrases():
    check_allocation("small", (10, 10), torch.float32)
    with pytest.raises(ValueError, match=r"^huge would need 4.0 EB \(shape \(1000000000000000000,\), torch.float32\), more than"):
        check_allocation("huge", (10**18,), torch.float32)
    with pytest.raises(ValueError, match=r"^x must be a positive number; got -1"):
        check_number("x", -1, minimum=0.0, strict=True)


# ---- graph model and transforms --------------------------------------------------------------


@pytest.mark.parametrize(
    "edge_index, batch, error, pieces",
    [
        (torch.tensor([[0, 1], [1, 9]]), None, ValueError, ["edge_index", "9"]),
        (torch.tensor([[0, -1], [1, 0]]), None, ValueError, ["edge_index", "-1"]),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), None, TypeError, ["edge_index", "float32"]),
        (torch.tensor([[0, 3], [3, 0]]), torch.tensor([0, 0, 0, 1, 1]), ValueError, ["edge_index", "graph 0 to graph 1"]),
        (torch.tensor([[0, 1], [1, 0]]), torch.tensor([0.0, 0, 0, 0, 0]), TypeError, ["batch", "float32"]),
    ],
)
def test_gps_forward_checks_the_graph_itself(edge_index, batch, error, pieces):
    from posenc.graph.gps import GPS

    model = GPS(4, 2, dim=16, depth=1, num_heads=2)
    with pytest.raises(error) as info:
        model(torch.randn(5, 4), edge_index, batch=batch)
    for piece in pieces:
        assert piece in str(info.value), str(info.value)


@pytest.mark.parametrize("which", ["lap", "rwse"])
def test_transforms_keep_float_encodings_beside_an_integer_x(which):
    from torch_geometric.data import Data

    from posenc.graph import laplacian_pe, random_walk_se
    from posenc.graph.transforms import AddLaplacianPE, AddRandomWalkSE

    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(x=torch.tensor([[1], [2], [3]]), edge_index=ei)
    if which == "lap":
        out = AddLaplacianPE(2, attr_name=None, random_sign=False)(data)
        expected = laplacian_pe(ei, 3, 2)[0]
    else:
        out = AddRandomWalkSE(3, attr_name=None)(data)
        expected = random_walk_se(ei, 3, 3)
    assert out.x.dtype == torch.float32
    assert out.x[:, 0].tolist() == [1.0, 2.0, 3.0]
    torch.testing.assert_close(out.x[:, 1:], expected)
    assert out.x[:, 1:].abs().sum() > 0


# ---- the .ts reader ---------------------------------------------------------------------------

TS_HEADER = "@problemName T\n@missing false\n@classLabel true a b\n@data\n"  # 4 lines: cases start on line 5


@pytest.mark.parametrize(
    "body, piece",
    [
        ("1,inf:a\n", "'inf' is not a number"),
        ("1,-inf:a\n", "'-inf' is not a number"),
        ("1,Infinity:a\n", "'Infinity' is not a number"),
        ("1,1e999:a\n", "1e999 is outside the float32 range"),
        ("1,1e39:a\n", "1e39 is outside the float32 range"),
        ("1,1_000:a\n", "'1_000' is not a number"),
        ("1,\u0663:a\n", "'\u0663' is not a number"),
        ("1,0x10:a\n", "'0x10' is not a number"),
        ("1,?:a\n", "a missing value '?' with @missing false"),
        ("1,NaN:a\n", "a missing value 'NaN' with @missing false"),
    ],
)
def test_ts_values_must_be_finite_plain_numbers(body, piece):
    from posenc.timeseries.ts_format import TsFormatError, read_ts_text

    with pytest.raises(TsFormatError) as info:
        read_ts_text(TS_HEADER + body, source="t.ts")
    assert str(info.value).startswith("t.ts:5: dimension 0: ") and piece in str(info.value), str(info.value)


def test_ts_missing_values_need_the_header_and_header_integers_are_ascii():
    from posenc.timeseries.ts_format import TsFormatError, read_ts_text

    text = "@classLabel true a\n@data\n1,?:a\n"  # no @missing at all
    with pytest.raises(TsFormatError, match=r"^t.ts:3: .*'\?' with no @missing true"):
        read_ts_text(text, source="t.ts")
    assert math.isnan(read_ts_text("@missing true\n" + text).series[0][0, 1])
    for value in ("1_0", "\u0663", "+3"):
        with pytest.raises(TsFormatError, match=rf"^t.ts:1: @dimensions must be an integer; got '{re.escape(value)}'"):
            read_ts_text(f"@dimensions {value}\n@data\n", source="t.ts")


def test_ts_byte_order_mark_and_encodings(tmp_path):
    from posenc.timeseries.ts_format import TsFormatError, read_ts

    path = tmp_path / "bom.ts"
    path.write_bytes(b"\xef\xbb\xbf" + TS_HEADER.encode() + b"1,2:b\n")
    assert read_ts(path).labels == ["b"]
    latin = tmp_path / "latin.ts"
    latin.write_bytes("@classLabel true caf\xe9 caf\xe8\n@data\n1,2:caf\xe9\n3,4:caf\xe8\n".encode("latin-1"))
    with pytest.raises(TsFormatError, match=rf"^{latin}:1: byte 0xe9 at column 21 is not valid utf-8"):
        read_ts(latin)
    data = read_ts(latin, encoding="latin-1")
    assert data.labels == ["caf\xe9", "caf\xe8"] and data.class_labels == ["caf\xe9", "caf\xe8"]


# ---- checkpoints ------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        return self.fc(x)


def _loss(model, batch):
    return ((model(batch[0]) - batch[1]) ** 2).mean(), {}


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    from posenc.training import TrainConfig, Trainer

    out = tmp_path_factory.mktemp("good")
    torch.manual_seed(0)
    Trainer(_Net(), _data(), _loss, TrainConfig(steps=2, batch_size=4, out_dir=str(out), log_every=0,
                                                 progress=False)).fit()
    # as the step-2 checkpoint of a 4-step run that was killed (a resume keeps the run's settings)
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    ckpt["config"]["steps"] = 4
    torch.save(ckpt, out / "checkpoint.pt")
    return out / "checkpoint.pt"


def _edit(**changes):
    def write(good, path):
        ckpt = torch.load(good, weights_only=True)
        for key, value in changes.items():
            if value is KeyError:
                del ckpt[key]
            else:
                ckpt[key] = value(ckpt) if callable(value) else value
        torch.save(ckpt, path)

    return write


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled",))


CHECKPOINT_CASES = {
    "truncated": (lambda good, p: p.write_bytes(good.read_bytes()[: good.stat().st_size // 2]), "cannot be loaded: truncated"),
    "empty": (lambda good, p: p.write_bytes(b""), "is empty (0 bytes)"),
    "directory": (lambda good, p: p.mkdir(), "is a directory"),
    "random bytes": (lambda good, p: p.write_bytes(bytes(range(256)) * 4), "cannot be loaded"),
    "pickled class": (lambda good, p: torch.save({"model": _Evil(), "step": 1}, p), "pickled Python objects"),
    "a list": (lambda good, p: torch.save([1, 2], p), "is not a posenc trainer checkpoint"),
    "no optimizer": (_edit(optimizer=KeyError), "has no 'optimizer' entry"),
    "step -5": (_edit(step=-5), "step=-5 is impossible"),
    "step True": (_edit(step=True), "'step' must be an int; found bool True"),
    "epoch 1.5": (_edit(epoch=1.5), "'epoch' must be an int; found float 1.5"),
    "world_size 0": (_edit(world_size=0), "world_size=0 is impossible"),
    "nan weights": (_edit(model=lambda c: {k: torch.full_like(v, math.nan) for k, v in c["model"].items()}),
                    "model['fc.weight'] holds 3 non-finite value(s) of 3"),
    "inf optimizer state": (_edit(optimizer=lambda c: {**c["optimizer"], "state": {0: {**c["optimizer"]["state"][0],
                            "exp_avg": torch.full((1, 3), math.inf)}}}), "optimizer['state'][0]['exp_avg'] holds"),
    "nan lr": (_edit(optimizer=lambda c: {**c["optimizer"], "param_groups": [{**c["optimizer"]["param_groups"][0],
               "lr": math.nan}]}), "['lr'] is nan"),
    "foreign optimizer": (_edit(optimizer={"state": {}, "param_groups": []}), "its 'optimizer' entry does not fit"),
    "foreign scheduler": (_edit(scheduler={"x": 1}), "its 'scheduler' entry does not fit"),
    "foreign rng": (_edit(rng=[{"torch": 1}]), "its 'rng' entry does not fit"),
    "rng for two ranks": (_edit(rng=lambda c: c["rng"] * 2), "'rng' has 2 entries for world_size=1"),
    "elapsed nan": (_edit(elapsed=math.nan), "elapsed=nan is impossible"),
    "format 2": (_edit(format=2), "expected checkpoint format 1; found 2"),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_broken_checkpoint_is_one_checkpoint_error_naming_the_file(case, good_checkpoint, tmp_path):
    from posenc.training import CheckpointError, TrainConfig, Trainer

    make, piece = CHECKPOINT_CASES[case]
    path = tmp_path / "checkpoint.pt"
    make(good_checkpoint, path)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, _data(), _loss, TrainConfig(steps=4, batch_size=4, out_dir=str(tmp_path), resume=True,
                                                         log_every=0, progress=False))
    with pytest.raises(CheckpointError) as info:
        trainer.fit()
    msg = str(info.value)
    assert msg.startswith(f"checkpoint {path}: ") and piece in msg and "\n" not in msg, msg
    assert isinstance(info.value, ValueError)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_load_checkpoint_refuses_a_missing_file(tmp_path):
    from posenc.training import CheckpointError, load_checkpoint

    with pytest.raises(CheckpointError, match=rf"^checkpoint {tmp_path / 'none.pt'}: does not exist"):
        load_checkpoint(tmp_path / "none.pt")


# ---- the molecule cache -----------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "empty", "edit"])
def test_a_damaged_molecule_cache_is_rebuilt_with_a_warning(damage, tmp_path):
    from posenc.graph.datasets import molecule_dataset

    smiles = ["CCO", "c1ccccc1O", "CC(=O)O"]
    first = molecule_dataset(smiles, cache_dir=tmp_path)
    (path,) = tmp_path.glob("molecules-*.pt")
    good = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        blob = torch.load(path, weights_only=True)
        blob["edge_index"] = blob["edge_index"] + 100  # edges outside their graphs
        torch.save(blob, path)
    with pytest.warns(RuntimeWarning, match=rf"molecule cache {path} is damaged .*; rebuilding it"):
        again = molecule_dataset(smiles, cache_dir=tmp_path)
    assert len(again) == len(first) and all(torch.equal(a.x, b.x) for a, b in zip(first, again))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt whole: read back without a warning
        molecule_dataset(smiles, cache_dir=tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ValueError, match=rf"molecule cache path {path} exists but is not a file"):
        molecule_dataset(smiles, cache_dir=tmp_path)
    shutil.rmtree(path)
