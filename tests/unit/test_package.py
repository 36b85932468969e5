"""The top-level package: the names it exports, imported on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tinyformer


def test_all_lists_exactly_the_names_the_package_imports_on_demand():
    # __all__ is spelled out for tools that read it without running the module: it must
    # name what __getattr__ can import, no more and no less
    lazy = {name for names in tinyformer._TOP_LEVEL.values() for name in names}
    assert set(tinyformer.__all__) == lazy | {"__version__"}
    assert len(tinyformer.__all__) == len(set(tinyformer.__all__))


@pytest.mark.parametrize("name", sorted(tinyformer._WHERE))
def test_every_top_level_name_is_the_object_of_its_module(name):
    module = importlib.import_module(tinyformer._WHERE[name])
    assert getattr(tinyformer, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error_that_names_it():
    with pytest.raises(
        AttributeError, match="module 'tinyformer' has no attribute 'EncoderBlock'"
    ):
        tinyformer.EncoderBlock  # noqa: B018


def test_importing_the_package_imports_no_model_code():
    program = (
        "import sys, tinyformer\n"
        "print(sorted(m for m in sys.modules if m.startswith('tinyformer.')))\n"
        "tinyformer.DecoderOnlyLM\n"
        "print('tinyformer.models' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert after == "True"
