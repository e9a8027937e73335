"""JSON lines between the grader and a sandboxed process (the grading kernel, a rank-check runner).

The sandboxed end (`sandbox_end`) answers on a copy of its stdout and points fd 0 and 1 at /dev/null first, so
that what the learner's code prints never lands on the channel by accident. On purpose it can — the learner's
code shares that process — so everything read from a sandbox is treated as the learner's data (return values,
source text), never as a verdict. The grader's end (`Channel`) reads with a deadline and a size cap: a sandbox
that stalls, floods or dies becomes an exception, never a hang. Its stderr is drained too (a full pipe would
block it) and its last lines kept, to say why it died.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from typing import Any, TextIO

MAX_LINE_BYTES = 8 * 2**20  # a reply is a return value or a function's source: 8 MiB is far beyond either
STDERR_TAIL_BYTES = 4096


class Closed(Exception):
    """The sandboxed process closed its end (it exited or was killed), or broke the protocol."""


class Channel:
    """The grader's end: send a JSON object, receive one before a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._lines = bytearray()
        self._stderr = bytearray()
        self._output_open = True
        self._selector = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            self._selector.register(stream, selectors.EVENT_READ)

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise Closed("the process is gone") from None

    def receive(self, deadline: float) -> dict:
        """The next JSON object the sandbox wrote (other lines are skipped); TimeoutError at `deadline`."""
        while True:
            newline = self._lines.find(b"\n")
            if newline >= 0:
                line = bytes(self._lines[:newline])
                del self._lines[:newline + 1]
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    return message
                continue
            if len(self._lines) > MAX_LINE_BYTES:
                raise Closed(f"it sent a line over {MAX_LINE_BYTES // 2**20} MiB")
            if not self._output_open:
                raise Closed("it closed its output")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            for key, _ in self._selector.select(remaining):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    self._selector.unregister(key.fileobj)
                    self._output_open = self._output_open and key.fileobj is not self.proc.stdout
                elif key.fileobj is self.proc.stdout:
                    self._lines += chunk
                else:
                    self._stderr = (self._stderr + chunk)[-STDERR_TAIL_BYTES:]

    def stderr_tail(self, lines: int = 1) -> str:
        text = self._stderr.decode(errors="replace").strip().splitlines()
        return " / ".join(line.strip() for line in text[-lines:])

    def close(self) -> None:
        self._selector.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


def sandbox_end() -> tuple[TextIO, TextIO]:
    """In the sandboxed process, before any learner code: the channel's reader and writer (private copies of
    fd 0 and 1, not inherited by children), with fd 0 and 1 themselves pointed at /dev/null."""
    reader = os.fdopen(os.dup(0), "r", encoding="utf-8")
    writer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    return reader, writer


def reply(writer: TextIO, message: dict[str, Any], **dumps) -> None:
    writer.write(json.dumps(message, **dumps) + "\n")
    writer.flush()
