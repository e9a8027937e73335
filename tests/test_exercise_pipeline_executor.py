"""Exercise 11, a 1F1B pipeline executor (4 ranks, one launch per run grading 3 steps with m drawn below p − 1, at
least p, and anywhere, with fresh widths and data): the solution passes; GPipe's order fails on its measured peak
of stashed activations; plain blocking sends on both sides of the steady phase deadlock into the timeout and its
hint; a loss not divided by m fails on the losses with the factor named; no warm-up fails on the order its
messages show; a warm-up not capped at m, and an answer hard-coded to one setup, fail naming the step's m and
shape. The verify half names the micro-batches missing from an accumulation that was zeroed in between (fed what
such an answer reports, in-process), and the measured bytes per micro-batch follow the model. Replay: an answer
that runs 1F1B only for the (m, shape) a few runs' messages named, GPipe's order otherwise, passes those runs and
fails the next one."""
import json
import re

from exercise_sources import solution_source, variant
from partrain_edu.grading import observations as obs
from partrain_edu.grading import run_check
from partrain_edu.grading.checks import pipeline_executor as pe
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import CHECKS

NAME = "pipeline_executor"
SEED = 5   # its steps: m = 5 (2×8), m = 2 (2×7), m = 6 (3×7)
SOLUTION = solution_source("11_pipeline_executor", "one_f_one_b_step")
WARMUP = "warmup = min(stages - stage - 1, m)"
NAMED = re.compile(r"\(m = (\d+) micro-batch(?:es)? of (\d+)×(\d+)\)")


def message(source, timeout: float = 120, seed: int = SEED) -> str:
    result = run_check(NAME, source, timeout=timeout, seed=seed)
    assert not result.passed, "a wrong answer passed"
    return result.message


def test_every_run_draws_m_below_and_above_the_stages_and_fresh_shapes():
    for seed in range(30):
        counts = [step.microbatches for step in pe.steps(seed)]
        assert len(counts) == pe.STEPS and any(m < pe.STAGES - 1 for m in counts)
        assert any(m >= pe.STAGES for m in counts)
    shapes = {(s.microbatches, s.rows, s.hidden) for seed in range(30) for s in pe.steps(seed)}
    assert len(shapes) > 40


def test_the_solution_passes():
    assert run_check(NAME, SOLUTION, seed=1).passed


def test_gpipe_order_fails_on_its_measured_peak_of_activations():
    text = message(variant(SOLUTION, WARMUP, "warmup = m"))
    step = pe.steps(SEED)[0]
    per_mb = 4 * step.rows * (2 * step.hidden + step.inner[0])  # stage 0 saves its input and both Tanh outputs
    assert f"step 1 of 3 (m = 5 micro-batches of 2×8), stage 0 of 4: at its peak autograd kept {5 * per_mb} " in text
    assert f"one saves {per_mb} bytes" in text and "min(p − s, m) = 4" in text and "GPipe's order" in text


def test_plain_sends_on_both_sides_of_the_steady_phase_deadlock():
    wrong = variant(SOLUTION, "        grad = send_forward_recv_backward(forward(i, received), shape)",
                    "        send_forward(forward(i, received))\n        grad = recv_backward(shape)")
    wrong = variant(wrong, "            received = send_backward_recv_forward(input_grad, shape)",
                    "            send_backward(input_grad)\n            received = recv_forward(shape)")
    text = message(wrong, timeout=15)
    assert "timed out (limit 15 s)" in text and "send_forward_recv_backward" in text


def test_a_loss_not_divided_by_m_is_told_the_factor():
    text = message(variant(SOLUTION, "y = loss_fn(y, targets[i]) / m", "y = loss_fn(y, targets[i])"))
    assert "rank 3 (rank(s) [2, 1, 0] failed this check too): step 1 of 3 (m = 5 micro-batches of 2×8)" in text
    assert "the losses you returned (one per micro-batch)" in text and "everywhere 5× the expected" in text


def test_no_warm_up_fails_on_the_order_its_messages_show():
    text = message(variant(SOLUTION, WARMUP, "warmup = 0"))
    assert "stage 0 of 4: your messages show the order F0 B0 F1 B1" in text
    assert "1F1B's is F0 F1 F2 F3 B0 F4" in text and "they part at action 2 (B0 where 1F1B runs F1)" in text


