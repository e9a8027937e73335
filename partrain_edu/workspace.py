"""The learner's own copy of the course, which `make lab` opens: the committed notebooks are never run in place.

    python -m partrain_edu.workspace sync    --course . --workspace workspace   (every `make lab`)
    python -m partrain_edu.workspace refresh --course . --workspace workspace   (`make refresh`)

Running a notebook rewrites its outputs; run in the clone, that would leave the tracked notebooks modified and
make every `git pull` conflict. The workspace (git-ignored) holds copies of notebooks/ and exercises/, and links
to the folders they use by relative path (`../benchmarks/...`). It remembers which course version each copy
came from, so that:
- sync copies what is new in the course and updates every copy the learner never changed; a copy the learner
  changed is left as it is, and named when the course has a newer version;
- refresh also takes those newer versions, after moving the learner's to backups/<date-time>/<same path>.
Files the learner made themselves are never touched.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COPIED = ("notebooks", "exercises")  # the learner's to edit and run: their *.ipynb files are copied
LINKED = ("benchmarks",)  # scripts the notebooks run by relative path: linked, so they are always current
MANIFEST = ".partrain-workspace.json"  # relative path -> sha256 of the course version last copied


@dataclass
class Report:
    created: bool = False
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # changed by the learner, newer in the course
    backed_up: list[str] = field(default_factory=list)  # where refresh moved the learner's versions

    def lines(self, workspace: Path) -> list[str]:
        out = [f"created {workspace}: your own copy of the course"] if self.created else []
        out += [f"new from the course: {path}" for path in ([] if self.created else self.added)]
        out += [f"updated (you had not changed it): {path}" for path in self.updated]
        out += [f"your version kept, backed up in {path}" for path in self.backed_up]
        out += [f"kept your version of {path}; the course has a newer one (`make refresh` takes it and keeps "
                "yours in backups/)" for path in self.kept]
        return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(source: Path, target: Path) -> None:
    """Whole or not at all: a notebook half-written by an interrupted copy would be lost work later."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def _new_folder_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`... if a refresh in the same second already used it: a backup never
    replaces an older one."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def course_files(course: Path) -> dict[str, Path]:
    return {p.relative_to(course).as_posix(): p for folder in COPIED for p in sorted((course / folder).glob("*.ipynb"))}


def sync(course: Path, workspace: Path, take_newer: bool = False) -> Report:
    """Bring `workspace` up to date with `course` without losing a learner's change (see the module doc);
    `take_newer`: refresh, i.e. also replace the learner's changed copies, moving them to backups/ first."""
    report = Report(created=not workspace.exists())
    workspace.mkdir(parents=True, exist_ok=True)
    manifest_path = workspace / MANIFEST
    copied_from = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    backups = _new_folder_name(workspace / "backups" / time.strftime("%Y-%m-%d_%H%M%S"))
    for rel, source in course_files(course).items():
        target, latest = workspace / rel, _digest(source)
        if not target.exists():
            _copy(source, target)
            report.added.append(rel)
        elif copied_from.get(rel) == latest:
            continue  # the course has not changed since the copy: whatever the learner did stays
        elif (current := _digest(target)) == latest:
            pass  # already the course's version
        elif current == copied_from.get(rel):
            _copy(source, target)  # untouched by the learner: take the new version
            report.updated.append(rel)
        elif take_newer:
            (backups / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, backups / rel)
            _copy(source, target)
            report.backed_up.append((backups / rel).relative_to(workspace).as_posix())
        else:
            report.kept.append(rel)
            continue  # remember the version it was copied from: the learner's change is still theirs
        copied_from[rel] = latest
    manifest_path.write_text(json.dumps(copied_from, indent=1, sort_keys=True) + "\n")
    for name in LINKED:
        link = workspace / name
        if not link.exists() and not link.is_symlink() and (course / name).is_dir():
            link.symlink_to(os.path.relpath(course / name, workspace), target_is_directory=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partrain_edu.workspace", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["sync", "refresh"])
    parser.add_argument("--course", type=Path, default=Path.cwd(), help="the clone (default: here)")
    parser.add_argument("--workspace", type=Path, default=Path("workspace"), help="default: workspace/")
    args = parser.parse_args(argv)
    course = args.course.resolve()
    workspace = args.workspace if args.workspace.is_absolute() else course / args.workspace
    if not (course / "notebooks").is_dir():
        print(f"{course} has no notebooks/ folder: pass --course the clone of the course", file=sys.stderr)
        return 2
    report = sync(course, workspace, take_newer=args.command == "refresh")
    for line in report.lines(workspace):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
