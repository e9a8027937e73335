"""Every bad input of the reliability review's §1 table (`partrain-edu check` aside: its rows live with the
grader's tests) exits 2 with one line on stderr, nothing on stdout, no traceback, within seconds.

The rows run in this process through `partrain_edu.cli.main` (a subprocess each would take minutes, most of it
importing torch); a few go through `python -m partrain_edu` to cover the real entry point.
"""
import shlex
import subprocess
import sys
import time

import pytest

from partrain_edu.cli import main

LIMIT_S = 10   # per command; the slowest of these took ~100 s (plan) or never ended (pipeline) before the limits
pytestmark = pytest.mark.timeout(120)   # a command that runs away again fails here, not after the suite's 600 s

# (row of §1, arguments, words the error must contain)
BAD = [
    (1, "memory --params -1", "size must be positive"),
    (2, "memory --params 1e400", "above the limit of 1e18"),
    (3, "memory --params abc", "cannot read 'abc' as a size"),
    (4, "memory --params 7.5Q", "cannot read '7.5Q' as a size"),
    (5, "memory --params 0", "size must be positive"),
    (6, "memory --params 1e-9", "rounds to 0"),
    (7, "memory --params nan", "cannot read 'nan'"),
    (8, "memory --params inf", "cannot read 'inf'"),
    (9, "memory --params ''", "cannot read ''"),
    (10, "memory", "give --params, or --layers"),
    (12, "memory --params 7.5B --dp 0", "--dp: must be at least 1"),
    (13, "memory --params 7.5B --dp -3", "--dp: must be at least 1"),
    (15, "memory --params 7.5B --zero 4", "invalid choice: 4"),
    (16, "memory --params 7.5B --precision fp8", "invalid choice: 'fp8'"),
    (17, "memory --params 7.5B --micro-batch 1", "activations need"),
    (18, "memory --params 7.5B --layers 32 --hidden 4096 --heads 3 --seq 2048 --micro-batch 1",
     "not divisible by --heads 3"),
    (19, "memory --params 7.5B --tp 3 --layers 32 --hidden 4096 --heads 32 --seq 2048 --micro-batch 1",
     "not divisible by --tp 3"),
    (20, "memory --params 7.5B --sequence-parallel", "--sequence-parallel splits activations"),
    (21, "memory --params 7.5B --dp 0 --json", "--dp: must be at least 1"),
    (22, "memory --params abc --json", "cannot read 'abc'"),
    (23, "memory --params 7.5B --layers 0", "--layers: must be at least 1"),
    (24, "memory --params 7.5B --dp 1.5", "expected a whole number"),
    (25, "traffic --strategy foo --params 1B", "invalid choice: 'foo'"),
    (26, "traffic --strategy ddp", "needs --params"),
    (27, "traffic --strategy tp --params 1B --tp 2", "needs --layers --hidden --seq --micro-batch"),
    (28, "traffic --strategy ddp --params 1B --bytes-per-element 0", "--bytes-per-element: must be at least 1"),
    (29, "traffic --strategy zero3 --params 1B --dp 8 --tp 0", "--tp: must be at least 1"),
    (30, "traffic --params 1B", "required: --strategy"),
    (31, "traffic --strategy ddp --params 1B --dp 8 --json --microbatches 0", "--microbatches: must be at least 1"),
    (32, "pipeline --stages 0 --microbatches 8", "--stages: must be at least 1"),
    (33, "pipeline --stages 4", "required: --microbatches"),
    (34, "pipeline --stages 4 --microbatches 8 --schedule foo", "invalid choice: 'foo'"),
    (35, "pipeline --stages 4 --microbatches 3 --schedule interleaved", "multiple of --stages 4"),
    (36, "pipeline --stages 4 --microbatches 8 --schedule 1f1b --chunks 2", "--chunks only applies"),
    (37, "pipeline --stages 4 --microbatches 8 --t-forward -1", "finite number >= 0"),
    (38, "pipeline --stages 4 --microbatches 8 --t-forward nan", "finite number >= 0"),
    (40, "pipeline --stages 4 --microbatches 8 --t-forward inf", "finite number >= 0"),
    (44, "pipeline --stages 4 --microbatches 8 --schedule interleaved --chunks 1", "--chunks 2 or more"),
    (45, "pipeline --stages 2000 --microbatches 2000 --schedule 1f1b --json", "--stages must be at most 256"),
    (46, "pipeline --stages 4 --microbatches 3 --schedule interleaved --json", "multiple of --stages 4"),
    (47, "plan --params 1T --gpus 1 --gpu-memory 80GB", "fit no layout of 1 GPU"),
    (48, "plan --params 1T --gpus 1 --gpu-memory 80GB --json", "fit no layout of 1 GPU"),
    (49, "plan --params 13B --gpus 64 --gpu-memory 80XB", "cannot read '80XB'"),
    (50, "plan --params 13B --gpus 64 --gpu-memory 80", "80 would be 80 bytes: write the unit, e.g. 80GB"),
    (51, "plan --params 13B --gpus 0 --gpu-memory 80GB", "--gpus: must be at least 1"),
    (52, "plan --params 13B --gpus 64 --gpu-memory 80GB --gpus-per-node 3", "use whole nodes"),
    (53, "plan --params 13B --gpus 64", "needs --gpu-memory (e.g. 80GB)"),
    (54, "plan --params 13B --gpus 64 --gpu-memory 80GB --interconnect pigeon", "invalid choice: 'pigeon'"),
    (55, "plan --params 1e400 --gpus 8 --gpu-memory 80GB", "above the limit of 1e18"),
    (58, "plan --params 1 --gpus 8 --gpu-memory 1", "1 would be 1 parameters: write the unit, e.g. 1B"),
    (59, "plan --params 1M --gpus 8 --gpu-memory 1MB", "fit no layout of 8 GPU"),
    (60, "train", "required: --strategy"),
    (61, "train --strategy foo", "unknown strategy 'foo'"),
    (62, "train --strategy foo --json", "unknown strategy 'foo'"),
    (63, "train --strategy torch-ddp --nproc 0", "--nproc must be a positive integer"),
    (64, "train --strategy torch-ddp --nproc 1000", "--nproc must be at most 64"),
    (65, "train --strategy torch-ddp --nproc -2", "--nproc must be a positive integer"),
    (66, "train --strategy torch-ddp --nproc 3", "must be divisible by dp × microbatches = 3 × 1"),
    (67, "train --strategy tp --nproc 3 --tp 2", "give --tp equal to --nproc"),
    (68, "train --strategy pp-1f1b --nproc 4 --pp 4 --microbatches 3", "divisible by --microbatches 3"),
    (69, "train --strategy pp-interleaved --nproc 2 --pp 2 --microbatches 3", "groups of --pp 2"),
    (70, "train --strategy single --steps 0", "--steps must be a positive integer"),
    (71, "train --strategy single --steps -1", "--steps must be a positive integer"),
    (72, "train --strategy single --steps abc", "invalid int value: 'abc'"),
    (73, "train --strategy single --nproc 2", "single runs on one process"),
    (74, "train --strategy torch-ddp --nproc 2 --dp 4", "data parallel only"),
    (75, "train --strategy torch-ddp --nproc 2 --tp 2", "data parallel only"),
    (76, "train --strategy single --timeout -1 --steps 1", "--timeout must be a positive, finite number"),
    (77, "train --strategy single --timeout 0 --steps 1", "--timeout must be a positive, finite number"),
    (78, "train --strategy single --timeout nan --steps 1", "--timeout must be a positive, finite number"),
    (79, "train --strategy single --global-batch 0", "--global-batch must be a positive integer"),
    (80, "train --strategy single --seed -1", "--seed must be non-negative"),
    (81, "train --strategy single --microbatches 0", "--microbatches must be a positive integer"),
    (82, "train --strategy single --microbatches 32", "dp × microbatches = 1 × 32"),
    (83, "train --strategy tp --nproc 2 --tp 2 --pp 0", "--pp must be a positive integer"),
    (84, "train --strategy 3d --nproc 2 --dp 1 --tp 1 --pp 1", "whose product is --nproc 2"),
    (85, "train --strategy 3d --nproc 8 --dp 2 --tp 2 --pp 4", "whose product is --nproc 8"),
    (86, "train --strategy zero3 --nproc 2 --tp 2", "data parallel only"),
    (87, "train --strategy single --nproc 2 --json", "single runs on one process"),
    (101, "", "required: command"),
    (102, "nosuchcommand", "invalid choice: 'nosuchcommand'"),
    (103, "memory --params 7.5B extra_positional", "unrecognized arguments: extra_positional"),
    (104, "memory --params 7.5B --unknown-flag", "unrecognized arguments: --unknown-flag"),
    (105, "memory --params 1e400 --json", "above the limit of 1e18"),
    (107, "traffic --strategy ddp --params 1e400 --dp 8", "above the limit of 1e18"),
    (108, "traffic --strategy ddp --params 1e400 --dp 8 --json", "above the limit of 1e18"),
    (109, "plan --params 13B --gpus 64 --gpu-memory 1e400", "--gpu-memory: size '1e400' is above the limit"),
    (110, "plan --params 1e30 --gpus 8 --gpu-memory 80GB", "above the limit of 1e18"),
    (111, "plan --params 1e60 --gpus 8 --gpu-memory 1e70", "above the limit of 1e18"),
    (112, "memory --params 7.5B --dp 8 --zero 3 --precision fp32 --optimizer sgd --layers 0",
     "--layers: must be at least 1"),
    (113, "memory --params 9e99999", "above the limit of 1e18"),
    (115, "train --strategy torch-ddp --nproc 2 --timeout -1 --steps 1", "--timeout must be a positive"),
    (116, "train --strategy torch-ddp --nproc 2 --timeout abc --steps 1", "--timeout must be a positive"),
    (117, "train --strategy tp --nproc 3 --tp 3 --global-batch 15 --steps 1", "does not divide the hidden size"),
    (119, "train --strategy torch-pp --nproc 2 --pp 2 --microbatches 3 --steps 1", "divisible by --microbatches 3"),
    (120, "train --strategy naive-dp --nproc 3 --steps 1", "dp × microbatches = 3 × 1"),
    (122, "train --strategy single --global-batch 99999999999999999999999", "--global-batch must be at most 1024"),
]

