"""Train the GPS graph transformer with each graph encoding on a task, over several seeds, and print
a table of the test score (mean +- standard deviation) and the wall time of each run.

Issue 48's task rows: RRWP and SPE beside LapPE and RWSE on CSL and the molecules, and MagLapPE
against LapPE on a directed task (the depth of every node of a random DAG; attention only, no
message passing, so that the encoding alone carries the structure)::

    python scripts/graph_encoding_tasks.py --task csl --encodings none,lap,rwse,rrwp,stable_pe --seeds 3
    python scripts/graph_encoding_tasks.py --task molecules --encodings none,lap,rwse,rrwp,stable_pe --seeds 3
    python scripts/graph_encoding_tasks.py --task dag_depth --encodings none,lap,maglap,rrwp --seeds 3

Every run is seeded (data, initialisation, batches); ``--json PATH`` writes the rows. Scores:
accuracy for CSL and the DAG depths (per node), mean absolute error for the molecules.

``--bn-stats recomputed`` scores with BatchNorm statistics recomputed at the final weights (a plain
average over the training graphs) instead of the running averages kept during training (the default,
as the recorded rows). On CSL an encoding that is constant over each graph's nodes (RWSE, SPE) varies
very little within a batch, and the running means, which trail weights that still move, can sit
many batch standard deviations away: every test graph then falls into one class.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from posenc.graph import (
    GPS,
    AddLaplacianPE,
    AddMagneticLaplacianPE,
    AddRandomWalkSE,
    AddRRWP,
    AddStablePE,
    node_positions,
)
from posenc.graph import datasets as gd
from posenc.graph.directed_tasks import dag_depth_dataset
from posenc.graph.norm_stats import recompute_batch_norm_statistics
from torch_geometric.data import Batch

TASKS = ("csl", "molecules", "dag_depth")
# encoding -> (transform, constructor options); the directed graphs are symmetrised for LapPE and SPE
ENCODINGS = {
    "none": (None, {}),
    "lap": (lambda: AddLaplacianPE(8, random_sign=False, eigenvalues=True, symmetrize=True), {"k": 8}),
    "rwse": (lambda: AddRandomWalkSE(20), {"walk_length": 20}),
    "rrwp": (lambda: AddRRWP(8), {"walk_length": 8}),
    "stable_pe": (lambda: AddStablePE(32, symmetrize=True), {"k": 32}),
    "maglap": (lambda: AddMagneticLaplacianPE(8, q=0.25), {"k": 8}),
}


def load(task: str, seed: int, molecules: int) -> tuple[list, dict, int, int | None, int, str]:
    """``(graphs, splits, in_dim, edge_dim, out_dim, kind)`` of a task."""
    if task == "csl":
        graphs = gd.csl_dataset(15, seed=seed)
        return graphs, gd.csl_splits(15, test_per_class=5), 1, None, len(gd.CSL_SKIPS), "graph"
    if task == "molecules":
        graphs = gd.molecule_dataset(limit=molecules, cache_dir=gd.default_cache_dir())
        return graphs, gd.random_splits(len(graphs), seed=seed), gd.NODE_FEATURES, gd.EDGE_FEATURES, 1, "regression"
    graphs = dag_depth_dataset(600, seed=seed)
    return graphs, gd.random_splits(len(graphs), seed=seed), 1, None, 6, "node"


def score(model: GPS, graphs: list, kind: str) -> float:
    model.eval()
    with torch.no_grad():
        data = Batch.from_data_list(graphs)
        out = model.forward_data(data)
    model.train()
    if kind == "regression":
        return (out.squeeze(-1) - data.y).abs().mean().item()
    return (out.argmax(-1) == data.y).float().mean().item()


def run(task: str, encoding: str, seed: int, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    graphs, splits, in_dim, edge_dim, out_dim, kind = load(task, seed, args.molecules)
    transform, options = ENCODINGS[encoding]
    if transform is not None:
        make = transform()
        graphs = [make(g) for g in graphs]
    torch.manual_seed(seed)
    model = GPS(in_dim, out_dim, dim=args.dim, depth=args.depth, num_heads=args.heads, edge_dim=edge_dim,
                encoding=None if encoding == "none" else encoding, encoding_options=options or None,
                local="none" if task == "dag_depth" else "auto", task="node" if kind == "node" else "graph")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    train = [graphs[i] for i in splits["train"]]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(args.steps):
        pick = torch.randint(0, len(train), (args.batch_size,), generator=gen).tolist()
        data = Batch.from_data_list([train[i] for i in pick])
        out = model(data.x, data.edge_index, batch=data.batch, edge_attr=data.edge_attr if edge_dim else None,
                    positions=None if model.encoding is None else node_positions(data, model.encoding),
                    num_graphs=data.num_graphs)
        if kind == "regression":
            loss = F.l1_loss(out.squeeze(-1), data.y)
        else:
            loss = F.cross_entropy(out, data.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.bn_stats == "recomputed":
        recompute_batch_norm_statistics(model, train, batch_size=args.batch_size)
    test = score(model, [graphs[i] for i in splits["test"]], kind)
    row = {"task": task, "encoding": encoding, "seed": seed, "test": test, "seconds": time.perf_counter() - start}
    if args.bn_stats != "running":
        row["bn_stats"] = args.bn_stats
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--encodings", default="none,lap,rwse,rrwp,stable_pe,maglap")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--molecules", type=int, default=2000, help="molecules: the first N")
    parser.add_argument("--bn-stats", choices=("running", "recomputed"), default="running",
                        help="BatchNorm statistics at test time: the running averages of training, or recomputed "
                        "over the training graphs at the final weights")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for encoding in args.encodings.split(","):
        if encoding not in ENCODINGS:
            parser.error(f"--encodings: unknown {encoding!r}; choose from {', '.join(ENCODINGS)}")
        for seed in range(args.seeds):
            rows.append(run(args.task, encoding, seed, args))
            r = rows[-1]
            print(f"{args.task} {encoding} seed {seed}: test {r['test']:.4f} ({r['seconds']:.0f} s)", flush=True)
    metric = "MAE" if args.task == "molecules" else "accuracy"
    stats = "" if args.bn_stats == "running" else ", BatchNorm statistics recomputed"
    print(f"\n{args.task}, {args.seeds} seeds, {args.steps} steps{stats}: test {metric}")
    for encoding in args.encodings.split(","):
        values = [r["test"] for r in rows if r["encoding"] == encoding]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"  {encoding:10s} {statistics.mean(values):.4f} +- {sd:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
