"""The Python-side cases of ``scripts/hostile_audit.py`` (issue 51): the attention core's score
scale, the functional helpers, the KV cache and generation, resumed unit logs read directly, the
Hugging Face and AttentionSmithy bridges.

Each case is a :class:`PyCase`: a call and either the fragments its refusal must name (the
argument and the value) or a check of its answer against a reference (``right``: the result ->
None when it equals the reference, else why not). Everything is built tiny, in float64 where an
answer is compared, and runs in a second or two per surface.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import posenc
import posenc.functional as PF


@dataclass
class PyCase:
    surface: str
    case: str
    call: Callable[[], Any]
    names: tuple[str, ...] = ()  # what a refusal must name: the argument, the value
    right: Callable[[Any], str | None] | None = None  # None: a refusal is expected


def _close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-10) -> str | None:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    return None if err <= atol else f"off the reference by {err:.2e} (tolerance {atol:g})"


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="posenc-audit-"))


# ---- attention: the score scale ------------------------------------------------------------------


def attention_cases() -> list[PyCase]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(5)
    alibi = posenc.build("alibi", num_heads=2)
    causal = posenc.AttentionMask(causal=True)
    cases = []
    for text, scale in (("0", 0.0), ("-1", -1.0), ("inf", math.inf), ("nan", math.nan)):
        cases.append(PyCase("attention (scale)", f"attend(scale={text})",
                            lambda s=scale: posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=s), ("scale", text)))
    # of our own: the other paths and the other ways of giving it
    for text, scale, extra in (("0", 0.0, dict(encoding=alibi, mask=causal, backend="dense")),
                               ("nan", math.nan, dict(encoding=alibi, mask=causal, backend="math")),
                               ("-1", -1.0, dict(feature_map=posenc.EluFeatureMap())),
                               ("inf", math.inf, dict(encoding=alibi, mask=causal))):
        path = extra.get("backend") or ("linear" if "feature_map" in extra else "auto")
        cases.append(PyCase("attention (scale)", f"attend(scale={text}, {path} path)",
                            lambda s=scale, e=extra: posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=s, **e),
                            ("scale", text)))
    cases += [
        PyCase("attention (scale)", "plan(scale=0)", lambda: posenc.plan(q, k, v, scale=0.0), ("scale", "0")),
        PyCase("attention (scale)", "attend(scale=True)", lambda: posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=True), ("scale", "True")),
        PyCase("attention (scale)", "attend(scale='0.1')", lambda: posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale="0.1"), ("scale", "0.1")),
        PyCase("attention (scale)", "MultiheadAttention(scale=0)",
               lambda: posenc.MultiheadAttention(16, 2, scale=0.0), ("scale", "0")),
        PyCase("attention (scale)", "attend(scale=0.3) = softmax(0.3 q k^T) v",
               lambda: posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, scale=0.3),
               right=lambda out: _close(out, torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v)),
    ]
    return cases


# ---- the functional helpers -------------------------------------------------------------------


def functional_cases() -> list[PyCase]:
    from posenc.seq.spline import SplineTransformer
    from posenc.torch_attention import TorchMultiheadAttention

    x = torch.randn(1, 2, 4, 8)
    four = torch.arange(4)
    cases = []
    for text in ("nan", "inf"):
        bad = torch.tensor([0.0, 1.0, float(text), 3.0])
        for name, call, arg in (
            ("apply_rope", lambda b=bad: PF.apply_rope(x, x, b), "positions"),
            ("rope_cos_sin", lambda b=bad: PF.rope_cos_sin(b, 8), "positions"),
            ("alibi_bias (slopes)", lambda t=text: PF.alibi_bias(4, 4, torch.tensor([0.5, float(t)]), causal=True),
             "slopes"),
            ("alibi_penalty", lambda b=bad: PF.alibi_penalty(b, PF.alibi_slopes(2)[:, None], symmetric=True),
             "distance"),
            ("relative_positions", lambda b=bad: PF.relative_positions(b, four.float()), "q_pos"),
            ("sinusoid_table", lambda b=bad: PF.sinusoid_table(b, 8), "positions"),
            ("sincos2d_table", lambda b=bad: PF.sincos2d_table(torch.stack((b, b), -1), 8), "coords"),
        ):
            cases.append(PyCase("functional helpers", f"{name} with {text}", call, (arg, text)))
    cases += [
        PyCase("functional helpers", "clipped_relative_index(rel, 0)",
               lambda: PF.clipped_relative_index(torch.tensor([-2, 0, 3]), 0), ("max_distance", "0")),
        PyCase("functional helpers", "TorchMultiheadAttention(kdim=0)", lambda: TorchMultiheadAttention(16, 2, kdim=0),
               ("kdim", "0")),
        PyCase("functional helpers", "SplineTransformer(decoder_depth=True)",
               lambda: SplineTransformer(2, 16, 1, 2, decoder_depth=True), ("decoder_depth", "True")),
        # of our own
        PyCase("functional helpers", "alibi_slopes(0)", lambda: PF.alibi_slopes(0), ("num_heads", "0")),
        PyCase("functional helpers", "rope_cos_sin(pos, dim=7)", lambda: PF.rope_cos_sin(four, 7), ("dim", "7")),
        PyCase("functional helpers", "sinusoid_table(pos, dim=0)", lambda: PF.sinusoid_table(four, 0), ("dim", "0")),
        PyCase("functional helpers", "relative_positions(bool positions)",
               lambda: PF.relative_positions(torch.tensor([True, False]), torch.arange(2)), ("q_pos", "bool")),
        PyCase("functional helpers", "alibi_bias(k_len=-1)",
               lambda: PF.alibi_bias(4, -1, PF.alibi_slopes(2), causal=True), ("k_len", "-1")),
        PyCase("functional helpers", "apply_rope(5 positions for 4 tokens)", lambda: PF.apply_rope(x, x, torch.arange(5)),
               ("positions", "(5,)")),
        PyCase("functional helpers", "sincos2d_table(dim=6)", lambda: PF.sincos2d_table(torch.zeros(3, 2), 6),
               ("dim", "6")),
        PyCase("functional helpers", "sinusoid_frequencies(base=1.0)", lambda: PF.sinusoid_frequencies(8, 1.0),
               ("base", "1")),
        PyCase("functional helpers", "t5_bias with float (nan) relative positions",
               lambda: PF.t5_bias(torch.tensor([0.0, float("nan")]), torch.zeros(32, 2), bidirectional=True),
               ("relative_position", "float")),
        PyCase("functional helpers", "fox_bias with nan log gates",
               lambda: PF.fox_bias(torch.tensor([[[0.0, float("nan"), -0.1]]])), ("log_gates", "nan")),
        PyCase("functional helpers", "fox_bias with a log gate above 0",
               lambda: PF.fox_bias(torch.tensor([[[0.0, 0.5, -0.1]]])), ("log_gates", "0.5")),
        PyCase("functional helpers", "rope_cos_sin = cos/sin of p w (float64)",
               lambda: PF.rope_cos_sin(torch.tensor([0.0, 1.5, 7.25]), 4, dtype=None),
               right=lambda cs: _close(cs[0], (torch.tensor([0.0, 1.5, 7.25], dtype=torch.float64)[:, None]
                                               * torch.tensor([1.0, 0.01], dtype=torch.float64)).cos(), 1e-6)),
    ]
    return cases


# ---- the KV cache and generation ------------------------------------------------------------


def _lm(encoding: str, depth: int = 2, **kw):
    from posenc.seq import CausalLM

    torch.manual_seed(0)
    model = CausalLM(11, 16, depth, 2, encoding=encoding, max_len=64, **kw).eval().double()
    if encoding == "peg1d":
        with torch.no_grad():
            for m in model.encodings:
                m.proj.bias.normal_()  # a zero bias would hide rows that were not rewound
    return model


def _crop_then_decode(model, keep: int) -> str | None:
    gen = torch.Generator().manual_seed(5)
    tokens, other = torch.randint(0, 11, (2, 9), generator=gen), torch.randint(0, 11, (2, 3), generator=gen)
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens, cache=cache)
        cache.crop(keep)
        if keep == 0:
            return _close(model(other, cache=cache), model(other))
        steps = torch.cat([model(other[:, t: t + 1], cache=cache) for t in range(3)], 1)
        return _close(steps, model(torch.cat((tokens[:, :keep], other), 1))[:, keep:])


def _refused_call_leaves_cache(model) -> str | None:
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
        try:
            model(torch.tensor([[1], [2], [3]]), cache=cache)
        except ValueError:
            pass
        else:
            return "a cache of batch 2 took a batch of 3"
    return None if [layer.length for layer in cache.layers] == [3, 3] else "the refused call changed the cache"


def kv_cases() -> list[PyCase]:
    from posenc import KVCache

    lm, peg = _lm("rope"), _lm("peg1d", peg_blocks=(0, 1), encoding_options={"kernel_size": 4})
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])

    def filled(n=3):
        cache = lm.new_cache()
        with torch.no_grad():
            lm(prompt[:, :n], cache=cache)
        return cache

    s = "KV cache and generation"
    return [
        PyCase(s, "peg1d: crop(5) then decode = full forward", lambda: _crop_then_decode(peg, 5), right=lambda r: r),
        PyCase(s, "peg1d: crop(0) then prefill = full forward", lambda: _crop_then_decode(peg, 0), right=lambda r: r),
        PyCase(s, "generate: a token id past the vocabulary", lambda: lm.generate(torch.tensor([[1, 11]]), 2),
               ("tokens", "11")),
        # of our own
        PyCase(s, "rope: crop(4) then decode = full forward", lambda: _crop_then_decode(lm, 4), right=lambda r: r),
        PyCase(s, "crop(-1)", lambda: filled().crop(-1), ("length", "-1")),
        PyCase(s, "crop(past the cached length)", lambda: filled().crop(4), ("length", "4")),
        PyCase(s, "crop(True)", lambda: filled().crop(True), ("length", "True")),
        PyCase(s, "crop(2.0)", lambda: filled().crop(2.0), ("length", "2.0")),
        PyCase(s, "KVCache(0)", lambda: KVCache(0), ("num_layers", "0")),
        PyCase(s, "KVCache(True)", lambda: KVCache(True), ("num_layers", "True")),
        PyCase(s, "KVCache('2')", lambda: KVCache("2"), ("num_layers", "'2'")),
        PyCase(s, "KVCache(2.5)", lambda: KVCache(2.5), ("num_layers", "2.5")),
        PyCase(s, "a cache of another depth", lambda: lm(prompt, cache=KVCache(1)), ("cache", "1")),
        PyCase(s, "a cache that is no KVCache", lambda: lm(prompt, cache=[]), ("cache", "list")),
        PyCase(s, "a refused call leaves the cache as it was", lambda: _refused_call_leaves_cache(lm),
               right=lambda r: r),
        PyCase(s, "peg1d: a cache of another batch", lambda: _peg_other_batch(peg), ("batch", "3")),
        PyCase(s, "generate(max_new_tokens=-1)", lambda: lm.generate(prompt, -1), ("max_new_tokens", "-1")),
        PyCase(s, "generate(top_k=0)", lambda: lm.generate(prompt, 2, top_k=0), ("top_k", "0")),
        PyCase(s, "generate(temperature=0)", lambda: lm.generate(prompt, 2, temperature=0.0), ("temperature", "0")),
        PyCase(s, "generate(1-D prompt)", lambda: lm.generate(torch.tensor([1, 2]), 2), ("tokens", "(2,)")),
        PyCase(s, "generate(use_cache='no')", lambda: lm.generate(prompt, 2, greedy=True, use_cache="no"),
               ("use_cache", "'no'")),
        PyCase(s, "forward: a token id past the vocabulary", lambda: lm(torch.tensor([[1, 11]])), ("tokens", "11")),
        PyCase(s, "cached greedy = uncached greedy (alibi, t5)", lambda: _cached_equals_full(),
               right=lambda r: r),
    ]


def _peg_other_batch(peg):
    cache = peg.new_cache()
    with torch.no_grad():
        peg(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
        return peg(torch.tensor([[1], [2], [3]]), cache=cache)


def _cached_equals_full() -> str | None:
    for name in ("alibi", "t5"):
        model = _lm(name)
        prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
        if not torch.equal(model.generate(prompt, 6, greedy=True, use_cache=True),
                           model.generate(prompt, 6, greedy=True, use_cache=False)):
            return f"{name}: cached tokens differ from the full forward's"
    return None


# ---- resumed unit logs, read directly -------------------------------------------------------


TASK_LINE = {"unit": "task/copy/rope/1", "config": "abc", "kind": "task", "task": "copy", "encoding": "rope", "seed": 1,
             "train_loss": 0.5, "train_s": 1.0, "eval_s": 0.5, "exact_match": {"@8": 0.75, "@16": 0.25}}
LM_LINE = {"unit": "lm/alibi/0", "config": "abc", "kind": "lm", "encoding": "alibi", "seed": 0, "train_loss": 1.5,
           "train_s": 2.0, "eval_s": 1.0, "bpb": {"128": 2.1}}


def _load(lines: list[str], link: bool = False):
    from posenc.cli.bench.length_units import check_line
    from posenc.cli.bench.unit_log import UnitLog

    directory = _tmp()
    path = directory / "units.jsonl"
    if link:
        (directory / "victim").write_text("".join(line + "\n" for line in lines))
        os.symlink(directory / "victim", path)
    else:
        path.write_text("".join(line + "\n" for line in lines))
    return UnitLog(path, check=check_line).load()


def _edited(base: dict, **changes) -> str:
    item = json.loads(json.dumps(base))
    item.update(changes)
    return json.dumps(item)


def log_cases() -> list[PyCase]:
    s = "resume logs (read directly)"
    ok = [json.dumps(TASK_LINE), json.dumps(LM_LINE)]
    return [
        PyCase(s, "exact match True", lambda: _load([*ok, _edited(TASK_LINE, exact_match={"@8": True})]),
               ("line 3", "True")),
        PyCase(s, "bits per byte inf", lambda: _load([*ok, _edited(LM_LINE, bpb={"128": float("inf")})]),
               ("line 3", "inf")),
        PyCase(s, "seed not the unit's", lambda: _load([*ok, _edited(TASK_LINE, seed=2)]), ("line 3", "seed is 2")),
        PyCase(s, "unit id without a seed", lambda: _load([*ok, _edited(TASK_LINE, unit="task/copy/rope")]),
               ("line 3", "task/copy/rope")),
        PyCase(s, "train_loss a string", lambda: _load([*ok, _edited(TASK_LINE, train_loss="low")]),
               ("line 3", "'low'")),
        PyCase(s, "negative seconds", lambda: _load([*ok, _edited(LM_LINE, train_s=-1.0)]), ("line 3", "-1.0")),
        PyCase(s, "not UTF-8", lambda: _load_bytes(b"\xff\xfe\n"),
               ("line 1", "UTF-8")),
        PyCase(s, "a line that is a number", lambda: _load(["7", *ok]), ("line 1", "int")),
        PyCase(s, "units.jsonl is a symbolic link", lambda: _load(ok, link=True), ("units.jsonl", "symbolic link")),
        PyCase(s, "a partial last line is dropped, the rest kept",
               lambda: _load_partial(ok), right=lambda log: None if (log.dropped, len(log.lines)) == (1, 2) else
               f"dropped {log.dropped}, kept {len(log.lines)}"),
    ]


def _load_bytes(data: bytes):
    from posenc.cli.bench.length_units import check_line
    from posenc.cli.bench.unit_log import UnitLog

    path = _tmp() / "units.jsonl"
    path.write_bytes(data)
    return UnitLog(path, check=check_line).load()


def _load_partial(ok: list[str]):
    return _load_bytes(("\n".join(ok) + "\n" + '{"unit": "task/copy/rope/2", "conf').encode())


# ---- the size policy, read in-process ---------------------------------------------------------


def _same_estimate(words: list[str], extra: list[str]) -> str | None:
    """``extra`` (a huge ``--long-repeats``) asks for no more work than ``--long-repeats`` at ``--repeats``:
    it caps the rounds above the long lengths at ``--repeats``, so the size check does not refuse it."""
    import importlib

    from posenc import cli
    from posenc.cli import sizes

    module = importlib.import_module(dict(cli.command_groups()[words[0]][1])[words[1]][0])
    capped = cli.build_parser([*words, *extra]).parse_known_args([*words, *extra])[0]
    at_repeats = [*words, "--long-repeats", str(capped.repeats)]
    base = cli.build_parser(at_repeats).parse_known_args(at_repeats)[0]
    if module.estimate(capped) != module.estimate(base):
        return "the estimate grew"
    defaults = sizes.defaults_of(module.add_arguments)
    return sizes.size_error(capped, module.SIZE_FLAGS, module.estimate, defaults, device="cpu")


def policy_cases() -> list[PyCase]:
    s = "benches: sizes (our own)"
    return [PyCase(s, f"bench {words[1]} {' '.join(extra)}: a cap at --repeats",
                   lambda w=words, e=extra: _same_estimate(w, e), right=lambda r: r)
            for words, extra in ((["bench", "generate"], ["--long-repeats", "1000000000"]),
                                 (["bench", "attention"], ["--long-repeats", "1000000000"]))]


__all__ = ["PyCase", "attention_cases", "functional_cases", "kv_cases", "log_cases", "policy_cases"]
