"""The ViT's rule for encodings (``posenc train vision``, ``posenc bench resolution``, the demo's
vision part)."""

from __future__ import annotations

from ..options import encoding_error

# Registered encodings a ViT takes: the 2D (or 3D, on video) ones, and the 1D ones over the
# flattened patch order.
VIT_MODALITIES = ("vision", "seq")
# the digits tasks of posenc.vision.data.TASKS, named here without torch (tests/test_errors_before_torch.py
# checks that they agree)
DIGIT_TASKS = ("class", "where")


def vit_encoding_error(name: str, flag: str = "--encoding", feature_map: str | None = None, *,
                   video: bool = False) -> str | None:
    """What is wrong with an encoding name for a ViT on images (or on ``video``), or None ("none"
    means no encoding): the shared rule (:func:`posenc.cli.options.encoding_error`), then the grid's
    rank: vision encodings over 3D grids (``grid_ndim = 3``) are for video only, the 2D ones for
    images only."""
    error = encoding_error(name, VIT_MODALITIES, model="a ViT", bidirectional=True, flag=flag, feature_map=feature_map)
    if error is not None or name == "none":
        return error
    from ..catalog import entry

    info = entry(name)
    if info.modality == "vision":
        ndim = info.grid_ndim
        if video and ndim != 3:
            return (f"{flag}: {name!r} is a 2D (image) encoding; with --video use a 3D one (sincos3d, axial3d, rope3d), "
                    "a seq encoding over the flattened (t, row, col) order, or none")
        if not video and ndim == 3:
            return f"{flag}: {name!r} is a 3D (video) encoding of (t, row, col) positions (posenc train vision --video)"
    return None


