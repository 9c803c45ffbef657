"""Time whole book builds: cold (empty cache) and warm (every cache hit).

For each preset, a copy of the book sources is built twice by ``crs book``'s
code path (:func:`crslib.runner.build_book`) in a fresh interpreter:

- **cold**: an empty ``CRS_CACHE_DIR``, as after ``make install`` on a fresh
  clone: the phantom is generated, every embedding extracted, every notebook
  executed and the HTML built (the zoo and the fine-tunings ship: nothing is
  trained);
- **warm**: the same again in the same book folder with the cache the cold
  build filled, so every lookup is a hit: data, models, embeddings and the
  notebook executions themselves (a notebook whose source, parameters,
  crslib code and package versions are unchanged is reused, see
  :func:`crslib.runner.execution_key`); nothing changed, so the HTML of the
  cold build is kept;
- **rerun** (``quick`` only, for time): the warm build with ``--rerun``
  (every notebook executed again, every data, model and embedding lookup
  still a hit), to show what the execution cache saves.

Targets (issue 59, 2-core machine, cold = venv present, empty cache): ``quick``
<= 2 min, ``default`` <= 8 min, warm (nothing changed) <= 15 s. The ratio
printed is measured / target (<= 1 passes). Each chapter's time is recorded
beside a **reference workload** timed in the same run (a bare ResNet-18
forward pass over 2,000 random images at 64 px, the same torch threads), so
a slower CPU shows up as a slower reference, not as a regression; the CPU
model is recorded with the machine.

Usage: ``python bench/bench_book.py [quick] [default]`` (both by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import REPO_ROOT, record, results_path, row  # bench/ is the script's folder

COLD_TARGET_S = {"quick": 120.0, "default": 480.0, "full": 900.0}
WARM_TARGET_S = 15.0

REFERENCE = """
import time
import crslib  # the torchvision import fix, as every entry point
import timm, torch
model = timm.create_model("resnet18", pretrained=False, num_classes=0).eval()
x = torch.randn(2000, 3, 64, 64, generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    model(x[:100])
    start = time.perf_counter()
    for i in range(0, 2000, 100):
        model(x[i:i + 100])
print(time.perf_counter() - start)
"""


def reference_seconds() -> float:
    """Seconds of the reference workload (ResNet-18 forward, 2,000 images at 64 px) in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True, check=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return float(done.stdout.strip().splitlines()[-1])

BUILD = """
import json, sys
from crslib.runner import build_book
record = build_book(sys.argv[1], run_root=sys.argv[2], book_root=sys.argv[3], reuse=sys.argv[4] == "reuse")
print(json.dumps({n.name[:2]: n.seconds for n in record.notebooks if not n.reused_from}))
print(record.html_index)
"""


def book_copy(dest: Path) -> Path:
    """The book sources as ``make book`` sees them, without generated pages."""
    dest.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(REPO_ROOT / name, dest / name)
    shutil.copytree(REPO_ROOT / "book", dest / "book", ignore=shutil.ignore_patterns("generated", "__pycache__"))
    return dest


def timed_build(preset: str, book_root: Path, cache: Path, *, reuse: bool = True) -> tuple[float, str]:
    """Seconds of one build, and the seconds of each notebook it executed
    (``"01 14s, 02 184s, ..."``; reused notebooks are left out)."""
    env = dict(os.environ, CRS_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", BUILD, preset, str(book_root / "runs"), str(book_root),
                           "reuse" if reuse else "rerun"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise SystemExit(f"the {preset} book build failed with status {done.returncode}")
    *_, executed, index = done.stdout.strip().splitlines()
    if not Path(index).is_file():
        raise SystemExit(f"the {preset} build reported {index}, which does not exist")
    return seconds, ", ".join(f"{name} {value:.0f}s" for name, value in json.loads(executed).items())


def earlier_rows(presets: list[str]) -> list[dict]:
    """Rows of the recorded ``book`` entry for presets not in ``presets``,
    marked with the run they come from."""
    path = results_path()
    entry = json.loads(path.read_text(encoding="utf-8")).get("benchmarks", {}).get("book") if path.is_file() else None
    if not entry:
        return []
    kept = []
    for old in entry["rows"]:
        if any(f"preset {p}," in old["measure"] for p in presets):
            continue
        origin = old.get("from_run") or f"{entry['recorded_utc']}, commit {entry['commit']}"
        kept.append({**old, "from_run": origin,
                     "note": f"{old['note']} (an earlier run: {origin})" if "(an earlier run" not in old["note"]
                     else old["note"]})
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=["quick", "default"], choices=sorted(COLD_TARGET_S))
    parser.add_argument("--no-rerun", action="store_true", help="skip the --rerun build of the quick preset")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = []
    for preset in args.presets:
        with tempfile.TemporaryDirectory(prefix=f"crs-bench-book-{preset}-") as tmp:
            tmp = Path(tmp)
            cache = tmp / "cache"
            load = os.getloadavg()[0]
            reference = reference_seconds()
            checkout = book_copy(tmp / "cold")
            cold, cold_notebooks = timed_build(preset, checkout, cache)
            # warm: `make book` again in the same checkout with nothing changed
            warm, warm_notebooks = timed_build(preset, checkout, cache)
            rerun = timed_build(preset, book_copy(tmp / "rerun"), cache, reuse=False)[0] if (
                preset == "quick" and not args.no_rerun) else None
            load_after = os.getloadavg()[0]
        cold_target = COLD_TARGET_S[preset]
        rerun_text = f"rerun {rerun:.0f} s, " if rerun is not None else ""
        print(f"book {preset}: cold {cold:.0f} s (target {cold_target:.0f} s, ratio {cold / cold_target:.2f}), "
              f"warm {warm:.0f} s (target {WARM_TARGET_S:.0f} s, ratio {warm / WARM_TARGET_S:.2f}), {rerun_text}"
              f"load average {load:.1f} before, {load_after:.1f} after", flush=True)
        print(f"  cold notebooks: {cold_notebooks}; warm executed: {warm_notebooks or 'none'}; reference workload "
              f"{reference:.1f} s", flush=True)
        table += [
            row(f"book build, preset {preset}, cold (empty cache)", f"{cold / 60:.1f} min",
                f"<= {cold_target / 60:.0f} min", cold <= cold_target,
                f"ratio {cold / cold_target:.2f}; notebooks {cold_notebooks}; reference workload {reference:.1f} s "
                "(ResNet-18 forward, 2,000 images at 64 px, same run)"),
            row(f"book build, preset {preset}, warm (every cache hit)", f"{warm:.0f} s",
                f"<= {WARM_TARGET_S:.0f} s", warm <= WARM_TARGET_S,
                f"ratio {warm / WARM_TARGET_S:.2f}; load average {load:.1f} before, {load_after:.1f} after; "
                f"executed again: {warm_notebooks or 'none'}"),
        ]
        if rerun is not None:
            table.append(row(f"book build, preset {preset}, every notebook executed again (--rerun), other caches hit",
                             f"{rerun / 60:.1f} min", note="what the execution cache saves on a warm build"))
        # recorded as soon as a preset is measured, so a stopped run keeps what
        # it measured; rows of presets this run did not build are kept
        record("book", table + earlier_rows(args.presets), title="Whole book builds",
               seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
