"""Run the figure scripts ``fig_*.py`` in one process, each only when its inputs changed.

A script's inputs are its own source, ``_common.py``, the ``tinyformer`` package
(its source digest, which also keys every stored experiment a script reads) and
the versions of NumPy and matplotlib. After a script runs, a stamp in
``--stamps`` records those inputs and the SHA-256 of every PNG it wrote; next
time, a script whose inputs and outputs are unchanged is skipped. Scripts run
into a fresh folder and only files whose bytes changed are copied into
``--out-dir``, so Sphinx re-reads no page whose figures did not change; files
that no script makes any more are deleted. ``--force`` runs every script.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import matplotlib as mpl
import numpy as np

from tinyformer.experiments import package_digest

HERE = Path(__file__).resolve().parent


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _inputs(script: Path, versions: str) -> str:
    """Digest of everything a script's output depends on (``versions``: package and libraries)."""
    digest = hashlib.sha256()
    common = script.parent / "_common.py"
    for part in (script.read_bytes(), common.read_bytes() if common.is_file() else b""):
        digest.update(part)
        digest.update(b"\0")
    digest.update(versions.encode())
    return digest.hexdigest()


def _up_to_date(stamp: Path, inputs: str, out_dir: Path) -> dict[str, str] | None:
    """The stamp's outputs if the script's inputs and outputs are unchanged, else None."""
    if not stamp.is_file():
        return None
    record = json.loads(stamp.read_text())
    outputs = record.get("outputs", {})
    unchanged = record.get("inputs") == inputs and all(
        (out_dir / name).is_file() and _sha256(out_dir / name) == sha
        for name, sha in outputs.items()
    )
    return outputs if unchanged else None


def _run(script: Path, folder: Path) -> None:
    """Run ``script`` as a module and call its ``main()`` as if run with ``--out-dir folder``."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after the backend is chosen)

    mpl.rcdefaults()  # no style leaks from one script into the next
    name = f"_figure_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses and pickling look it up
    argv = sys.argv
    sys.argv = [str(script), "--out-dir", str(folder)]
    try:
        # Compiled from the file as it is now, never from cached bytecode: a cached module is
        # matched to its source by time and size, so an edit within the same second that kept
        # the size would run the old script (a unit test that edits a script did, once).
        code = compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102
        module.main()
    finally:
        sys.argv = argv
        sys.modules.pop(name, None)
        plt.close("all")


def main(argv: list[str] | None = None) -> int:
    """Bring ``--out-dir`` up to date with the figure scripts; 1 if a script failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="the figures folder")
    parser.add_argument("--stamps", type=Path, required=True, help="folder for the stamps")
    parser.add_argument("--force", action="store_true", help="run every script")
    parser.add_argument("--scripts", type=Path, default=HERE, help="folder of the fig_*.py")
    args = parser.parse_args(argv)
    mpl.use("Agg")
    folder = str(args.scripts.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    scripts = sorted(args.scripts.glob("fig_*.py"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.stamps.mkdir(parents=True, exist_ok=True)
    made: set[str] = set()
    ran = changed = 0
    started = time.perf_counter()
    versions = f"{package_digest()} numpy {np.__version__} mpl {mpl.__version__}"  # hashed once
    for script in scripts:
        stamp = args.stamps / f"{script.stem}.json"
        inputs = _inputs(script, versions)
        kept = None if args.force else _up_to_date(stamp, inputs, args.out_dir)
        if kept is not None:
            made.update(kept)
            continue
        stamp.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=args.stamps) as temp:
            fresh = Path(temp)
            begun = time.perf_counter()
            try:
                _run(script, fresh)
            except Exception:  # noqa: BLE001 (name the script that failed, then fail the build)
                print(f"figure script {script.name} failed:\n{traceback.format_exc()}")
                return 1
            outputs = {p.name: _sha256(p) for p in sorted(fresh.iterdir()) if p.is_file()}
            if not outputs:
                print(f"figure script {script.name} wrote no file")
                return 1
            for name, sha in outputs.items():
                target = args.out_dir / name
                if not target.is_file() or _sha256(target) != sha:
                    shutil.copyfile(fresh / name, target)
                    changed += 1
        stamp.write_text(json.dumps({"inputs": inputs, "outputs": outputs}, indent=1))
        made.update(outputs)
        ran += 1
        print(f"  {script.name}: {time.perf_counter() - begun:.2f} s, {len(outputs)} file(s)")
    for old in sorted(args.out_dir.iterdir()):
        if old.is_file() and old.name not in made:
            old.unlink()
            print(f"  removed {old.name}: no script makes it")
    print(
        f"figures: {ran} of {len(scripts)} scripts ran ({len(scripts) - ran} up to date),"
        f" {changed} file(s) changed, {time.perf_counter() - started:.2f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
