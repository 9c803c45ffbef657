"""Benchmark: generate about 2,000 phantom images at 64 px.

Target: under 30 s on the 2-core reference machine. A same-run reference
(encoding and writing 2,000 64-px PNGs of random noise with PIL) makes the
ratio meaningful on a noisy machine.

    python bench/bench_phantom.py
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crslib.data.phantom import generate_phantom  # noqa: E402
from _results import record, row  # noqa: E402

TARGET_S = 30.0
IMAGE_SIZE = 64
N_PATIENTS = 830  # 1-4 images each, 2.5 on average: 1,999 images with seed 0
SEED = 0


def bare_png_encode(n: int, size: int, out: Path) -> float:
    """Seconds to encode and write ``n`` PNGs of random noise."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (size, size), dtype=np.uint8) for _ in range(n)]
    start = time.perf_counter()
    for i, a in enumerate(arrays):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        (out / f"{i}.png").write_bytes(buf.getvalue())
    return time.perf_counter() - start


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench_phantom_") as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        manifest = generate_phantom(tmp / "phantom", n_patients=N_PATIENTS, image_size=IMAGE_SIZE, random_state=SEED)
        seconds = time.perf_counter() - start
        n = len(manifest)
        (tmp / "ref").mkdir()
        ref = bare_png_encode(n, IMAGE_SIZE, tmp / "ref")

    rows = [
        ("images", f"{n} ({N_PATIENTS} patients, {IMAGE_SIZE} px)"),
        ("phantom seconds", f"{seconds:.2f}"),
        ("phantom images/s", f"{n / seconds:.0f}"),
        ("bare PNG encode seconds (same n)", f"{ref:.2f}"),
        ("phantom time / bare PNG encode time", f"{seconds / ref:.1f}"),
        ("target_ratio = 30 s / measured s (>= 1 passes)", f"{TARGET_S / seconds:.2f}"),
        ("verdict", "PASS" if seconds <= TARGET_S else "FAIL"),
    ]
    width = max(len(k) for k, _ in rows)
    print("bench_phantom")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    record("phantom", [
        row("phantom images generated", f"{n:,} ({N_PATIENTS} patients, {IMAGE_SIZE} px)"),
        row("phantom generation time", f"{seconds:.1f} s", f"<= {TARGET_S:.0f} s", seconds <= TARGET_S),
        row("phantom rate", f"{n / seconds:.0f} images/s"),
        row("phantom time / bare PNG encode of the same count (same run)", f"{seconds / ref:.1f}",
            note=f"bare encode {ref:.1f} s"),
    ], title="Phantom dataset generation", seconds=seconds + ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
