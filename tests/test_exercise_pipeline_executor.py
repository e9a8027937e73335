"""Exercise 11, a 1F1B pipeline executor (4 ranks; the solution is graded in test_exercises): GPipe's order fails on
its measured peak of stashed activations, plain blocking sends on both sides of the steady phase deadlock into the
timeout and its hint, a loss not divided by m fails on the gradients with the factor named, and no warm-up fails
on the order its messages show. The verify half names the micro-batches missing from an accumulation that was
zeroed in between (fed what such an answer reports, in-process), and the measured bytes per micro-batch follow the
model."""
from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check
from partrain_edu.grading.checks import pipeline_executor as pe
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import CHECKS

NAME = "pipeline_executor"
SOLUTION = solution_source("11_pipeline_executor", "one_f_one_b_step")
WARMUP = "warmup = min(stages - stage - 1, m)"


def message(source, timeout: float = 120) -> str:
    result = run_check(NAME, source, timeout=timeout)
    assert not result.passed, "a wrong answer passed"
    return result.message


def test_gpipe_order_fails_on_its_measured_peak_of_activations():
    text = message(variant(SOLUTION, WARMUP, "warmup = m"))
    per_mb = 4 * pe.BATCH * pe.HIDDEN * 2  # stage 0 saves its input and its Tanh output
    assert f"kept {pe.MICROBATCHES * per_mb} bytes of activations alive, 6 micro-batches" in text
    assert f"one saves {per_mb} bytes" in text and "min(p − s, m) = 4" in text and "GPipe's order" in text


def test_plain_sends_on_both_sides_of_the_steady_phase_deadlock():
    wrong = variant(SOLUTION, "        grad = send_forward_recv_backward(forward(i, received), shape)",
                    "        send_forward(forward(i, received))\n        grad = recv_backward(shape)")
    wrong = variant(wrong, "            received = send_backward_recv_forward(input_grad, shape)",
                    "            send_backward(input_grad)\n            received = recv_forward(shape)")
    text = message(wrong, timeout=20)
    assert "timed out (limit 20 s)" in text and "send_forward_recv_backward" in text


def test_a_loss_not_divided_by_m_is_told_the_factor():
    text = message(variant(SOLUTION, "y = loss_fn(y, targets[i]) / m", "y = loss_fn(y, targets[i])"))
    assert "stage 0 of 4, gradient of its Linear weight" in text and "everywhere 6× the expected" in text
    assert "divide each micro-batch's loss by m = 6" in text


def test_no_warm_up_fails_on_the_order_its_messages_show():
    text = message(variant(SOLUTION, WARMUP, "warmup = 0"))
    assert "stage 0 of 4: your messages show the order F0 B0 F1 B1" in text
    assert "1F1B's is F0 F1 F2 F3 B0 F4" in text and "at step 2 (B0 where 1F1B runs F1)" in text


def test_zeroed_accumulation_names_the_missing_micro_batches():
    per_mb, _, _ = pe.contributions(1)
    last_only = {"grads": [tensor(g) for g in per_mb[-1]], "losses": tensor(None), "peak_bytes": 0,
                 "messages": []}
    problems = CHECKS[NAME].verify(1, pe.STAGES, Reader(last_only))
    assert len(problems) == 1 and "stage 1 of 4, gradient of its Linear weight" in problems[0]
    assert "Micro-batch(es) [0, 1, 2, 3, 4] are missing from .grad" in problems[0] and "zero_grad" in problems[0]


def test_the_bytes_one_micro_batch_saves_follow_the_model():
    row = 4 * pe.BATCH * pe.HIDDEN  # one (rows, hidden) float32 tensor
    # every stage: its input and its Tanh output; the last one also the loss's target
    assert [pe.contributions(s)[2] for s in range(pe.STAGES)] == [2 * row] * (pe.STAGES - 1) + [3 * row]
