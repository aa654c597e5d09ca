"""Vision encodings (PEG, axial, 2D sinusoidal, learned 2D, 2D RoPE, 2D relative bias) and a
reference ViT that takes any of them, or any sequence encoding over the raster patch order.

Importing this package registers the encodings (modality "vision"). 2D positions are
``[B or 1, T, 2]`` ``(row, col)`` per token; encodings built with ``num_prefix_tokens = P``
keep the first ``P`` tokens (class token, registers) out (see :mod:`posenc.vision.grid`).
"""

from .axial import AxialEncoding, resample_axis
from .conv_spe2d import ConvSPE2d
from .grid import grid_positions, raster_positions, resample_grid
from .learned2d import Learned2D
from .peg import PEG
from .prefix import PatchTokensOnly
from .relbias2d import RelativePositionBias2D, resample_offset_table
from .rope2d import Rope2DAxial, Rope2DMixed, rope2d_frequencies
from .sincos2d import SinCos2D, sincos2d_table
from .vit import ViT
from .timm_models import replace_position_encoding  # importing it registers posenc_vit_* with timm

__all__ = [
    "ConvSPE2d",
    "AxialEncoding", "resample_axis", "grid_positions", "raster_positions", "resample_grid", "Learned2D", "PEG",
    "PatchTokensOnly", "RelativePositionBias2D", "resample_offset_table", "Rope2DAxial", "Rope2DMixed",
    "rope2d_frequencies", "SinCos2D", "sincos2d_table", "ViT", "replace_position_encoding",
]
