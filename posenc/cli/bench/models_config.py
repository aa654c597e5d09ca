"""The settings of ``posenc bench models`` (see :mod:`.models`): the pairs, the encodings of the lm
pair (read from the registry's snapshot, :mod:`posenc.cli.catalog`) and :class:`ModelsBenchConfig`,
which checks a run's settings. No torch: the command checks its arguments with these before
torch loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..catalog import entries
from ..errors import unknown_name
from .devices import bench_device

MODELS = ("lm", "vit", "gps", "convtran")
DEFAULT_MODELS = ("lm", "vit", "gps")
XT_LM = {"rope": {"rotary_pos_emb": True}, "alibi": {"alibi_pos_bias": True}, "none": {}}  # x-transformers' kwargs
LM_ENCODINGS = tuple(XT_LM)  # the default lm rows: the encodings with an x-transformers peer
LM_MODALITIES = ("seq", "timeseries")  # the encodings a CausalLM builds with
ALL = "all"  # --lm-encodings all, --vit-encodings all, --gps-encodings all
VIT_ENCODINGS = ("learned2d", "rope2d_axial", "rope2d_mixed")  # the default vit rows: the encodings with a timm peer
GPS_ENCODINGS = ("rwse",)  # the default gps rows: the encoding the PyG GPSConv peer is written with
GPS_EIGENVECTORS = 8  # k of lap, maglap, stable_pe and anchors of landmark in the gps rows: GraphGPS's LapPE k
PROG = "posenc bench models"
DTYPES = ("float32", "bfloat16")  # bfloat16: the forward pass and loss under torch.autocast


@dataclass(frozen=True)
class ModelsBenchConfig:
    """Sizes of each pair and the run's settings."""

    models: tuple[str, ...] = DEFAULT_MODELS
    lm_encodings: tuple[str, ...] = LM_ENCODINGS
    vit_encodings: tuple[str, ...] = VIT_ENCODINGS
    gps_encodings: tuple[str, ...] = GPS_ENCODINGS
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
        problem = convtran_repo_error(self.convtran_repo)
        if problem is not None:
            raise ValueError(problem)
        for field, names in (("lm_encodings", lm_encoding_names), ("vit_encodings", vit_encoding_names),
                             ("gps_encodings", gps_encoding_names)):
            chosen, known = getattr(self, field), names()
            unknown = [e for e in chosen if e not in known]
            if not chosen or unknown:
                raise ValueError(f"{field} must be some of {', '.join(known)}; got {', '.join(unknown) or 'none'}")
        spectral = sorted(set(self.gps_encodings) & {"lap", "maglap", "stable_pe", "landmark"})
        if "gps" in self.models and spectral and self.nodes <= GPS_EIGENVECTORS:
            raise ValueError(f"nodes must be more than {GPS_EIGENVECTORS} for {', '.join(spectral)} "
                             f"({GPS_EIGENVECTORS} eigenvectors or anchors per graph); got {self.nodes}")
        if self.img_size % self.patch:
            raise ValueError(f"img_size ({self.img_size}) must be divisible by patch ({self.patch})")


def convtran_repo_error(repo: str | None) -> str | None:
    """Why ``repo`` is no checkout of the authors' ConvTran (its ``Models/model.py`` is what runs), or None."""
    if repo is not None and not (Path(repo) / "Models" / "model.py").is_file():
        return (f"convtran_repo must be a checkout of github.com/Navidfoumani/ConvTran (with Models/model.py); got "
                f"{repo!r}")
    return None


def lm_encoding_names() -> tuple[str, ...]:
    """``none`` and every registered sequence and time-series encoding of softmax attention
    (a :class:`posenc.seq.CausalLM` builds with each; the SPE codes need linear attention), from
    the registry's snapshot (:mod:`posenc.cli.catalog`): the names are checked before torch loads."""
    return ("none", *(e.name for e in entries() if e.modality in LM_MODALITIES and not e.linear_only))


def _row_error(name: str, pair: str, known: tuple[str, ...], takes: str, modality: str) -> str | None:
    """Why ``name`` (not in ``known``) cannot be a row of ``pair``: one line, the closest names for a misspelt one."""
    found = next((e for e in entries() if e.name == name), None)
    if found is None:
        return unknown_name("encoding", name, known, listing=f"posenc list --modality {modality}")
    if found.linear_only:
        return f"{name!r} runs on linear attention only, and the {pair} pair trains softmax attention"
    if found.modality == modality:  # a vision encoding the vit pair lacks: a video one
        return f"{name!r} is a video encoding (a 3D grid); the {pair} pair trains on images"
    return f"{name!r} is a {found.modality} encoding; the {pair} pair takes {takes} (posenc list --modality {modality})"


def lm_encoding_error(name: str) -> str | None:
    """Why ``name`` cannot be a row of the lm pair (one line), or None."""
    known = lm_encoding_names()
    return None if name in known else _row_error(name, "lm", known, "sequence and time-series encodings", "seq")


def vit_encoding_names() -> tuple[str, ...]:
    """``none`` and every registered image encoding of softmax attention (a
    :class:`posenc.vision.ViT` builds with each at one image size; the video encodings need a
    clip, ``conv_spe2d`` linear attention), from the registry's snapshot."""
    return ("none", *(e.name for e in entries() if e.modality == "vision" and e.grid_ndim == 2 and not e.linear_only))


def vit_encoding_error(name: str) -> str | None:
    """Why ``name`` cannot be a row of the vit pair (one line), or None."""
    known = vit_encoding_names()
    return None if name in known else _row_error(name, "vit", known, "image encodings", "vision")


def gps_encoding_names() -> tuple[str, ...]:
    """``none`` and every registered graph encoding of softmax attention (a :class:`posenc.graph.GPS`
    builds with each, its structure precomputed for the batch), from the registry's snapshot."""
    return ("none", *(e.name for e in entries() if e.modality == "graph" and not e.linear_only))


def gps_encoding_error(name: str) -> str | None:
    """Why ``name`` cannot be a row of the gps pair (one line), or None."""
    known = gps_encoding_names()
    return None if name in known else _row_error(name, "gps", known, "graph encodings", "graph")


__all__ = [
    "ALL", "DEFAULT_MODELS", "DTYPES", "GPS_EIGENVECTORS", "GPS_ENCODINGS", "LM_ENCODINGS", "MODELS", "PROG",
    "VIT_ENCODINGS", "XT_LM", "ModelsBenchConfig", "convtran_repo_error", "gps_encoding_error", "gps_encoding_names",
    "lm_encoding_error", "lm_encoding_names", "vit_encoding_error", "vit_encoding_names",
]
