"""Graph encodings: Laplacian eigenvector PE (``lap``), random-walk SE (``rwse``), landmark
distances (``landmark``) and the shortest-path bias (``spd``), with fast batched/sparse
precomputation and PyG transforms.

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
from .random_walk import random_walk_se, random_walk_se_batch
from .shortest_path import ShortestPathBias, shortest_path_distances, shortest_path_distances_batch, spd_positions
from .signnet import SignNet

_TRANSFORMS = (
    "AddLandmarkPE", "AddLaplacianPE", "AddRandomWalkSE", "add_landmark_pe_batch", "add_laplacian_pe_batch",
    "add_random_walk_se_batch",
)
_GPS = ("GPS", "node_positions")


def __getattr__(name: str):
    # these need torch_geometric: imported on first use
    if name in _TRANSFORMS:
        from . import transforms

        return getattr(transforms, name)
    if name in _GPS:
        from . import gps

        return getattr(gps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "check_edge_index", "is_undirected", "symmetrize", "LandmarkPE", "LapPE", "RWSE", "landmark_features",
    "landmark_pe", "landmark_pe_batch", "select_anchors", "laplacian", "laplacian_pe",
    "laplacian_pe_batch", "random_sign_flip", "random_walk_se", "random_walk_se_batch", "ShortestPathBias",
    "shortest_path_distances", "shortest_path_distances_batch", "spd_positions", "SignNet", "GPSLayer",
    *_TRANSFORMS, *_GPS,
]
