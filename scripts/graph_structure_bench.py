"""Issue 48 item 3, graph side: the batched RRWP and MagLapPE over 1,000 molecules against a loop
over the same graphs one by one, and RRWP with K = 20 on one 10,000-node, 50,000-edge graph (its
wall time, the pairs it keeps and the peak resident memory of the process that computed it).

Run it on a quiet machine (the lead's timing runs); it prints one line per row::

    python scripts/graph_structure_bench.py                       # both parts
    python scripts/graph_structure_bench.py --part molecules --repeats 5
    python scripts/graph_structure_bench.py --part large --large-graph grid   # a graph of small K-hop balls

``--large-graph random`` (default) is the graph of ``posenc bench graph-pe``: uniform random edges,
mean degree 10, so every pair lies within a few hops and the support of K = 20 is every pair
(N^2 pairs of two int64 ids and K float32 values: 9.6 GB at N = 10,000, about twice that at the
peak: 19.5 GB resident measured on a 24 GiB machine), which rrwp refuses with its estimate on a
machine without that much memory; ``grid`` is a 100 x 100 grid with its diagonals (about 40,000 edges),
whose 19-hop balls hold about 1,500 nodes.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from posenc.graph import magnetic_laplacian_pe, magnetic_laplacian_pe_batch, rrwp, rrwp_batch


def molecules(count: int) -> list[tuple[torch.Tensor, int]]:
    """``count`` molecule graphs (RDKit's NCI SMILES, or random trees with ring closures without RDKit)."""
    try:
        from posenc.graph.datasets import molecule_dataset

        return [(g.edge_index, g.num_nodes) for g in molecule_dataset(limit=count)]
    except ImportError:
        gen = torch.Generator().manual_seed(0)
        out = []
        for _ in range(count):
            n = int(torch.randint(10, 41, (1,), generator=gen))
            parent = [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
            e = torch.tensor([list(range(1, n)) + [0], parent + [n - 1]])
            out.append((torch.cat([e, e.flip(0)], 1), n))
        return out


def packed(graphs: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    edges, batch, first = [], [], 0
    for g, (e, n) in enumerate(graphs):
        edges.append(e + first)
        batch.append(torch.full((n,), g))
        first += n
    return torch.cat(edges, 1), torch.cat(batch)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_molecules(args) -> None:
    graphs = molecules(args.graphs)
    edge_index, batch = packed(graphs)
    # molecules are undirected; MagLapPE gets them with one direction per bond (a directed graph)
    directed = [(e[:, e[0] < e[1]], n) for e, n in graphs]
    d_index, _ = packed(directed)
    rows = [
        ("RRWP K=20", lambda: rrwp_batch(edge_index, batch, 20), lambda: [rrwp(e, n, 20) for e, n in graphs]),
        ("MagLapPE k=8 q=0.25", lambda: magnetic_laplacian_pe_batch(d_index, batch, 8, q=0.25),
         lambda: [magnetic_laplacian_pe(e, n, 8, q=0.25) for e, n in directed]),
    ]
    print(f"{len(graphs)} molecules, {batch.numel()} nodes, torch threads {torch.get_num_threads()}")
    for name, batched, loop in rows:
        b, looped = timed(batched, args.repeats), timed(loop, args.repeats)
        print(f"  {name:22s} batched {b:7.3f} s   per-graph loop {looped:7.3f} s   speed-up {looped / b:5.1f}x")


def large_graph(kind: str) -> tuple[torch.Tensor, int]:
    if kind == "grid":
        side = 100
        idx = torch.arange(side * side).view(side, side)
        parts = [(idx[:, :-1], idx[:, 1:]), (idx[:-1], idx[1:]), (idx[:-1, :-1], idx[1:, 1:]), (idx[:-1, 1:], idx[1:, :-1])]
        e = torch.cat([torch.stack([a.reshape(-1), b.reshape(-1)]) for a, b in parts], 1)
        return torch.cat([e, e.flip(0)], 1), side * side
    gen = torch.Generator().manual_seed(0)
    e = torch.randint(0, 10_000, (2, 50_000), generator=gen)
    e = e[:, e[0] != e[1]]
    return torch.cat([e, e.flip(0)], 1), 10_000


def bench_large(args) -> None:
    edges, n = large_graph(args.large_graph)
    start = time.perf_counter()
    try:
        pairs, values = rrwp(edges, n, 20)
        wall = time.perf_counter() - start
        kept = f"{pairs.shape[1]} pairs ({pairs.shape[1] / n:.0f} per node), values {values.numel() * 4 / 1e9:.2f} GB"
    except ValueError as exc:
        wall, kept = time.perf_counter() - start, f"refused: {exc}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB (Linux)
    print(f"RRWP K=20 on a {args.large_graph} graph of {n} nodes, {edges.shape[1] // 2} undirected edges: "
          f"{wall:.1f} s, {kept}; peak resident memory of the process {peak:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("molecules", "large", "both"), default="both")
    parser.add_argument("--graphs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large-graph", choices=("random", "grid"), default="random")
    args = parser.parse_args()
    if args.part in ("molecules", "both"):
        bench_molecules(args)
    if args.part in ("large", "both"):
        bench_large(args)


if __name__ == "__main__":
    main()
