"""The memory / traffic / pipeline / plan subcommands, through a parser built like partrain_edu/cli.py's."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from partrain_edu.theory.cli import add_subcommands
from partrain_edu.theory.traffic import step_traffic

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    parser = argparse.ArgumentParser(prog="partrain-edu")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def run_json(capsys, *argv):
    out = run(capsys, *argv, "--json")
    assert out.count("\n") == 1  # exactly one JSON object, on one line
    return json.loads(out)


def test_memory_must_show(capsys):
    d = run_json(capsys, "memory", "--params", "7.5e9")
    assert d == {"params": 7_500_000_000, "bytes": {"params": 15_000_000_000, "grads": 15_000_000_000,
                                                     "optimizer": 90_000_000_000, "activations": 0,
                                                     "total": 120_000_000_000}}
    d = run_json(capsys, "memory", "--params", "7.5e9", "--dp", "64", "--zero", "3")
    assert d["bytes"]["total"] == 1_875_000_000


def test_memory_from_architecture_with_activations(capsys):
    d = run_json(capsys, "memory", "--layers", 24, "--hidden", 2304, "--heads", 24, "--vocab", "51200",
                 "--seq", 2048, "--micro-batch", 1)
    assert d["params"] == 1_652_230_656
    assert d["bytes"]["activations"] == 24 * (34 * 2048 * 2304 + 5 * 24 * 2048 * 2048)
    assert all(isinstance(v, int) for v in d["bytes"].values())


def test_pipeline_must_show(capsys):
    d = run_json(capsys, "pipeline", "--stages", 4, "--microbatches", 8, "--schedule", "1f1b")
    assert d["bubble_fraction"] == pytest.approx(3 / 11, abs=1e-15)
    assert d["peak_activations"] == [4, 3, 2, 1]
    assert d["makespan"] == 33.0


def test_pipeline_interleaved_and_zb_h1(capsys):
    d = run_json(capsys, "pipeline", "--stages", 4, "--microbatches", 8, "--schedule", "interleaved",
                 "--chunks", 2)
    assert d["bubble_fraction"] == pytest.approx(3 / 19)        # (p−1)/(v·m+p−1)
    assert {e["chunk"] for e in d["events"]} == {0, 1}
    d = run_json(capsys, "pipeline", "--stages", 4, "--microbatches", 8, "--schedule", "zb-h1")
    assert d["makespan"] == 27.0 and {e["kind"] for e in d["events"]} == {"F", "B", "W"}   # F = B = W = 1
    assert d["bubble_fraction"] == pytest.approx(3 / 27)         # a third of 1F1B's idle time, 9 of 33


# FSDP's traffic crosses the nodes on all 8 NICs (issue 37): on 64 GPUs sharding alone stays within the planner's
# margin of the fastest up to 175B; on 1024 GPUs of one batch a replica has too few sequences and 3D wins
@pytest.mark.parametrize("params, gpus, strategy", [("1.3B", 64, "ddp"), ("13B", 64, "fsdp"), ("175B", 64, "fsdp"),
                                                     ("1.3B", 8, "ddp"), ("13B", 8, "fsdp"), ("175B", 1024, "3d")])
def test_plan_must_show(capsys, params, gpus, strategy):
    d = run_json(capsys, "plan", "--params", params, "--gpus", gpus, "--gpu-memory", "80GB")
    assert d["strategy"] == strategy


def test_traffic_json(capsys):
    d = run_json(capsys, "traffic", "--strategy", "zero3", "--params", "7.5B", "--dp", 64)
    assert d["per_rank_bytes_sent"] == 3 * 63 * 15_000_000_000 // 64
    assert [c["op"] for c in d["collectives"]] == ["all_gather", "reduce_scatter"]


@pytest.mark.parametrize("argv, word", [
    (["memory", "--params", "7.5B"], "total"),
    (["traffic", "--strategy", "ddp", "--params", "1.3B", "--dp", "8"], "1gbe"),
    (["pipeline", "--stages", "2", "--microbatches", "3"], "bubble"),
    (["plan", "--params", "13B", "--gpus", "8", "--gpu-memory", "80GB"], "why"),
])
def test_tables_for_people(capsys, argv, word):
    out = run(capsys, *argv)
    assert word in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_bad_values_raise_value_error_in_the_handler(capsys):
    with pytest.raises(ValueError, match="multiple of --stages 4"):
        run(capsys, "pipeline", "--stages", 4, "--microbatches", 6, "--schedule", "interleaved")
    with pytest.raises(ValueError, match="not divisible by --pp 4"):
        run(capsys, "memory", "--params", "1B", "--layers", 30, "--pp", 4)


@pytest.mark.parametrize("argv, words", [
    (["memory", "--params", "-5"], "size must be positive"),
    (["memory", "--params", "lots"], "cannot read 'lots' as a size"),
    (["memory", "--params", "7.5B", "--zero", "5"], "invalid choice"),
    (["memory", "--params", "7.5B", "--dp", "0"], "must be at least 1"),
    (["plan", "--params", "13B", "--gpus", "8", "--gpu-memory", "0GB"], "size must be positive"),
    (["pipeline", "--stages", "4", "--microbatches", "8", "--t-forward", "-1"], "finite number >= 0"),
])
def test_bad_flags_are_argparse_errors(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        run(capsys, *argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


needs_main = pytest.mark.skipif(not (REPO / "partrain_edu" / "__main__.py").exists(),
                                reason="partrain_edu/__main__.py (the lead's CLI entry point) not there yet")


def cli(*argv):
    return subprocess.run([sys.executable, "-m", "partrain_edu", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@needs_main
def test_python_m_partrain_edu_memory_json():
    done = cli("memory", "--params", "7.5e9", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["bytes"]["total"] == 120_000_000_000


@needs_main
@pytest.mark.parametrize("argv", [("memory", "--params", "-5"),
                                  ("pipeline", "--stages", 4, "--microbatches", 6, "--schedule", "interleaved")])
def test_python_m_partrain_edu_bad_input_exits_2_with_one_line(argv):
    done = cli(*argv)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "error" in done.stderr


def test_traffic_cp_passes_the_ring_degree(capsys):
    shape = ["--layers", 32, "--hidden", 4096, "--seq", 131072, "--micro-batch", 1]
    sent = {c: run_json(capsys, "traffic", "--strategy", "cp", "--cp", c, *shape) for c in (2, 8)}
    for c, d in sent.items():
        assert d == step_traffic("cp", cp=c, layers=32, hidden=4096, seq=131072, micro_batch=1).to_dict()
    assert sent[2]["per_rank_bytes_sent"] != sent[8]["per_rank_bytes_sent"]


def test_memory_cp_splits_the_activations(capsys):
    shape = ["--params", "8B", "--layers", 32, "--hidden", 4096, "--heads", 32, "--seq", 8192, "--micro-batch", 1]
    alone, split = run_json(capsys, "memory", *shape), run_json(capsys, "memory", *shape, "--cp", 4)
    assert split["bytes"]["activations"] * 4 == alone["bytes"]["activations"] > 0
    assert split["bytes"]["params"] == alone["bytes"]["params"]


def test_plan_global_batch_caps_the_replicas(capsys):
    big = run_json(capsys, "plan", "--params", "7.5B", "--gpus", 1024, "--gpu-memory", "80GB")
    small = run_json(capsys, "plan", "--params", "7.5B", "--gpus", 1024, "--gpu-memory", "80GB", "--global-batch", 64)
    assert big["dp"] > 64 >= small["dp"] and small["tp"] * small["pp"] > 1
    assert "a global batch of 64 sequences feeds at most 64 data-parallel replicas" in small["reason"]


def test_plan_seq_long_sequences_choose_cp(capsys):
    d = run_json(capsys, "plan", "--params", "8B", "--gpus", 64, "--gpu-memory", "80GB", "--seq", 131072)
    assert d["strategy"] == "cp" and d["cp"] > 1 and "of the 131,072 positions" in d["reason"]
    assert "cp" not in run_json(capsys, "plan", "--params", "8B", "--gpus", 64, "--gpu-memory", "80GB")
    # an odd length still plans: the search skips the tp that would not divide it
    assert run_json(capsys, "plan", "--params", "13B", "--gpus", 64, "--gpu-memory", "80GB", "--seq", 4097)


ESTIMATE_KEYS = {"memory_bytes_per_gpu", "fits", "bubble", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                 "mfu", "breakdown"}


def test_estimate_prints_every_key_for_a_preset_and_for_a_shape(capsys):
    d = run_json(capsys, "estimate", "--model", "llama3-405b", "--device", "h100-sxm", "--tp", 8, "--pp", 16,
                 "--vpp", 8, "--dp", 64, "--zero", 2, "--global-batch", 2048)
    assert ESTIMATE_KEYS <= set(d) and d["fits"] and d["gpus"] == 8192
    assert d["step_time_s"] == pytest.approx(sum(d["breakdown"].values()))
    assert 0.3 < d["mfu"] < 0.6 and d["layout"]["schedule"] == "interleaved"
    moe = run_json(capsys, "estimate", "--layers", 16, "--hidden", 2048, "--heads", 16, "--kv-heads", 4, "--ffn", 5632,
                   "--gated", "--untied", "--vocab", 32000, "--seq", 4096, "--experts", 8, "--top-k", 2,
                   "--device", "a100-40gb", "--dp", 8, "--ep", 8, "--zero", 1, "--global-batch", 64,
                   "--recompute", "full")
    assert ESTIMATE_KEYS <= set(moe) and moe["breakdown"]["ep"] > 0


def test_plan_costs_a_given_layout_beside_its_three_best(capsys):
    d = run_json(capsys, "plan", "--model", "gpt3-175b", "--device", "a100-80gb", "--gpus", 1024,
                 "--global-batch", 1536, "--tp", 8, "--pp", 8, "--vpp", 2)
    assert len(d["best"]) == 3 and d["given"]["layout"]["dp"] == 16
    # the given layout is one the search also prices (ZeRO-0, tp 8, pp 8, vpp 2): the best is never slower
    assert d["best"][0]["step_time_s"] <= d["given"]["step_time_s"] < 2 * d["best"][0]["step_time_s"]


def test_a_layout_that_does_not_fit_is_told_the_first_saving_that_does(capsys):
    layout = ("estimate", "--model", "llama3-8b", "--device", "h100", "--tp", "2", "--dp", "4")
    assert run_json(capsys, *layout)["fits"] is False
    hint = run(capsys, *layout).splitlines()[-1]
    assert hint.startswith("  hint: fits with --zero 1: ")
    fixed = run_json(capsys, *layout, "--zero", "1")   # the hint's claim, checked by the estimate itself
    assert fixed["fits"] and fixed["memory_fraction"] <= 0.9
    assert f"{fixed['memory_bytes_per_gpu'] / 1e9:.1f} GB" in hint


def test_a_layout_no_saving_rescues_points_to_more_gpus_and_plan(capsys):
    hint = run(capsys, "estimate", "--model", "llama3-70b", "--device", "h100", "--dp", "8").splitlines()[-1]
    assert "none of --zero, --recompute or --micro-batch 1 fits it on 8 GPUs" in hint and "partrain-edu plan" in hint
    assert "hint" not in run(capsys, "estimate", "--model", "gpt-1.3b", "--device", "h100", "--dp", "8")
