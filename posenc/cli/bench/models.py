"""``posenc bench models``: training steps/s and peak memory of posenc's reference models against
their peers, and what ``torch.compile`` makes of them.

::

    posenc bench models                       # every pair, eager and compiled (inductor on CPU)
    posenc bench models --no-compile          # eager only (compiling takes most of the run)
    posenc bench models --models lm,vit --out results/

Pairs (same sizes, same data, same optimizer: AdamW, one step = forward, loss, backward, step):

``lm``
    :class:`posenc.seq.CausalLM` against x-transformers' ``TransformerWrapper`` over a ``Decoder``
    (tied embeddings, flash attention), with ``rope``, ``alibi`` and ``none`` (x-transformers:
    ``rotary_pos_emb``, ``alibi_pos_bias``, no position signal); next-token cross-entropy on
    random tokens ``[B, T]``. ``--lm-encodings`` picks other encodings (``all``: every
    registered sequence and time-series encoding of softmax attention); those x-transformers
    lacks have the posenc row alone, for its speed, graph breaks and compiled speed-up.
``vit``
    :class:`posenc.vision.ViT` against timm: ``learned2d`` against ``VisionTransformer`` (learned
    absolute table, class token), ``rope2d_axial`` / ``rope2d_mixed`` against timm's
    ``vit_small_patch16_rope_224`` / ``..._rope_mixed_224`` architectures (EVA blocks with axial
    or mixed RoPE) rebuilt at the same width, depth, heads, patch and image size (no
    pretrained weights); cross-entropy on random images.
``gps``
    :class:`posenc.graph.GPS` (RWSE input encoding, GINE local layer, mean pool) against a model
    written here from PyG's ``GPSConv`` (``GINEConv`` local, multi-head attention global) with the
    same RWSE features through a linear layer; random graphs batched as PyG does.

``convtran``
    :class:`posenc.timeseries.ConvTranClassifier` (``tape+erpe``, ConvTran's sizes: width 16, 8
    heads, feed-forward 256) against the authors' ``ConvTran`` module (Foumani et al. 2023,
    github.com/Navidfoumani/ConvTran, MIT) with ``Fix_pos_encode="tAPE"`` and
    ``Rel_pos_encode="eRPE"``; cross-entropy on random series ``[B, C, T]``. No package ships
    the authors' modules, so the peer row needs ``--convtran-repo DIR``, a checkout of that
    repository: its ``Models/model.py`` is imported from there (the repository's own code runs;
    name only a checkout you trust). Without it the pair has the posenc row alone.

Each row: median ms per training step over ``--repeats`` rounds after ``--warmup`` (rows of a
pair interleaved round robin, see :mod:`.timing`), steps/s, peak memory of one step (see
:mod:`.memory`), the posenc row's time over its peer's round by round (the median over rounds
of the two rows' ratio in each round, :func:`.timing.paired_ratio`). ``--device cuda`` runs every model and
its batch there; ``--dtype bfloat16`` runs each step's forward pass and loss under
``torch.autocast`` in bfloat16 (float32 weights and optimizer: mixed precision, as models are
trained), the same for every row. With compiling on (the default) each row
is also compiled with ``torch.compile`` (default inductor backend): ``graph breaks`` counts
``torch._dynamo.explain`` over the forward pass, and ``compiled x`` is eager ms over compiled ms.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..argtypes import nonnegative_int, out_directory, positive_int, seed_value
from ..errors import code_notice, usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import CALL_SECONDS, Work, add_allow_large, defaults_of, size_error, transformer
from ...training.report import Progress, format_table
from .devices import bench_device, device_arg, require_available
from .load import background_load, describe, format_load_average, load_average
from .memory import MB, peak_memory_bytes
from .timing import error_text, paired_ratio, time_interleaved

MODELS = ("lm", "vit", "gps", "convtran")
DEFAULT_MODELS = ("lm", "vit", "gps")
XT_LM = {"rope": {"rotary_pos_emb": True}, "alibi": {"alibi_pos_bias": True}, "none": {}}  # x-transformers' kwargs
LM_ENCODINGS = tuple(XT_LM)  # the default lm rows: the encodings with an x-transformers peer
ALL = "all"  # --lm-encodings all
VIT_ENCODINGS = ("learned2d", "rope2d_axial", "rope2d_mixed")
TIMM_VIT = {"rope2d_axial": "vit_small_patch16_rope_224", "rope2d_mixed": "vit_small_patch16_rope_mixed_224"}
PROG = "posenc bench models"
PEER_DISTS = {"x-transformers": "x-transformers", "timm": "timm", "torch_geometric": "torch_geometric"}
DTYPES = ("float32", "bfloat16")  # bfloat16: the forward pass and loss under torch.autocast


@dataclass(frozen=True)
class ModelsBenchConfig:
    """Sizes of each pair and the run's settings."""

    models: tuple[str, ...] = DEFAULT_MODELS
    lm_encodings: tuple[str, ...] = LM_ENCODINGS
    batch: int = 8
    seq_len: int = 256
    lm_dim: int = 256
    lm_depth: int = 4
    lm_heads: int = 4
    vocab: int = 256
    img_size: int = 32
    patch: int = 4
    vit_dim: int = 192
    vit_depth: int = 6
    vit_heads: int = 3
    graphs: int = 16
    nodes: int = 24
    gps_dim: int = 64
    gps_depth: int = 4
    gps_heads: int = 4
    rwse_steps: int = 8
    series: int = 16  # ConvTran: series per step, their channels and length
    series_channels: int = 3
    series_len: int = 150
    classes: int = 4
    convtran_repo: str | None = None
    repeats: int = 5
    warmup: int = 1
    compile: bool = True
    seed: int = 0
    background_processes: int = 0
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        bench_device(self.device)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        bad = [m for m in self.models if m not in MODELS]
        if not self.models or bad:
            raise ValueError(f"models must be some of {', '.join(MODELS)}; got {', '.join(self.models) or 'none'}")
        for name, value in asdict(self).items():
            if isinstance(value, int) and not isinstance(value, bool) and name not in ("warmup", "seed", "background_processes"):
                if value < 1:
                    raise ValueError(f"{name} must be a positive integer; got {value}")
        if self.warmup < 0 or self.background_processes < 0:
            raise ValueError(f"warmup and background_processes must be >= 0; got {self.warmup}, {self.background_processes}")
        for dim, heads, what in ((self.lm_dim, self.lm_heads, "lm"), (self.vit_dim, self.vit_heads, "vit"),
                                 (self.gps_dim, self.gps_heads, "gps")):
            if dim % heads:
                raise ValueError(f"{what}: dim ({dim}) must be divisible by heads ({heads})")
        if self.convtran_repo is not None and not (Path(self.convtran_repo) / "Models" / "model.py").is_file():
            raise ValueError(f"convtran_repo must be a checkout of github.com/Navidfoumani/ConvTran (with "
                             f"Models/model.py); got {self.convtran_repo!r}")
        known = lm_encoding_names()
        unknown = [e for e in self.lm_encodings if e not in known]
        if not self.lm_encodings or unknown:
            raise ValueError(f"lm_encodings must be some of {', '.join(known)}; got {', '.join(unknown) or 'none'}")
        if self.img_size % self.patch:
            raise ValueError(f"img_size ({self.img_size}) must be divisible by patch ({self.patch})")


