"""``posenc train graph``: train a GPS-style graph transformer with one graph encoding.

::

    posenc train graph --dataset csl --encoding lap             # CSL classification, test accuracy
    posenc train graph --dataset molecules --encoding rwse      # penalized logP regression, test MAE
    posenc train graph --dataset csl --encoding landmark --landmark-k 8 --landmark-anchors random
    posenc train graph --dataset my_graphs.pt --encoding spd    # your own PyG graphs
    torchrun --standalone --nproc_per_node 2 --no-python posenc train graph --dataset csl --encoding rwse

Datasets (see :mod:`posenc.graph.datasets`): ``csl`` (generated: ``--csl-per-class`` graphs per
class, the last ``--csl-test-per-class`` of each class test); ``molecules`` (NCI SMILES shipped in
RDKit's wheel, target penalized logP, random 80/10/10 split, cached under ``--cache-dir``); or a
file holding a list of PyG ``Data`` (loaded with ``weights_only=True``, never imported; Python
code that provides graphs is named explicitly with ``--dataset-module package.module:attr``) (integer ``y``: classification, float ``y``:
regression with the L1 loss, as GPS on ZINC; one ``y`` per graph, or per node with ``--task node``).

Encodings are precomputed once per graph with posenc's transforms: ``lap`` (``--lap-k``
eigenvectors and eigenvalues, canonical signs; the encoding flips signs at random in training),
``rwse`` (``--walk-length`` return probabilities), ``landmark`` (``1/(d+1)`` to ``--landmark-k``
anchors per graph, chosen by ``--landmark-anchors``: top degree, ties to the lower node index, or
at random from ``--seed``; graphs with fewer nodes are zero-padded); ``spd`` is computed per batch
from the edges.
Training goes through :class:`posenc.training.trainer.Trainer`: progress bar, ``metrics.jsonl`` and
atomic checkpoints in ``--out``, ``--resume``, DDP under ``torchrun``. The final evaluation reports
accuracy (classification) or MAE (regression) on the validation and test splits.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..argtypes import nonnegative_int, positive_int
from ..options import (
    add_model_arguments,
    add_optim_arguments,
    add_run_arguments,
    encoding_error,
    out_dir_error,
    train_config,
)
from ..sizes import Work, defaults_of, sequence, size_error, transformer
from ...training.report import format_table
from . import run_checked, run_dir_error, write_results

PROG = "posenc train graph"
BUILTIN = ("csl", "molecules")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="csl, molecules, or a file of PyG graphs (a torch.save'd list of Data, or "
                                          "InMemoryDataset.save output; loaded as data, never imported)")
    source.add_argument("--dataset-module", metavar="MODULE:ATTR",
                        help="Python code providing the graphs: an importable dataset object or a callable returning "
                             "one (imported and run: name only code you trust)")
    parser.add_argument("--encoding", required=True, help="a graph encoding (posenc list --modality graph), or 'none'")
    parser.add_argument("--task", choices=("graph", "node"), default="graph", help="one target per graph or per node")
    parser.add_argument("--lap-k", type=positive_int, default=8, help="lap: eigenvectors per node (the API's k)")
    parser.add_argument("--lap-sign", choices=("flip", "signnet"), default="flip",
                        help="lap: random sign flips in training, or SignNet")
    parser.add_argument("--walk-length", type=positive_int, default=20,
                        help="rwse: random-walk steps K (the API's walk_length; 20 as GraphGPS)")
    parser.add_argument("--landmark-k", type=positive_int, default=8, help="landmark: anchor nodes per graph (the API's k)")
    parser.add_argument("--landmark-anchors", choices=("degree", "random"), default="degree",
                        help="landmark: anchors of largest degree (ties: lower node index) or random (seeded by --seed)")
    parser.add_argument("--spd-max-distance", type=nonnegative_int, default=20,
                        help="spd: distances beyond share one bucket (the API's max_distance)")
    parser.add_argument("--csl-per-class", type=positive_int, default=15, help="csl: graphs per class")
    parser.add_argument("--csl-test-per-class", type=positive_int, default=5, help="csl: test graphs per class")
    parser.add_argument("--molecules-limit", type=positive_int, default=None,
                        help="molecules: use only the first N molecules (default all ~5,000)")
    parser.add_argument("--cache-dir", default=None, help="molecules: cache directory (default $POSENC_CACHE or ~/.cache/posenc)")
    parser.add_argument("--epochs", type=positive_int, default=None, help="training epochs (default: csl 60, else 10); or give --steps")
    add_optim_arguments(parser, steps=None, batch_size=None, lr=1e-3, weight_decay=0.01,
                        steps_help="optimizer steps (overrides --epochs)",
                        batch_help="graphs per batch and process (default: csl 10, else 64)")
    add_model_arguments(parser, dim=64, depth=3, heads=4)
    parser.add_argument("--local", choices=("auto", "gine", "gin", "none"), default="auto",
                        help="message-passing layer: auto = GINE with edge features, GIN without")
    parser.add_argument("--pool", choices=("mean", "add", "max"), default="mean", help="graph pooling")
    parser.add_argument("--bn-stats", choices=("running", "recomputed"), default="running",
                        help="BatchNorm statistics when scoring: the running averages of training, or recomputed over "
                             "the training graphs at the weights scored (on a copy: the trained model keeps its own)")
    add_run_arguments(parser)


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (before anything is loaded), or None."""
    error = encoding_error(args.encoding, ("graph",), model="the GPS graph transformer", bidirectional=True)
    if error is not None:
        return error
    error = _dataset_error(args.dataset)
    if error is not None:
        return error
    if args.dataset in BUILTIN and args.task != "graph":
        return f"--task node: dataset {args.dataset!r} has one target per graph"
    if args.csl_test_per_class >= args.csl_per_class:
        return (f"--csl-test-per-class ({args.csl_test_per_class}) must be below --csl-per-class "
                f"({args.csl_per_class}) to leave training graphs")
    if args.dim % args.heads:
        return f"--dim ({args.dim}) must be divisible by --heads ({args.heads})"
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments))
    if error is not None:
        return error
    return out_dir_error(args.out, args.resume) or run_dir_error(args.out)


