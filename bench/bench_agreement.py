"""Benchmark of crslib.agreement: one search per model, memory linear in N.

Prints a short table:

(a) ``agreement_matrix`` wall time over M x one bare faiss ``IndexFlatIP``
    search of the same data (normalised copy, k+1 neighbours); target <= 1.2.
(b) speed-up over the naive route, scikit-learn ``NearestNeighbors(metric=
    "cosine", algorithm="brute")`` run for both models of every pair (one
    pair is measured and extrapolated to all M(M-1)/2 pairs); target >= 3.
(c) peak memory of ``agreement_matrix``: tracemalloc peak (numpy/Python
    allocations) and the ``getrusage`` maxrss increase (whole process,
    faiss's C++ buffers included).
(d) one ``knn_indices`` search at N=100,000, d=512: time and peak memory,
    against the N x N x 4 bytes a full similarity matrix would need.

Each part runs in a fresh interpreter so that its memory high-water mark is
its own. Data: M models, each a shared 64-d latent mapped to d dimensions
plus model-specific noise, float32, so overlaps are well above chance.

Usage: ``python bench/bench_agreement.py [--quick] [--skip-large] [--batch-sweep]``
(``--quick``: N=4,000 and N_large=20,000, for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc

import crslib  # noqa: F401  (first: applies the import fix before torch)

import numpy as np  # noqa: E402

from _results import record, row  # noqa: E402  (bench/ is the script's folder)


def make_embeddings(m: int, n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    """M float32 models sharing a latent; generated in chunks (no big temporaries)."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, 64), dtype=np.float32)
    out = {}
    for i in range(m):
        A = (rng.standard_normal((64, d), dtype=np.float32) / 8).astype(np.float32)
        sigma = np.float32(0.6 + 0.8 * i / max(1, m - 1))
        X = np.empty((n, d), dtype=np.float32)
        for s in range(0, n, 8192):
            X[s : s + 8192] = Z[s : s + 8192] @ A
            X[s : s + 8192] += sigma * rng.standard_normal((min(8192, n - s), d), dtype=np.float32)
        out[f"model_{i}"] = X
    return out


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _faiss():
    from crslib.neighbors import _import_faiss

    return _import_faiss()  # same faiss (and OpenBLAS set-up) as crslib uses


def bare_faiss_search(X: np.ndarray, k: int) -> float:
    faiss = _faiss()
    t = time.perf_counter()
    Xn = X.copy()
    faiss.normalize_L2(Xn)
    index = faiss.IndexFlatIP(Xn.shape[1])
    index.add(Xn)
    index.search(Xn, k + 1)
    return time.perf_counter() - t


def _warm_up():
    from crslib.neighbors import knn_indices

    X = np.random.default_rng(1).standard_normal((500, 16), dtype=np.float32)
    knn_indices(X, k=5)
    bare_faiss_search(X, 5)


# --------------------------------------------------------------------------- workers


def worker_matrix(args) -> dict:
    """(a) + (c): agreement_matrix time and memory, then bare searches."""
    from crslib.agreement import agreement_matrix

    emb = make_embeddings(args.m, args.n, args.d)
    names = list(emb)
    _warm_up()
    # bare reference: one search of the first model before and of the last after,
    # so that drift in machine load hits both sides alike
    bare = [bare_faiss_search(emb[names[0]], args.k)]
    rss0, maxrss0 = _rss_mb(), _maxrss_mb()
    tracemalloc.start()
    tracemalloc.reset_peak()
    t = time.perf_counter()
    A = agreement_matrix(emb, k=args.k).overlap
    t_matrix = time.perf_counter() - t
    peak_tm = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    maxrss1 = _maxrss_mb()
    bare.append(bare_faiss_search(emb[names[-1]], args.k))
    iu = np.triu_indices(len(names), 1)
    return {
        "t_matrix": t_matrix,
        "bare": bare,
        "tracemalloc_peak_mb": peak_tm,
        "maxrss_delta_mb": maxrss1 - maxrss0,
        "peak_above_start_mb": maxrss1 - rss0,
        "data_mb": sum(x.nbytes for x in emb.values()) / 2**20,
        "overlap_min": float(A.values[iu].min()),
        "overlap_max": float(A.values[iu].max()),
        "pair01": float(A.iloc[0, 1]),
    }