# Found beyond the table, same classes: an unbounded count or duration overflowing or running for minutes.
BEYOND = [
    ("pipeline --stages 256 --microbatches 200", "--stages × --microbatches × --chunks must be at most 20,000"),
    ("pipeline --stages 20000 --microbatches 1", "--stages must be at most 256"),
    ("pipeline --stages 4 --microbatches 8 --t-forward 1e308", "at most 1e9"),
    ("memory --params 7.5B --layers 32 --hidden 4096 --heads 32 --seq 2048 --micro-batch 1 --sequence-parallel",
     "--sequence-parallel splits activations"),
    ("memory --layers 100000000000000000000 --hidden 100000000000000000000 --vocab 1 --seq 1", "beyond 1e30"),
    ("traffic --strategy tp --tp 2 --layers 10000000000000000 --hidden 10000000000000000 --seq 10000000000000000 "
     "--micro-batch 1", "beyond 1e30"),
    ("memory --params 1e99999999999999999999", "cannot read"),
    ("train --strategy single --seed 99999999999999999999999", "--seed must be at most 4294967295"),
    # issue 18's context parallelism: --cp where it means nothing, and sequences too long for any layout
    ("memory --params 8B --cp 4", "--cp splits the activations by sequence"),
    ("traffic --strategy ddp --params 1B --dp 8 --cp 4", "--cp is the ring of --strategy cp"),
    ("traffic --strategy cp --layers 32 --hidden 4096 --seq 8192 --micro-batch 1", "needs --cp 2 or more"),
    ("plan --params 13B --gpus 64 --gpu-memory 80GB --seq 0", "--seq: must be at least 1"),
    ("plan --params 13B --gpus 64 --gpu-memory 80GB --seq 100000000000000000000", "shorter sequences (--seq)"),
    # issue 26: estimate, and plan with a model and a device
    ("estimate --model tpu-9000", "unknown model 'tpu-9000'"),
    ("estimate --layers 24 --hidden 2048 --dp 8", "missing --heads --vocab --seq"),
    ("estimate --model llama3-405b --device b200", "unknown device 'b200'"),
    ("estimate --model llama3-405b --tp 3", "--tp 3 does not divide the 128 heads"),
    ("estimate --model llama3-405b --vpp 4", "--vpp 4 interleaves chunks of a pipeline"),
    ("estimate --model gpt-1.3b --dp 3 --global-batch 8", "not a multiple of dp × micro-batch"),
    ("estimate --model gpt-1.3b --ep 2", "this model has none"),
    ("estimate --model gpt-1.3b --recompute some", "invalid choice: 'some'"),
    ("estimate --model gpt-1.3b --hidden 2050", "not divisible by --heads"),
    ("plan --gpus 64", "plan needs a model"),
    ("plan --model llama3-405b --device h100 --gpus 64", "fit no layout of 64 GPU"),
    ("plan --model gpt3-175b --device a100 --gpus 1024 --tp 8 --pp 8 --dp 8", "the given layout uses 512 GPUs"),
    # issue 38: no option is read from its abbreviation; a size without its unit is refused with the fix
    ("estimate --gpus 8 --model llama3-8b --zero 3", "unrecognized arguments: --gpus 8; did you mean --gpus-per-node?"
     " Here the GPUs are the layout's: tp × pp × cp × dp (set --dp)"),
    ("plan --params 70 --gpus 64 --gpu-memory 80GB", "70 would be 70 parameters: write the unit, e.g. 70B or 70M"),
    ("train --strat ddp", "required: --strategy"),
    ("train --strategy ddp --step 3", "unrecognized arguments: --step 3; did you mean --steps?"),
    ("memory --param 7B", "did you mean --params?"),
    ("estimate --model llama3-8b --gpu-memory 94", "94 would be 94 bytes: write the unit, e.g. 94GB or 94GiB"),
]


