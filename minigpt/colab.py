"""Where the notebooks install the course package from when it is missing (Colab), and where the Colab badge
points: one setting, :data:`REPOSITORY` (with :data:`BRANCH`), in this file.

A notebook's setup cell runs before ``minigpt`` can be imported, so it cannot read this setting when it runs;
its text is generated from :func:`setup_cell` instead and written into every notebook by a command::

    python -m minigpt.colab --write     # the setup cell of course/, solutions/, exercises/ and every Colab badge
    python -m minigpt.colab --check     # exit 1 naming each notebook (or README.md) that is out of date
    python -m minigpt.colab --write --repository you/your-fork --branch dev   # publish from somewhere else

A learner overrides the source when running, with the environment variable :data:`ENV` (``MINIGPT_SOURCE``):
a git URL pip understands, or a folder that holds the course (``%env MINIGPT_SOURCE=/content/minigpt-course``
before the setup cell, after uploading and unzipping the course). A failed install stops the cell with one
line that says so.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPOSITORY = "fast-decoding-course/minigpt-course"   # GitHub owner/name where the course is published
BRANCH = "main"
ENV = "MINIGPT_SOURCE"
FOLDERS = ("course", "solutions", "exercises")
FIRST_LINE = "# Setup: install the course package if it is missing (e.g. on Colab), then pick the device and seed."
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_LINK = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w./-]+?/"
                        r"(?P<path>[\w./-]+\.ipynb)")
EXTRAS = re.compile(r"minigpt(?P<extras>\[[\w,-]+\])? @ ")


def install_source(repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """What pip installs the package from by default: the repository's branch over git."""
    return f"git+https://github.com/{repository}@{branch}"


def badge_url(notebook: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The Colab address that opens ``notebook`` (a path in the repository, e.g. course/00_start_here.ipynb)."""
    return f"https://colab.research.google.com/github/{repository}/blob/{branch}/{notebook}"


def badge(notebook: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The markdown of an "Open in Colab" badge for ``notebook``."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({badge_url(notebook, repository, branch)})"


def setup_cell(extras: str = "", repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The setup cell's source. ``extras``: the package's extras the notebook needs, e.g. ``"[real]"``."""
    folder_spec = f'f"{{os.path.abspath(src)}}{extras}"' if extras else "os.path.abspath(src)"
    return f'''{FIRST_LINE}
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("minigpt") is None:
    # from {ENV} when it is set: a git URL, or a folder that holds the course
    src = os.environ.get("{ENV}", "{install_source(repository, branch)}")
    spec = {folder_spec} if os.path.isdir(src) else f"minigpt{extras} @ {{src}}"
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], capture_output=True).returncode:
        raise SystemExit(f"Could not install the course package from {{src}}: upload the course folder and run "
                         "%env {ENV}=/content/<that folder> (or a git URL of the course), then this cell.")
import torch, minigpt
device = minigpt.get_device()
torch.manual_seed(0)
print(f"minigpt {{minigpt.__version__}} | torch {{torch.__version__}} | device: {{device}}")'''


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def setup_cell_index(nb: dict) -> int | None:
    """The index of the notebook's setup cell: its first code cell that begins with :data:`FIRST_LINE`."""
    return next((i for i, c in enumerate(nb["cells"])
                 if c["cell_type"] == "code" and _source(c).startswith(FIRST_LINE)), None)


def expected_setup(source: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The template's text for a setup cell that now reads ``source`` (its extras are kept)."""
    m = EXTRAS.search(source)
    return setup_cell(m.group("extras") or "" if m else "", repository, branch)


def with_badges(text: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """``text`` with every Colab badge link pointing at the setting's repository and branch."""
    return BADGE_LINK.sub(lambda m: badge_url(m.group("path"), repository, branch), text)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def updated_notebook(nb: dict, repository: str = REPOSITORY, branch: str = BRANCH) -> tuple[dict, list[str]]:
    """``nb`` with its setup cell and badges as the setting says, and what changed (empty: up to date)."""
    changes = []
    i = setup_cell_index(nb)
    if i is None:
        changes.append("no setup cell (a first code cell beginning with the setup comment)")
    elif _source(nb["cells"][i]) != expected_setup(_source(nb["cells"][i]), repository, branch):
        nb["cells"][i]["source"] = _lines(expected_setup(_source(nb["cells"][i]), repository, branch))
        changes.append(f"cell {i}: the setup cell")
    for j, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown" and with_badges(_source(cell), repository, branch) != _source(cell):
            cell["source"] = _lines(with_badges(_source(cell), repository, branch))
            changes.append(f"cell {j}: a Colab badge")
    return nb, changes


def notebooks(root: Path) -> list[Path]:
    """Every notebook of :data:`FOLDERS` under ``root``."""
    return [p for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]


def sync(root: Path, write: bool, repository: str = REPOSITORY, branch: str = BRANCH) -> list[str]:
    """Bring every notebook's setup cell and badges, and README.md's badges, in line with the setting
    (``write=False``: only report). Returns one line per file that was (or would be) changed."""
    report = []
    for path in notebooks(root):
        text = path.read_text(encoding="utf-8")
        nb, changes = updated_notebook(json.loads(text), repository, branch)
        if changes:
            report.append(f"{path.relative_to(root)}: {'; '.join(changes)}")
            if write and setup_cell_index(nb) is not None:
                path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    readme = root / "README.md"
    if readme.exists():
        text = readme.read_text(encoding="utf-8")
        if with_badges(text, repository, branch) != text:
            report.append("README.md: a Colab badge")
            if write:
                readme.write_text(with_badges(text, repository, branch), encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.colab", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite setup cells and badges that are out of date")
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is out of date")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the course's folder")
    ap.add_argument("--repository", default=REPOSITORY, help=f"GitHub owner/name (default {REPOSITORY})")
    ap.add_argument("--branch", default=BRANCH, help=f"branch (default {BRANCH})")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", args.repository):
        ap.error(f"--repository takes owner/name, got {args.repository!r}")
    root = Path(args.root)
    if not any((root / f).is_dir() for f in FOLDERS):
        ap.error(f"{root} holds none of {', '.join(FOLDERS)}")
    report = sync(root, args.write, args.repository, args.branch)
    for line in report:
        print(("updated " if args.write else "out of date: ") + line)
    if args.check and report:
        print("run: python -m minigpt.colab --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
