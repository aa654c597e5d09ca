"""The 1D PEG (``peg1d``): hand-worked values, causality (alone and through a CausalLM), packed
sequences and padding, cached decoding, gradients, the CLI and bench, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch

import posenc
from posenc import cli
from posenc.common.masks import AttentionMask
from posenc.seq.models import CausalLM, SequenceEncoder
from posenc.seq.peg1d import PEG1d, peg1d, peg1d_term

VOCAB, DIM, HEADS = 40, 16, 2

# x = [1, 2, 3, 4] on one channel, taps [1, 10, 100], bias 0.5 (worked by hand, see each case).
X = torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])
W = torch.tensor([[1.0, 10.0, 100.0]])
B = torch.tensor([0.5])


def _col(values):
    return torch.tensor(values).view(1, -1, 1)


@pytest.mark.parametrize(
    "causal, segments, expected",
    [
        # causal: term[t] = 1 x[t-2] + 10 x[t-1] + 100 x[t] + 0.5
        (True, None, [100.5, 210.5, 321.5, 432.5]),
        # symmetric: term[t] = 1 x[t-1] + 10 x[t] + 100 x[t+1] + 0.5
        (False, None, [210.5, 321.5, 432.5, 43.5]),
        # packed [1, 2 | 3, 4]: no tap crosses the boundary
        (True, [0, 0, 1, 1], [100.5, 210.5, 300.5, 430.5]),
        (False, [0, 0, 1, 1], [210.5, 21.5, 430.5, 43.5]),
    ],
)
def test_known_values_on_a_hand_worked_case(causal, segments, expected):
    seg = None if segments is None else torch.tensor([segments])
    term = peg1d_term(X, W, B, causal=causal, segments=seg)
    torch.testing.assert_close(term, _col(expected))
    torch.testing.assert_close(peg1d(X, W, B, causal=causal, segments=seg), X + _col(expected))


def test_padding_tokens_are_read_as_zeros_and_history_replaces_the_left_zeros():
    valid = torch.tensor([[True, True, True, False]])  # x[3] = 4 is padding
    torch.testing.assert_close(peg1d_term(X, W, B, causal=False, valid=valid), _col([210.5, 321.5, 32.5, 3.5]))
    # a cached prefix [7, 9] before x: term[0] = 1*7 + 10*9 + 100*1 + 0.5, term[1] = 9 + 10 + 200 + 0.5
    history = torch.tensor([[[7.0], [9.0]]])
    torch.testing.assert_close(peg1d_term(X, W, B, causal=True, history=history), _col([197.5, 219.5, 321.5, 432.5]))


def test_segment_path_equals_the_convolution_and_channels_are_independent():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 9, 5, generator=g), torch.randn(5, 5, generator=g), torch.randn(5, generator=g)
    same = torch.zeros(1, 9, dtype=torch.long)
    for causal in (True, False):
        torch.testing.assert_close(peg1d_term(x, w, b, causal=causal, segments=same),
                                   peg1d_term(x, w, b, causal=causal), rtol=1e-5, atol=1e-5)
    # float64 reference by the definition, channel by channel
    xd, wd, bd = x.double(), w.double(), b.double()
    ref = torch.zeros_like(xd) + bd
    for t in range(9):
        for j in range(5):
            s = t + j - 2
            if 0 <= s < 9:
                ref[:, t] += wd[:, j] * xd[:, s]
    torch.testing.assert_close(peg1d_term(xd, wd, bd, causal=False), ref)


def test_causal_term_never_reads_the_future_and_the_symmetric_one_does():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(2, 12, 4, generator=g), torch.randn(4, 4, generator=g), torch.randn(4, generator=g)
    for t in range(11):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(2, 11 - t, 4, generator=g)
        a, c = peg1d_term(x, w, b, causal=True), peg1d_term(changed, w, b, causal=True)
        torch.testing.assert_close(a[:, : t + 1], c[:, : t + 1], rtol=0, atol=0)
    changed = x.clone()
    changed[:, 6] += 1.0
    sym = peg1d_term(x, w[:, :3], b, causal=False) - peg1d_term(changed, w[:, :3], b, causal=False)
    assert sym[:, 5].abs().sum() > 0  # symmetric padding lets token 5 read token 6


def test_a_whole_causal_lm_with_peg1d_is_causal():
    torch.manual_seed(0)
    model = CausalLM(VOCAB, DIM, 3, HEADS, encoding="peg1d", peg_blocks=(0, 1), encoding_options={"kernel_size": 4})
    model.eval()
    assert sorted(model.encoder.conditional) == ["0", "1"] and all(m.causal for m in model.encodings)
    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        for t in range(9):
            other = tokens.clone()
            other[:, t + 1:] = (other[:, t + 1:] + 1 + t) % VOCAB
            torch.testing.assert_close(model(other)[:, : t + 1], full[:, : t + 1], rtol=1e-5, atol=1e-5)
            assert not torch.allclose(model(other)[:, t + 1], full[:, t + 1])


def test_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    hist = torch.randn(2, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    seg = torch.tensor([[0, 0, 0, 1, 1, 2]])
    assert torch.autograd.gradcheck(lambda x, w, b: peg1d(x, w, b, causal=True), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: peg1d(x, w, b, causal=False, segments=seg), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b, h: peg1d(x, w, b, causal=True, history=h), (x, w, b, hist))


def test_packed_sequences_equal_separate_runs_through_an_encoder():
    torch.manual_seed(0)
    for causal in (True, False):
        peg = PEG1d(DIM, kernel_size=3, causal=causal)
        stack = posenc.TransformerEncoder(DIM, 2, HEADS, conditional={0: peg, 1: peg}).eval()
        a, b = torch.randn(1, 5, DIM), torch.randn(1, 4, DIM)
        segments = torch.tensor([[0] * 5 + [1] * 4])
        positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]])
        with torch.no_grad():
            packed = stack(torch.cat((a, b), 1), positions=positions,
                           mask=AttentionMask.packed(segments, causal=causal))
            alone = torch.cat([stack(s, mask=AttentionMask(causal=causal)) for s in (a, b)], 1)
        torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_sequence_encoder_padding_does_not_leak_into_real_tokens(pool):
    torch.manual_seed(0)
    model = SequenceEncoder(VOCAB, DIM, 2, HEADS, encoding="peg1d", pool=pool, num_outputs=3,
                            encoding_options={"kernel_size": 5}).eval()
    peg = model.encoder.conditional["0"]
    assert not peg.causal and peg.num_prefix_tokens == (1 if pool == "cls" else 0)
    tokens = torch.randint(1, VOCAB, (1, 7))
    padded = torch.cat((tokens, torch.full((1, 3), 5)), dim=1)
    valid = torch.tensor([[True] * 7 + [False] * 3])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, key_valid=valid), model(tokens), rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_the_full_forward_from_a_one_token_prompt():
    torch.manual_seed(0)
    model = CausalLM(VOCAB, DIM, 2, HEADS, encoding="peg1d", peg_blocks=(0, 1),
                     encoding_options={"kernel_size": 4}).eval()
    with torch.no_grad():
        for m in model.encodings:
            m.proj.bias.normal_()
    tokens = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :1], cache=cache)]  # shorter than kernel_size - 1: zeros fill the history
        steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(1, 6)]
        steps.append(model(tokens[:, 6:], cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.rows(0).length == cache.length == 9 and cache[0].length == 9
    assert torch.equal(model.generate(tokens[:, :2], 5, greedy=True),
                       model.generate(tokens[:, :2], 5, greedy=True, use_cache=False))


def test_a_cropped_cache_rewinds_the_convolution_rows_with_the_keys():
    """Decoding after crop(n) equals the full forward over the first n tokens and the new ones;
    crop(0) then a prefill equals a fresh prefill (issue 51: the rows used to stay unrewound)."""
    torch.manual_seed(0)
    model = CausalLM(VOCAB, DIM, 2, HEADS, encoding="peg1d", peg_blocks=(0, 1),
                     encoding_options={"kernel_size": 4}).eval().double()
    with torch.no_grad():
        for m in model.encodings:
            m.proj.bias.normal_()
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=gen)
    other = torch.randint(0, VOCAB, (2, 3), generator=gen)
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens, cache=cache)
        cache.crop(5)
        steps = [model(other[:, t : t + 1], cache=cache) for t in range(3)]
        want = model(torch.cat((tokens[:, :5], other), 1))[:, 5:]
        torch.testing.assert_close(torch.cat(steps, 1), want, rtol=0, atol=1e-10)
        cache.crop(0)
        torch.testing.assert_close(model(other, cache=cache), model(other), rtol=0, atol=1e-10)


def test_models_choose_blocks_and_refuse_a_non_causal_peg_in_a_causal_lm():
    lm = CausalLM(VOCAB, DIM, 3, HEADS, encoding="peg1d", peg_blocks=[2, 0])
    assert sorted(lm.encoder.conditional) == ["0", "2"]
    assert lm.encoder.conditional["0"] is not lm.encoder.conditional["2"]
    shared = CausalLM(VOCAB, DIM, 3, HEADS, encoding="peg1d", peg_blocks=[0, 1], share_encoding=True)
    assert shared.encoder.conditional["0"] is shared.encoder.conditional["1"]
    assert all(b.attn.encoding is None for b in lm.encoder.blocks) and lm.encoder.encoding is None
    for kw, msg in [
        ({"encoding_options": {"causal": False}}, "needs a causal peg1d"),
        ({"encoding": PEG1d(DIM)}, "needs a causal PEG1d"),
        ({"peg_blocks": [3]}, r"peg_blocks \[3\] are outside 0..2"),
        ({"peg_blocks": []}, "peg_blocks must name at least one block"),
        ({"encoding": "rope", "peg_blocks": [0]}, "peg_blocks applies to encoding 'peg1d' only"),
        ({"encoding_options": {"kernel_size": 0}}, "kernel_size must be a positive int; got 0"),
    ]:
        kw = {"encoding": "peg1d", **kw}
        with pytest.raises(ValueError, match=msg):
            CausalLM(VOCAB, DIM, 3, HEADS, **kw)
    with pytest.raises(ValueError, match="kernel_size must be odd for symmetric"):
        SequenceEncoder(VOCAB, DIM, 2, HEADS, encoding="peg1d", encoding_options={"kernel_size": 4})
    causal_in_encoder = SequenceEncoder(VOCAB, DIM, 2, HEADS, encoding="peg1d", encoding_options={"kernel_size": 4,
                                                                                                  "causal": True})
    assert causal_in_encoder.encoder.conditional["0"].causal
    # a symmetric PEG under a causal mask, or with a cache, is refused at the call
    peg = PEG1d(DIM)
    x = torch.randn(1, 4, DIM)
    with pytest.raises(ValueError, match="built with causal=False"):
        peg(x, mask=AttentionMask(causal=True))
    with pytest.raises(ValueError, match="causal=False cannot decode with a KV cache"):
        peg(x, cache=posenc.KVCache(1).rows(0))


@pytest.mark.parametrize(
    "call, error, msg",
    [
        (lambda: peg1d_term(X[0], W, B, causal=True), ValueError, r"x must be a floating-point \[batch, tokens, channels\]"),
        (lambda: peg1d_term(X, W[:, :2], B, causal=False), ValueError, "must be odd for symmetric .*got 2"),
        (lambda: peg1d_term(X, W[:, :0], B, causal=True), ValueError, "must be a positive int; got 0"),
        (lambda: peg1d_term(X, W[0], B, causal=True), ValueError, r"weight must be \[channels=1, kernel_size\]"),
        (lambda: peg1d_term(X, W, torch.zeros(2), causal=True), ValueError, r"bias must be \[channels=1\]"),
        (lambda: peg1d_term(X, W, B, causal=True, segments=torch.zeros(1, 3, dtype=torch.long)), ValueError,
         r"segments must be \[batch=1 or 1, tokens=4\]"),
        (lambda: peg1d_term(X, W, B, causal=True, segments=torch.zeros(1, 4)), ValueError, "integer tensor"),
        (lambda: peg1d_term(X, W, B, causal=False, history=torch.zeros(1, 2, 1)), ValueError, "needs causal=True"),
        (lambda: peg1d_term(X, W, B, causal=True, history=torch.zeros(1, 3, 1)), ValueError,
         r"history must be \[batch=1, kernel_size - 1=2"),
        (lambda: PEG1d(8, kernel_size=4), ValueError, "kernel_size must be odd for symmetric"),
        (lambda: PEG1d(8, kernel_size=0, causal=True), ValueError, "kernel_size must be a positive int; got 0"),
        (lambda: PEG1d(0), ValueError, "dim must be a positive int"),
        (lambda: PEG1d(8)(torch.randn(2, 8)), ValueError, r"x must be \[batch, tokens, dim=8\]; got \(2, 8\)"),
    ],
)
def test_bad_input_is_a_clear_error(call, error, msg):
    with pytest.raises(error, match=msg):
        call()


def test_even_causal_kernels_are_fine_and_registry_builds_it():
    info = posenc.common.registry.get("peg1d")
    assert info.modality == "seq" and info.hooks == ("input",) and not info.causal_only
    enc = posenc.build("peg1d", dims=posenc.ModelDims(DIM, HEADS, 64), kernel_size=2, causal=True)
    x = torch.randn(1, 5, DIM)
    torch.testing.assert_close(enc.encode_input(x, torch.arange(5)[None]), x + enc(x))


TINY = ["--dim", "16", "--depth", "2", "--heads", "2", "--batch-size", "4", "--no-progress"]


def test_train_seq_and_bench_extrapolation_run_peg1d(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "seq", "--encoding", "peg1d", "--peg-blocks", "0,1", "--encoding-option", "kernel_size=4",
            "--task", "copy", "--length", "3", "--eval-examples", "8", "--steps", "2", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    config = torch.load(out / "checkpoint.pt", weights_only=True)["model_config"]
    assert config["encoding"] == "peg1d" and config["peg_blocks"] == [0, 1]
    assert sorted(CausalLM(**config).encoder.conditional) == ["0", "1"]
    capsys.readouterr()
    assert cli.main(["train", "seq", "--encoding", "rope", "--peg-blocks", "1", *TINY]) == 2
    assert "--peg-blocks is for --encoding peg1d" in capsys.readouterr().err
    assert cli.main(["train", "seq", "--encoding", "peg1d", "--peg-blocks", "2", *TINY]) == 2
    assert "block indices must be below --depth 2" in capsys.readouterr().err
    bench = tmp_path / "bench"
    assert cli.main(["bench", "extrapolation", "--encodings", "peg1d", "--train-len", "16", "--eval-lens", "16,32",
                     "--eval-tokens", "64", "--steps", "2", "--out", str(bench), *TINY]) == 0
    row = json.loads((bench / "extrapolation.json").read_text())["results"][0]
    assert row["encoding"] == "peg1d" and row["hooks"] == "input (between blocks)" and all(v > 0 for v in row["eval"].values())
