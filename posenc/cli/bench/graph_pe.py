"""``posenc bench graph-pe``: precomputing Laplacian and random-walk encodings, posenc against
PyG's transforms in the same run.

Workloads:

``molecules``
    1,000 molecule-sized graphs (``--graphs``): the heavy-atom graphs of the first NCI SMILES
    RDKit ships (largest fragment), or, without RDKit, deterministic molecule-like graphs (a
    random tree with a few ring closures, 10-40 nodes). PyG applies its transform graph by graph
    (as a dataset ``transform`` does); posenc runs once over the collated ``Batch``
    (``laplacian_pe_batch``, ``random_walk_se_batch``) and, for reference, its drop-in transforms
    graph by graph.
``large``
    one random graph with 10,000 nodes and 50,000 undirected edges (``--nodes``, ``--edges``).
    PyG's random walk on it runs in a child process that is stopped after ``--pyg-timeout``
    seconds or when its resident memory passes ``--pyg-memory-gb`` (PyG's K=20 needs about
    17 GB), and is then reported as "timeout (> N s)" or "memory (> N GB)".

Encodings: LapPE with ``k = --lap-k`` (8) and RWSE with ``K = --walk-length`` (20). Each row gives
the median wall time over ``--repeats`` rounds (interleaved, after a warm-up round), the process
CPU time of one round (user + sys, all threads: on a busy shared machine ``cpu / threads`` is the
better estimate of the quiet wall time), the speed-up of posenc over PyG measured in the same run,
and a check of the values against PyG's: RWSE the largest absolute difference; LapPE the share of
graphs whose PyG eigenvectors satisfy ``L w_j = lambda_j w_j`` (within 1e-3) with posenc's
eigenvalues ``lambda_j``, column by column: the two then agree up to sign, and up to a rotation
inside a repeated eigenvalue (molecules have many).

``--threads N`` sets torch's thread count for the whole run (PyG's child process too), by the one
policy of :mod:`posenc.common.threads` (default: one fewer than the cores). On a shared,
oversubscribed machine many small multi-threaded operations wait for descheduled threads;
posenc's batched and blocked paths run their operations on one intra-op thread each and spread
independent parts over the threads instead.
``--background-load`` runs one busy process (a Python loop on one core, see :mod:`.load`) for the
whole run, to measure exactly that; the header and the JSON say whether it was on and give the
load average at the end of the run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..argtypes import positive_float, positive_int, seed_value
from ..errors import usage_error
from ..outputs import out_error, write_file, write_json_file
from ..sizes import CALL_SECONDS, Work, add_allow_large, defaults_of, size_error
from ...training.report import Progress, format_table
from .load import background_load, describe, format_load_average, load_average
from .timing import error_text, time_interleaved

if TYPE_CHECKING:
    import torch

PROG = "posenc bench graph-pe"

LAP, RWSE = "LapPE", "RWSE"


@dataclass(frozen=True)
class GraphPEBenchConfig:
    graphs: int = 1000
    nodes: int = 10_000
    edges: int = 50_000
    lap_k: int = 8
    walk_length: int = 20
    repeats: int = 3
    pyg_timeout: float = 60.0
    pyg_memory_gb: float = 4.0
    workloads: tuple[str, ...] = ("molecules", "large")
    threads: int | None = None  # None: torch's default
    seed: int = 0
    background_processes: int = 0  # busy processes run alongside (see .load)


@dataclass
class Row:
    workload: str
    encoding: str
    impl: str
    wall_s: float | None = None
    cpu_s: float | None = None
    speedup: float | None = None
    check: str = ""
    error: str | None = None
    times_s: list[float] = field(default_factory=list)
    stopped_after_s: float | None = None  # a guarded PyG row stopped unfinished after this long


# ---- data -------------------------------------------------------------------------------------

def molecule_graphs(count: int, seed: int = 0) -> tuple[list, str]:
    """``count`` PyG ``Data`` graphs (undirected ``edge_index``) and a description of their source."""
    import torch

    _quiet_pyg()
    from torch_geometric.data import Data

    graphs = []
    try:
        import rdkit
        from rdkit import Chem, RDLogger

        RDLogger.DisableLog("rdApp.*")
        path = Path(rdkit.__file__).parent / "Data" / "NCI" / "first_5K.smi"
        with open(path) as f:
            for line in f:
                mol = Chem.MolFromSmiles(line.split()[0]) if line.strip() else None
                if mol is None:
                    continue
                frags = Chem.GetMolFrags(mol, asMols=True)
                mol = max(frags, key=lambda m: m.GetNumAtoms())
                n = mol.GetNumAtoms()
                if n < 2:
                    continue
                pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
                e = torch.tensor(pairs, dtype=torch.long).T.reshape(2, -1)
                graphs.append(Data(edge_index=torch.cat([e, e.flip(0)], 1), num_nodes=n))
                if len(graphs) == count:
                    return graphs, f"RDKit NCI SMILES ({path.name}), heavy atoms, largest fragment"
    except ImportError:
        graphs = []
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):  # a random tree plus a few ring closures, molecule-like sizes
        n = int(torch.randint(10, 41, (1,), generator=gen))
        parent = torch.stack([torch.randint(0, max(1, i), (1,), generator=gen)[0] for i in range(1, n)])
        e = torch.stack([torch.arange(1, n), parent])
        rings = torch.randint(0, n, (2, max(1, n // 10)), generator=gen)
        e = torch.cat([e, rings[:, rings[0] != rings[1]]], 1)
        e = torch.unique(torch.cat([e, e.flip(0)], 1), dim=1)
        graphs.append(Data(edge_index=e, num_nodes=n))
    return graphs, "generated molecule-like graphs (RDKit not installed)"


def random_graph(nodes: int, edges: int, seed: int = 0):
    """A uniform random simple graph with ``edges`` undirected edges (both directions listed)."""
    import torch

    _quiet_pyg()
    from torch_geometric.data import Data

    if edges > nodes * (nodes - 1) // 2:
        raise ValueError(f"--edges {edges} is more than a simple graph on {nodes} nodes can hold")
    gen = torch.Generator().manual_seed(seed)
    keys = torch.empty(0, dtype=torch.long)
    while keys.numel() < edges:
        e = torch.randint(0, nodes, (2, 2 * edges), generator=gen)
        e = e[:, e[0] != e[1]].sort(0).values
        keys = torch.unique(torch.cat([keys, e[0] * nodes + e[1]]))
    keys = keys[torch.randperm(keys.numel(), generator=gen)[:edges]]
    e = torch.stack([keys // nodes, keys % nodes])
    return Data(edge_index=torch.cat([e, e.flip(0)], 1), num_nodes=nodes)


# ---- checks -----------------------------------------------------------------------------------

def laplacian_residual(edge_index: torch.Tensor, num_nodes: int, vecs: torch.Tensor, vals: torch.Tensor) -> float:
    """``max |L v_j - lambda_j v_j|`` over the columns of ``vecs [n, k]``, ``L = I - D^-1/2 A D^-1/2``
    (float64, from the edge list): small when ``vecs`` are eigenvectors for the eigenvalues ``vals``."""
    import torch

    v = vecs.double()
    row, col = edge_index[:, edge_index[0] != edge_index[1]]
    deg = torch.zeros(num_nodes, dtype=torch.float64).index_add_(0, row, torch.ones(row.numel(), dtype=torch.float64))
    inv = torch.where(deg > 0, deg.clamp(min=1).rsqrt(), 0.0)
    av = torch.zeros_like(v).index_add_(0, row, (inv[col, None] * v[col]))
    lv = v - inv[:, None] * av
    return float((lv - v * vals.double()[: v.shape[1]]).abs().max()) if v.numel() else 0.0


def _eigen_check(graphs: list, pyg_vecs: list, vals: torch.Tensor, atol: float = 1e-3) -> str:
    """How many of PyG's results are eigenvectors for posenc's eigenvalues, column by column (so
    the two agree up to sign, and up to rotation inside a repeated eigenvalue)."""
    pairs = [(g, w, vals[i]) for i, (g, w) in enumerate(zip(graphs, pyg_vecs)) if w is not None]
    agree = sum(laplacian_residual(g.edge_index, g.num_nodes, w, lam) < atol for g, w, lam in pairs)
    return f"PyG eigvecs fit our eigvals: {agree}/{len(pairs)}"


def _diff_check(ours: torch.Tensor, theirs: torch.Tensor) -> str:
    return f"max |diff| {float((ours - theirs).abs().max()):.1e}"


# ---- timing -----------------------------------------------------------------------------------

def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    cpu, start = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def _child(conn, fn: Callable[..., torch.Tensor], args: tuple, threads: int) -> None:  # pragma: no cover - a child process
    import torch

    try:
        torch.set_num_threads(threads)
        wall, cpu, out = _timed(lambda: fn(*args))
        # As a numpy array: a tensor would travel through torch's shared-memory sharing, whose
        # socket is gone once this process exits.
        conn.send(("ok", wall, cpu, out.numpy()))
    except BaseException as exc:
        conn.send(("error", error_text(exc)))


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def run_guarded(fn: Callable[..., torch.Tensor], args: tuple, *, timeout: float, memory_gb: float) -> tuple:
    """Run ``fn(*args)`` in a child process (``fn`` a module-level function: the spawned child
    imports it by its qualified name); stop it after ``timeout`` seconds or when its resident memory
    passes ``memory_gb``. Returns ``(status, wall, cpu, out_or_error)`` with status "ok", "timeout",
    "memory" or "error"."""
    import torch

    # spawn, not fork: a child forked from a process whose OpenMP pool has run can hang.
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, torch.get_num_threads()), daemon=True)
    start = time.perf_counter()
    proc.start()
    send.close()
    status, result = "timeout", None
    limit = memory_gb * (1 << 30)
    try:
        while time.perf_counter() - start < timeout:
            if recv.poll(0.2):
                try:
                    result = recv.recv()
                    status = "ok" if result[0] == "ok" else "error"
                except EOFError:
                    status, result = "error", ("error", f"child exited with code {proc.exitcode}")
                break
            if not proc.is_alive():
                status, result = "error", ("error", f"child exited with code {proc.exitcode}")
                break
            if _rss_bytes(proc.pid) > limit:
                status = "memory"
                break
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
    if status == "ok":
        return "ok", result[1], result[2], torch.from_numpy(result[3])
    if status == "error":
        return "error", None, None, result[1]
    return status, time.perf_counter() - start, None, None


# Functions the child process runs (module level, so that a spawned child can import them).

def pyg_rwse_one(data, walk_length: int) -> torch.Tensor:
    from torch_geometric.transforms import AddRandomWalkPE

    return AddRandomWalkPE(walk_length)(data.clone()).random_walk_pe


# ---- workloads --------------------------------------------------------------------------------

def _quiet_pyg():
    """PyG's Batch and transforms (imported through posenc.graph.pyg, without PyG's import-time warning)."""
    from torch_geometric.data import Batch
    from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE

    from ...graph import pyg  # noqa: F401

    return Batch, AddLaplacianEigenvectorPE, AddRandomWalkPE


def bench_molecules(config: GraphPEBenchConfig, rows: list[Row], notes: list[str], progress: bool) -> None:
    import torch

    from ...graph import laplacian_pe_batch, random_walk_se_batch
    from ...graph.transforms import AddLaplacianPE, AddRandomWalkSE

    Batch, PygLap, PygRW = _quiet_pyg()
    graphs, source = molecule_graphs(config.graphs, config.seed)
    sizes = torch.tensor([g.num_nodes for g in graphs], dtype=torch.float)
    notes.append(f"molecules: {len(graphs)} graphs from {source}; nodes mean {sizes.mean():.1f}, "
                 f"max {int(sizes.max())}; {sum(g.edge_index.shape[1] for g in graphs) // 2} edges")
    collate_s, _, batch = _timed(lambda: Batch.from_data_list(graphs))
    notes.append(f"molecules: the whole-Batch rows take a collated Batch; collating it (untimed in those rows, "
                 f"a DataLoader does it anyway) took {collate_s:.3f} s")
    k, walk = config.lap_k, config.walk_length
    pyg_lap, pyg_rw = PygLap(k, is_undirected=True), PygRW(walk)
    our_lap, our_rw = AddLaplacianPE(k), AddRandomWalkSE(walk)

    def per_graph(transform, attr, min_nodes=0):
        return lambda: [transform(g.clone())[attr] if g.num_nodes >= min_nodes else None for g in graphs]

    # PyG's AddLaplacianEigenvectorPE raises for a graph with n <= k (it multiplies n - 1 columns
    # by k random signs); its row skips those graphs, posenc's rows compute them (zero-padded).
    small = sum(g.num_nodes <= k for g in graphs)
    if small:
        notes.append(f"molecules: PyG's AddLaplacianEigenvectorPE raises for graphs with n <= k={k} nodes; "
                     f"its row skips those {small} graphs, posenc's rows include them")

    steps = {
        (LAP, "PyG AddLaplacianEigenvectorPE, per graph"): per_graph(pyg_lap, "laplacian_eigenvector_pe", k + 1),
        (LAP, "posenc AddLaplacianPE, per graph"): per_graph(our_lap, "laplacian_eigenvector_pe"),
        (LAP, "posenc laplacian_pe_batch, whole Batch"): lambda: laplacian_pe_batch(
            batch.edge_index, batch.batch, k, num_graphs=batch.num_graphs),
        (RWSE, "PyG AddRandomWalkPE, per graph"): per_graph(pyg_rw, "random_walk_pe"),
        (RWSE, "posenc AddRandomWalkSE, per graph"): per_graph(our_rw, "random_walk_pe"),
        (RWSE, "posenc random_walk_se_batch, whole Batch"): lambda: random_walk_se_batch(
            batch.edge_index, batch.batch, walk, num_graphs=batch.num_graphs),
    }
    bar = Progress(len(steps) * (config.repeats + 1), "molecules", enabled=progress)
    results = time_interleaved({f"{e}|{i}": fn for (e, i), fn in steps.items()}, repeats=config.repeats, warmup=1,
                               device=torch.device("cpu"), progress=bar, keep_output=True)
    bar.close()
    timed = {name: (None if r.median_ms is None else r.median_ms / 1e3,
                    None if r.median_cpu_ms is None else r.median_cpu_ms / 1e3,
                    r.output if r.error is None else None, r.error, [t / 1e3 for t in r.times_ms])
             for name, r in results.items()}
    ptr = batch.ptr.tolist()
    for (enc, impl) in steps:
        wall, cpu, out, error, times = timed[f"{enc}|{impl}"]
        row = Row("molecules", enc, impl, wall, cpu, error=error, times_s=[round(t, 4) for t in times])
        rows.append(row)
        if out is None or impl.startswith("PyG"):
            continue
        ref_out = timed[f"{enc}|{next(i for e, i in steps if e == enc and i.startswith('PyG'))}"][2]
        if ref_out is None:
            continue
        if enc == LAP:
            if isinstance(out, tuple):  # the batched function: (vecs, vals per graph)
                row.check = _eigen_check(graphs, ref_out, out[1])
        else:
            ours = out if isinstance(out, list) else [out[a:b] for a, b in zip(ptr[:-1], ptr[1:])]
            row.check = _diff_check(torch.cat(ours), torch.cat(ref_out))


def bench_large(config: GraphPEBenchConfig, rows: list[Row], notes: list[str], progress: bool) -> None:
    from ...graph import laplacian_pe, random_walk_se

    _, PygLap, _ = _quiet_pyg()
    data = random_graph(config.nodes, config.edges, config.seed)
    n, k, walk = config.nodes, config.lap_k, config.walk_length
    notes.append(f"large: one uniform random graph, {n} nodes, {config.edges} undirected edges")
    bar = Progress(4, "large graph", enabled=progress)

    def run_row(enc: str, impl: str, fn: Callable[[], object]) -> tuple[Row, object]:
        row = Row("large", enc, impl)
        rows.append(row)
        try:
            row.wall_s, row.cpu_s, out = _timed(fn)
            row.times_s = [round(row.wall_s, 4)]
        except Exception as exc:
            row.error, out = error_text(exc), None
        bar.update(note=impl)
        return row, out

    _, ref_vecs = run_row(LAP, "PyG AddLaplacianEigenvectorPE (eigsh)",
                          lambda: PygLap(k, is_undirected=True)(data.clone()).laplacian_eigenvector_pe)
    row, ours = run_row(LAP, "posenc laplacian_pe (sparse)", lambda: laplacian_pe(data.edge_index, n, k))
    if ours is not None and ref_vecs is not None:
        row.check = _eigen_check([data], [ref_vecs], ours[1][None])
    row, ours = run_row(RWSE, "posenc random_walk_se (blocked sparse)",
                        lambda: random_walk_se(data.edge_index, n, walk))
    pyg = Row("large", RWSE, "PyG AddRandomWalkPE (child process)")
    rows.insert(len(rows) - 1, pyg)
    status, wall, cpu, out = run_guarded(
        pyg_rwse_one, (data, walk), timeout=config.pyg_timeout, memory_gb=config.pyg_memory_gb
    )
    bar.update(note="PyG random walk")
    bar.close()
    if status == "ok":
        pyg.wall_s, pyg.cpu_s, pyg.times_s = wall, cpu, [round(wall, 4)]
        if ours is not None:
            row.check = _diff_check(ours, out)
    elif status == "timeout":
        pyg.error, pyg.stopped_after_s = f"timeout (> {config.pyg_timeout:g} s)", wall
    elif status == "memory":
        pyg.error, pyg.stopped_after_s = f"memory (> {config.pyg_memory_gb:g} GB resident after {wall:.0f} s)", wall
    else:
        pyg.error = out


def _speedups(rows: list[Row]) -> None:
    for row in rows:
        if row.impl.startswith("PyG") or row.wall_s is None:
            continue
        ref = next((r for r in rows if r.workload == row.workload and r.encoding == row.encoding
                    and r.impl.startswith("PyG")), None)
        if ref is not None and ref.wall_s is not None:
            row.speedup = ref.wall_s / row.wall_s


@dataclass
class BenchResult:
    config: GraphPEBenchConfig
    rows: list[Row]
    notes: list[str]
    environment: dict

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "environment": self.environment, "notes": self.notes,
                "rows": [asdict(r) for r in self.rows]}


def run_benchmark(config: GraphPEBenchConfig, *, progress: bool = True) -> BenchResult:
    import torch

    threads_before = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    n = config.background_processes
    try:
        with background_load(n > 0, max(n, 1)):
            return _run(config, progress)  # the load average is read inside, with the load still on
    finally:
        torch.set_num_threads(threads_before)


def _run(config: GraphPEBenchConfig, progress: bool) -> BenchResult:
    import torch

    torch.manual_seed(config.seed)
    rows: list[Row] = []
    notes: list[str] = []
    if "molecules" in config.workloads:
        bench_molecules(config, rows, notes, progress)
    if "large" in config.workloads:
        bench_large(config, rows, notes, progress)
    _speedups(rows)
    load = load_average()
    environment = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "platform": platform.platform(), "background_load": describe(config.background_processes),
        "load_average": None if load is None else list(load),
    }
    return BenchResult(config, rows, notes, environment)


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render(result: BenchResult) -> str:
    headers = ["workload", "encoding", "implementation", "wall s", "cpu s", "speed-up vs PyG", "check"]
    table = []
    for r in result.rows:
        speed = "-" if r.speedup is None else f"{r.speedup:.1f}x"
        if r.speedup is None and not r.impl.startswith("PyG") and r.wall_s is not None:
            ref = next((x for x in result.rows if x.workload == r.workload and x.encoding == r.encoding
                        and x.impl.startswith("PyG") and x.stopped_after_s is not None), None)
            if ref is not None:  # PyG was stopped unfinished: a lower bound
                speed = f"> {ref.stopped_after_s / r.wall_s:.1f}x"
        wall = r.error if r.error else _fmt(r.wall_s)
        table.append([r.workload, r.encoding, r.impl, wall, _fmt(r.cpu_s), speed, r.check])
    env = result.environment
    lines = [
        f"graph PE precomputation, posenc against PyG: torch {env['torch']}, {env['threads']} threads, "
        f"{env['cpus']} CPUs",
        f"background load: {env['background_load']}; load average at the end: "
        f"{format_load_average(env['load_average'])}",
        "",
        format_table(headers, table, align="lllrrrl"),
        "",
    ]
    lines += [f"note: {n}" for n in result.notes]
    lines.append(
        f"note: wall = median of {result.config.repeats} interleaved rounds after a warm-up (one round on the large "
        f"graph); cpu = process CPU time (user + sys, {env['threads']} threads)"
    )
    return "\n".join(lines)


# ---- command line -----------------------------------------------------------------------------

def _workloads(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in ("molecules", "large")]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"workloads are 'molecules' and/or 'large', comma-separated; got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``posenc bench graph-pe``."""
    d = GraphPEBenchConfig()
    parser.add_argument("--graphs", type=positive_int, default=d.graphs, help="molecule graphs (default: %(default)s)")
    parser.add_argument("--nodes", type=positive_int, default=d.nodes, help="nodes of the large graph (default: %(default)s)")
    parser.add_argument("--edges", type=positive_int, default=d.edges,
                        help="undirected edges of the large graph (default: %(default)s)")
    parser.add_argument("--lap-k", type=positive_int, default=d.lap_k, metavar="K", help="LapPE eigenvectors (default: %(default)s)")
    parser.add_argument("--walk-length", type=positive_int, default=d.walk_length, metavar="K",
                        help="RWSE steps (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=d.repeats, help="timed rounds on the molecules (default: %(default)s)")
    parser.add_argument("--pyg-timeout", type=positive_float, default=d.pyg_timeout, metavar="S",
                        help="stop PyG's random walk on the large graph after S seconds (default: %(default)s)")
    parser.add_argument("--pyg-memory-gb", type=positive_float, default=d.pyg_memory_gb, metavar="GB",
                        help="... or when its resident memory passes GB (default: %(default)s)")
    parser.add_argument("--workloads", type=_workloads, default=d.workloads, metavar="molecules,large",
                        help="default: both")
    parser.add_argument(
        "--background-load", dest="background_processes", action="store_const", const=1, default=0,
        help="run one busy process (a Python loop on one core, in its own session) for the whole run; noted in the header and JSON",
    )
    parser.add_argument("--seed", type=seed_value, default=d.seed, help="default: %(default)s")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write graph_pe.json and graph_pe.txt (the table) into DIR")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    add_allow_large(parser)


SIZE_FLAGS = ("graphs", "nodes", "edges", "lap_k", "walk_length", "repeats", "pyg_timeout")
OUTPUTS = ("graph_pe.json", "graph_pe.txt")
MOLECULE_NODES = 25  # about, for the estimate
LANCZOS_STEPS = 1000  # sparse products an eigensolver takes for a few eigenvectors, about


def estimate(args: argparse.Namespace) -> Work:
    """The run's work (posenc.cli.sizes): both encodings by posenc and PyG on the molecules (dense
    per graph, each round), and on the large graph (sparse products per block of nodes for RWSE,
    an eigensolver's for LapPE; PyG's random walk at most ``--pyg-timeout`` seconds)."""
    work = Work()
    if "molecules" in args.workloads:
        n = MOLECULE_NODES
        per_graph = 10 * n ** 3 + args.walk_length * n ** 3 + args.lap_k * n ** 2
        work = work + Work(2 * (1 + args.repeats) * args.graphs * per_graph, 2 * (1 + args.repeats) * args.graphs,
                           4 * args.graphs * n * (args.lap_k + args.walk_length + 8))
    if "large" in args.workloads:
        n, e = args.nodes, 2 * args.edges
        walks = args.walk_length * e * n  # K/2 sparse x dense products per block, both chains
        lap = 2 * LANCZOS_STEPS * e * args.lap_k
        memory = 4 * (n * (args.lap_k + args.walk_length) + 6 * e)
        work = work + Work(walks + lap, args.pyg_timeout / CALL_SECONDS, memory)
    return work


def run(args: argparse.Namespace) -> int:
    """Run, print the table, write the files. 0 on success, 1 if a posenc row failed, 2 on bad input."""
    if args.edges > args.nodes * (args.nodes - 1) // 2:
        return usage_error(PROG, f"--edges {args.edges} is more than a simple graph on --nodes {args.nodes} holds")
    error = size_error(args, SIZE_FLAGS, estimate, defaults_of(add_arguments), device="cpu")
    error = error or out_error(args.out, OUTPUTS)
    if error is not None:
        return usage_error(PROG, error)
    config = GraphPEBenchConfig(
        graphs=args.graphs, nodes=args.nodes, edges=args.edges, lap_k=args.lap_k, walk_length=args.walk_length,
        repeats=args.repeats, pyg_timeout=args.pyg_timeout, pyg_memory_gb=args.pyg_memory_gb,
        workloads=args.workloads, seed=args.seed,  # --threads: applied by posenc.cli.main
        background_processes=args.background_processes,
    )
    result = run_benchmark(config, progress=args.progress)
    text = render(result)
    print(text)
    if args.out is not None:
        written = [write_json_file(args.out, "graph_pe.json", result.to_json()), write_file(args.out, "graph_pe.txt",
                                                                                            text + "\n")]
        print(f"\nwrote {written[0]} and {written[1]}")
    failed = [r for r in result.rows if r.impl.startswith("posenc") and r.error]
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.cli.bench.graph_pe``: the same as ``posenc bench graph-pe``."""
    from ...common.threads import using_threads
    from ..options import add_threads_argument

    parser = argparse.ArgumentParser(prog="posenc bench graph-pe", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    add_threads_argument(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    with using_threads(args.threads):
        return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