def lm_encoding_names() -> tuple[str, ...]:
    """``none`` and every registered sequence and time-series encoding of softmax attention
    (a :class:`posenc.seq.CausalLM` builds with each; the SPE codes need linear attention)."""
    from ...common.registry import available

    return ("none", *(i.name for i in available() if i.modality in ("seq", "timeseries") and not i.cls.linear_only))


# --- the rows ---------------------------------------------------------------------------------


@dataclass
class Unit:
    """A model and the one batch it trains on: ``apply(module)`` runs a module (the model, or the
    model compiled) on that batch, ``loss_of(output)`` is the training loss."""

    model: nn.Module
    apply: Callable[[nn.Module], Tensor]
    loss_of: Callable[[Tensor], Tensor]


@dataclass
class Candidate:
    pair: str  # "lm/rope": the model and encoding both rows share
    name: str
    impl: str
    factory: Callable[[], Unit]


def _lm_batch(cfg: ModelsBenchConfig) -> Tensor:
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=g).to(cfg.device)


def _lm_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def posenc_lm(cfg: ModelsBenchConfig, encoding: str) -> Unit:
    from ...seq.models import CausalLM

    model = CausalLM(cfg.vocab, cfg.lm_dim, cfg.lm_depth, cfg.lm_heads, encoding=None if encoding == "none" else encoding,
                     max_len=cfg.seq_len)
    tokens = _lm_batch(cfg)
    inputs = tokens[:, :-1]
    return Unit(model, lambda m: m(inputs), lambda out: _lm_loss(out, tokens))


