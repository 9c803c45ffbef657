"""Time the README's commands on a fresh clone: ``make install``, ``make book`` and ``make test``.

This is what a new user, a student on a laptop and CI do first. The script
clones the repository's ``HEAD`` (committed work only) into a temporary
folder and runs there, one after the other, each with an empty
``CRS_CACHE_DIR``:

- ``make install``: the user install (``requirements.lock``, no test tools);
- ``make book``: the default book, cold (the venv present, the cache empty);
- ``make test``: the development tools (``requirements-dev.lock``) on top of
  the user install, then the test suite, as CI's ``.ci/run`` does.

Targets (issue 59, 2-core machine): install <= 3 min, default book cold
<= 8 min, ``make test`` <= 15 min (its development install included). The
reference workload of :mod:`bench_book` (a bare ResNet-18 forward pass over
2,000 images at 64 px) is timed before and after, so a slower CPU shows up as
a slower reference, not as a regression. pip's own download cache is the
machine's: where the wheels come from a local folder, as on these machines,
the install time is what a user with that folder sees.

Usage: ``python bench/bench_setup.py [--skip-book] [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import REPO_ROOT, record, row  # bench/ is the script's folder
from bench_book import reference_seconds

TARGETS_S = {"install": 180.0, "book": 480.0, "test": 900.0}
MEASURES = {
    "install": "make install (user install), fresh clone",
    "book": "make book (default preset), cold, after make install",
    "test": "make test (development install + the test suite), fresh clone",
}


def timed_make(target: str, clone: Path, cache: Path, log: Path) -> float:
    """Seconds of ``make TARGET`` in ``clone``; its output goes to ``log``; a failure stops the script."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST_", "CRS_"))}
    # no virtual environment of this checkout on the PATH: the clone makes and uses its own
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "activate").is_file()]
    env.update(CRS_CACHE_DIR=str(cache), PATH=os.pathsep.join(path))
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(["make", target], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(log.read_text()[-6000:])
        raise SystemExit(f"make {target} failed with status {done.returncode} (log: {log})")
    print(f"  make {target}: {seconds:.0f} s", flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-book", action="store_true", help="time make install and make test only")
    parser.add_argument("--keep", action="store_true", help="keep the clone and the logs (printed)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="crs-bench-setup-"))
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    print(f"fresh clone of {commit} in {clone}", flush=True)
    reference_before = reference_seconds()
    seconds = {}
    for target in ("install", *(() if args.skip_book else ("book",)), "test"):
        seconds[target] = timed_make(target, clone, tmp / f"cache-{target}", tmp / f"make-{target}.log")
    reference_after = reference_seconds()
    references = f"reference workload {reference_before:.1f} s before, {reference_after:.1f} s after (same run)"
    rows = [row(MEASURES[target], f"{value / 60:.1f} min", f"<= {TARGETS_S[target] / 60:.0f} min",
                value <= TARGETS_S[target], f"{value:.0f} s, ratio {value / TARGETS_S[target]:.2f}; commit "
                f"{commit}; {references}") for target, value in seconds.items()]
    for r in rows:
        print(f"{r['measure']}: {r['value']} (target {r['target']}) {r['note']}")
    record("setup", rows, title="A fresh clone: install, default book and test suite", seconds=time.perf_counter() - start)
    if args.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
