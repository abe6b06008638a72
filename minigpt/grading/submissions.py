"""Submissions as they arrive: which release notebook a file is, and whose it is.

A class's files come renamed (``ex03_speculative_step (1).ipynb``, ``ex03_speculative_step-alice.ipynb``,
``alice_ex03.ipynb``), nested (nbgrader's ``submitted/<student>/<assignment>/<notebook>.ipynb``, or a folder per
student) or flat (``<student>_<notebook>.ipynb``). :func:`match_release` finds the release notebook by the first
rule that applies, and says which:

1. ``notebook metadata``: the exercise identity the generator writes into every release notebook
   (``metadata.minigpt.exercise``, kept by Jupyter when the learner saves);
2. ``cell tags``: most of the submission's tagged code cells carry the cell ids of one release notebook (a
   notebook whose top-level metadata was lost, or made from an older release);
3. ``file name``: the file is named like the release notebook (``ex03_speculative_step.ipynb``);
4. ``file name contains ex03_speculative_step``: the release's name appears in the file name;
5. ``file name contains ex03``: the exercise number appears, and only one release notebook has it.

:func:`student_of` reads the student from the layout: the folder after ``submitted/`` (nbgrader), else the first
folder under the graded folder, else what is left of the file name once the release's name (or number) and
separators are taken out; ``"-"`` when nothing is left.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

NUMBER = re.compile(r"(?<![A-Za-z0-9])(ex\d{2})(?![0-9])", re.IGNORECASE)


@dataclass
class Release:
    """A release notebook: its path, its exercise identity (the file stem, e.g. ``ex03_speculative_step``) and
    the ids of its tagged code cells."""
    path: Path
    identity: str
    cells: set[str] = field(default_factory=set)

    @property
    def number(self) -> str | None:
        m = NUMBER.match(self.identity)
        return m.group(1).lower() if m else None


def read_notebook(path: Path):
    """A notebook read and validated with nbformat (version 4), warnings about old formats silenced."""
    import nbformat
    with warnings.catch_warnings():  # e.g. nbformat's MissingIDFieldWarning on older notebooks: not our concern
        warnings.simplefilter("ignore")
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    return nb


def identity(nb) -> str | None:
    """The exercise identity the generator wrote into a notebook's metadata, if any."""
    meta = nb.get("metadata", {}).get("minigpt")
    value = meta.get("exercise") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


def cell_tags(nb) -> list[str]:
    """The generator's ids of a notebook's tagged code cells."""
    tags = []
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("minigpt")
        if cell.get("cell_type") == "code" and isinstance(meta, dict) and isinstance(meta.get("cell"), str):
            tags.append(meta["cell"])
    return tags


def load_releases(folder: Path) -> list[Release]:
    """The release notebooks of a folder (not recursive); unreadable ones are skipped."""
    releases = []
    for path in sorted(Path(folder).glob("*.ipynb")):
        try:
            nb = read_notebook(path)
        except Exception:
            continue
        releases.append(Release(path, identity(nb) or path.stem, set(cell_tags(nb))))
    return releases


def match_release(path: Path, nb, releases: list[Release]) -> tuple[Release | None, str]:
    """The release notebook a submission answers, and the rule that matched (see the module docstring); (None,
    why not) when no rule does."""
    if nb is not None:
        ident = identity(nb)
        found = next((r for r in releases if r.identity == ident), None) if ident else None
        if found:
            return found, "notebook metadata"
        tags = cell_tags(nb)
        if tags:
            best = max(releases, key=lambda r: len(r.cells.intersection(tags)), default=None)
            if best is not None and 2 * len(best.cells.intersection(tags)) > len(tags):
                return best, "cell tags"
    stem = Path(path).stem
    exact = next((r for r in releases if r.path.stem == stem or r.identity == stem), None)
    if exact:
        return exact, "file name"
    contains = [r for r in releases if r.identity.lower() in stem.lower()]
    if contains:
        best = max(contains, key=lambda r: len(r.identity))
        return best, f"file name contains {best.identity}"
    numbers = {m.lower() for m in NUMBER.findall(stem)}
    by_number = [r for r in releases if r.number in numbers]
    if len(by_number) == 1:
        return by_number[0], f"file name contains {by_number[0].number}"
    if len(by_number) > 1:
        return None, f"the file name names {len(by_number)} release notebooks ({', '.join(sorted(numbers))})"
    return None, "no release notebook matches its metadata, its cells or its file name"


def student_of(path: Path, root: Path | None, release: Release | None) -> str:
    """The student a submission belongs to, read from where it lies (see the module docstring)."""
    path = Path(path)
    parts = path.resolve().parts
    if "submitted" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("submitted")  # the last "submitted" folder above the file
        if i + 2 < len(parts):
            return parts[i + 1]
    if root is not None:
        try:
            rel = path.resolve().relative_to(Path(root).resolve()).parts
        except ValueError:
            rel = ()
        if len(rel) >= 2:
            return rel[0]
    stem = path.stem
    if release is not None:
        stem = re.sub(re.escape(release.identity), " ", stem, flags=re.IGNORECASE)
        if release.number:
            stem = re.sub(rf"(?<![A-Za-z0-9]){release.number}(?![0-9])", " ", stem, flags=re.IGNORECASE)
    stem = re.sub(r"\(\d+\)|\bcopy\b", " ", stem, flags=re.IGNORECASE)  # "(1)", "copy": a browser's or an OS's
    name = re.sub(r"[\s_\-.]+", " ", stem).strip().replace(" ", "_")
    return name or "-"
