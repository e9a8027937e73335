"""The torch-free `train` argument checks (train_checks.py, issue 30 L4) say what the strategies' own `layout`
and `emulation.check` say — the same refusal in the same words, or none — for every strategy over a grid of
layouts; and `train`'s --timeout counts from the command's start."""
import dataclasses
import itertools
import subprocess
import sys

import pytest

from partrain_edu import train_checks
from partrain_edu.config import TrainConfig
from partrain_edu.models import GPTConfig
from partrain_edu.strategies import STRATEGIES, get_strategy, strategies
from partrain_edu.strategies.emulation import check as check_emulation

SIZES = [None, 1, 2, 3, 4, 8]
GRID = [dict(nproc=n, dp=d, tp=t, pp=p, microbatches=m, global_batch=b)
        for n, d, t, p, m, b in itertools.product([1, 2, 3, 4, 8], SIZES, SIZES, SIZES, [1, 3, 4], [12, 16])]


def refusal(check, cfg):
    try:
        check(cfg)
    except ValueError as error:
        return str(error)
    return None


def authority(cfg):
    get_strategy(cfg.strategy).layout(cfg)
    check_emulation(cfg)


def test_the_names_and_the_model_are_the_registry_and_gptconfig():
    strategies()                                   # imports every module of the index: all registered
    assert set(train_checks.STRATEGY_MODULES) == set(STRATEGIES)
    assert train_checks.MODEL == dataclasses.asdict(GPTConfig())


@pytest.mark.parametrize("name", list(train_checks.STRATEGY_MODULES))
def test_every_layout_gets_the_strategys_own_verdict(name):
    for sizes in GRID:
        cp = sizes["nproc"] if name == "cp" else None
        cfg = TrainConfig(strategy=name, cp=cp, **sizes)
        light = dataclasses.replace(cfg, model=train_checks.light_model())
        assert refusal(train_checks.check_train_arguments, light) == refusal(authority, cfg), sizes


@pytest.mark.parametrize("name, device", [("torch-ddp", "emulated:a100"), ("ddp", "emulated:h100"),
                                          ("3d", "emulated:a100")])
def test_the_emulated_device_gets_the_same_verdict(name, device):
    cfg = TrainConfig(strategy=name, nproc=2 if name != "3d" else 1, device=device)
    light = dataclasses.replace(cfg, model=train_checks.light_model())
    assert refusal(train_checks.check_train_arguments, light) == refusal(authority, cfg)


def test_an_unknown_strategy_lists_the_registry():
    cfg = TrainConfig(strategy="foo", model=train_checks.light_model())
    assert refusal(train_checks.check_train_arguments, cfg) == refusal(get_strategy, "foo")


def test_a_bad_train_argument_is_refused_without_importing_torch():
    code = ("import sys\nfrom partrain_edu.cli import main\n"
            "assert main(['train', '--strategy', 'tp', '--nproc', '3', '--tp', '3']) == 2\n"
            "assert main(['check', 'nowhere']) == 2\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "does not divide the hidden size" in done.stderr


def test_train_timeout_counts_from_the_command_start(monkeypatch, capsys):
    from types import SimpleNamespace

    from partrain_edu import cli, train
    given = {}

    def launch(cfg, on_step=None, echo=None, timeout=None):
        given["timeout"] = timeout
        return {"losses": []}
    clock = iter([100.0, 103.0])             # main() starts at 100; the imports and checks took 3 s
    monkeypatch.setattr(cli, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(train, "launch", launch)
    assert cli.main(["train", "--strategy", "single", "--steps", "1", "--timeout", "5", "--json"]) == 0
    assert given["timeout"] == 2.0