# the size flags of the policy (posenc.cli.sizes)
SIZE_FLAGS = ("steps", "epochs", "batch_size", "dim", "depth", "csl_per_class", "molecules_limit", "lap_k",
              "walk_length", "landmark_k")
# graphs and their nodes, for the estimate: CSL's 41-node circulant graphs (10 classes), the
# molecules (about 5,000, about 30 atoms), a user's dataset (unknown before it is read)
CSL_NODES, MOLECULES, MOLECULE_NODES, USER_GRAPHS = 41, 5000, 30, 1000


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): the encodings precomputed per graph (an eigensolver,
    ``--walk-length`` dense products, a search per anchor; RRWP's pairs, K values each), the
    training steps of a GPS over dense per-graph attention, the final evaluation; memory: the graphs' encodings."""
    if args.dataset == "csl":
        graphs, nodes = 10 * args.csl_per_class, CSL_NODES
    elif args.dataset == "molecules":
        graphs, nodes = min(args.molecules_limit or MOLECULES, MOLECULES), MOLECULE_NODES
    else:
        graphs, nodes = USER_GRAPHS, MOLECULE_NODES
    batch = args.batch_size or (10 if args.dataset == "csl" else 64)
    steps = args.steps or (args.epochs or (60 if args.dataset == "csl" else 10)) * max(1, graphs // batch)
    per_graph = {"lap": 10 * nodes ** 3, "rwse": args.walk_length * 2 * nodes ** 3,
                 "landmark": args.landmark_k * nodes ** 2, "rrwp": 8 * 2 * nodes ** 3, "maglap": 40 * nodes ** 3,
                 "stable_pe": 10 * nodes ** 3}.get(args.encoding, 0)
    features = {"lap": 2 * args.lap_k, "rwse": args.walk_length, "landmark": args.landmark_k,
                "rrwp": 8 * nodes, "maglap": 3 * 8, "stable_pe": 2 * 16}.get(args.encoding, 0)
    encodings = Work(graphs * per_graph, 0, 4 * graphs * nodes * (features + 16))
    train = transformer(batch, nodes, args.dim, args.depth, steps=steps)
    evaluate = transformer(graphs, nodes, args.dim, args.depth, train=False)
    return sequence([encodings, train, evaluate])


def _dataset_error(dataset: str | None) -> str | None:
    """A ``--dataset`` that is neither built in nor an existing file (the closest built-in names), or
    None; ``--dataset-module`` (None here) is imported when the run starts."""
    import os

    from ..catalog import suggest

    if dataset is None or dataset in BUILTIN or os.path.exists(dataset):
        return None
    hint = suggest(dataset, BUILTIN)
    if hint:
        return f"--dataset: {dataset!r} is not a built-in dataset{hint}, and no file of that name exists"
    return f"--dataset: file {dataset!r} does not exist (the built-in datasets: {', '.join(BUILTIN)})"


def run(args: argparse.Namespace) -> int:
    # FileNotFoundError too: a user dataset path that does not exist
    return run_checked(PROG, args, check, _train, (ValueError, TypeError, OSError))


# ------------------------------------------------------------------------------------------------
# Data


@dataclass
class GraphTask:
    """A dataset ready for training: graphs with their encodings precomputed, and what to predict."""

    name: str
    graphs: list
    splits: dict[str, list[int]]
    in_dim: int
    edge_dim: int | None
    out_dim: int
    kind: str  # "classification" or "regression"
    level: str  # "graph" or "node"

    @property
    def metric(self) -> str:
        return "accuracy" if self.kind == "classification" else "mae"

    def subset(self, split: str) -> list:
        return [self.graphs[i] for i in self.splits[split]]


def load_task(args: argparse.Namespace) -> GraphTask:
    """The dataset of ``--dataset`` with its splits (deterministic in ``--seed``)."""
    from ...graph import datasets as gd

    if args.dataset == "csl":
        graphs = gd.csl_dataset(args.csl_per_class, seed=args.seed)
        splits = gd.csl_splits(args.csl_per_class, test_per_class=args.csl_test_per_class)
        return GraphTask("csl", graphs, splits, 1, None, len(gd.CSL_SKIPS), "classification", "graph")
    if args.dataset == "molecules":
        cache = args.cache_dir if args.cache_dir is not None else gd.default_cache_dir()
        graphs = gd.molecule_dataset(limit=args.molecules_limit, cache_dir=cache)
        splits = gd.random_splits(len(graphs), seed=args.seed)
        return GraphTask("molecules", graphs, splits, gd.NODE_FEATURES, gd.EDGE_FEATURES, 1, "regression", "graph")
    if args.dataset_module is not None:
        from ..errors import code_notice

        code_notice(PROG, "--dataset-module", f"module {args.dataset_module.partition(':')[0]!r}")
        try:
            graphs = gd.load_user_dataset(args.dataset_module, entry_point=True)
        except (ValueError, TypeError) as exc:  # the library names the entry point; the user typed a flag
            raise type(exc)(f"--dataset-module {args.dataset_module}: {exc}") from None
        return _user_task(args.dataset_module, graphs, args.task, args.seed)
    graphs = gd.load_user_dataset(args.dataset)
    return _user_task(args.dataset, graphs, args.task, args.seed)


def _user_task(name: str, graphs: list, level: str, seed: int) -> GraphTask:
    import torch

    from ...graph import datasets as gd

    in_dims = {g.x.shape[-1] if g.x.dim() > 1 else 1 for g in graphs}
    if len(in_dims) != 1:
        raise ValueError(f"dataset {name!r}: node feature widths differ between graphs ({sorted(in_dims)})")
    for g in graphs:
        if g.x.dim() == 1:
            g.x = g.x.view(-1, 1)
        g.x = g.x.float()
    with_edges = [getattr(g, "edge_attr", None) is not None for g in graphs]
    edge_dim = None
    if all(with_edges):
        widths = {g.edge_attr.view(g.edge_attr.shape[0], -1).shape[1] for g in graphs}
        if len(widths) == 1:
            edge_dim = widths.pop()
            for g in graphs:
                g.edge_attr = g.edge_attr.view(g.edge_attr.shape[0], -1).float()
    ys = [g.y for g in graphs]
    if level == "graph":
        bad = [i for i, y in enumerate(ys) if y.numel() != 1]
        if bad:
            raise ValueError(f"dataset {name!r}: graph {bad[0]} has {ys[bad[0]].numel()} targets; "
                             "the graph task needs one y per graph (use --task node for one per node)")
    else:
        bad = [i for i, g in enumerate(graphs) if g.y.numel() != g.num_nodes]
        if bad:
            raise ValueError(f"dataset {name!r}: graph {bad[0]} has {graphs[bad[0]].y.numel()} targets for "
                             f"{graphs[bad[0]].num_nodes} nodes; --task node needs one y per node")
    classification = not ys[0].dtype.is_floating_point
    if classification:
        all_y = torch.cat([y.reshape(-1) for y in ys])
        if int(all_y.min()) < 0:
            raise ValueError(f"dataset {name!r}: class labels must be >= 0, got {int(all_y.min())}")
        out_dim = int(all_y.max()) + 1
    else:
        out_dim = 1
    for g in graphs:
        g.y = g.y.reshape(-1).long() if classification else g.y.reshape(-1).float()
    splits = gd.random_splits(len(graphs), seed=seed)
    kind = "classification" if classification else "regression"
    return GraphTask(name, graphs, splits, next(iter(in_dims)), edge_dim, out_dim, kind, level)


def add_encoding_features(
    graphs: list, encoding: str, *, lap_k: int = 8, walk_length: int = 20, landmark_k: int = 8,
    landmark_anchors: str = "degree", seed: int = 0,
) -> list:
    """Precompute the per-node features an encoding reads (see
    :func:`posenc.graph.gps.node_positions`): ``lap`` with canonical signs and the eigenvalues,
    ``rwse``, ``landmark`` (random anchors drawn graph by graph from a generator seeded with
    ``seed``), and ``rrwp``, ``maglap`` and ``stable_pe`` at their encodings' default sizes (the
    transforms' defaults: 8 walk steps, 8 eigenvectors with q = 0.25, 16 eigenpairs; no flag
    changes them); ``spd`` computes its distances from each batch, ``none`` reads nothing.
    Modifies and returns ``graphs``."""
    from ...graph.gps import LANDMARK_ATTR, LAP_ATTR, RWSE_ATTR
    from ...graph.structure_transforms import AddMagneticLaplacianPE, AddRRWP, AddStablePE
    from ...graph.transforms import AddLandmarkPE, AddLaplacianPE, AddRandomWalkSE

    if encoding == "lap":
        transform = AddLaplacianPE(lap_k, LAP_ATTR, random_sign=False, eigenvalues=True)
    elif encoding == "rwse":
        transform = AddRandomWalkSE(walk_length, RWSE_ATTR)
    elif encoding == "landmark":
        transform = AddLandmarkPE(landmark_k, LANDMARK_ATTR, anchors=landmark_anchors, seed=seed)
    elif encoding == "rrwp":
        transform = AddRRWP()
    elif encoding == "maglap":
        transform = AddMagneticLaplacianPE()
    elif encoding == "stable_pe":
        transform = AddStablePE()
    else:
        return graphs
    return [transform(g) for g in graphs]


def encoding_options(args: argparse.Namespace) -> dict:
    if args.encoding == "lap":
        return {"k": args.lap_k, "sign": args.lap_sign}
    if args.encoding == "rwse":
        return {"walk_length": args.walk_length}
    if args.encoding == "landmark":
        return {"k": args.landmark_k}
    if args.encoding == "spd":
        return {"max_distance": args.spd_max_distance}
    return {}


def collate(graphs: list):
    from torch_geometric.data import Batch

    return Batch.from_data_list(graphs)


def make_loss(task: GraphTask):
    """``loss_fn(model, batch) -> (loss, extras)`` for the Trainer: cross-entropy or L1."""
    import torch.nn.functional as F


    def loss_fn(model, batch):
        out = model(batch.x, batch.edge_index, batch=batch.batch, edge_attr=_edge_attr(model, batch),
                    positions=_positions(model, batch))
        if task.kind == "classification":
            loss = F.cross_entropy(out, batch.y)
            return loss, {"accuracy": (out.argmax(-1) == batch.y).float().mean().item()}
        return F.l1_loss(out.squeeze(-1), batch.y), {}

    return loss_fn


def _unwrap(model):
    return getattr(model, "module", model)  # DDP


def _edge_attr(model, batch):
    return batch.edge_attr if _unwrap(model).edge_dim is not None else None


def _positions(model, batch):
    from ...graph.gps import node_positions

    enc = _unwrap(model).encoding
    return None if enc is None else node_positions(batch, enc)


def evaluate_split(model, graphs: list, task: GraphTask, *, batch_size: int = 128) -> float:
    """Accuracy or mean absolute error of ``model`` on ``graphs`` (model in eval mode)."""
    import torch

    with torch.no_grad():
        device = next(model.parameters()).device
        total, count = 0.0, 0
        for i in range(0, len(graphs), batch_size):
            batch = collate(graphs[i:i + batch_size]).to(device)
            out = model.forward_data(batch)
            if task.kind == "classification":
                total += (out.argmax(-1) == batch.y).sum().item()
            else:
                total += (out.squeeze(-1) - batch.y).abs().sum().item()
            count += batch.y.numel()
        return total / max(count, 1)


def default_schedule(task: GraphTask, args: argparse.Namespace) -> tuple[int, int]:
    """``(steps, batch_size)`` from ``--steps`` / ``--epochs`` / ``--batch-size`` and the dataset."""
    batch_size = args.batch_size or (10 if task.name == "csl" else 64)
    num_train = len(task.splits["train"])
    if batch_size > num_train:
        raise ValueError(f"--batch-size {batch_size} exceeds the {num_train} training graphs")
    if args.steps is not None:
        return args.steps, batch_size
    epochs = args.epochs or (60 if task.name == "csl" else 10)
    return epochs * (num_train // batch_size), batch_size


# ------------------------------------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    import torch

    from ...graph.gps import GPS
    from ...graph.norm_stats import with_recomputed_batch_norm
    from ...training.trainer import Trainer

    task = load_task(args)
    task.graphs = add_encoding_features(
        task.graphs, args.encoding, lap_k=args.lap_k, walk_length=args.walk_length, landmark_k=args.landmark_k,
        landmark_anchors=args.landmark_anchors, seed=args.seed,
    )
    steps, batch_size = default_schedule(task, args)
    model_config = {
        "in_dim": task.in_dim, "out_dim": task.out_dim, "dim": args.dim, "depth": args.depth,
        "num_heads": args.heads, "edge_dim": task.edge_dim,
        "encoding": None if args.encoding == "none" else args.encoding,
        "encoding_options": encoding_options(args), "local": args.local, "task": task.level,
        "pool": args.pool, "dropout": args.dropout,
    }
    torch.manual_seed(args.seed)
    model = GPS(**model_config)
    train_graphs = task.subset("train")
    eval_sets = {s: task.subset(s) for s in ("val", "test") if task.splits[s]}

    def evaluate(m) -> dict[str, float]:
        if args.bn_stats == "recomputed":
            m = with_recomputed_batch_norm(m, train_graphs, batch_size=batch_size, collate=collate)
        return {f"{s}_{task.metric}": evaluate_split(m, graphs, task) for s, graphs in eval_sets.items()}

    config = train_config(args, steps=steps, batch_size=batch_size)
    trainer = Trainer(model, train_graphs, make_loss(task), config, eval_fn=evaluate,
                      collate_fn=collate, model_config=model_config)
    metrics = trainer.fit()
    if not trainer.is_main:
        return 0
    params = sum(p.numel() for p in model.parameters())
    sizes = ", ".join(f"{s} {len(task.splits[s])}" for s in ("train", "val", "test") if task.splits[s])
    print(f"\nGPS with encoding {args.encoding} on {task.name} ({sizes} graphs): {params / 1e3:.1f}k parameters, "
          f"{trainer.step} steps, final train loss {metrics['train_loss']:.4f}")
    what = "accuracy (higher is better)" if task.metric == "accuracy" else "mean absolute error (lower is better)"
    stats = "" if args.bn_stats == "running" else ", BatchNorm statistics recomputed over the training graphs"
    print(f"final evaluation{stats}, {what}:")
    rows = [[s, f"{metrics[f'{s}_{task.metric}']:.4f}"] for s in eval_sets]
    print(format_table(["split", task.metric], rows, align="lr"))
    scores = {f"{s}_{task.metric}": metrics[f"{s}_{task.metric}"] for s in eval_sets}
    result = {"command": "train graph", "encoding": args.encoding, "model_config": model_config,
              "train_config": config.to_dict(), "steps": trainer.step, "train_loss": metrics["train_loss"],
              "metrics": scores, "dataset": task.name, "metric": task.metric, "bn_stats": args.bn_stats, **scores}
    if task.name == "molecules":
        from ...graph.datasets import molecule_target_name

        result["target"] = molecule_target_name()
    write_results(args.out, result)
    return 0
