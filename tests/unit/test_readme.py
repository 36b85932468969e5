"""The README's example is the book's quickstart, which the build runs: they must not drift apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def _code_cells(markdown: str) -> list[str]:
    return re.findall(r"```\{code-cell\} ipython3\n(.*?)```", markdown, flags=re.DOTALL)


def test_the_readme_example_is_the_executed_quickstart():
    readme = _python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert readme, "the README has no python example"
    cells = _code_cells((ROOT / "docs" / "using.md").read_text(encoding="utf-8"))
    shown = [cell for cell in cells if not cell.startswith(":tags: [remove-cell]")]
    executed = shown[0] + "\n" + shown[1]  # the imports, then the program
    assert readme[0].strip() == executed.strip()
