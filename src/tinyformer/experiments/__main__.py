"""``python -m tinyformer.experiments`` (see :mod:`tinyformer.experiments.cli`)."""

from tinyformer.experiments.cli import main

raise SystemExit(main())