def worker_naive(args) -> dict:
    """(b): one pair the naive way (two sklearn brute-force cosine searches)."""
    from sklearn.neighbors import NearestNeighbors

    emb = make_embeddings(args.m, args.n, args.d)
    names = list(emb)
    _warm_up()
    t = time.perf_counter()
    inds = []
    for name in names[:2]:
        X = emb[name]
        nn = NearestNeighbors(n_neighbors=args.k + 1, metric="cosine", algorithm="brute").fit(X)
        ind = nn.kneighbors(X, return_distance=False)
        inds.append(ind[:, 1:])  # naive self-removal by rank
    both = np.sort(np.concatenate(inds, axis=1), axis=1)
    overlap = float((both[:, 1:] == both[:, :-1]).sum(axis=1).mean() / args.k)
    return {"t_pair": time.perf_counter() - t, "pair01": overlap}


def worker_large(args) -> dict:
    """(d): one knn_indices search at large N."""
    from crslib.neighbors import knn_indices

    rng = np.random.default_rng(0)
    n, d = args.n_large, args.d
    X = np.empty((n, d), dtype=np.float32)
    Z = rng.standard_normal((n, 64), dtype=np.float32)
    A = rng.standard_normal((64, d), dtype=np.float32) / 8
    for s in range(0, n, 8192):
        X[s : s + 8192] = Z[s : s + 8192] @ A + rng.standard_normal((min(8192, n - s), d), dtype=np.float32)
    del Z
    _warm_up()
    rss0, maxrss0 = _rss_mb(), _maxrss_mb()
    tracemalloc.start()
    t = time.perf_counter()
    I = knn_indices(X, k=args.k)
    elapsed = time.perf_counter() - t
    peak_tm = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    maxrss1 = _maxrss_mb()
    assert I.shape == (n, args.k)
    return {
        "t": elapsed,
        "tracemalloc_peak_mb": peak_tm,
        "maxrss_delta_mb": maxrss1 - maxrss0,
        "peak_above_start_mb": maxrss1 - rss0,
        "data_mb": X.nbytes / 2**20,
        "nn_matrix_mb": n * n * 4 / 2**20,
    }


def worker_batches(args) -> dict:
    """Optional: knn_indices time for several query batch sizes (faiss)."""
    from crslib.neighbors import knn_indices

    X = make_embeddings(1, args.n, args.d)["model_0"]
    _warm_up()
    out = {}
    for bs in (1024, 4096, 16384, args.n):
        t = time.perf_counter()
        knn_indices(X, k=args.k, batch_size=bs)
        out[str(bs)] = time.perf_counter() - t
    return out


WORKERS = {"matrix": worker_matrix, "naive": worker_naive, "large": worker_large, "batches": worker_batches}


