"""BatchNorm statistics recomputed at a model's final weights: :func:`recompute_batch_norm_statistics`.

A GPS model (as PyG's ``GPSConv``) normalises with BatchNorm by default. In eval mode it uses the
running averages of training, which trail the weights: each step's batch was normalised at the
weights of its time. After a short training run they can lie far from what the final weights give
(on CSL, where an encoding that does not depend on the eigenbasis is one value per graph, every test
graph then falls into one class). Recomputing them over the training graphs at the final weights,
as ``torch.optim.swa_utils.update_bn`` does for averaged weights, scores the model as it is.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch import nn

from ..common.checks import check_int


def recompute_batch_norm_statistics(
    model: nn.Module, graphs: Sequence, *, batch_size: int, collate: Callable | None = None,
) -> int:
    """Set every BatchNorm's running mean and variance of ``model`` to their average over
    ``graphs`` (PyG ``Data``, run through ``model.forward_data(collate(chunk))`` in chunks of
    ``batch_size``, without gradients): each chunk counts once, as in BatchNorm's cumulative average
    (``momentum=None``). Only the BatchNorm modules run in training mode: dropout stays off, as when
    the model is scored. The momenta and every module's train/eval mode are restored. Returns how
    many BatchNorm modules were set (0: nothing to do).

    ``collate`` defaults to PyG's ``Batch.from_data_list``."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    if not (hasattr(graphs, "__len__") and hasattr(graphs, "__getitem__")) or isinstance(graphs, (str, bytes)):
        raise TypeError(f"graphs must be a sequence of PyG graphs (a list or a dataset); got {type(graphs).__name__}")
    if collate is not None and not callable(collate):
        raise TypeError(f"collate must be callable (graphs -> a PyG batch) or None; got {type(collate).__name__}")
    if len(graphs) == 0:
        raise ValueError("graphs must hold at least one graph (the statistics are averaged over them)")
    if not hasattr(model, "forward_data"):
        raise TypeError(f"model must have forward_data(batch) (posenc's GPS); got {type(model).__name__}")
    if collate is None:
        from torch_geometric.data import Batch

        collate = Batch.from_data_list
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    modes = [(m, m.training) for m in model.modules()]
    device = next(model.parameters()).device
    try:
        model.eval()
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the chunks
            m.train()  # BatchNorm updates its statistics in training mode only
        with torch.no_grad():
            for start in range(0, len(graphs), batch_size):
                model.forward_data(collate(list(graphs[start: start + batch_size])).to(device))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        for m, training in modes:
            m.training = training
    return len(norms)


def with_recomputed_batch_norm(model: nn.Module, graphs: Sequence, *, batch_size: int,
                               collate: Callable | None = None) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose BatchNorm statistics are recomputed over ``graphs``
    (:func:`recompute_batch_norm_statistics`); ``model`` itself, its running statistics included, is
    left as it is: scoring does not change what training resumes from or saves."""
    scored = copy.deepcopy(model)
    recompute_batch_norm_statistics(scored, graphs, batch_size=batch_size, collate=collate)
    return scored.eval()


__all__ = ["recompute_batch_norm_statistics", "with_recomputed_batch_norm"]
