"""Vision encodings (PEG, axial, 2D sinusoidal, learned 2D, 2D RoPE, DINOv3's RoPE, 2D relative
bias; for video 3D sinusoidal, axial 3D and 3D RoPE) and a reference ViT for images and videos that
takes any of them, or any sequence encoding over the raster patch order.

Importing this package registers the encodings (modality "vision"); ``import
posenc.vision.timm_models`` (or using :func:`replace_position_encoding`) registers the
``posenc_vit_*`` models with timm. 2D positions are
``[B or 1, T, 2]`` ``(row, col)`` per token; encodings built with ``num_prefix_tokens = P``
keep the first ``P`` tokens (class token, registers) out (see :mod:`posenc.vision.grid`). Video
positions are ``[B or 1, T, 3]`` ``(t, row, col)`` (:func:`grid_positions3d`).
"""

from .axial import AxialEncoding, resample_axis
from .axial3d import Axial3D
from .conv_spe2d import ConvSPE2d
from .grid import grid_positions, grid_positions3d, raster_positions, resample_grid
from .learned2d import Learned2D
from .peg import PEG
from .prefix import PatchTokensOnly
from .relbias2d import RelativePositionBias2D, resample_offset_table
from .rope2d import Rope2DAxial, Rope2DMixed, rope2d_frequencies
from .rope3d import Rope3D, rope3d_angles
from .rope_dinov3 import Rope2DDinoV3, dinov3_patch_coords
from .sincos2d import SinCos2D, sincos2d_grid, sincos2d_table
from .sincos3d import SinCos3D, sincos3d_table
from .vit import ViT


def __getattr__(name: str):
    # timm costs about 0.4 s to import: the integration (which registers posenc_vit_* with timm)
    # loads on first use, or with ``import posenc.vision.timm_models``.
    if name in ("replace_position_encoding", "timm_models"):
        import importlib

        timm_models = importlib.import_module(f"{__name__}.timm_models")
        return timm_models if name == "timm_models" else timm_models.replace_position_encoding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ConvSPE2d",
    "AxialEncoding", "resample_axis", "grid_positions", "raster_positions", "resample_grid", "Learned2D", "PEG",
    "PatchTokensOnly", "RelativePositionBias2D", "resample_offset_table", "Rope2DAxial", "Rope2DMixed",
    "rope2d_frequencies", "SinCos2D", "sincos2d_grid", "sincos2d_table", "ViT", "replace_position_encoding",
    "Axial3D", "grid_positions3d", "Rope3D", "rope3d_angles", "SinCos3D", "sincos3d_table",
    "Rope2DDinoV3", "dinov3_patch_coords",
]