def run_in_process(capsys, args: str) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    try:
        code = main(shlex.split(args))
    except SystemExit as done:   # argparse's errors
        code = done.code
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    return code, out, err, seconds


def assert_one_line_error(code, out: str, err: str, words: str) -> None:
    assert code == 2, (code, out[:200], err[-500:])
    assert out == ""
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert words in err


@pytest.mark.parametrize("row, args, words", BAD, ids=[f"row{r}" for r, _, _ in BAD])
def test_every_bad_input_of_the_review_is_one_line_and_exit_2(capsys, row, args, words):
    code, out, err, seconds = run_in_process(capsys, args)
    assert_one_line_error(code, out, err, words)
    assert seconds < LIMIT_S


@pytest.mark.parametrize("args, words", BEYOND)
def test_bad_inputs_beyond_the_table(capsys, args, words):
    code, out, err, seconds = run_in_process(capsys, args)
    assert_one_line_error(code, out, err, words)
    assert seconds < LIMIT_S


@pytest.mark.parametrize("args", [
    "memory --params 1e18 --json",                                         # the size limit itself
    "memory --params 7.5B --dp 99999999999999999999999",                   # §1 row 14: a degree may be huge
    "plan --params 1e18 --gpus 1024 --gpu-memory 1e18",
    "pipeline --stages 100 --microbatches 100 --schedule 1f1b --json",     # §1 row 114
    "pipeline --stages 4 --microbatches 8 --t-forward 1e9",
    "memory --params 7.5B --layers 32 --hidden 4096 --heads 32 --seq 2048 --micro-batch 1 --tp 2 "
    "--sequence-parallel",
])
def test_the_limits_leave_large_valid_inputs_alone(capsys, args):
    code, out, err, seconds = run_in_process(capsys, args)
    assert code == 0, err
    assert err == "" and out
    assert seconds < LIMIT_S


@pytest.mark.parametrize("row, args, words", [r for r in BAD if r[0] in (2, 45, 122)])
def test_the_installed_command_line_too(row, args, words):
    """The real entry point (`python -m partrain_edu`), for one size, one work limit and one train flag."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "partrain_edu", *shlex.split(args)], capture_output=True,
                          text=True, timeout=120)
    assert_one_line_error(done.returncode, done.stdout, done.stderr, words)
    assert time.perf_counter() - start < 60   # includes starting Python (and, for train, importing torch)
