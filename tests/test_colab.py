"""The setup cell every notebook starts with and the Colab badge (minigpt.colab): one install source, one
template, and a command that writes the template into the notebooks."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from minigpt import colab

ROOT = Path(__file__).resolve().parents[1]


def run_install_part(cell: str, monkeypatch, returncode: int, source: str | None):
    """Run the setup cell's install step as if minigpt were missing, with pip replaced by a stand-in that
    records what it was asked and returns ``returncode``; the cell's lines from ``import torch`` on are left out."""
    asked = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "minigpt" else
                        real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: asked.append(args) or
                        subprocess.CompletedProcess(args, returncode))
    if source is None:
        monkeypatch.delenv(colab.ENV, raising=False)
    else:
        monkeypatch.setenv(colab.ENV, source)
    exec(cell.split("import torch, minigpt")[0], {})
    return asked[0][-1]


def test_the_setup_cell_installs_from_the_setting_with_the_notebooks_extras(monkeypatch):
    assert run_install_part(colab.setup_cell(), monkeypatch, 0, None) == f"minigpt @ {colab.install_source()}"
    assert colab.install_source() == f"git+https://github.com/{colab.REPOSITORY}@{colab.BRANCH}"
    spec = run_install_part(colab.setup_cell("[real]"), monkeypatch, 0, None)
    assert spec == f"minigpt[real] @ {colab.install_source()}"


def test_the_environment_variable_overrides_the_source(monkeypatch, tmp_path):
    assert run_install_part(colab.setup_cell(), monkeypatch, 0, "git+https://example.org/fork") == \
        "minigpt @ git+https://example.org/fork"
    assert run_install_part(colab.setup_cell("[real]"), monkeypatch, 0, str(tmp_path)) == f"{tmp_path}[real]"
    assert run_install_part(colab.setup_cell(), monkeypatch, 0, str(tmp_path)) == str(tmp_path)  # an uploaded folder


def test_a_failed_install_stops_with_one_line_that_says_what_to_do(monkeypatch):
    with pytest.raises(SystemExit) as stop:
        run_install_part(colab.setup_cell(), monkeypatch, 1, "/no/such/folder")
    message = str(stop.value)
    assert "\n" not in message and "/no/such/folder" in message
    assert "upload the course folder" in message and f"%env {colab.ENV}=" in message


def test_a_real_failed_pip_install_gives_that_line(tmp_path):
    """The cell as a learner runs it where minigpt is missing (a python that cannot see it) and the source does
    not exist: pip fails, and the last line of the output is the one-line message."""
    cell = colab.setup_cell().replace('importlib.util.find_spec("minigpt") is None', "True")
    script = tmp_path / "cell.py"
    script.write_text(cell.split("import torch, minigpt")[0])
    r = subprocess.run(["python", str(script)], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin:" + str(Path(shutil.which("python")).parent),
                            colab.ENV: "git+file:///no/such/repository", "PIP_NO_INDEX": "1"})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "Could not install" in r.stderr


def test_badges_point_where_the_setting_points():
    text = "[![Open In Colab](x)](https://colab.research.google.com/github/old/repo/blob/dev/course/05_x.ipynb)"
    assert colab.with_badges(text, "you/fork", "main") == \
        "[![Open In Colab](x)](https://colab.research.google.com/github/you/fork/blob/main/course/05_x.ipynb)"
    assert colab.badge("course/00_start_here.ipynb").endswith(
        f"(https://colab.research.google.com/github/{colab.REPOSITORY}/blob/{colab.BRANCH}/course/00_start_here.ipynb)")


def _copy_course(tmp_path: Path) -> Path:
    for folder in colab.FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def _exercises_in_step(root: Path) -> set[str]:
    """The solutions whose exercise notebook is what make_exercises generates from them."""
    from minigpt.grading.make_exercises import make_exercise
    return {p.name for p in (root / "solutions").glob("*.ipynb")
            if make_exercise(p.read_text(encoding="utf-8"), p.name) == (root / "exercises" / p.name).read_text()}


def test_write_rewrites_only_setup_cells_and_badges_of_a_copy(tmp_path, capsys):
    root = _copy_course(tmp_path)
    before = {p: json.loads(p.read_text()) for p in colab.notebooks(root)}
    in_step = _exercises_in_step(root)
    assert colab.main(["--write", "--root", str(root), "--repository", "you/fork", "--branch", "dev"]) == 0
    assert colab.main(["--check", "--root", str(root), "--repository", "you/fork", "--branch", "dev"]) == 0
    assert colab.sync(root, write=False, repository="you/fork", branch="dev") == []     # idempotent
    for path, old in before.items():
        new = json.loads(path.read_text())
        i = colab.setup_cell_index(new)
        assert i is not None and "".join(new["cells"][i]["source"]) == colab.expected_setup(
            "".join(old["cells"][i]["source"]), "you/fork", "dev")
        assert "git+https://github.com/you/fork@dev" in "".join(new["cells"][i]["source"])
        for j, (a, b) in enumerate(zip(old["cells"], new["cells"])):   # nothing else changed
            if j != i:
                assert a == b or "colab.research.google.com" in "".join(a["source"]), (path.name, j)
        assert new["cells"][i]["outputs"] == old["cells"][i]["outputs"]
    assert _exercises_in_step(root) == in_step      # exercises still what their solutions generate
    lesson0 = "".join(json.loads((root / "course/00_start_here.ipynb").read_text())["cells"][0]["source"])
    assert colab.badge_url("course/00_start_here.ipynb", "you/fork", "dev") in lesson0
    capsys.readouterr()
    assert colab.main(["--check", "--root", str(root)]) == 1                              # the default differs
    assert "out of date: course/" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        colab.main(["--check", "--repository", "no-slash"])
    with pytest.raises(SystemExit):
        colab.main(["--check", "--root", str(tmp_path)])
    assert "holds none of" in capsys.readouterr().err


def test_every_notebook_starts_with_the_template_and_every_badge_points_at_the_setting():
    """Fails until ``python -m minigpt.colab --write`` has been run after a change of the template or setting."""
    stale = colab.sync(ROOT, write=False)
    assert not stale, "run python -m minigpt.colab --write:\n" + "\n".join(stale)
