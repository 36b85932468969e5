"""scripts/make_figures.py: each figure script runs only when its inputs changed, outputs stay exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[2] / "scripts" / "make_figures.py"
SCRIPT = '''"""A test figure."""
from pathlib import Path
import sys

from tinyformer.viz import new_figure, save_figure

LEVEL = {level}


def main():
    folder = Path(sys.argv[sys.argv.index("--out-dir") + 1])
    fig, ax = new_figure(size=(2.0, 2.0))
    ax.plot([0, 1], [0, LEVEL])
    save_figure(fig, folder / "{name}.png")
'''


@pytest.fixture
def runner():
    spec = importlib.util.spec_from_file_location("make_figures_under_test", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tree(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("one", "two"):
        (scripts / f"fig_{name}.py").write_text(SCRIPT.format(level=1, name=name))
    return scripts, tmp_path / "figures", tmp_path / "stamps"


def make(runner, tree, capsys, *extra):
    scripts, figures, stamps = tree
    code = runner.main(
        ["--scripts", str(scripts), "--out-dir", str(figures), "--stamps", str(stamps), *extra]
    )
    return code, capsys.readouterr().out


def test_scripts_run_once_and_then_only_when_their_inputs_change(runner, tree, capsys):
    scripts, figures, _ = tree
    code, out = make(runner, tree, capsys)
    assert code == 0
    assert "2 of 2 scripts ran" in out
    first = {p.name: p.read_bytes() for p in figures.iterdir()}
    assert sorted(first) == ["one.png", "two.png"]

    code, out = make(runner, tree, capsys)
    assert "0 of 2 scripts ran (2 up to date)" in out

    (scripts / "fig_two.py").write_text(SCRIPT.format(level=2, name="two"))
    code, out = make(runner, tree, capsys)
    assert "1 of 2 scripts ran" in out
    assert "fig_two.py" in out
    assert (figures / "one.png").read_bytes() == first["one.png"]
    assert (figures / "two.png").read_bytes() != first["two.png"]


def test_forced_runs_give_byte_identical_files(runner, tree, capsys):
    _, figures, _ = tree
    make(runner, tree, capsys)
    first = {p.name: p.read_bytes() for p in figures.iterdir()}
    code, out = make(runner, tree, capsys, "--force")
    assert code == 0
    assert "2 of 2 scripts ran" in out
    assert "0 file(s) changed" in out
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == first


def test_a_damaged_or_missing_output_makes_its_script_run_again(runner, tree, capsys):
    _, figures, _ = tree
    make(runner, tree, capsys)
    good = (figures / "one.png").read_bytes()
    (figures / "one.png").write_bytes(b"not a png")
    (figures / "two.png").unlink()
    code, out = make(runner, tree, capsys)
    assert code == 0
    assert "2 of 2 scripts ran" in out
    assert (figures / "one.png").read_bytes() == good
    assert (figures / "two.png").is_file()


def test_a_figure_no_script_makes_is_removed(runner, tree, capsys):
    scripts, figures, _ = tree
    make(runner, tree, capsys)
    (scripts / "fig_two.py").unlink()
    (figures / "stray.png").write_bytes(b"x")
    code, out = make(runner, tree, capsys)
    assert code == 0
    assert sorted(p.name for p in figures.iterdir()) == ["one.png"]
    assert "removed two.png" in out


def test_a_failing_script_fails_the_run_and_is_named(runner, tree, capsys):
    scripts, _, stamps = tree
    (scripts / "fig_two.py").write_text(
        "def main():\n    raise RuntimeError('broken on purpose')\n"
    )
    code, out = make(runner, tree, capsys)
    assert code == 1
    assert "figure script fig_two.py failed" in out
    assert "broken on purpose" in out
    assert not (stamps / "fig_two.json").exists()
