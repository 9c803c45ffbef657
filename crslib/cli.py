"""The ``crs`` command line.

Each subcommand is a thin shell over a crslib function. A user error (a
:class:`crslib.errors.CRSError`) prints one line naming the problem and exits
with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import crslib
from crslib.errors import CRSError

log = logging.getLogger("crslib.cli")


def _cmd_phantom(args: argparse.Namespace) -> int:
    from crslib.phantom import generate_phantom

    manifest = generate_phantom(
        args.out_dir,
        n_patients=args.patients,
        image_size=args.image_size,
        seed=args.seed,
        n_sources=args.sources,
        shortcut_strength=args.shortcut_strength,
        split_shift=args.split_shift,
        kermany_layout=args.kermany_layout,
        progress=sys.stderr.isatty(),
    )
    print(
        f"wrote {len(manifest)} images of {manifest['patient_id'].nunique()} patients to {args.out_dir}"
    )
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from crslib._io import atomic_save_npy
    from crslib.data import load_data
    from crslib.embed import extract_embeddings
    from crslib.encoders import load_encoder

    manifest = load_data(args.data)
    encoder = load_encoder(args.model)
    result = extract_embeddings(
        manifest,
        encoder,
        batch_size=args.batch_size,
        num_workers=args.workers,
        cache=not args.no_cache,
        on_error="skip" if args.skip_unreadable else "raise",
        progress=None,
    )
    for row in result.skipped.itertuples():
        print(f"skipped {row.path}: {row.reason}", file=sys.stderr)
    status = "cache hit" if result.cache_hit else "computed"
    print(
        f"{result.X.shape[0]} embeddings of dimension {result.X.shape[1]} from {encoder.name} "
        f"({status}, {result.seconds:.2f} s, key {result.key[:12]})"
    )
    if args.out:
        out = Path(args.out)
        atomic_save_npy(out, result.X)
        atomic_save_npy(out.with_name(out.stem + "_image_ids.npy"), np.asarray(result.image_ids, dtype=str))
        print(f"saved {out}")
    return 0


def _cmd_book(args: argparse.Namespace) -> int:
    from crslib.runner import build_book

    record = build_book(args.config or args.preset, only=args.only, build=not args.no_build)
    for notebook in record.notebooks:
        print(f"{notebook.name}: {notebook.seconds:.1f} s")
    print(f"run folder: {record.run_dir}")
    if record.html_index:
        print(f"book built in {record.build_seconds:.1f} s: {record.html_index}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``crs`` (exposed for the CLI reference page)."""
    parser = argparse.ArgumentParser(
        prog="crs",
        description="CRS companion: agreement, protocol sensitivity and representation risk "
        "of medical image encoders.",
    )
    parser.add_argument("--version", action="version", version=f"crs {crslib.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "phantom",
        help="generate the synthetic chest-radiograph data set",
        description="Generate the phantom data set: image files, manifest.csv and latents.csv. "
        "The same arguments give byte-identical files.",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (created)")
    p.add_argument("--patients", type=int, default=300, help="number of patients (default 300)")
    p.add_argument("--image-size", type=int, default=64, help="image size in pixels, 32-512 (default 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--sources", type=int, default=4, help="number of acquisition sites (default 4)")
    p.add_argument("--shortcut-strength", type=float, default=0.0,
                   help="coupling of label and file encoding in the training pool, 0-1 (default 0)")
    p.add_argument("--split-shift", type=float, default=0.0,
                   help="acquisition shift of the official test split, 0-1 (default 0)")
    p.add_argument("--kermany-layout", action="store_true",
                   help="single label, chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/ folders, Kermany file names")
    p.set_defaults(func=_cmd_phantom)

    p = sub.add_parser(
        "embed",
        help="extract (cached) embeddings of a data set with a model",
        description="Extract embeddings with a content-addressed cache: a second run with the same "
        "images and weights is a cache hit; an interrupted run resumes.",
    )
    p.add_argument("--data", required=True, metavar="DATA",
                   help="manifest .csv/.parquet, data folder, image folder, MedMNIST .npz, or 'phantom?patients=N&size=PX&seed=S'")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="model spec: timm:NAME[?weights=PATH|pretrained=hf][&size=PX], onnx:PATH#OUTPUT")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--workers", type=int, default=None, help="data loader workers (default: automatic)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="skip unreadable images and list them, instead of stopping at the first")
    p.add_argument("--out", metavar="FILE.npy", help="also save the embeddings (and FILE_image_ids.npy)")
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser(
        "book",
        help="run the notebooks with a preset and build the book",
        description="Execute notebooks/*.py with papermill into a new run folder runs/<time>-<preset>/, "
        "then build the HTML book with jupyter-book and print the path of index.html.",
    )
    p.add_argument("--preset", default="default", choices=["quick", "default", "full"],
                   help="parameter preset from configs/ (default: default)")
    p.add_argument("--config", metavar="FILE", help="a YAML config file instead of a preset")
    p.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (name or number)")
    p.add_argument("--no-build", action="store_true", help="execute the notebooks but do not build HTML")
    p.set_defaults(func=_cmd_book)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``crs``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except CRSError as exc:
        if args.debug:
            raise
        message = str(exc).strip().splitlines()
        print(f"crs {args.command}: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        for line in message[1:]:
            print(f"  {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("crs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
