"""Graph datasets that need no network: CSL generated on the fly, a molecular property regression
built from the NCI SMILES inside RDKit's wheel, and the user's own PyG data.

Every dataset is a list of PyG :class:`~torch_geometric.data.Data` objects; splits are index lists
from :func:`csl_splits` / :func:`random_splits`, deterministic for a given seed. Positional encodings
are not computed here: apply a transform (``posenc.graph.AddLaplacianPE``, ``AddRandomWalkSE`` or
PyG's own) to each graph, as the training command does.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import warnings
from pathlib import Path
from typing import Sequence

import torch

from . import pyg as _pyg  # noqa: F401  (first: PyG without its import-time FutureWarning)

# isort: split
from torch_geometric.data import Data

from ..training.checkpoint import save_atomic

# ------------------------------------------------------------------------------------------------
# CSL (Murphy et al. 2019, "Relational Pooling for Graph Representations")

CSL_NUM_NODES = 41
CSL_SKIPS: tuple[int, ...] = (2, 3, 4, 5, 6, 9, 11, 12, 13, 16)


def csl_graph(label: int, *, seed: int | None = None) -> Data:
    """One CSL graph: the circulant graph ``C_41(1, s)`` with ``s = CSL_SKIPS[label]``, its nodes
    relabelled by a random permutation drawn from a generator seeded with ``seed`` (identity when
    ``seed`` is None).

    Returns ``Data(x=ones [41, 1], edge_index [2, 164] (both directions), y=[label], num_nodes=41)``.
    Every node has degree 4, so 1-WL (and any message-passing net without an encoding) sees all ten
    classes as the same graph.
    """
    import networkx as nx

    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(CSL_SKIPS):
        raise ValueError(f"label must be an int in 0..{len(CSL_SKIPS) - 1}; got {label!r}")
    g = nx.circulant_graph(CSL_NUM_NODES, [1, CSL_SKIPS[label]])
    edges = torch.tensor(sorted(g.edges()), dtype=torch.long).t()
    if seed is None:
        perm = torch.arange(CSL_NUM_NODES)
    else:
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(CSL_NUM_NODES, generator=gen)
    # perm[i] is the new name of node i
    edges = perm[edges]
    edge_index = torch.cat([edges, edges.flip(0)], dim=1)
    order = torch.argsort(edge_index[0] * CSL_NUM_NODES + edge_index[1])
    return Data(
        x=torch.ones(CSL_NUM_NODES, 1), edge_index=edge_index[:, order],
        y=torch.tensor([label]), num_nodes=CSL_NUM_NODES,
    )


def csl_dataset(num_per_class: int = 15, *, seed: int = 0) -> list[Data]:
    """``10 * num_per_class`` CSL graphs, class-major (sample ``i`` has label ``i // num_per_class``),
    each with its own node permutation (seeded by ``(seed, i)``). The classic benchmark has 15 per
    class (150 graphs); since the graphs are generated, any number can be drawn."""
    if not isinstance(num_per_class, int) or num_per_class < 1:
        raise ValueError(f"num_per_class must be a positive int; got {num_per_class!r}")
    return [
        csl_graph(i // num_per_class, seed=_seed32("csl", seed, i))
        for i in range(num_per_class * len(CSL_SKIPS))
    ]


def csl_splits(num_per_class: int = 15, *, test_per_class: int = 5, val_per_class: int = 0) -> dict[str, list[int]]:
    """Stratified splits of :func:`csl_dataset`: in each class the first ``num_per_class - val - test``
    samples train, then ``val_per_class`` validate, the last ``test_per_class`` test (every sample
    has its own random permutation, so the order within a class carries no information)."""
    train_per_class = num_per_class - test_per_class - val_per_class
    if test_per_class < 1 or val_per_class < 0 or train_per_class < 1:
        raise ValueError(
            f"need test_per_class >= 1, val_per_class >= 0 and at least one training sample per class; got "
            f"num_per_class={num_per_class}, test_per_class={test_per_class}, val_per_class={val_per_class}"
        )
    out: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for c in range(len(CSL_SKIPS)):
        base = c * num_per_class
        out["train"] += range(base, base + train_per_class)
        out["val"] += range(base + train_per_class, base + train_per_class + val_per_class)
        out["test"] += range(base + train_per_class + val_per_class, base + num_per_class)
    return out


def random_splits(num: int, *, val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0) -> dict[str, list[int]]:
    """A seeded random train/val/test partition of ``range(num)`` (sizes rounded down for val and
    test, the rest trains)."""
    for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= f < 1:
            raise ValueError(f"{name} must be in [0, 1); got {f!r}")
    n_val, n_test = int(num * val_fraction), int(num * test_fraction)
    if num - n_val - n_test < 1:
        raise ValueError(f"no training samples left: num={num}, val_fraction={val_fraction}, test_fraction={test_fraction}")
    perm = torch.randperm(num, generator=torch.Generator().manual_seed(_seed32("split", seed, num))).tolist()
    return {"train": sorted(perm[n_val + n_test:]), "val": sorted(perm[:n_val]), "test": sorted(perm[n_val:n_val + n_test])}


# ------------------------------------------------------------------------------------------------
# Molecules from RDKit's NCI SMILES

ATOM_TYPES: tuple[str, ...] = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se")  # + "other"
MAX_DEGREE = 5  # degrees 0..5 (+ ">5")
FORMAL_CHARGES: tuple[int, ...] = (-1, 0, 1)  # + "other"
MAX_HYDROGENS = 3  # 0..3 (+ ">3")
BOND_TYPES: tuple[str, ...] = ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC")

NODE_FEATURES = (len(ATOM_TYPES) + 1) + (MAX_DEGREE + 2) + (len(FORMAL_CHARGES) + 1) + (MAX_HYDROGENS + 2) + 2
"""Width of a molecule's ``x``: one-hots of element, degree, formal charge and hydrogen count, then
aromatic and in-ring flags."""
EDGE_FEATURES = len(BOND_TYPES) + 1
"""Width of ``edge_attr``: one-hot bond type (single, double, triple, aromatic), then conjugated."""

MOLECULE_FORMAT = 1  # bump when the features or the target change: old cache files are then ignored


def nci_smiles_path() -> Path:
    """``rdkit/Data/NCI/first_5K.smi`` inside the installed RDKit (4,999 NCI compounds)."""
    import rdkit

    path = Path(rdkit.__file__).parent / "Data" / "NCI" / "first_5K.smi"
    if not path.is_file():
        raise FileNotFoundError(f"RDKit's NCI SMILES are not where expected: {path}")
    return path


def _sa_scorer():
    """RDKit Contrib's synthetic-accessibility scorer (Ertl & Schuffenhauer 2009), or None."""
    try:
        from rdkit.Contrib.SA_Score import sascorer  # type: ignore[import-not-found]
    except ImportError:
        return None
    return sascorer


def penalized_logp(mol, *, sa_scorer=None) -> float:
    """The ZINC benchmark's target, "constrained solubility" (Gomez-Bombarelli 2018, Jin 2018):
    Crippen logP minus the synthetic-accessibility score minus the number of atoms by which the
    largest ring exceeds six (``max(0, largest ring - 6)``). Unnormalised. Without an SA scorer
    the SA term is left out (logP minus the ring penalty)."""
    from rdkit.Chem import Crippen

    logp = Crippen.MolLogP(mol)
    rings = [len(r) for r in mol.GetRingInfo().AtomRings()]
    cycle = max(0, max(rings, default=0) - 6)
    sa = sa_scorer.calculateScore(mol) if sa_scorer is not None else 0.0
    return float(logp - sa - cycle)


def _one_hot(index: int, size: int) -> list[float]:
    out = [0.0] * size
    out[index] = 1.0
    return out


def atom_features(atom) -> list[float]:
    """The :data:`NODE_FEATURES` features of an RDKit atom."""
    sym = atom.GetSymbol()
    element = ATOM_TYPES.index(sym) if sym in ATOM_TYPES else len(ATOM_TYPES)
    degree = min(atom.GetDegree(), MAX_DEGREE + 1)
    charge = atom.GetFormalCharge()
    charge_i = FORMAL_CHARGES.index(charge) if charge in FORMAL_CHARGES else len(FORMAL_CHARGES)
    hydrogens = min(atom.GetTotalNumHs(), MAX_HYDROGENS + 1)
    return (
        _one_hot(element, len(ATOM_TYPES) + 1) + _one_hot(degree, MAX_DEGREE + 2)
        + _one_hot(charge_i, len(FORMAL_CHARGES) + 1) + _one_hot(hydrogens, MAX_HYDROGENS + 2)
        + [float(atom.GetIsAromatic()), float(atom.IsInRing())]
    )


def bond_features(bond) -> list[float]:
    """The :data:`EDGE_FEATURES` features of an RDKit bond (dative and other rare types count as single)."""
    name = str(bond.GetBondType())
    kind = BOND_TYPES.index(name) if name in BOND_TYPES else 0
    return _one_hot(kind, len(BOND_TYPES)) + [float(bond.GetIsConjugated())]


def molecule_graph(smiles: str, *, largest_fragment: bool = True, sa_scorer=None) -> Data | None:
    """A molecule as a graph: heavy atoms -> nodes (``x [N, NODE_FEATURES]``), bonds -> edges in
    both directions (``edge_index [2, 2E]``, ``edge_attr [2E, EDGE_FEATURES]``), target
    ``y [1]`` = :func:`penalized_logp`. With ``largest_fragment``, salts and solvents are dropped
    (the fragment with most heavy atoms stays). None if RDKit cannot parse ``smiles``."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    if largest_fragment:
        frags = Chem.GetMolFrags(mol, asMols=True)
        mol = max(frags, key=lambda m: m.GetNumAtoms())
    x = torch.tensor([atom_features(a) for a in mol.GetAtoms()], dtype=torch.float32).reshape(-1, NODE_FEATURES)
    src, dst, attrs = [], [], []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        f = bond_features(bond)
        src += [i, j]
        dst += [j, i]
        attrs += [f, f]
    edge_index = torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)
    edge_attr = torch.tensor(attrs, dtype=torch.float32).reshape(-1, EDGE_FEATURES)
    y = torch.tensor([penalized_logp(mol, sa_scorer=sa_scorer)], dtype=torch.float32)
    return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, y=y, num_nodes=x.shape[0])


def molecule_dataset(
    smiles: Sequence[str] | None = None,
    *,
    max_atoms: int = 50,
    min_atoms: int = 2,
    limit: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[Data]:
    """Molecules as graphs with the penalized-logP target (see :func:`molecule_graph`).

    Args:
        smiles: the SMILES to use; default the 4,999 NCI compounds shipped in RDKit's wheel
            (:func:`nci_smiles_path`).
        max_atoms: molecules (largest fragments) above this many heavy atoms are dropped (ZINC's
            molecules have 9..37), as are SMILES RDKit cannot parse.
        min_atoms: molecules below this many heavy atoms are dropped.
        limit: keep at most this many molecules (the first ones, in file order).
        cache_dir: where the built dataset is cached (written atomically, read back with
            ``weights_only=True``); None builds without caching. The file name hashes the SMILES,
            the filters, the feature format and whether the SA scorer was used, so a stale cache is
            never read. A cache file that cannot be read back whole (truncated, emptied, edited) is
            rebuilt, with a warning naming it and what was wrong.

    Returns a list of ``Data`` in input order; ``Data.smiles`` holds the input SMILES.
    """
    if not isinstance(max_atoms, int) or not isinstance(min_atoms, int) or not 1 <= min_atoms <= max_atoms:
        raise ValueError(f"need 1 <= min_atoms <= max_atoms (ints); got min_atoms={min_atoms!r}, max_atoms={max_atoms!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None; got {limit!r}")
    if smiles is None:
        lines = nci_smiles_path().read_text().splitlines()
        smiles = [ln.split()[0] for ln in lines if ln.strip()]
    else:
        smiles = list(smiles)
        bad = [s for s in smiles if not isinstance(s, str)]
        if bad:
            raise TypeError(f"smiles must be a sequence of str; got {type(bad[0]).__name__} {bad[0]!r}")
    scorer = _sa_scorer()
    key = {
        "format": MOLECULE_FORMAT, "max_atoms": max_atoms, "min_atoms": min_atoms, "limit": limit,
        "sa": scorer is not None, "smiles": hashlib.sha256("\n".join(smiles).encode()).hexdigest(),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = None if cache_dir is None else Path(cache_dir) / f"molecules-{digest}.pt"
    if path is not None and path.exists():
        cached = _read_cache(path)
        if cached is not None:
            return cached
    graphs: list[Data] = []
    for s in smiles:
        g = molecule_graph(s, sa_scorer=scorer)
        if g is None or not min_atoms <= g.num_nodes <= max_atoms:
            continue
        g.smiles = s
        graphs.append(g)
        if limit is not None and len(graphs) >= limit:
            break
    if not graphs:
        raise ValueError(f"no molecule passed the filters (min_atoms={min_atoms}, max_atoms={max_atoms}) out of {len(smiles)} SMILES")
    if path is not None:
        save_atomic(_pack(graphs), path)
    return graphs


def molecule_target_name() -> str:
    """What the molecular target is with the installed RDKit."""
    if _sa_scorer() is not None:
        return "penalized logP (Crippen logP - SA score - ring penalty)"
    return "Crippen logP - ring penalty (RDKit's SA scorer is not installed)"


def _pack(graphs: list[Data]) -> dict[str, object]:
    """Plain tensors and strings (loadable with ``weights_only=True``)."""
    return {
        "format": MOLECULE_FORMAT,
        "x": torch.cat([g.x for g in graphs]),
        "edge_index": torch.cat([g.edge_index for g in graphs], dim=1),
        "edge_attr": torch.cat([g.edge_attr for g in graphs]),
        "y": torch.cat([g.y for g in graphs]),
        "num_nodes": torch.tensor([g.num_nodes for g in graphs]),
        "num_edges": torch.tensor([g.edge_index.shape[1] for g in graphs]),
        "smiles": [g.smiles for g in graphs],
    }


def _read_cache(path: Path) -> list[Data] | None:
    """The graphs of the cache file ``path``, or None (with a warning saying why) when it cannot
    be read back whole: the caller then rebuilds it."""
    if not path.is_file():
        raise ValueError(f"molecule cache path {path} exists but is not a file; remove it or choose another cache_dir")
    try:
        blob = torch.load(path, weights_only=True)
        _check_pack(blob)
        return _unpack(blob)
    except Exception as exc:  # truncated (EOFError, RuntimeError), foreign (UnpicklingError), edited (ValueError)
        reason = str(exc).strip().splitlines()[0].split(". ")[0][:100] if str(exc).strip() else ""
        warnings.warn(
            f"molecule cache {path} is damaged ({type(exc).__name__}{': ' + reason if reason else ''}); rebuilding it",
            RuntimeWarning, stacklevel=3,
        )
        return None


def _check_pack(blob: object) -> None:
    """A ValueError unless ``blob`` is a whole :func:`_pack` of this format: every field present,
    the per-graph counts adding up to the stacked tensors, edges inside their graph."""
    fields = ("format", "x", "edge_index", "edge_attr", "y", "num_nodes", "num_edges", "smiles")
    if not isinstance(blob, dict) or any(k not in blob for k in fields):
        found = sorted(map(str, blob))[:8] if isinstance(blob, dict) else type(blob).__name__
        raise ValueError(f"expected the fields {', '.join(fields)}; found {found}")
    if blob["format"] != MOLECULE_FORMAT:
        raise ValueError(f"format {blob['format']!r}, expected {MOLECULE_FORMAT}")
    nodes, edges = blob["num_nodes"], blob["num_edges"]
    if not all(isinstance(blob[k], torch.Tensor) for k in fields[1:7]) or not isinstance(blob["smiles"], list):
        raise ValueError("a field has the wrong type")
    n = nodes.numel()
    if edges.numel() != n or blob["y"].shape[0] != n or len(blob["smiles"]) != n or n == 0:
        raise ValueError(f"{n} graphs, but {edges.numel()} edge counts, {blob['y'].shape[0]} targets, "
                         f"{len(blob['smiles'])} SMILES")
    if bool((nodes < 1).any()) or bool((edges < 0).any()):
        raise ValueError("negative or zero counts")
    total_nodes, total_edges = int(nodes.sum()), int(edges.sum())
    if blob["x"].shape[0] != total_nodes:
        raise ValueError(f"x has {blob['x'].shape[0]} rows for {total_nodes} nodes")
    if blob["edge_index"].shape != (2, total_edges) or blob["edge_attr"].shape[0] != total_edges:
        raise ValueError(f"edge_index {tuple(blob['edge_index'].shape)} / edge_attr {tuple(blob['edge_attr'].shape)} "
                         f"for {total_edges} edges")
    if total_edges:
        limit = nodes.repeat_interleave(edges)  # each edge's graph size
        ei = blob["edge_index"]
        if bool((ei < 0).any()) or bool((ei >= limit).any()):
            raise ValueError("an edge points outside its graph")
    for k in ("x", "edge_attr", "y"):
        t = blob[k]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{k} holds non-finite values")


def _unpack(blob: dict) -> list[Data]:
    nodes = blob["num_nodes"].tolist()
    edges = blob["num_edges"].tolist()
    xs = blob["x"].split(nodes)
    eis = blob["edge_index"].split(edges, dim=1)
    eas = blob["edge_attr"].split(edges)
    out = []
    for i, (x, ei, ea) in enumerate(zip(xs, eis, eas)):
        g = Data(x=x, edge_index=ei, edge_attr=ea, y=blob["y"][i:i + 1], num_nodes=nodes[i])
        g.smiles = blob["smiles"][i]
        out.append(g)
    return out


def default_cache_dir() -> Path:
    """``$POSENC_CACHE`` if set, else ``~/.cache/posenc``."""
    env = os.environ.get("POSENC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "posenc"


# ------------------------------------------------------------------------------------------------
# The user's own data


def load_user_dataset(spec: str, *, entry_point: bool = False) -> list[Data]:
    """The user's PyG graphs, from

    * (default) a file path: a list of ``Data`` saved with ``torch.save``, or the file written by
      ``InMemoryDataset.save(data_list, path)`` (PyG's ``(dict, slices, cls)`` format). Loaded with
      ``weights_only=True`` (PyG allowlists its data classes); a file that needs arbitrary pickles
      is refused with the reason, never loaded unsafely. A path is data: it is never imported,
      whatever lies beside it.
    * with ``entry_point=True`` only: Python code the user names explicitly, ``package.module:attr``
      -- a dataset object (anything indexable yielding ``Data``, such as an ``InMemoryDataset``), or
      a callable taking no arguments that returns one. The module is imported and may run code.

    Every item must be a ``Data`` with ``edge_index``, ``y`` and a node count; ``x`` is optional
    (nodes then get a constant feature of 1).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"dataset must be a non-empty path or dotted name; got {spec!r}")
    if entry_point:
        items = _import_dataset(spec)
    elif os.path.isfile(spec):
        items = _load_file(spec)
    else:
        what = "is a directory" if os.path.isdir(spec) else "does not exist"
        raise FileNotFoundError(f"dataset file {spec!r} {what} (Python code providing graphs is named explicitly: "
                                "--dataset-module package.module:attr)")
    graphs = [items[i] for i in range(len(items))]
    if not graphs:
        raise ValueError(f"dataset {spec!r} is empty")
    for i, g in enumerate(graphs):
        if not isinstance(g, Data):
            raise TypeError(f"dataset {spec!r}: item {i} is a {type(g).__name__}, expected torch_geometric.data.Data")
        if g.edge_index is None or g.y is None or g.num_nodes is None:
            raise ValueError(f"dataset {spec!r}: item {i} lacks edge_index, y or a node count")
        if g.x is None:
            g.x = torch.ones(g.num_nodes, 1)
    return graphs


def _load_file(path: str) -> Sequence[Data]:
    import pickle

    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    # PyG's own containers (Data, its storages and attribute descriptors) are allowed; nothing else.
    pyg_classes = [DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]
    try:
        with torch.serialization.safe_globals(pyg_classes):
            obj = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln] or [str(exc).splitlines()[0]]
        raise ValueError(
            f"dataset file {path!r} cannot be loaded with weights_only=True ({lines[0]}); "
            "save a list of PyG Data objects with torch.save, or use InMemoryDataset.save"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:  # truncated or not a torch.save file at all
        text = str(exc).strip().splitlines()
        raise ValueError(f"dataset file {path!r} is not a readable torch.save file ({type(exc).__name__}: "
                         f"{text[0][:160] if text else 'no message'}); is it truncated?") from None
    if isinstance(obj, tuple) and len(obj) in (2, 3) and isinstance(obj[0], dict):  # InMemoryDataset.save
        from torch_geometric.data import InMemoryDataset

        data_cls = obj[2] if len(obj) == 3 else Data
        ds = InMemoryDataset()
        ds.data, ds.slices = data_cls.from_dict(obj[0]), obj[1]
        if ds.slices is None:  # a single graph
            return [ds.data]
        return ds
    if isinstance(obj, Data):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return obj
    raise TypeError(f"dataset file {path!r} holds a {type(obj).__name__}; expected a list of Data or InMemoryDataset.save output")


def _import_dataset(spec: str) -> Sequence[Data]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"dataset entry point {spec!r} must be 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"dataset entry point {spec!r}: module {module_name!r} cannot be imported ({exc})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"dataset {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__")):
        obj = obj()
    if not hasattr(obj, "__len__") or not hasattr(obj, "__getitem__"):
        raise TypeError(f"dataset {spec!r} is a {type(obj).__name__}; expected a dataset (indexable, with a length) or a callable returning one")
    return obj


def _seed32(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest(), "little")