def test_a_warm_up_not_capped_at_m_fails_on_the_step_with_fewer_micro_batches():
    text = message(variant(SOLUTION, WARMUP, "warmup = stages - stage - 1"))
    assert "rank 0 raised RuntimeError: your step with m = 2 micro-batches of 2×7 raised IndexError" in text
    assert "x = microbatches[i]" in text   # the learner's own line


def test_an_answer_hard_coded_to_one_setup_fails():
    text = message(variant(SOLUTION, "m, shape = len(microbatches), microbatches[0].shape", "m, shape = 6, (2, 8)"))
    assert "your step with m = 5 micro-batches of 2×8 raised IndexError" in text   # there are 5, not 6


def test_a_received_tensor_of_another_shape_is_named():
    exc = RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x8 and 7x11)")
    said = pe.failed(pe.steps(SEED)[1], exc)
    assert said.startswith("your step with m = 2 micro-batches of 2×7 raised RuntimeError: mat1")
    assert "receive with microbatches[0].shape, never a fixed shape" in said
    assert "never a fixed shape" not in pe.failed(pe.steps(SEED)[1], IndexError("list index out of range"))


def test_zeroed_accumulation_names_the_missing_micro_batches():
    step = pe.steps(SEED)[0]
    per_mb, _, _ = pe.contributions(step, 1)
    last_only = {"grads": [tensor(g) for g in per_mb[-1]], "losses": tensor(None), "peak_bytes": 0, "messages": []}
    problems = CHECKS[NAME].verify(1, pe.STAGES, Reader({"steps": [last_only] * pe.STEPS}), seed=SEED)
    assert len(problems) == 1 and "stage 1 of 4, gradient of its first Linear's weight" in problems[0]
    assert "Micro-batch(es) [0, 1, 2, 3] are missing from .grad" in problems[0] and "zero_grad" in problems[0]


def test_the_bytes_one_micro_batch_saves_follow_the_model():
    for step in pe.steps(SEED):
        row = 4 * step.rows   # bytes of one float32 row's worth per unit of width
        # every stage: its input and its two Tanh outputs; the last one also the loss's target
        want = [row * (2 * step.hidden + w) for w in step.inner]
        want[-1] += row * step.hidden
        assert [pe.contributions(step, s)[2] for s in range(pe.STAGES)] == want


def reported(seed: int, me: int, runs_1f1b) -> dict:
    """Rank `me`'s observations from an answer with right values that runs 1F1B on the steps where
    `runs_1f1b(step)`, GPipe's order on the others (messages as the helpers make them)."""
    steps, n = [], pe.STAGES
    for step in pe.steps(seed):
        per_mb, losses, saved = pe.contributions(step, me)
        m, size = step.microbatches, step.message_bytes
        order = (pe.one_f_one_b_order(me, m) if runs_1f1b(step)
                 else [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)])
        messages = []
        for action in order:
            ahead, back = (me - 1, me + 1) if action[0] == "F" else (me + 1, me - 1)
            messages += [[op, peer, size] for op, peer in (("recv", ahead), ("send", back)) if 0 <= peer < n]
        steps.append({"grads": [tensor(sum(mb[i] for mb in per_mb)) for i in range(len(per_mb[0]))],
                      "losses": tensor(losses if me == n - 1 else None),
                      "peak_bytes": saved * (min(n - me, m) if runs_1f1b(step) else m), "messages": messages})
    return {"steps": steps}


def test_an_answer_running_1f1b_only_for_the_steps_messages_named_fails_the_next_run():
    table: set[tuple[int, int, int]] = set()

    def runs_1f1b(step) -> bool:
        return (step.microbatches, step.rows, step.hidden) in table

    for seed in (21, 22, 23):   # fix each step a message names until the run passes, as a learner would
        for _ in range(pe.STEPS + 1):
            text = json.dumps([reported(seed, rank, runs_1f1b) for rank in range(pe.STAGES)])
            problems = obs.verify(CHECKS[NAME], text, seed)
            if not problems:
                break
            table.add(tuple(map(int, NAMED.search(problems[0]).groups())))
        assert not problems
    assert len(table) >= 4
    replay = variant(SOLUTION, WARMUP, f"warmup = min(stages - stage - 1, m) if (m, *shape) in {sorted(table)!r} "
                                       "else m")
    assert run_check(NAME, replay, seed=21).passed   # what the emulated reports stood for, on the ranks
    text = message(replay, seed=24)
    assert "GPipe's order" in text and tuple(map(int, NAMED.search(text).groups())) not in table
