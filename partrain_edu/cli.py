"""`partrain-edu` — the command line (also `python -m partrain_edu`). The contract: docs/cli.md.

    partrain-edu train --strategy torch-ddp --nproc 2 --steps 20 --json
    partrain-edu memory --params 7.5B --json

`--json` prints exactly one JSON object on stdout; without it a person gets a readable table and a progress
bar on stderr. Bad input exits 2 with one line that names the fix, never a traceback.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
import time

from partrain_edu.config import add_train_arguments, config_from_args
from partrain_edu.grading.headless.cli import add_subcommands as add_grading_subcommands
from partrain_edu.problems.cli import add_subcommands as add_problems_subcommands
from partrain_edu.theory.cli import add_subcommands as add_theory_subcommands


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on an error; a one-line message is easier to act on. No option is
    read from its abbreviation: `estimate --gpus 8` would silently be `--gpus-per-node 8`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{self._nearest(message)} (see {self.prog} --help)\n")

    def _nearest(self, message: str) -> str:
        """For an unknown option, the options it may have meant (an abbreviation, a typo)."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        given = [word.split("=", 1)[0] for word in message.split(":", 1)[1].split() if word.startswith("--")]
        meant = sorted({o for g in given for o in known if o.startswith(g)}
                       or {o for g in given for o in difflib.get_close_matches(g, known, n=2, cutoff=0.8)})
        hint = f"; did you mean {' or '.join(meant)}?" if meant else ""
        if "--gpus" in given and "--gpus" not in known and "--dp" in known:
            hint += " Here the GPUs are the layout's: tp × pp × cp × dp (set --dp)"
        return hint


def _timeout(text: str) -> float | None:
    """--timeout as seconds (None: `none`), as `launcher.check_timeout` reads it, without importing it."""
    if text.lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"--timeout must be a positive, finite number of seconds, not {text!r} (none for no limit)")
    return seconds


def cmd_train(args: argparse.Namespace) -> int:
    from partrain_edu.train_checks import check_train_arguments, light_model

    timeout = _timeout(args.timeout)
    check_train_arguments(config_from_args(args, model=light_model()))  # the same refusals, before torch

    from tqdm import tqdm

    from partrain_edu import train  # imports torch: only the train command pays for it
    from partrain_edu.launcher import TorchrunError
    from partrain_edu.strategies import get_strategy
    from partrain_edu.strategies.emulation import check as check_emulation

    cfg = config_from_args(args)
    get_strategy(cfg.strategy).layout(cfg)  # the authority, in the same words: bad sizes fail before a bar
    check_emulation(cfg)
    given = timeout
    if timeout is not None:   # the limit counts from the command's start, not from the start of training
        timeout = max(0.1, timeout - (time.monotonic() - args.started))
    bar = tqdm(total=cfg.steps, desc=cfg.strategy, unit="step", file=sys.stderr, disable=args.json)

    def progress(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")

    def echo(rank, text: str) -> None:
        if not args.json:
            bar.write(f"[rank {rank}] {text}", file=sys.stderr)

    try:
        report = train.launch(cfg, on_step=progress, echo=echo, timeout=timeout)
    except TorchrunError as error:
        bar.close()
        text = str(error)
        if given is not None and text.startswith(f"timed out after {timeout:g} s"):   # say the limit given
            text = f"timed out after {given:g} s" + text[len(f"timed out after {timeout:g} s"):]
        print(f"partrain-edu train: {text}", file=sys.stderr)
        return 1
    bar.close()
    if args.json:
        print(json.dumps(report))
    else:
        print(_train_table(report))
    return 0


def _train_table(report: dict) -> str:
    lines = [f"{report['strategy']} on {report['world_size']} rank(s)", "step  loss"]
    lines += [f"{i + 1:>4}  {loss:.4f}" for i, loss in enumerate(report["losses"])]
    lines.append("communication per step (rank that sends most, ring model):")
    lines += [f"  {op:<24} {c['calls']:>4} calls {c['bytes']:>12,} bytes" for op, c in report["comm"].items()]
    if not report["comm"]:
        lines.append("  none")
    held = report["state_bytes"]
    lines.append("model states held (most-loaded rank): " + ", ".join(f"{k} {v:,} B" for k, v in held.items()))
    lines.append(f"median step time: {report['step_time_s'] * 1e3:.1f} ms")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="partrain-edu", description="Learn data, tensor and pipeline parallelism.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train TinyGPT for real with a parallel strategy")
    add_train_arguments(p_train)
    p_train.add_argument("--timeout", default="600", help="seconds from the command's start before every rank "
                         "is killed (default 600; 'none': no limit)")
    p_train.add_argument("--json", action="store_true", help="print one JSON object")
    p_train.set_defaults(func=cmd_train)
    add_theory_subcommands(sub)   # memory, traffic, pipeline, plan
    add_grading_subcommands(sub)  # check
    add_problems_subcommands(sub)  # problems list, show, grade, export
    parser.commands = sub.choices  # each command's own parser names the options it has (main)
    return parser


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()   # `train --timeout` counts from here, the command's start
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's parser, which knows its options (the top one would name none)
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.started = started
    try:
        return args.func(args)
    except ValueError as error:  # bad sizes and combinations: the message names the fix
        print(f"partrain-edu {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