def x_transformers_lm(cfg: ModelsBenchConfig, encoding: str) -> Unit:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from x_transformers import Decoder, TransformerWrapper
    kind = XT_LM[encoding]
    model = TransformerWrapper(
        num_tokens=cfg.vocab, max_seq_len=cfg.seq_len, use_abs_pos_emb=False, tie_embedding=True,
        attn_layers=Decoder(dim=cfg.lm_dim, depth=cfg.lm_depth, heads=cfg.lm_heads,
                            attn_dim_head=cfg.lm_dim // cfg.lm_heads, attn_flash=True, **kind),
    )
    tokens = _lm_batch(cfg)
    inputs = tokens[:, :-1]
    return Unit(model, lambda m: m(inputs), lambda out: _lm_loss(out, tokens))


def _images(cfg: ModelsBenchConfig) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(cfg.seed)
    x, y = torch.randn(cfg.batch, 3, cfg.img_size, cfg.img_size, generator=g), torch.randint(0, 10, (cfg.batch,), generator=g)
    return x.to(cfg.device), y.to(cfg.device)


def posenc_vit(cfg: ModelsBenchConfig, encoding: str) -> Unit:
    from ...vision.vit import ViT

    model = ViT(cfg.img_size, cfg.patch, num_classes=10, dim=cfg.vit_dim, depth=cfg.vit_depth, num_heads=cfg.vit_heads,
                encoding=encoding)
    x, y = _images(cfg)
    return Unit(model, lambda m: m(x), lambda out: F.cross_entropy(out, y))


def timm_vit(cfg: ModelsBenchConfig, encoding: str) -> Unit:
    import timm

    sizes = dict(img_size=cfg.img_size, patch_size=cfg.patch, embed_dim=cfg.vit_dim, depth=cfg.vit_depth,
                 num_heads=cfg.vit_heads, num_classes=10)
    if encoding == "learned2d":
        from timm.models.vision_transformer import VisionTransformer

        model = VisionTransformer(**sizes)
    else:
        model = timm.create_model(TIMM_VIT[encoding], pretrained=False, **sizes)
    x, y = _images(cfg)
    return Unit(model, lambda m: m(x), lambda out: F.cross_entropy(out, y))


def _graphs(cfg: ModelsBenchConfig):
    """Random graphs (a ring plus random chords, ``nodes`` each), batched, with RWSE features."""
    from torch_geometric.data import Batch, Data
    from torch_geometric.transforms import AddRandomWalkPE

    g = torch.Generator().manual_seed(cfg.seed)
    walk = AddRandomWalkPE(cfg.rwse_steps, attr_name="random_walk_pe")
    items = []
    n = cfg.nodes
    for _ in range(cfg.graphs):
        ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
        chords = torch.randint(0, n, (2, n // 2), generator=g)
        e = torch.cat([ring, chords], dim=1)
        e = torch.cat([e, e.flip(0)], dim=1)
        data = Data(x=torch.randn(n, 16, generator=g), edge_index=e, edge_attr=torch.randn(e.shape[1], 8, generator=g),
                    num_nodes=n)
        items.append(walk(data))
    batch = Batch.from_data_list(items)
    return batch.to(cfg.device), torch.randn(cfg.graphs, 1, generator=g).to(cfg.device)


def posenc_gps(cfg: ModelsBenchConfig) -> Unit:
    from ...graph.gps import GPS

    batch, y = _graphs(cfg)
    model = GPS(16, 1, dim=cfg.gps_dim, depth=cfg.gps_depth, num_heads=cfg.gps_heads, edge_dim=8, encoding="rwse",
                encoding_options={"walk_length": cfg.rwse_steps})
    return Unit(model, lambda m: m(batch.x, batch.edge_index, batch=batch.batch, edge_attr=batch.edge_attr,
                                      positions=batch.random_walk_pe, num_graphs=batch.num_graphs), lambda out: F.mse_loss(out, y))


class PyGGPS(nn.Module):
    """GPS from PyG's ``GPSConv`` (GINE local layer, multi-head attention global): node and RWSE
    features embedded by linear layers and added, ``depth`` ``GPSConv`` layers, mean pool, linear head."""

    def __init__(self, in_dim: int, edge_dim: int, rwse: int, dim: int, depth: int, heads: int) -> None:
        super().__init__()
        from torch_geometric.nn import GINEConv, GPSConv

        self.embed = nn.Linear(in_dim, dim)
        self.pe = nn.Linear(rwse, dim)
        self.edge = nn.Linear(edge_dim, dim)
        self.layers = nn.ModuleList(
            GPSConv(dim, GINEConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))), heads=heads,
                    attn_type="multihead", norm="layer_norm")
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, 1)

    def forward(self, data) -> Tensor:
        from torch_geometric.nn import global_mean_pool

        x = self.embed(data.x) + self.pe(data.random_walk_pe)
        e = self.edge(data.edge_attr)
        for layer in self.layers:
            x = layer(x, data.edge_index, data.batch, edge_attr=e)
        return self.head(global_mean_pool(x, data.batch))


