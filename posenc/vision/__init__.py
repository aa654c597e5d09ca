"""Vision encodings (PEG, axial, 2D sinusoidal, learned 2D, 2D RoPE, 2D relative bias) and a
reference ViT that takes any of them, or any sequence encoding over the raster patch order.

Importing this package registers the encodings (modality "vision").
"""

from .grid import grid_positions, raster_positions, resample_grid
from .learned2d import Learned2D
from .peg import PEG
from .prefix import PatchTokensOnly
from .sincos2d import SinCos2D, sincos2d_table
from .vit import ViT

__all__ = [
    "grid_positions", "raster_positions", "resample_grid", "Learned2D", "PEG", "PatchTokensOnly",
    "SinCos2D", "sincos2d_table", "ViT",
]
