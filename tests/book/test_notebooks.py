"""Every executable page is offered as a notebook, and a downloaded notebook runs top to bottom."""

from __future__ import annotations

import re
import shutil

import pytest

pytestmark = pytest.mark.book

# A short chapter (a few seconds) that needs no stored training run.
RUN_ME = "chapters/numpy"


def _notebook_link(html: str) -> str | None:
    match = re.search(r'href="([^"]+\.ipynb)"', html)
    return match[1] if match else None


def test_every_chapter_offers_its_notebook(html_root):
    problems = []
    for page in sorted((html_root / "chapters").glob("*.html")):
        link = _notebook_link(page.read_text(encoding="utf-8"))
        if link is None:
            problems.append(f"{page.name}: no .ipynb in the download menu")
        elif not (page.parent / link).resolve().is_file():
            problems.append(f"{page.name}: {link} is missing")
    assert not problems, "\n".join(problems)


def test_downloaded_notebook_runs_top_to_bottom(html_root, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    page = html_root / f"{RUN_ME}.html"
    link = _notebook_link(page.read_text(encoding="utf-8"))
    assert link, f"{RUN_ME}.html offers no notebook"
    # Run it where a reader would: in a folder of its own, away from the book's sources.
    notebook = tmp_path / "downloaded.ipynb"
    shutil.copyfile((page.parent / link).resolve(), notebook)
    nb = nbformat.read(notebook, as_version=4)
    assert sum(c.cell_type == "code" for c in nb.cells) >= 3
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors
