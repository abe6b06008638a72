"""The project's own setup: pyproject.toml and environment.yml agree, CI runs the README's test command, and the
data files the package needs are there."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> tuple[str, str]:
    """'ipywidgets >= 7.6, <9' -> ('ipywidgets', '<9,>=7.6'): name lower-cased with - for _, specifiers sorted."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*", requirement)
    assert m, f"cannot parse requirement {requirement!r}"
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    specs = ",".join(sorted(s.replace(" ", "") for s in m.group(3).split(",") if s.strip()))
    return name, specs


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def environment_pip_requirements(text: str) -> list[str]:
    """The entries of the ``- pip:`` list in a conda environment file (a line parser; no PyYAML needed).
    Options such as ``-e .`` (installing the package itself) are left out."""
    reqs, in_pip, pip_indent = [], False, None
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped.strip():
            continue
        indent = len(stripped) - len(stripped.lstrip())
        if re.fullmatch(r"\s*-\s*pip:\s*", stripped):
            in_pip, pip_indent = True, indent
            continue
        if in_pip:
            if indent <= pip_indent:
                in_pip = False
                continue
            item = re.sub(r"^\s*-\s*", "", stripped).strip().strip("'\"")
            if not item.startswith("-"):
                reqs.append(item)
    return reqs


def environment_conda_requirements(text: str) -> list[str]:
    """Top-level conda dependencies (``  - python>=3.10``), the pip list excluded."""
    out, in_deps = [], False
    for line in text.splitlines():
        if re.match(r"^dependencies:\s*$", line):
            in_deps = True
            continue
        if in_deps and re.match(r"^\S", line):
            break
        m = re.match(r"^  - ([^:#]+?)\s*(#.*)?$", line)
        if in_deps and m:
            out.append(m.group(1))
    return out


def test_environment_parser_reads_the_pip_section():
    text = "name: x\ndependencies:\n  - python>=3.10\n  - pip\n  - pip:\n      - a>=1  # note\n      - 'b'\n" \
           "      - -e .\n  - numpy\nother: 1\n"
    assert environment_pip_requirements(text) == ["a>=1", "b"]
    assert environment_conda_requirements(text) == ["python>=3.10", "pip", "numpy"]


def test_pyproject_and_environment_list_the_same_dependencies():
    proj = pyproject()["project"]
    extras = proj["optional-dependencies"]
    wanted = proj["dependencies"] + extras["lab"] + extras["test"]
    env_text = (ROOT / "environment.yml").read_text()
    listed = environment_pip_requirements(env_text)
    assert sorted(map(_normalise, listed)) == sorted(map(_normalise, wanted))
    assert len(listed) == len(set(listed)), "environment.yml lists a dependency twice"
    conda = environment_conda_requirements(env_text)
    python = [c for c in conda if c.startswith("python")]
    assert python and _normalise(python[0])[1] == _normalise("python" + proj["requires-python"])[1]
    assert "pip" in conda
    assert re.search(r"^name:\s*minigpt-course\s*$", env_text, re.M)


def test_dependencies_keep_colab_torch_and_widgets():
    proj = pyproject()["project"]
    deps = dict(map(_normalise, proj["dependencies"]))
    # a lower bound only: Colab's preinstalled torch 2.x must satisfy it, so pip never replaces it
    assert deps["torch"].startswith(">=2") and "<" not in deps["torch"] and "==" not in deps["torch"]
    assert deps["ipywidgets"] == "<9,>=7.6"     # Colab ships ipywidgets 7
    assert "jupyterlab" not in deps             # JupyterLab only with the [lab] extra
    assert {"tiktoken", "numpy", "matplotlib", "tqdm", "regex"} <= set(deps)
    assert proj["requires-python"] == ">=3.10"


def test_pytest_collects_lessons_but_not_exercises_or_solutions():
    opts = pyproject()["tool"]["pytest"]["ini_options"]
    assert opts["testpaths"] == ["tests", "course"]
    assert "--nbval-lax" in opts["addopts"] and "--nbval-current-env" in opts["addopts"]
    assert {"exercises", "solutions"} <= set(opts["norecursedirs"])
    assert any(m.startswith("slow:") for m in opts["markers"])


def readme_test_command() -> str:
    """The single command in the first fenced block under the README heading 'Run the tests'."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^#+\s*Run the tests\s*$(.*?)^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    assert m, "README.md needs a 'Run the tests' heading followed by a fenced block with the command"
    assert "```" not in m.group(1), "the command block must be the first one under the heading"
    lines = [ln.strip() for ln in m.group(2).splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one command under 'Run the tests', got {lines}"
    return lines[0]


def test_ci_runs_the_readme_test_command():
    command = readme_test_command()
    assert "pytest" in command and "torch==" in command
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in [ln.strip() for ln in ci.splitlines()], f".ci/run does not run {command!r} verbatim"
    assert "set -euo pipefail" in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111, ".ci/run is not executable"


def test_readme_gives_the_lab_command():
    assert 'python -m pip install torch==2.13.0 -e ".[lab]" && python -m jupyter lab course/' in \
        (ROOT / "README.md").read_text()


@pytest.mark.parametrize("relpath", ["minigpt/assets/stdlib_bpe.tiktoken", "minigpt/checkpoints/target.pt",
                                     "minigpt/checkpoints/draft.pt"])
def test_package_data_is_present(relpath):
    path = ROOT / relpath
    assert path.is_file() and path.stat().st_size > 0, f"{relpath} is missing"
    globs = pyproject()["tool"]["setuptools"]["package-data"]["minigpt"]
    inside = Path(relpath).relative_to("minigpt")
    assert any(inside.match(g) for g in globs), f"{relpath} is not declared as package data"


@pytest.mark.parametrize("relpath, ignored", [
    ("runs/target/ckpt.pt", True), (".venv-ci/bin/python", True), ("minigpt/__pycache__/model.cpython-311.pyc", True),
    ("minigpt/checkpoints/target.pt", False), ("minigpt/checkpoints/card.json", False),
    ("minigpt/assets/stdlib_bpe.tiktoken", False), ("course/01_example.ipynb", False)])
def test_gitignore(relpath, ignored):
    import shutil, subprocess
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = subprocess.run(["git", "check-ignore", "--no-index", "-q", relpath], cwd=ROOT)
    assert r.returncode in (0, 1), "git check-ignore failed"
    assert (r.returncode == 0) == ignored, f"{relpath} should {'' if ignored else 'not '}be ignored"