def pyg_gps(cfg: ModelsBenchConfig) -> Unit:
    batch, y = _graphs(cfg)
    model = PyGGPS(16, 8, cfg.rwse_steps, cfg.gps_dim, cfg.gps_depth, cfg.gps_heads)
    return Unit(model, lambda m: m(batch), lambda out: F.mse_loss(out, y))


def _series(cfg: ModelsBenchConfig) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.series, cfg.series_channels, cfg.series_len, generator=g)
    return x.to(cfg.device), torch.randint(0, cfg.classes, (cfg.series,), generator=g).to(cfg.device)


def posenc_convtran(cfg: ModelsBenchConfig) -> Unit:
    from ...timeseries.convtran import ConvTranClassifier

    model = ConvTranClassifier(cfg.series_channels, cfg.classes, cfg.series_len, encoding="tape+erpe")
    x, y = _series(cfg)
    return Unit(model, lambda m: m(x), lambda out: F.cross_entropy(out, y))


def authors_convtran(cfg: ModelsBenchConfig) -> Unit:
    """The authors' ``ConvTran`` imported from a checkout of their repository (its modules import
    each other as ``Models.*``, so the checkout is on ``sys.path`` while they load)."""
    repo = str(Path(cfg.convtran_repo).resolve())
    code_notice(PROG, "--convtran-repo", os.path.join(repo, "Models", "model.py"))
    saved_path, saved_modules = list(sys.path), {k: v for k, v in sys.modules.items() if k.split(".")[0] == "Models"}
    sys.path.insert(0, repo)
    for name in saved_modules:  # another package called Models must not stand in for theirs
        del sys.modules[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_module = importlib.import_module("Models.model")
    finally:
        sys.path[:] = saved_path
        for name in [k for k in sys.modules if k.split(".")[0] == "Models"]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
    config = {"Data_shape": (cfg.series, cfg.series_channels, cfg.series_len), "emb_size": 16, "num_heads": 8,
              "dim_ff": 256, "Fix_pos_encode": "tAPE", "Rel_pos_encode": "eRPE", "dropout": 0.01,
              "num_labels": cfg.classes}
    model = model_module.ConvTran(config, num_classes=cfg.classes)
    x, y = _series(cfg)
    return Unit(model, lambda m: m(x), lambda out: F.cross_entropy(out, y))


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def candidates(cfg: ModelsBenchConfig, notes: list[str]) -> list[Candidate]:
    out: list[Candidate] = []
    if "lm" in cfg.models:
        peer = _installed("x-transformers")
        for e in cfg.lm_encodings:
            out.append(Candidate(f"lm/{e}", "CausalLM", "posenc", lambda e=e: posenc_lm(cfg, e)))
            if peer and e in XT_LM:
                out.append(Candidate(f"lm/{e}", "TransformerWrapper", "x-transformers", lambda e=e: x_transformers_lm(cfg, e)))
        if not peer:
            notes.append("x-transformers is not installed: no LM peers (pip install 'posenc[bench]')")
    if "vit" in cfg.models:
        peer = _installed("timm")
        for e in VIT_ENCODINGS:
            out.append(Candidate(f"vit/{e}", "ViT", "posenc", lambda e=e: posenc_vit(cfg, e)))
            if peer:
                label = "VisionTransformer" if e == "learned2d" else TIMM_VIT[e]
                out.append(Candidate(f"vit/{e}", label, "timm", lambda e=e: timm_vit(cfg, e)))
        if not peer:
            notes.append("timm is not installed: no ViT peers")
    if "gps" in cfg.models:
        out.append(Candidate("gps/rwse", "GPS", "posenc", lambda: posenc_gps(cfg)))
        out.append(Candidate("gps/rwse", "GPSConv stack", "torch_geometric", lambda: pyg_gps(cfg)))
    if "convtran" in cfg.models:
        out.append(Candidate("convtran/tape+erpe", "ConvTranClassifier", "posenc", lambda: posenc_convtran(cfg)))
        if cfg.convtran_repo is not None:
            out.append(Candidate("convtran/tape+erpe", "ConvTran", "authors", lambda: authors_convtran(cfg)))
        else:
            notes.append("convtran: no peer row without --convtran-repo DIR (a checkout of the authors' repository; "
                         "no package ships their modules)")
    else:
        notes.append("ConvTran-style classifier not run: add convtran to --models (its peer needs --convtran-repo DIR)")
    return out


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Row:
    pair: str
    name: str
    impl: str
    ms: float | None = None
    steps_per_s: float | None = None
    peak_mb: float | None = None
    vs_peer: float | None = None  # this row's ms over the peer's (posenc rows)
    graph_breaks: int | None = None
    graphs: int | None = None
    compiled_ms: float | None = None
    compile_speedup: float | None = None
    break_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    compile_error: str | None = None


@dataclass
class ModelsResult:
    config: dict
    rows: list[Row]
    notes: list[str]

    def to_json(self) -> dict:
        return {"config": self.config, "rows": [asdict(r) for r in self.rows], "notes": self.notes}


def _autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` in ``dtype`` on ``device``; off for None (float32)."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def _train_step(unit: Unit, module: nn.Module, opt: torch.optim.Optimizer, device: torch.device,
                autocast: torch.dtype | None) -> Callable[[], None]:
    """One training step; ``autocast``: the forward pass and loss under ``torch.autocast`` in that dtype."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with _autocast(device, autocast):
            loss = unit.loss_of(unit.apply(module))
        loss.backward()
        opt.step()

    return step


def _explain(unit: Unit, device: torch.device, autocast: torch.dtype | None) -> tuple[int, int, list[str]]:
    """``(graph breaks, graphs, reasons)`` of the forward pass under ``torch._dynamo.explain``."""
    import torch._dynamo

    torch._dynamo.reset()
    with _autocast(device, autocast):
        info = torch._dynamo.explain(lambda: unit.apply(unit.model))()
    reasons = []
    for b in info.break_reasons:
        where = b.user_stack[-1] if getattr(b, "user_stack", None) else None
        place = f" ({os.path.basename(where.filename)}:{where.lineno})" if where is not None else ""
        reasons.append(" ".join(str(b.reason).split())[:160] + place)
    return info.graph_break_count, info.graph_count, list(dict.fromkeys(reasons))


def _measure(cfg: ModelsBenchConfig, *, progress: bool) -> ModelsResult:
    notes: list[str] = []
    todo = candidates(cfg, notes)
    rows = [Row(c.pair, c.name, c.impl) for c in todo]
    pairs = list(dict.fromkeys(c.pair for c in todo))
    bar = Progress(len(pairs), "pairs", enabled=progress)
    device = require_available(cfg.device)
    autocast = torch.bfloat16 if cfg.dtype == "bfloat16" else None
    for pair in pairs:
        members = [(c, r) for c, r in zip(todo, rows) if c.pair == pair]
        steps, units = {}, {}
        for cand, row in members:
            try:
                torch.manual_seed(cfg.seed)
                unit = cand.factory()
                unit.model.to(device).train()
                opt = torch.optim.AdamW(unit.model.parameters(), lr=1e-4)
                step = _train_step(unit, unit.model, opt, device, autocast)
                step()  # one checked step before timing
                steps[cand.name], units[cand.name] = step, (unit, opt)
            except Exception as exc:
                row.error = error_text(exc)
        timings = time_interleaved(steps, repeats=cfg.repeats, warmup=cfg.warmup, device=device, progress=False)
        for cand, row in members:
            if cand.name not in steps:
                continue
            t = timings[cand.name]
            row.error = t.error
            row.ms = t.median_ms
            row.steps_per_s = 1e3 / row.ms if row.ms else None
            try:
                row.peak_mb = peak_memory_bytes(steps[cand.name], device) / MB
            except Exception as exc:
                row.error = row.error or f"memory: {error_text(exc)}"
        if cfg.compile:
            compiled_steps = {}
            for cand, row in members:
                if cand.name not in units or row.error:
                    continue
                unit, _ = units[cand.name]
                try:
                    row.graph_breaks, row.graphs, row.break_reasons = _explain(unit, device, autocast)
                    torch._dynamo.reset()
                    compiled = torch.compile(unit.model)  # the same parameters, compiled
                    cstep = _train_step(unit, compiled, torch.optim.AdamW(unit.model.parameters(), lr=1e-4), device, autocast)
                    cstep()  # compiles
                    compiled_steps[cand.name] = cstep
                except Exception as exc:
                    row.compile_error = error_text(exc)
            # at least one untimed round: the first calls after compiling may still recompile
            ctimes = time_interleaved(compiled_steps, repeats=cfg.repeats, warmup=max(1, cfg.warmup), device=device,
                                      progress=False)
            for cand, row in members:
                if cand.name in compiled_steps:
                    t = ctimes[cand.name]
                    row.compile_error = row.compile_error or t.error
                    row.compiled_ms = t.median_ms
                    if row.compiled_ms and row.ms:
                        row.compile_speedup = row.ms / row.compiled_ms
        ours = next(((c, r) for c, r in members if r.impl == "posenc"), None)
        peer = next(((c, r) for c, r in members if r.impl != "posenc"), None)
        if ours is not None and peer is not None and ours[1].ms and peer[1].ms:
            # round by round: the pair's two rows alternate in the same rounds
            ours[1].vs_peer = paired_ratio(timings[ours[0].name].times_ms, timings[peer[0].name].times_ms)
        bar.update(note=pair)
    bar.close()
    config = asdict(cfg)
    config.update(
        torch=torch.__version__, threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
        machine=platform.processor() or platform.machine(), background_load=describe(cfg.background_processes),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        load_average=load_average(), peer_versions={k: importlib.metadata.version(v) for k, v in PEER_DISTS.items()
                                                    if _installed(v)},
        timing="training step (AdamW) median of repeats after warmup; the rows of a pair round robin",
    )
    return ModelsResult(config, rows, notes)


def run_benchmark(cfg: ModelsBenchConfig, *, progress: bool = True) -> ModelsResult:
    n = cfg.background_processes
    with background_load(n > 0, max(n, 1)):
        return _measure(cfg, progress=progress)


# --- output -----------------------------------------------------------------------------------


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _precision(config: dict) -> str:
    return "bfloat16 autocast" if config["dtype"] == "bfloat16" else "float32"


def render(result: ModelsResult) -> str:
    c = result.config
    lines = [
        f"training steps (AdamW), {_precision(c)} on {c.get('device_name') or c['device']} ({c['threads']} CPU threads): "
        f"lm B={c['batch']} T={c['seq_len']} dim={c['lm_dim']} "
        f"depth={c['lm_depth']} heads={c['lm_heads']}; vit {c['img_size']}px/{c['patch']} dim={c['vit_dim']} "
        f"depth={c['vit_depth']} heads={c['vit_heads']} B={c['batch']}; gps {c['graphs']} graphs x {c['nodes']} nodes "
        f"dim={c['gps_dim']} depth={c['gps_depth']}; convtran B={c['series']} C={c['series_channels']} "
        f"T={c['series_len']}",
        f"background load: {c['background_load']}; load average at the end: {format_load_average(c['load_average'])}",
        "vs peer: median over rounds of posenc ms / peer ms in the same round (target <= 1.10); "
        "breaks: torch._dynamo.explain graph breaks of the forward; "
        "compiled x: eager ms / compiled ms",
        "",
    ]
    headers = ["pair", "model", "impl", "ms/step", "steps/s", "peak MB", "vs peer", "breaks", "compiled ms", "compiled x"]
    body = [[r.pair, r.name, r.impl, _num(r.ms, ".1f"), _num(r.steps_per_s, ".2f"), _num(r.peak_mb, ".1f"),
             _num(r.vs_peer, ".2f"), "-" if r.graph_breaks is None else str(r.graph_breaks),
             _num(r.compiled_ms, ".1f"), _num(r.compile_speedup, ".2f")] for r in result.rows]
    lines.append(format_table(headers, body, align="lll" + "r" * 7))
    reasons = [(r, why) for r in result.rows for why in r.break_reasons]
    if reasons:
        lines += ["", "graph breaks:"] + [f"  {r.pair} {r.impl}: {why}" for r, why in reasons]
    errors = [(r, r.error or r.compile_error) for r in result.rows if r.error or r.compile_error]
    if errors:
        lines += ["", "errors:"] + [f"  {r.pair} {r.impl}: {e}" for r, e in errors]
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    return "\n".join(lines)


def _models(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in MODELS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(MODELS)}, got {text!r}")
    return names


def _lm_encodings(text: str) -> tuple[str, ...]:
    known = lm_encoding_names()
    if text.strip() == ALL:
        return known
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected {ALL} or some of {', '.join(known)}, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ModelsBenchConfig()
    parser.add_argument("--models", type=_models, default=d.models, metavar="A,B",
                        help=f"pairs to run, of {','.join(MODELS)} (default: {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--lm-encodings", type=_lm_encodings, default=d.lm_encodings, metavar="A,B|all",
                        help=f"encodings of the lm pair ({ALL}: every sequence and time-series encoding of softmax "
                             f"attention; x-transformers rows for {', '.join(XT_LM)}) (default: "
                             f"{','.join(LM_ENCODINGS)})")
    parser.add_argument("--batch", type=positive_int, default=d.batch, help="LM sequences / images per step (default: %(default)s)")
    parser.add_argument("--seq-len", type=positive_int, default=d.seq_len, help="LM tokens (default: %(default)s)")
    parser.add_argument("--graphs", type=positive_int, default=d.graphs, help="graphs per GPS batch (default: %(default)s)")
    parser.add_argument("--convtran-repo", default=None, metavar="DIR",
                        help="a checkout of github.com/Navidfoumani/ConvTran: the convtran pair's peer row imports "
                             "its Models/model.py (that repository's code runs; default: no peer row)")
    parser.add_argument("--device", type=device_arg, default=d.device, help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                        help="bfloat16: each step's forward pass and loss under torch.autocast (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=d.repeats, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=nonnegative_int, default=d.warmup, help="untimed rounds (default: %(default)s)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip torch.compile (graph breaks and compiled speed-up): the slow part of the run")
    parser.add_argument("--background-load", dest="background_processes", action="store_const", const=1, default=0,
                        help="run one busy process for the whole run; noted in the header and JSON")
    parser.add_argument("--out", type=out_directory, default=None, metavar="DIR", help="write models.txt and models.json into DIR")
    parser.add_argument("--seed", type=seed_value, default=d.seed, help="default: %(default)s")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("batch", "seq_len", "graphs", "repeats", "warmup")
COMPILE_SECONDS = 60.0  # torch.compile and dynamo's explain of one model, about


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): per row, the checked step, the warm-up and timed rounds,
    the memory step, and with compiling its explain, compile and rounds again; the GPS batch's
    graphs are made one by one in Python first."""
    d = ModelsBenchConfig()
    rounds = 2 + args.warmup + args.repeats + (1 + max(1, args.warmup) + args.repeats if args.compile else 0)
    compiling = Work(calls=COMPILE_SECONDS / CALL_SECONDS) if args.compile else Work()
    models = tuple(args.models)
    work = Work()
    if "lm" in models:
        rows = len(args.lm_encodings) + len(set(args.lm_encodings) & set(XT_LM))
        step = transformer(args.batch, args.seq_len, d.lm_dim, d.lm_depth, vocab=d.vocab)
        work = work + (step * rounds + compiling) * rows
    if "vit" in models:
        step = transformer(args.batch, (d.img_size // d.patch) ** 2 + 1, d.vit_dim, d.vit_depth)
        work = work + (step * rounds + compiling) * (2 * len(VIT_ENCODINGS))
    if "gps" in models:
        making = Work(calls=0.2 * args.graphs, bytes=4 * args.graphs * d.nodes * (16 + d.rwse_steps + 4 * 8))
        step = transformer(args.graphs, d.nodes, d.gps_dim, d.gps_depth)
        work = work + (making + step * rounds + compiling) * 2
    if "convtran" in models:
        step = transformer(d.series, d.series_len, 16, 1)
        work = work + (step * rounds + compiling) * 2
    return work


def run(args: argparse.Namespace) -> int:
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is None:
        error = out_error(args.out, ["models.txt", "models.json"])
    if error is not None:
        return usage_error(PROG, error)
    try:
        cfg = ModelsBenchConfig(models=tuple(args.models), lm_encodings=tuple(args.lm_encodings), batch=args.batch,
                                seq_len=args.seq_len, graphs=args.graphs, repeats=args.repeats, warmup=args.warmup,
                                compile=args.compile, seed=args.seed, background_processes=args.background_processes,
                                convtran_repo=args.convtran_repo, device=args.device, dtype=args.dtype)
        require_available(cfg.device)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    result = run_benchmark(cfg, progress=args.progress)
    text = render(result)
    print(text)
    if args.out:
        paths = [write_json_file(args.out, "models.json", result.to_json()),
                 write_file(args.out, "models.txt", text + "\n")]
        print(f"\nwrote {', '.join(map(str, paths))}")
    return 0


__all__ = ["ModelsBenchConfig", "ModelsResult", "add_arguments", "render", "run", "run_benchmark"]
