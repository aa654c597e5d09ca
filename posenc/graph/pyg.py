"""PyG, imported once without its import-time noise.

``import torch_geometric`` calls ``torch.jit.script`` on a few classes, and torch 2.14 warns
(``FutureWarning``) on every such call, so every graph command printed a warning about PyG's
internals that the user can do nothing about. Importing this module first imports PyG with that
one warning silenced, locally (the user's own ``torch.jit.script`` calls still warn).
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
    import torch_geometric  # noqa: F401

__all__ = ["torch_geometric"]
