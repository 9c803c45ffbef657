"""Beyond one machine: Dask shard tasks and the approximate neighbour index.

Prints, and records in ``bench/results.json``:

(a) embedding extraction throughput on a local Dask cluster with 1 and 2
    worker processes, relative to the in-process run of the same images and
    model in the same session (cluster start-up excluded; each measured
    after a warm-up, cache off);
(b) ``agreement_matrix`` of two models with the approximate index (a faiss
    HNSW graph over 8-bit codes with exact re-ranking, ``index="auto"``'s
    choice above its threshold) at N = 100,000 and 1,000,000, d = 512,
    synthetic embeddings with
    the neighbourhood structure of image embeddings (see
    :func:`clustered_embeddings`), saved as .npy files and memory-mapped
    (:func:`crslib.embed.load_embeddings`): wall time and peak memory above the
    start, sampled every 50 ms in a fresh process (the memory no file backs,
    which must fit, and the resident memory with the mapped pages), with the
    recall@10 against exact search measured on a 20,000-query sample and the
    overlap error it bounds;
    The approximate searches are tuned to ``knn_search``'s default
    ``target_recall`` (0.95, the lower end of the recall's 95% interval on
    2,000 tuning queries); the bench records the depth chosen, whether the
    target was met, and the peak against the memory budget: 1.3 x (one
    model's float32 embeddings + its index: 8-bit codes and graph links,
    ``params["index_mb"]``);
(c) the reference for (b): exact search of the same data at N = 100,000
    (flat inner-product index), so the approximate index's speed-up is a
    ratio measured in the same run;
(d) the exact search of one model sharded into query blocks on a
    LocalCluster of 2 workers, against the same search in-process: the wall
    time, the worker-core seconds it used (wall x workers), and what those
    scale to at N = 1,000,000 (exact search costs N^2), to size a cluster;
(e) float16 storage (:func:`crslib.embed.save_embeddings`): each model's exact
    neighbours from float16 against float32 (recall@10) and the two models'
    overlap from each, at N = 20,000.

Usage: ``python bench/bench_scale.py [--quick] [--sizes 100000 1000000]``
(``--quick``: 500 images and N = 20,000 / 50,000, a smoke run). The graph
index is what makes N = 1,000,000 at the recall target fit in a routine
benchmark on 2 cores: on this data an IVF search must probe ~500 of its
4,000 cells to hold 0.95 of the exact neighbours (with 64 cells, 0.725 in
2,144 s for two models), while a graph walk with a pool of 32 finds 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crslib  # noqa: F401  (first: applies the import fix before torch)

from _results import record, row  # noqa: E402  (bench/ is the script's folder)

SPEC = "timm:resnet18?size=64"
BATCH = 64
SHARD = 128


class PeakMemory:
    """Peak memory above the level at entry, sampled by a thread (``ru_maxrss`` is a
    lifetime high-water mark: the data generation before the call would hide the
    call's own peak): resident memory, and the part of it no file backs
    (``rss - shared``: memory-mapped embeddings are pages of their file, which the
    kernel can drop and read again, so only this part must fit in memory)."""

    def __enter__(self):
        import threading

        import psutil

        self._process = psutil.Process()
        info = self._process.memory_info()
        self.start, self.start_anon = info.rss, info.rss - info.shared
        self.peak, self.peak_anon = self.start, self.start_anon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        info = self._process.memory_info()
        self.peak = max(self.peak, info.rss)
        self.peak_anon = max(self.peak_anon, info.rss - info.shared)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._read()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    @property
    def above_start_mb(self) -> float:
        return (self.peak - self.start) / 2**20

    @property
    def anon_above_start_mb(self) -> float:
        return (self.peak_anon - self.start_anon) / 2**20


def clustered_embeddings(m: int, n: int, d: int, seed: int = 0) -> dict:
    """M float32 models of the same N images: a 64-d latent of clusters of
    about 20 images (centres N(0, 4), spread 1.5), mapped to d dimensions by
    a model-specific random linear map, plus model-specific isotropic noise.
    Each image has real near neighbours, as in image embeddings (pure noise
    in 512 dimensions has none, and no index finds them). Calibrated at
    N=20,000: exact overlap of two models 0.84, IVF recall@10 0.99."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = 2 * rng.standard_normal((max(50, n // 20), 64), dtype=np.float32)
    Z = centres[rng.integers(0, len(centres), n)]
    Z += 1.5 * rng.standard_normal((n, 64), dtype=np.float32)
    out = {}
    for i in range(m):
        A = rng.standard_normal((64, d), dtype=np.float32) / 8
        noise = np.float32((1 + i) / 8)
        X = np.empty((n, d), dtype=np.float32)
        for s in range(0, n, 65536):
            block = Z[s : s + 65536]
            X[s : s + len(block)] = block @ A
            X[s : s + len(block)] += noise * rng.standard_normal((len(block), d), dtype=np.float32)
        out[f"model_{i}"] = X
    return out


# --------------------------------------------------------------------------- (a) extraction


def extraction(n_images: int) -> dict:
    from bench_embed import write_images

    from crslib.cluster import open_client
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder

    out = {}
    with tempfile.TemporaryDirectory(prefix="crs-bench-scale-") as tmp:
        folder = Path(tmp) / "images"
        folder.mkdir()
        manifest = write_images(folder, n_images)
        encoder = load_encoder(SPEC)

        def timed(scheduler) -> float:
            extract_embeddings(manifest.iloc[:SHARD], encoder, batch_size=BATCH, shard_size=SHARD, cache=False,
                               progress=False, scheduler=scheduler)  # warm-up: model on the workers, imports
            start = time.perf_counter()
            result = extract_embeddings(manifest, encoder, batch_size=BATCH, shard_size=SHARD, cache=False,
                                        progress=False, scheduler=scheduler)
            seconds = time.perf_counter() - start
            out.setdefault("arrays", []).append(result.X)
            return seconds

        out["in_process"] = timed(None)
        for workers in (1, 2):
            with open_client(f"local:{workers}") as client:
                out[f"workers_{workers}"] = timed(client)
        import numpy as np

        first = out.pop("arrays")
        out["identical"] = all(np.array_equal(first[0], a) for a in first[1:])
    return out


# --------------------------------------------------------------------------- (b), (c) agreement


def agreement_worker(n: int, index: str, recall_sample: int) -> dict:
    """Two models' agreement from embeddings saved as .npy files and memory-mapped, as
    :func:`crslib.embed.load_embeddings` gives them to a researcher."""
    import gc

    from crslib.agreement import agreement_matrix
    from crslib.embed import load_embeddings, save_embeddings

    with tempfile.TemporaryDirectory(prefix="crs-bench-scale-") as tmp:
        generated = clustered_embeddings(2, n, 512)
        paths = {name: save_embeddings(Path(tmp) / f"{name}.npy", X) for name, X in generated.items()}
        data_mb = sum(X.nbytes for X in generated.values()) / 2**20
        del generated
        gc.collect()
        embeddings = {name: load_embeddings(path) for name, path in paths.items()}
        with PeakMemory() as memory:
            start = time.perf_counter()
            matrix = agreement_matrix(embeddings, k=10, index=index, threshold=0, recall_sample=recall_sample)
            seconds = time.perf_counter() - start
        del embeddings
    search = matrix.search
    params = next(iter(search.values()), {}).get("params") or {}
    method = next(iter(search.values()), {}).get("index", index)
    return {
        "n": n, "index": index, "method": {"hnswsq": "HNSW-SQ", "ivfpq": "IVF-PQ"}.get(method, method),
        "seconds": seconds, "overlap": float(matrix.overlap.iloc[0, 1]),
        "peak_mb": memory.anon_above_start_mb, "rss_mb": memory.above_start_mb, "data_mb": data_mb,
        "budget_mb": 1.3 * (data_mb / 2 + params.get("index_mb", 0.0)),
        "target_met": [info.get("target_met") for info in search.values()],
        "recall": [info.get("recall") for info in search.values()],
        "recall_ci": [info.get("recall_ci") for info in search.values()],
        "search_seconds": [info.get("seconds") for info in search.values()],
        "params": params,
        "bound": matrix.max_error_bound,
    }


def dask_exact_worker(n: int, workers: int = 2) -> dict:
    """One model's exact search in-process and as query-block tasks on a LocalCluster."""
    import numpy as np

    from crslib.ann import knn_search
    from crslib.cluster import open_client

    X = clustered_embeddings(1, n, 512)["model_0"]
    start = time.perf_counter()
    local, _ = knn_search(X, k=10, index="exact")
    in_process = time.perf_counter() - start
    with open_client(f"local:{workers}") as client:
        knn_search(X[:2000], k=10, index="exact", client=client)  # warm-up: imports on the workers
        start = time.perf_counter()
        sharded, _ = knn_search(X, k=10, index="exact", client=client)
        wall = time.perf_counter() - start
    return {"n": n, "workers": workers, "in_process": in_process, "wall": wall,
            "identical": bool(np.array_equal(local, sharded))}


def float16_worker(n: int) -> dict:
    """(e) What float16 storage does to neighbours: each model's exact cosine neighbours
    from its float16 file against those from float32, and the two models' overlap."""
    import numpy as np

    from crslib.ann import knn_search
    from crslib.neighbors import _intersections

    embeddings = clustered_embeddings(2, n, 512)
    ids = {}
    for name, X in embeddings.items():
        for dtype in ("float32", "float16"):
            ids[name, dtype] = knn_search(X.astype(dtype), k=10, index="exact")[0]
    recall = [float(_intersections(ids[name, "float16"], ids[name, "float32"]).mean() / 10) for name in embeddings]
    overlap = {dtype: float(_intersections(ids["model_0", dtype], ids["model_1", dtype]).mean() / 10)
               for dtype in ("float32", "float16")}
    return {"n": n, "recall": recall, "overlap": overlap,
            "max_abs_error": float(max(np.abs(X.astype(np.float16) - X).max() for X in embeddings.values()))}


def depth_note(p: dict) -> str:
    """The index and the depth its tuning chose, in words."""
    tuned = f"in {len(p['tuning'])} trial(s)" if p.get("tuning") else "not tuned"
    if "ef_search" in p:
        storage = {"sq8": "8-bit codes"}.get(p.get("storage"), "float32 rows")
        return (f"HNSW graph of degree {p['hnsw_m']} over {storage} "
                f"({p['index_mb']:.0f} MB), search pool {p['ef_search']} ({tuned}), "
                + ("re-ranked exactly" if p.get("reranked") else "not re-ranked"))
    return (f"IVF of {p['nlist']} cells ({p['index_mb']:.0f} MB), nprobe {p['nprobe']} ({tuned})"
            + (f", {p['pq_m']}-byte codes, {p['refine_factor']} x re-ranked" if p.get("pq_m") else ""))


def run_worker(*args: str) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-6000:])
        raise SystemExit(f"worker {args} failed with status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--exact-size", type=int, default=100_000)
    parser.add_argument("--recall-sample", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dask-size", type=int, default=50_000, help="N of the sharded exact search (d)")
    parser.add_argument("--float16-size", type=int, default=20_000, help="N of the float16 comparison (e)")
    parser.add_argument("--worker", nargs=3, metavar=("N", "INDEX", "SAMPLE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        n, index, sample = args.worker
        if index == "dask-exact":
            result = dask_exact_worker(int(n))
        elif index == "float16":
            result = float16_worker(int(n))
        else:
            result = agreement_worker(int(n), index, int(sample))
        print(json.dumps(result))
        return 0
    if args.quick:
        args.images, args.sizes, args.exact_size, args.recall_sample = 500, [20_000, 50_000], 20_000, 5_000
        args.dask_size = 20_000

    start = time.perf_counter()
    table = []
    ex = extraction(args.images)
    base = args.images / ex["in_process"]
    print(f"(a) extraction of {args.images} images with {SPEC}, shards of {SHARD}, {os.cpu_count()} CPUs:")
    print(f"    in-process {base:.0f} images/s")
    table.append(row(f"extraction in-process, {args.images:,} images", f"{base:.0f} images/s", note=SPEC))
    for workers in (1, 2):
        rate = args.images / ex[f"workers_{workers}"]
        print(f"    LocalCluster, {workers} worker(s): {rate:.0f} images/s, ratio {rate / base:.2f}")
        table.append(row(f"extraction on a LocalCluster of {workers} worker(s) / in-process", f"{rate / base:.2f}",
                         note=f"{rate:.0f} images/s; the same array: {ex['identical']}"))

    exact = run_worker(str(args.exact_size), "exact", "1")  # exact: no recall check
    print(f"(c) exact agreement, N={args.exact_size:,}: {exact['seconds']:.1f} s, "
          f"peak memory +{exact['peak_mb']:.0f} MB, overlap {exact['overlap']:.4f}")
    table.append(row(f"agreement, 2 models, exact flat index, N={args.exact_size:,}, d=512",
                     f"{exact['seconds']:.0f} s", note=f"peak memory +{exact['peak_mb']:.0f} MB; "
                     f"overlap {exact['overlap']:.4f}"))
    for n in args.sizes:
        approx = run_worker(str(n), "auto", str(args.recall_sample))
        recall = min(r for r in approx["recall"] if r is not None)
        low = min(ci[0] for ci in approx["recall_ci"] if ci)
        met = all(approx["target_met"])
        print(f"(b) {approx['method']} agreement, N={n:,}: {approx['seconds']:.1f} s, peak memory +{approx['peak_mb']:.0f} MB "
              f"not backed by the files (+{approx['rss_mb']:.0f} MB resident) "
              f"(budget {approx['budget_mb']:.0f} MB; embeddings {approx['data_mb']:.0f} MB), recall@10 {recall:.3f} "
              f"(95% CI low {low:.3f}, target 0.95 met: {met}), overlap {approx['overlap']:.4f} "
              f"+- {approx['bound']:.3f}")
        note = (f"peak memory +{approx['peak_mb']:.0f} MB, {approx['peak_mb'] / approx['budget_mb']:.2f} x the "
                f"budget of 1.3 x (one model's embeddings + index) = {approx['budget_mb']:.0f} MB; "
                + depth_note(approx["params"]))
        if n == args.exact_size:
            note += f"; {approx['seconds'] / exact['seconds']:.2f} x the exact search's time, overlap " \
                    f"{approx['overlap']:.4f} vs exact {exact['overlap']:.4f}"
        table.append(row(f"agreement, 2 models, {approx['method']} index, N={n:,}, d=512", f"{approx['seconds']:.0f} s",
                         note=note))
        table.append(row(f"peak memory / budget, N={n:,}", f"{approx['peak_mb'] / approx['budget_mb']:.2f}",
                         target="<= 1", passed=approx["peak_mb"] <= approx["budget_mb"],
                         note=f"+{approx['peak_mb']:.0f} MB of memory no file backs (the embeddings are "
                         f"memory-mapped .npy files; +{approx['rss_mb']:.0f} MB resident with their pages)"))
        table.append(row(f"recall@10 against exact search, N={n:,} ({args.recall_sample:,}-query sample)",
                         f"{recall:.3f}", target=">= 0.95 (lower 95% bound)", passed=met,
                         note=f"95% CI lower bound {low:.3f}; overlap error bound {approx['bound']:.3f}; "
                         f"overlap {approx['overlap']:.4f}"))
    dask = run_worker(str(args.dask_size), "dask-exact", "0")
    core_seconds = dask["wall"] * dask["workers"]
    at_million = core_seconds * (1_000_000 / dask["n"]) ** 2
    print(f"(d) exact search of one model, N={dask['n']:,}: in-process {dask['in_process']:.1f} s, LocalCluster of "
          f"{dask['workers']} workers {dask['wall']:.1f} s ({core_seconds:.0f} worker-core s), same neighbours: "
          f"{dask['identical']}; at N=1,000,000: ~{at_million / 3600:.1f} worker-core hours")
    table.append(row(f"exact search sharded on a LocalCluster of {dask['workers']} workers / in-process, "
                     f"N={dask['n']:,}, d=512", f"{dask['wall'] / dask['in_process']:.2f}",
                     note=f"{dask['wall']:.0f} s vs {dask['in_process']:.0f} s; {core_seconds:.0f} worker-core s, "
                     f"~{at_million / 3600:.1f} worker-core hours at N=1,000,000 (cost grows as N^2); the same "
                     f"neighbours: {dask['identical']}"))
    half = run_worker(str(args.float16_size), "float16", "0")
    print(f"(e) float16 storage, N={half['n']:,}: recall@10 of the exact neighbours against float32 "
          f"{min(half['recall']):.4f}, overlap {half['overlap']['float16']:.4f} vs {half['overlap']['float32']:.4f}")
    table.append(row(f"float16 storage: exact neighbours kept (recall@10 vs float32), N={half['n']:,}, d=512",
                     f"{min(half['recall']):.4f}",
                     note=f"two models' overlap {half['overlap']['float16']:.4f} from float16 vs "
                     f"{half['overlap']['float32']:.4f} from float32; largest rounding error "
                     f"{half['max_abs_error']:.2g}"))
    print(f"total {time.perf_counter() - start:.0f} s")
    record("scale", table, title="Dask shard tasks and the approximate index", seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