def run_worker(name: str, args) -> dict:
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker", name,
        "--m", str(args.m), "--n", str(args.n), "--d", str(args.d), "--k", str(args.k),
        "--n-large", str(args.n_large),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"worker {name} failed with status {res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=6)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--n-large", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="N=4,000 and N_large=20,000")
    p.add_argument("--skip-large", action="store_true", help="skip part (d)")
    p.add_argument("--batch-sweep", action="store_true", help="also time several query batch sizes")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.n_large = 4_000, 20_000
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0

    import faiss  # noqa: F401  (version only; the workers import it through crslib)

    from crslib.neighbors import _openblas_coretype_hint

    t0 = time.perf_counter()
    m, n, d, k = args.m, args.n, args.d, args.k
    pairs = m * (m - 1) // 2
    print(
        f"crslib agreement benchmark: M={m} models, N={n:,}, d={d}, k={k}, float32; "
        f"{os.cpu_count()} CPU core(s), {platform.machine()}; faiss {faiss.__version__} "
        f"(OpenBLAS core type hint: {_openblas_coretype_hint()})",
        flush=True,
    )
    a = run_worker("matrix", args)
    bare = float(np.mean(a["bare"]))
    ratio = a["t_matrix"] / (m * bare)
    b = run_worker("naive", args)
    naive_all = b["t_pair"] * pairs
    speedup = naive_all / a["t_matrix"]
    rows = [
        ("(a)", "agreement_matrix wall time", f"{a['t_matrix']:.1f} s", ""),
        ("", "bare faiss IndexFlatIP search, 1 model", f"{bare:.1f} s", f"mean of 2 runs (before, after): {a['bare'][0]:.1f}, {a['bare'][1]:.1f} s"),
        ("", f"ratio agreement_matrix / ({m} x bare)", f"{ratio:.2f}", f"target <= 1.2: {'PASS' if ratio <= 1.2 else 'FAIL'}"),
        ("", "pair overlaps (min..max)", f"{a['overlap_min']:.3f}..{a['overlap_max']:.3f}", f"chance {k / (n - 1):.4f}"),
        ("(b)", "naive sklearn brute cosine, 1 pair", f"{b['t_pair']:.1f} s", "measured: 1 pair = 2 searches"),
        ("", f"naive, all {pairs} pairs (extrapolated)", f"{naive_all:.0f} s", f"= {pairs} x the measured pair"),
        ("", "speed-up of agreement_matrix", f"{speedup:.1f}x", f"target >= 3: {'PASS' if speedup >= 3 else 'FAIL'}"),
        ("", "same overlap for the measured pair", f"{a['pair01']:.4f} vs {b['pair01']:.4f}", "crslib vs naive"),
        ("(c)", "agreement_matrix tracemalloc peak", f"{a['tracemalloc_peak_mb']:.0f} MB", f"embeddings themselves {a['data_mb']:.0f} MB"),
        ("", "agreement_matrix maxrss increase", f"{a['maxrss_delta_mb']:.0f} MB", f"peak RSS above start {a['peak_above_start_mb']:.0f} MB"),
    ]
    if not args.skip_large:
        L = run_worker("large", args)
        rows += [
            ("(d)", f"knn_indices N={args.n_large:,} d={d} time", f"{L['t']:.1f} s", ""),
            ("", "tracemalloc peak", f"{L['tracemalloc_peak_mb']:.0f} MB", f"embeddings {L['data_mb']:.0f} MB"),
            ("", "maxrss increase", f"{L['maxrss_delta_mb']:.0f} MB", f"peak RSS above start {L['peak_above_start_mb']:.0f} MB"),
            (
                "",
                "N x N x 4 bytes (full matrix)",
                f"{L['nn_matrix_mb']:,.0f} MB",
                f"peak is {max(L['maxrss_delta_mb'], L['tracemalloc_peak_mb']) / L['nn_matrix_mb']:.1%} of it",
            ),
        ]
    if args.batch_sweep:
        B = run_worker("batches", args)
        rows.append(("(e)", "knn_indices time by query batch size", ", ".join(f"{b}: {t:.1f} s" for b, t in B.items()), ""))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]}")
    print(f"total benchmark time {time.perf_counter() - t0:.0f} s")
    table = [
        row(f"agreement_matrix time / ({m} x one bare faiss search), N={n:,}, d={d}", f"{ratio:.2f}",
            "<= 1.2", ratio <= 1.2, f"{a['t_matrix']:.1f} s vs {m} x {bare:.1f} s"),
        row(f"speed-up over naive scikit-learn cosine kNN, all {pairs} pairs", f"{speedup:.1f}x",
            ">= 3x", speedup >= 3, f"naive {naive_all:.0f} s (one pair measured, extrapolated)"),
        row("agreement_matrix peak memory (maxrss increase)", f"{a['maxrss_delta_mb']:.0f} MB",
            note=f"embeddings themselves {a['data_mb']:.0f} MB"),
    ]
    if not args.skip_large:
        share = max(L["maxrss_delta_mb"], L["tracemalloc_peak_mb"]) / L["nn_matrix_mb"]
        table.append(row(f"knn_indices at N={args.n_large:,}, d={d}: peak memory / full N x N matrix",
                         f"{share:.1%}", "linear in N", None,
                         f"{L['t']:.1f} s; peak {max(L['maxrss_delta_mb'], L['tracemalloc_peak_mb']):.0f} MB "
                         f"vs {L['nn_matrix_mb']:,.0f} MB"))
    record("agreement", table, title="Mutual kNN agreement (faiss)", seconds=time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
