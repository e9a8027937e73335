"""Shared test helpers. Multi-process tests go through `partrain_edu.launcher.oneshot.torchrun` (free ports, no
leftovers)."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (used to prove that no rank outlives a failed launch)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def repo() -> Path:
    return REPO
