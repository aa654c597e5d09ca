"""Graph encodings: Laplacian eigenvector PE (``lap``), random-walk SE (``rwse``), landmark
distances (``landmark``), the shortest-path bias (``spd``), relative random-walk probabilities
(``rrwp``: a node encoding and a bias per head), the magnetic Laplacian PE of directed graphs
(``maglap``) and the stable expressive PE (``stable_pe``, Huang et al. 2024), with fast
batched/sparse precomputation and PyG transforms.

Precompute per graph (or per PyG ``Batch``), then hand the features to the encoding as explicit
positions::

    vecs, vals = laplacian_pe_batch(data.edge_index, data.batch, k=8)     # [N, 8], [G, 8]
    feats = torch.cat([vecs, vals[data.batch]], -1)[None]               # [1, N, 16]
    x = posenc.build("lap", dims=ModelDims(64, 4, 512)).encode_input(x, feats)

In your own PyG model, :class:`GPSLayer` is a ``GPSConv``-shaped layer (your message-passing
``conv`` beside posenc's block-diagonal global attention, with score-bias encodings such as ``spd``);
:class:`~posenc.graph.gps.GPS` is the reference model built from it.

The PyG transforms (:mod:`posenc.graph.transforms`), ``GPS`` and ``node_positions`` are imported
lazily, so that this package does not need torch_geometric.
"""

from .edges import check_edge_index, is_undirected, symmetrize
from .encodings import RWSE, LandmarkPE, LapPE
from .gps_layer import GPSLayer
from .landmark import landmark_features, landmark_pe, landmark_pe_batch, select_anchors
from .laplacian import laplacian, laplacian_pe, laplacian_pe_batch, random_sign_flip
from .maglap_encoding import MagLapPE
from .magnetic import magnetic_laplacian, magnetic_laplacian_pe, magnetic_laplacian_pe_batch
from .random_walk import random_walk_se, random_walk_se_batch
from .rrwp import rrwp, rrwp_batch, rrwp_diagonal, rrwp_positions
from .rrwp_bias import RRWPBias
from .shortest_path import ShortestPathBias, shortest_path_distances, shortest_path_distances_batch, spd_positions
from .signnet import SignNet
from .stable_pe import StablePE, stable_pe_features, stable_pe_features_batch, stable_pe_positions

_TRANSFORMS = (
    "AddLandmarkPE", "AddLaplacianPE", "AddRandomWalkSE", "add_landmark_pe_batch", "add_laplacian_pe_batch",
    "add_random_walk_se_batch",
)
_STRUCTURE_TRANSFORMS = (
    "AddMagneticLaplacianPE", "AddRRWP", "AddStablePE", "add_magnetic_laplacian_pe_batch", "add_rrwp_batch",
    "add_stable_pe_batch",
)
_GPS = ("GPS", "node_positions")


def __getattr__(name: str):
    # these need torch_geometric: imported on first use
    if name in _TRANSFORMS:
        from . import transforms

        return getattr(transforms, name)
    if name in _STRUCTURE_TRANSFORMS:
        from . import structure_transforms

        return getattr(structure_transforms, name)
    if name in _GPS:
        from . import gps

        return getattr(gps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "check_edge_index", "is_undirected", "symmetrize", "LandmarkPE", "LapPE", "RWSE", "landmark_features",
    "landmark_pe", "landmark_pe_batch", "select_anchors", "laplacian", "laplacian_pe",
    "laplacian_pe_batch", "random_sign_flip", "random_walk_se", "random_walk_se_batch", "ShortestPathBias",
    "shortest_path_distances", "shortest_path_distances_batch", "spd_positions", "SignNet", "GPSLayer",
    "MagLapPE", "magnetic_laplacian", "magnetic_laplacian_pe", "magnetic_laplacian_pe_batch", "rrwp", "rrwp_batch",
    "rrwp_diagonal", "rrwp_positions", "RRWPBias", "StablePE", "stable_pe_features", "stable_pe_features_batch",
    "stable_pe_positions", *_TRANSFORMS, *_STRUCTURE_TRANSFORMS, *_GPS,
]
