"""``python -m tinyformer.experiments`` (see :mod:`tinyformer.experiments.cli`)."""

from tinyformer.experiments.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
