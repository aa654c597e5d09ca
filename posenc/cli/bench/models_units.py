"""The models of ``posenc bench models``, pair by pair (see :mod:`.models` for what each pair is):
each row is a :class:`Unit`, a model and the one batch it trains on, built when its pair runs."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import code_notice
from .models_config import GPS_ENCODINGS, GPS_EIGENVECTORS, PROG, VIT_ENCODINGS, XT_LM, ModelsBenchConfig
from .peers import installed

TIMM_VIT = {"rope2d_axial": "vit_small_patch16_rope_224", "rope2d_mixed": "vit_small_patch16_rope_mixed_224"}


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
                encoding=None if encoding == "none" else encoding)
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


def _graphs(cfg: ModelsBenchConfig, encoding: str = "rwse"):
    """Random graphs (a ring plus random chords, ``nodes`` each), batched, with the structure
    ``encoding`` reads precomputed graph by graph, as a dataset's transform would (RWSE with PyG's
    own transform: the peer reads the same features), and a target per graph."""
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(cfg.seed)
    factory, _ = _gps_structure(cfg, encoding)
    make = None if factory is None else factory()
    items = []
    n = cfg.nodes
    for _ in range(cfg.graphs):
        ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
        chords = torch.randint(0, n, (2, n // 2), generator=g)
        e = torch.cat([ring, chords], dim=1)
        e = torch.cat([e, e.flip(0)], dim=1)
        data = Data(x=torch.randn(n, 16, generator=g), edge_index=e, edge_attr=torch.randn(e.shape[1], 8, generator=g),
                    num_nodes=n)
        items.append(data if make is None else make(data))
    batch = Batch.from_data_list(items)
    return batch.to(cfg.device), torch.randn(cfg.graphs, 1, generator=g).to(cfg.device)


def _gps_structure(cfg: ModelsBenchConfig, encoding: str) -> tuple[Callable[[], object] | None, dict | None]:
    """``(transform factory, encoding options)`` of a gps row: the transform that precomputes what
    ``encoding`` reads and the sizes the encoding is built with, from one entry so that they agree
    (None, None: nothing to precompute, or spd's distances, which
    :func:`posenc.graph.node_positions` computes from the batch's edges)."""
    from torch_geometric.transforms import AddRandomWalkPE

    from ...graph import AddLandmarkPE, AddLaplacianPE, AddMagneticLaplacianPE, AddRRWP, AddStablePE

    k, walk = GPS_EIGENVECTORS, cfg.rwse_steps
    table = {
        "rwse": (lambda: AddRandomWalkPE(walk, attr_name="random_walk_pe"), {"walk_length": walk}),
        "rrwp": (lambda: AddRRWP(walk), {"walk_length": walk}),
        "lap": (lambda: AddLaplacianPE(k, random_sign=False, eigenvalues=True), {"k": k}),
        "maglap": (lambda: AddMagneticLaplacianPE(k, q=0.25), {"k": k}),
        "stable_pe": (lambda: AddStablePE(k), {"k": k}),
        "landmark": (lambda: AddLandmarkPE(k), {"k": k}),
    }
    return table.get(encoding, (None, None))


def posenc_gps(cfg: ModelsBenchConfig, encoding: str = "rwse") -> Unit:
    """posenc's GPS with ``encoding`` (or none). Each encoding's per-node input is read from the
    batch once, outside the step, as the precomputed structure is in training."""
    from ...graph.gps import GPS, node_positions

    batch, y = _graphs(cfg, encoding)
    model = GPS(16, 1, dim=cfg.gps_dim, depth=cfg.gps_depth, num_heads=cfg.gps_heads, edge_dim=8,
                encoding=None if encoding == "none" else encoding, encoding_options=_gps_structure(cfg, encoding)[1])
    positions = None if model.encoding is None else node_positions(batch, model.encoding)
    return Unit(model, lambda m: m(batch.x, batch.edge_index, batch=batch.batch, edge_attr=batch.edge_attr,
                                      positions=positions, num_graphs=batch.num_graphs), lambda out: F.mse_loss(out, y))


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


def candidates(cfg: ModelsBenchConfig, notes: list[str]) -> list[Candidate]:
    out: list[Candidate] = []
    if "lm" in cfg.models:
        peer = installed("x-transformers")
        for e in cfg.lm_encodings:
            out.append(Candidate(f"lm/{e}", "CausalLM", "posenc", lambda e=e: posenc_lm(cfg, e)))
            if peer and e in XT_LM:
                out.append(Candidate(f"lm/{e}", "TransformerWrapper", "x-transformers", lambda e=e: x_transformers_lm(cfg, e)))
        if not peer:
            notes.append("x-transformers is not installed: no LM peers (pip install 'posenc[bench]')")
    if "vit" in cfg.models:
        peer = installed("timm")
        for e in cfg.vit_encodings:
            out.append(Candidate(f"vit/{e}", "ViT", "posenc", lambda e=e: posenc_vit(cfg, e)))
            if peer and e in VIT_ENCODINGS:
                label = "VisionTransformer" if e == "learned2d" else TIMM_VIT[e]
                out.append(Candidate(f"vit/{e}", label, "timm", lambda e=e: timm_vit(cfg, e)))
        if not peer:
            notes.append("timm is not installed: no ViT peers")
    if "gps" in cfg.models:
        for e in cfg.gps_encodings:
            out.append(Candidate(f"gps/{e}", "GPS", "posenc", lambda e=e: posenc_gps(cfg, e)))
            if e in GPS_ENCODINGS:
                out.append(Candidate(f"gps/{e}", "GPSConv stack", "torch_geometric", lambda: pyg_gps(cfg)))
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


__all__ = [
    "Candidate", "PyGGPS", "Unit", "authors_convtran", "candidates", "installed", "posenc_convtran", "posenc_gps", "posenc_lm",
    "posenc_vit", "pyg_gps", "timm_vit", "x_transformers_lm",
]
