"""Benchmark of ``--device``: embedding extraction and exact kNN search on the
CPU against a CUDA GPU, with the checks that make the GPU path trustworthy.

(a) extraction: ``timm:resnet18?size=64`` (random init) over N phantom-like
    PNG images, the cache off, on the CPU and on CUDA (float32, then
    ``amp=True``); the ratio CPU time / GPU time; the max absolute deviation
    of the GPU's float32 embeddings from the CPU's, relative to the largest
    absolute value (stated tolerance 1e-3, see TorchEncoder.to) and the
    10-NN overlap of the amp embeddings with float32;
(b) exact search: N x d random float32 embeddings, k=10, cosine, on the CPU
    (faiss) and on CUDA (torch matmul + top-k, then the same float64
    re-scoring and tie rule): the time ratio, and whether the neighbour
    lists are identical (they must be);
(c) fine-tuning: ``finetune_classifier`` (chapter 04's fine-tuned policy)
    of the same network on the phantom, 3 epochs, on the CPU and on CUDA:
    the time ratio, the largest difference in predicted probability, and
    the test AUROC of each (a GPU's rounding, amplified by training, moves
    the probabilities; the AUROCs say by how much it matters).

Without a GPU the CUDA columns are skipped with a line that says so, and the
CPU figures are still measured. Run::

    python bench/bench_device.py [--images 1024] [--search-n 20000] [--dim 512] [--patients 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import crslib  # noqa: E402,F401  (before torch/timm)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from crslib.data import load_data  # noqa: E402
from crslib.embed import extract_embeddings  # noqa: E402
from crslib.models import finetune_classifier, load_encoder  # noqa: E402
from crslib.neighbors import knn_indices  # noqa: E402
from crslib.stats import auroc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import record, row  # noqa: E402
from bench_embed import write_images  # noqa: E402

SPEC = "timm:resnet18?size=64"
TOLERANCE = 1e-3  # max |X_gpu - X_cpu| / max |X_cpu|, as stated in TorchEncoder.to


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _extract(manifest, device: str, amp: bool = False):
    encoder = load_encoder(SPEC)
    # one warm-up batch: CUDA context, cuDNN autotuning, lazy module init
    extract_embeddings(manifest.iloc[:64], encoder, cache=False, progress=False, device=device, amp=amp)
    return _timed(lambda: extract_embeddings(manifest, encoder, cache=False, progress=False, device=device,
                                             amp=amp).X)


def _overlap(A: np.ndarray, B: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / A.shape[1] for a, b in zip(A, B)]))


def bench_extraction(n_images: int, gpu: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_images(Path(tmp), n_images)
        X_cpu, t_cpu = _extract(manifest, "cpu")
        rows.append(row(f"extraction, CPU ({n_images} images, {SPEC})", f"{t_cpu:.2f} s",
                        note=f"{n_images / t_cpu:.0f} images/s"))
        print(f"extraction on the CPU: {t_cpu:.2f} s ({n_images / t_cpu:.0f} images/s)")
        if not gpu:
            print("extraction on CUDA: skipped, torch sees no CUDA GPU on this machine")
            rows.append(row("extraction, CUDA", "skipped", note="torch sees no CUDA GPU"))
            return rows
        X_gpu, t_gpu = _extract(manifest, "cuda")
        X_amp, t_amp = _extract(manifest, "cuda", amp=True)
    dev = float(np.abs(X_gpu - X_cpu).max() / np.abs(X_cpu).max())
    ov = _overlap(knn_indices(X_amp, k=10), knn_indices(X_cpu, k=10))
    for label, t in (("CUDA float32", t_gpu), ("CUDA amp (float16)", t_amp)):
        print(f"extraction on {label}: {t:.2f} s, CPU / GPU = {t_cpu / t:.1f}x")
        rows.append(row(f"extraction, {label}", f"{t:.2f} s", note=f"CPU / GPU time {t_cpu / t:.1f}x"))
    print(f"max |X_gpu - X_cpu| / max |X_cpu| = {dev:.2e} (tolerance {TOLERANCE:g}); "
          f"amp 10-NN overlap with float32 {ov:.3f}")
    rows.append(row("float32 GPU vs CPU, max abs deviation / max abs value", f"{dev:.2e}",
                    target=f"<= {TOLERANCE:g}", passed=dev <= TOLERANCE))
    rows.append(row("amp (float16) vs float32, 10-NN overlap", f"{ov:.3f}"))
    return rows


def bench_search(n: int, d: int, gpu: bool) -> list[dict]:
    X = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    I_cpu, t_cpu = _timed(lambda: knn_indices(X, k=10, backend="faiss"))
    print(f"exact 10-NN search {n} x {d} on the CPU (faiss): {t_cpu:.2f} s")
    rows = [row(f"exact 10-NN search {n} x {d}, CPU (faiss)", f"{t_cpu:.2f} s")]
    if not gpu:
        print("exact search on CUDA: skipped, torch sees no CUDA GPU on this machine")
        rows.append(row("exact search, CUDA", "skipped", note="torch sees no CUDA GPU"))
        return rows
    knn_indices(X[:1000], k=10, device="cuda")  # warm-up
    I_gpu, t_gpu = _timed(lambda: knn_indices(X, k=10, device="cuda"))
    same = bool(np.array_equal(I_gpu, I_cpu))
    print(f"exact search on CUDA (torch top-k): {t_gpu:.2f} s, CPU / GPU = {t_cpu / t_gpu:.1f}x; "
          f"identical neighbours: {same}")
    rows.append(row(f"exact 10-NN search {n} x {d}, CUDA (torch top-k)", f"{t_gpu:.2f} s",
                    note=f"CPU / GPU time {t_cpu / t_gpu:.1f}x"))
    rows.append(row("GPU neighbours identical to faiss", str(same), target="True", passed=same))
    return rows


def bench_finetune(n_patients: int, gpu: bool) -> list[dict]:
    manifest = load_data(f"phantom?patients={n_patients}&size=64&seed=0")
    test = manifest["split"].to_numpy() == "test"

    def tune(device: str):
        with tempfile.TemporaryDirectory() as cache:  # a cached result from either device would be reused
            return _timed(lambda: finetune_classifier(manifest, SPEC, epochs=3, cache_root=cache,
                                                      progress=False, device=device))

    def test_auroc(out) -> float:
        return auroc(out["y_true"].to_numpy()[test], out["prob"].to_numpy()[test])

    label = f"fine-tuning {SPEC}, 3 epochs, {int((manifest['split'] == 'train').sum())} training images"
    cpu, t_cpu = tune("cpu")
    print(f"{label} on the CPU: {t_cpu:.1f} s, test AUROC {test_auroc(cpu):.3f}")
    rows = [row(f"{label}, CPU", f"{t_cpu:.1f} s", note=f"test AUROC {test_auroc(cpu):.3f}")]
    if not gpu:
        print("fine-tuning on CUDA: skipped, torch sees no CUDA GPU on this machine")
        rows.append(row("fine-tuning, CUDA", "skipped", note="torch sees no CUDA GPU"))
        return rows
    tune("cuda")  # warm-up: CUDA context, cuDNN autotuning
    gpu_out, t_gpu = tune("cuda")
    dev = float(np.abs(gpu_out["prob"].to_numpy() - cpu["prob"].to_numpy()).max())
    print(f"fine-tuning on CUDA: {t_gpu:.1f} s, CPU / GPU = {t_cpu / t_gpu:.1f}x, test AUROC "
          f"{test_auroc(gpu_out):.3f}; max |p_gpu - p_cpu| = {dev:.3g}")
    rows.append(row(f"{label}, CUDA", f"{t_gpu:.1f} s",
                    note=f"CPU / GPU time {t_cpu / t_gpu:.1f}x; test AUROC {test_auroc(gpu_out):.3f}"))
    rows.append(row("fine-tuned probabilities, max |GPU - CPU|", f"{dev:.3g}",
                    note="rounding differences amplified by 3 epochs of training"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--search-n", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--patients", type=int, default=600, help="phantom patients for the fine-tuning run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available()
    print(f"CUDA GPU: {torch.cuda.get_device_name(0) if gpu else 'none (CUDA measurements are skipped)'}")
    rows = (bench_extraction(args.images, gpu) + bench_search(args.search_n, args.dim, gpu)
            + bench_finetune(args.patients, gpu))
    record("device", rows, title="CPU vs GPU: extraction, exact search and fine-tuning",
           seconds=time.perf_counter() - t0)
    failed = [r["measure"] for r in rows if r["passed"] is False]
    if failed:
        print(f"FAILED: {'; '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
