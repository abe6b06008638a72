"""Grading on the platforms instructors use: a Gradescope autograder bundle and a GitHub Classroom workflow.

    python -m minigpt.grading.platforms gradescope autograder.zip [--notebooks ex03_speculative_step ...]
    python -m minigpt.grading.platforms github-classroom .github/workflows/classroom.yml

Both run the same grader as ``python -m minigpt.grade`` (a fresh kernel per notebook, the judge in the grader's
own process) inside the platform's container, one submission at a time:

* **Gradescope**: the bundle holds ``setup.sh`` (installs Python, a CPU torch and the course package, once, when
  Gradescope builds the image), ``run_autograder`` (grades ``/autograder/submission`` against the release
  notebooks in the bundle and writes ``/autograder/results/results.json``: a test per case, with its score,
  maximum, output and visibility), ``course/`` (the package: pyproject.toml, README.md, minigpt/ without caches
  and without the SmolLM2 checkpoints, which no exercise uses) and ``release/`` (the chosen release notebooks).
* **GitHub Classroom**: a workflow for the assignment's template repository; on every push it installs the grader
  from a pinned commit of the course, grades the student's notebooks with ``--github-classroom`` and hands the
  result to GitHub Classroom's grading reporter, which reports the points.

The templates (``setup.sh``, ``run_autograder``, ``classroom.yml``) live next to this file; the commands copy them,
so what is tested is what instructors get.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
TEMPLATES = ("setup.sh", "run_autograder", "classroom.yml")
SKIP_CHECKPOINTS = ("smollm2-",)  # the real-model track's weights: no exercise loads them


def template(name: str) -> str:
    """The text of one of this folder's templates."""
    path = HERE / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: build the bundle from a checkout of the course")
    return path.read_text(encoding="utf-8")


def _package_files(root: Path) -> list[Path]:
    files = []
    for path in sorted((root / "minigpt").rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
            continue
        if rel.parts[:2] == ("minigpt", "checkpoints") and path.name.startswith(SKIP_CHECKPOINTS):
            continue
        files.append(rel)
    return files + [Path("pyproject.toml"), Path("README.md")]


def gradescope_bundle(out: Path, notebooks: list[str] | None = None, root: Path = ROOT,
                      release: Path | None = None) -> list[str]:
    """Write Gradescope's autograder zip to ``out``; returns the names in it. ``notebooks``: the release
    notebooks of the assignment (file stems; default: every notebook of ``release``, the course's exercises/)."""
    release = release or root / "exercises"
    chosen = sorted(release.glob("*.ipynb"))
    if notebooks:
        wanted = {Path(n).stem for n in notebooks}
        unknown = wanted - {p.stem for p in chosen}
        if unknown:
            raise ValueError(f"no release notebook {', '.join(sorted(unknown))} in {release}")
        chosen = [p for p in chosen if p.stem in wanted]
    if not chosen:
        raise ValueError(f"no release notebooks in {release}")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name in ("setup.sh", "run_autograder"):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable, as Gradescope runs them
            z.writestr(info, template(name))
            names.append(name)
        for rel in _package_files(root):
            stored = rel.suffix == ".pt"  # weights do not compress
            z.write(root / rel, f"course/{rel.as_posix()}",
                    compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
            names.append(f"course/{rel.as_posix()}")
        for path in chosen:
            z.write(path, f"release/{path.name}")
            names.append(f"release/{path.name}")
    return names


def github_workflow(out: Path) -> None:
    """Write the GitHub Classroom workflow to ``out`` (e.g. ``.github/workflows/classroom.yml``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "classroom.yml", out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grading.platforms",
                                     description="Build the files instructors upload to a grading platform.")
    sub = parser.add_subparsers(dest="platform", required=True)
    gs = sub.add_parser("gradescope", help="write Gradescope's autograder zip")
    gs.add_argument("out", type=Path, help="the zip to write, e.g. autograder.zip")
    gs.add_argument("--notebooks", nargs="+", metavar="NAME",
                    help="the assignment's release notebooks (file stems); default: all of exercises/")
    gh = sub.add_parser("github-classroom", help="write the GitHub Classroom workflow")
    gh.add_argument("out", type=Path, nargs="?", default=Path(".github/workflows/classroom.yml"))
    args = parser.parse_args(argv)
    try:
        if args.platform == "gradescope":
            names = gradescope_bundle(args.out, args.notebooks)
            release = [n for n in names if n.startswith("release/")]
            size = args.out.stat().st_size / 2**20
            print(f"wrote {args.out} ({size:.0f} MB): setup.sh, run_autograder, the course package, "
                  f"{len(release)} release notebook(s): {', '.join(Path(n).stem for n in release)}")
        else:
            github_workflow(args.out)
            print(f"wrote {args.out}: commit it to the assignment's template repository and set COURSE_REPOSITORY "
                  "and COURSE_REF in it")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
