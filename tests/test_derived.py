"""DerivedTensors: a parameter-only table kept between calls without gradients, rebuilt whenever
a source changes in any way (DeBERTa's Kr/Qr in cached decoding)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from posenc.common.decoding_state import tracked_edits_only
from posenc.primitives.derived import DerivedTensors
from posenc.seq.deberta import DeBERTa


def counted(make):
    """``(build, builds)``: ``build()`` returns ``make()`` and appends to ``builds`` each time."""
    builds = []

    def build():
        builds.append(1)
        return make()

    return build, builds


@pytest.mark.parametrize("layout", ["contiguous", "strided", "bfloat16"])
def test_sources_compared_bit_by_bit(layout):
    """One flipped bit anywhere rebuilds (integer views compared by torch, contiguous or strided); the same
    bits keep the value, a NaN included (torch.equal calls NaN unequal to itself), and -0.0
    against 0.0 rebuilds (the bits differ), which is harmless."""
    base = torch.randn(64, 48, dtype=torch.bfloat16 if layout == "bfloat16" else torch.float32)
    source = base.t() if layout == "strided" else base
    cache = DerivedTensors()
    build, builds = counted(lambda: source.float().sum())

    with torch.no_grad():
        cache.get((source,), build)
        for i, j in ((0, 0), (63, 47), (31, 5)):
            bits = base.view(torch.int16 if layout == "bfloat16" else torch.int32)
            bits[i, j] ^= 1  # the lowest mantissa bit
            before = len(builds)
            cache.get((source,), build)
            assert len(builds) == before + 1, (i, j)
        base[3, 3] = float("nan")
        cache.get((source,), build)
        before = len(builds)
        cache.get((source,), build)
        assert len(builds) == before  # the same NaN bits: kept
        base[5, 5] = 0.0
        cache.get((source,), build)
        base[5, 5] = -0.0
        before = len(builds)
        cache.get((source,), build)
        assert len(builds) == before + 1


def test_kept_while_the_sources_are_equal_and_rebuilt_on_any_edit():
    weight = nn.Parameter(torch.randn(4, 3))
    cache = DerivedTensors()
    build, builds = counted(lambda: weight * 2)

    with torch.no_grad():
        first = cache.get((weight,), build)
        assert cache.get((weight,), build) is first and len(builds) == 1
        weight.data.add_(1)  # invisible to the version counter: the values are compared
        torch.testing.assert_close(cache.get((weight,), build), weight * 2)
        assert len(builds) == 2
        weight.add_(1)  # an optimizer-style in-place step
        torch.testing.assert_close(cache.get((weight,), build), weight * 2)
        cache.get((weight,), build, key=("other dtype",))
        assert len(builds) == 4
    # with gradients to the sources: built every call, part of the graph
    out = cache.get((weight,), build)
    assert out.requires_grad and len(builds) == 5
    out.sum().backward()
    torch.testing.assert_close(weight.grad, torch.full_like(weight, 2.0))


def test_tracked_edits_only_checks_versions_not_bits():
    """Inside the scope every edit torch tracks rebuilds (an in-place op under no_grad, a new
    tensor or storage in the parameter's place, load_state_dict); an in-place edit through
    ``.data`` is not seen there (as documented), and the next call outside it catches it."""
    lin = nn.Linear(3, 4)
    cache = DerivedTensors()
    build, builds = counted(lambda: lin.weight * 2)

    def check(expect_builds):
        torch.testing.assert_close(cache.get((lin.weight,), build), lin.weight * 2, rtol=0, atol=0)
        assert len(builds) == expect_builds

    with torch.no_grad():
        check(1)
        with tracked_edits_only():
            check(1)
            lin.weight.add_(1)  # an optimizer-style step
            check(2)
            lin.weight.data = torch.randn(4, 3)  # new storage
            check(3)
            lin.load_state_dict({"weight": torch.randn(4, 3), "bias": lin.bias.clone()})
            check(4)
            lin.weight = nn.Parameter(torch.randn(4, 3))  # a new tensor object
            check(5)
            stale = lin.weight * 2
            lin.weight.data.mul_(3)  # untracked: the scope trusts the counter
            torch.testing.assert_close(cache.get((lin.weight,), build), stale, rtol=0, atol=0)
            assert len(builds) == 5
        check(6)  # outside: compared bit by bit, rebuilt
        with tracked_edits_only():
            check(6)
        lin.weight.add_(0.0)  # the version moves, the bits stay: kept, and trusted again after
        check(6)
        with tracked_edits_only():
            check(6)


def test_cached_decoding_steps_rebuild_on_tracked_edits_between_steps():
    """A step over a non-empty KV cache keeps DeBERTa's tables by version counter; an in-place
    edit of its relative embeddings between two steps (tracked) gives the step a fresh encoding
    gives over the same cache."""
    from posenc.seq.models import CausalLM

    torch.manual_seed(0)
    model = CausalLM(32, 16, 2, 2, encoding="deberta", max_len=64).eval()
    tokens = torch.randint(0, 32, (1, 12))
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens, cache=cache)
        model(tokens[:, :1], cache=cache)  # a first step keeps the tables
        for block in model.encoder.blocks:
            block.attn.encoding.rel.mul_(1.5)  # tracked
        twin = copy.deepcopy(model)
        for block in twin.encoder.blocks:
            block.attn.encoding._tables.clear()
        twin_cache = copy.deepcopy(cache)
        torch.testing.assert_close(model(tokens[:, 1:2], cache=cache), twin(tokens[:, 1:2], cache=twin_cache),
                                   rtol=0, atol=0)


def test_deberta_decoding_tables_follow_the_parameters():
    torch.manual_seed(0)
    enc = DeBERTa(16, 2, span=4)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8)
    q_pos, kv_pos = torch.tensor([[5]]), torch.arange(6)[None]
    idx = torch.arange(6)

    def bias(e):
        return e.score_bias(q, k, q_pos, kv_pos).dense(1, 2, torch.tensor([0]), idx)

    with torch.no_grad():
        before = bias(enc)
        assert enc._tables._value is not None  # kept for the next step
        torch.testing.assert_close(bias(enc), before, rtol=0, atol=0)
        enc.pos_q.weight.data.mul_(2)  # e.g. weights loaded through .data after a first call
        enc.rel.data[0].add_(1.0)
        fresh = copy.deepcopy(enc)
        fresh._tables.clear()
        torch.testing.assert_close(bias(enc), bias(fresh), rtol=0, atol=0)
        assert not torch.equal(bias(enc), before)


def test_transformer_xl_decoding_cuts_its_distance_table_from_a_kept_one():
    """Without gradients to W_R, W_R R comes from a table kept over a growing range of distances;
    every step's bias equals the one built from scratch, also after W_R is edited through .data."""
    from posenc.seq.transformer_xl import TransformerXLRelative

    torch.manual_seed(0)
    enc = TransformerXLRelative(16, 2, 8)
    fresh = copy.deepcopy(enc)
    builds = []
    get = enc._projected.get
    enc._projected.get = lambda *a, **kw: builds.append(kw["key"][:2]) or get(*a, **kw)

    def bias(e, n):  # the decoding step of query n over keys 0 .. n
        q, k = torch.randn(1, 2, 1, 8, generator=torch.Generator().manual_seed(n)), torch.zeros(1, 2, n + 1, 8)
        return e.score_bias(q, k, torch.tensor([[n]]), torch.arange(n + 1)[None]).dense(1, 2, torch.tensor([0]),
                                                                                          torch.arange(n + 1))

    def reference(n):  # with gradients to W_R: projected for this call alone, as in training
        with torch.enable_grad():
            return bias(fresh, n).detach()

    with torch.no_grad():
        for n in (3, 40, 300, 301, 700):
            torch.testing.assert_close(bias(enc, n), reference(n), rtol=1e-6, atol=1e-6)
        assert len(set(builds)) == 3  # [0, 259], then grown to 300 + 256 and to 700 + 350
        enc.r_proj.weight.data.mul_(-1)
        fresh.r_proj.weight.data.mul_(-1)
        torch.testing.assert_close(bias(enc, 701), reference(701), rtol=1e-6, atol=1e-6)
    # with gradients to W_R: no kept table, W_R gets its gradient
    out = bias(enc, 5)
    assert out.requires_grad
    out.sum().backward()
    assert enc.r_proj.weight.grad is not None


def test_misuse_is_one_clear_error():
    import pytest

    from posenc.common.amp import autocast_off

    cache = DerivedTensors()
    weight = torch.zeros(2)
    with pytest.raises(TypeError, match=r"sources must be a non-empty tuple of tensors; got list"):
        cache.get([weight], lambda: weight)
    with pytest.raises(TypeError, match=r"sources must be a non-empty tuple of tensors; got tuple \(\)"):
        cache.get((), lambda: weight)
    with pytest.raises(TypeError, match="build must be a callable returning the derived value; got Tensor"):
        cache.get((weight,), weight)
    with pytest.raises(TypeError, match=r"key must be a tuple; got str 'float32'"):
        cache.get((weight,), lambda: weight, key="float32")
    with pytest.raises(TypeError, match="autocast_off decorates a Function's backward; got int"):
        autocast_off(3)



@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_decoding_cuts_its_kernel_from_a_kept_table(variant):
    """Without gradients to raw_r1, raw_r2, a decoding step's kernel by distance comes from a table
    kept over a doubling range of distances; every step's bias equals the one built from scratch
    (with gradients on, per call), also past a doubling and after raw_r1 is edited through .data."""
    from posenc.seq.kerple import KERPLE

    torch.manual_seed(0)
    enc = KERPLE(3, variant=variant)
    fresh = copy.deepcopy(enc)
    asked = []  # the table sizes asked for
    get = enc._kernel.get
    enc._kernel.get = lambda *a, **kw: asked.append(kw["key"][0]) or get(*a, **kw)

    def bias(e, n):  # the decoding step of query n over keys 0 .. n
        return e.score_bias(None, None, torch.tensor([[n]]), torch.arange(n + 1)[None]).dense(
            1, 3, torch.tensor([0]), torch.arange(n + 1))

    def reference(n):
        with torch.enable_grad():
            return bias(fresh, n).detach()

    with torch.no_grad():
        for n in (0, 5, 255, 256, 700):
            torch.testing.assert_close(bias(enc, n), reference(n), rtol=0, atol=0)
        assert asked == [256, 256, 256, 512, 1024]
        enc.raw_r1.data.add_(0.5)
        fresh.raw_r1.data.add_(0.5)
        torch.testing.assert_close(bias(enc, 701), reference(701), rtol=0, atol=0)
    out = bias(enc, 5)  # with gradients: no kept table, raw_r1 and raw_r2 get theirs
    assert out.requires_grad
    out.sum().backward()
    assert enc.raw_r1.grad.abs().sum() > 0 and enc.raw_r2.grad.abs().sum() > 0


@pytest.mark.parametrize("base", ["alibi", "kerple", "fire"])
def test_cape_decoding_reads_its_static_bias_from_a_kept_table(base):
    """CAPE's decoding hook over ALiBi or KERPLE reads the static bias and its first-layer part
    from a table by distance kept per doubling of the context, for one row or a few (query rows
    after every key); every step equals the transform computed from scratch, also after the MLP
    is edited through .data. Rows that see later keys (a speculative step whose own rows are in
    the cache) and FIRE, whose bias depends on the query's own position too, take the transform
    itself: no table."""
    from posenc.seq.cape import CAPE

    torch.manual_seed(0)
    heads = 3
    enc = CAPE(12, heads, 64, base=base)
    fresh = copy.deepcopy(enc)
    sizes = []
    get = enc._static_table.get
    enc._static_table.get = lambda *a, **kw: sizes.append(kw["key"][0]) or get(*a, **kw)

    def inputs(n, rows, keys):  # query rows n .. n + rows - 1 over keys 0 .. keys - 1, as the math path passes them
        g = torch.Generator().manual_seed(n)
        scores = torch.randn(2, heads, rows, keys, generator=g)
        q, k = torch.randn(2, heads, rows, 4, generator=g), torch.randn(2, heads, keys, 4, generator=g)
        return scores, q, k, torch.arange(n, n + rows)[None], torch.arange(keys)[None], None

    def check(n, rows=1, keys=None):
        args = inputs(n, rows, n + 1 if keys is None else keys)
        torch.testing.assert_close(enc.decode_transform_scores(*args), fresh.transform_scores(*args),
                                   rtol=1e-6, atol=1e-6)

    with torch.no_grad():
        for n in (0, 5, 255, 256, 700):
            check(n)
        enc.mlp[0].weight.data.mul_(-1)
        fresh.mlp[0].weight.data.mul_(-1)
        check(701)
        check(300, rows=4, keys=300)  # four rows after every key: each its own slice of the table
        check(1021, rows=3, keys=1021)  # the farthest pair (distance 1023) still in the 1024 table
        check(40, rows=3, keys=43)  # speculative: rows 40, 41 see keys after them, masked later
    if base == "fire":
        assert sizes == []
    else:
        assert sizes == [256, 256, 256, 512, 1024, 1024, 512, 1024]


def test_doubling_length_known_values_and_bad_input():
    from posenc.primitives.derived import doubling_length

    assert [doubling_length(n) for n in (0, 1, 255, 256, 700, 1023, 1024)] == [256, 256, 256, 512, 1024, 1024, 2048]
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match=r"largest must be a non-negative int \(a distance\); got"):
            doubling_length(bad)


def test_inference_tensors_as_sources_are_compared_bit_by_bit():
    """A source made under torch.inference_mode has no version counter: the scope cannot vouch
    for it, so it is compared bit by bit there too (an edit is seen), and nothing raises."""
    with torch.inference_mode():
        source = torch.randn(5)
    cache = DerivedTensors()
    build, builds = counted(lambda: source * 2)

    with torch.inference_mode():
        cache.get((source,), build)
        with tracked_edits_only():
            cache.get((source,), build)
            assert len(builds) == 1
            source.add_(1.0)  # no counter to see it
            torch.testing.assert_close(cache.get((source,), build), source * 2, rtol=0, atol=0)
            assert len(builds) == 2
