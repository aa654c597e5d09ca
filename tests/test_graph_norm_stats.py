"""BatchNorm statistics recomputed at the final weights: each BatchNorm's running mean and variance
become those of its inputs over the graphs (one chunk: exactly their mean and unbiased variance;
several: the average over chunks, as BatchNorm's cumulative average), with dropout off and every
module's mode and momentum restored; bad arguments are one clear line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.data import Batch, Data

from posenc.graph.gps import GPS
from posenc.graph.norm_stats import recompute_batch_norm_statistics


def _graphs(count=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = 4 + i % 3
        ring = torch.arange(n)
        edges = torch.stack((torch.cat((ring, (ring + 1) % n)), torch.cat(((ring + 1) % n, ring))))
        out.append(Data(x=torch.randn(n, 3, generator=gen), edge_index=edges, y=torch.tensor([i % 2])))
    return out


def _model(dropout=0.0):
    torch.manual_seed(0)
    model = GPS(3, 2, dim=16, depth=2, num_heads=2, dropout=dropout)
    with torch.no_grad():  # statistics far from the data's, as after training
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.fill_(5.0)
                m.running_var.fill_(0.01)
    return model.eval()


def _inputs_of_each_norm(model, graphs, chunk):
    """The inputs each BatchNorm sees, per chunk, with only the BatchNorms in training mode."""
    seen, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm1d):
            hooks.append(m.register_forward_hook(lambda mod, inp, out, name=name: seen.setdefault(name, []).append(inp[0])))
    with torch.no_grad():
        for start in range(0, len(graphs), chunk):
            model.forward_data(Batch.from_data_list(graphs[start: start + chunk]))
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("chunk", [6, 4])
def test_the_statistics_are_those_of_the_inputs_at_the_final_weights(chunk):
    graphs, model = _graphs(), _model(dropout=0.3)
    probe = _model(dropout=0.3)
    probe.load_state_dict(model.state_dict())
    # a BatchNorm in training mode normalises by its chunk's own statistics, so the inputs of every
    # BatchNorm, layer after layer, are the same in the probe (BatchNorms training, dropout off) as in
    # the recomputation, whatever the running statistics were
    assert recompute_batch_norm_statistics(model, graphs, batch_size=chunk) == 6  # 3 norms a layer, 2 layers
    assert not model.training and all(not m.training for m in model.modules())
    assert all(m.momentum == 0.1 for m in model.modules() if isinstance(m, nn.BatchNorm1d))
    for m in probe.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.train()
    seen = _inputs_of_each_norm(probe, graphs, chunk)
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm1d):
            chunks = seen[name]
            mean = torch.stack([c.mean(0) for c in chunks]).mean(0)
            var = torch.stack([c.var(0, unbiased=True) for c in chunks]).mean(0)
            torch.testing.assert_close(m.running_mean, mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m.running_var, var, rtol=1e-5, atol=1e-6)


def test_recomputed_statistics_change_the_eval_output_and_a_model_without_batchnorm_is_left_alone():
    graphs, model = _graphs(), _model()
    batch = Batch.from_data_list(graphs)
    with torch.no_grad():
        before = model.forward_data(batch)
        recompute_batch_norm_statistics(model, graphs, batch_size=3)
        after = model.forward_data(batch)
    assert not torch.allclose(before, after)
    layer_norm = GPS(3, 2, dim=16, depth=1, num_heads=2, norm="layer").eval()
    state = {k: v.clone() for k, v in layer_norm.state_dict().items()}
    assert recompute_batch_norm_statistics(layer_norm, graphs, batch_size=3) == 0
    assert all(torch.equal(v, layer_norm.state_dict()[k]) for k, v in state.items())


def test_bad_arguments_are_one_clear_line():
    model = _model()
    with pytest.raises(ValueError, match="batch_size"):
        recompute_batch_norm_statistics(model, _graphs(), batch_size=0)
    with pytest.raises(ValueError, match="graphs must hold at least one graph"):
        recompute_batch_norm_statistics(model, [], batch_size=2)
    with pytest.raises(TypeError, match="graphs must be a sequence of PyG graphs.*got NoneType"):
        recompute_batch_norm_statistics(model, None, batch_size=2)
    with pytest.raises(TypeError, match="graphs must be a sequence of PyG graphs.*got str"):
        recompute_batch_norm_statistics(model, "graphs.pt", batch_size=2)
    with pytest.raises(TypeError, match="collate must be callable.*got int"):
        recompute_batch_norm_statistics(model, _graphs(), batch_size=2, collate=3)
    with pytest.raises(TypeError, match=r"forward_data\(batch\).*got BatchNorm1d"):
        recompute_batch_norm_statistics(nn.BatchNorm1d(3), _graphs(), batch_size=2)
