"""Grading on ranks: deliberately wrong answers (missing average, per-parameter all-reduce, too many bytes, swapped
f/g, a deadlocking receive order, a helper left outside the function) are caught with the message that names the
mistake, showing only the learner's own frames — and a deadlock ends in a timeout message, not a hang. Each case
is one torchrun launch. (Exercises 01's and 04's wrong answers, graded on fixed seeds, are in
test_exercise_ring_all_reduce.py and test_exercise_zero1_optimizer.py.)"""
import pytest
import torch
import torch.distributed as dist

from partrain_edu.grading import run_check


def ring_receive_first(tensor, group=None):
    # every rank waits to receive before it sends: nobody ever sends
    n, me = dist.get_world_size(group), dist.get_rank(group)
    incoming = torch.empty_like(tensor)
    dist.recv(incoming, src=(me - 1) % n)
    dist.send(tensor, dst=(me + 1) % n)
    return tensor


def ddp_sum_not_mean(params, cap_bytes, group=None):
    params = list(params)
    seen = set()

    def hook(p):  # one bucket of everything, summed but never divided by the world size
        seen.add(id(p))
        if len(seen) == len(params):
            seen.clear()
            flat = torch.cat([q.grad.reshape(-1) for q in params])
            dist.all_reduce(flat)
            offset = 0
            for q in params:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                offset += q.numel()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def ddp_per_parameter(params, cap_bytes, group=None):
    def hook(p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def ddp_all_at_the_end(params, cap_bytes, group=None):
    # right buckets and bytes, no overlap: nothing leaves before backward has produced every gradient
    params = [p for p in params if p.requires_grad]
    buckets, current = [], []
    for p in reversed(params):
        current.append(p)
        if sum(q.numel() * q.element_size() for q in current) >= cap_bytes:
            buckets.append(current)
            current = []
    buckets += [current] if current else []
    queued = []

    def at_the_end():
        queued.clear()
        for bucket in buckets:
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            offset = 0
            for q in bucket:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                offset += q.numel()

    def hook(p):
        if not queued:
            queued.append(torch.autograd.Variable._execution_engine.queue_callback(at_the_end))

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def ddp_blocking(params, cap_bytes, group=None):
    # launched on time, but each all-reduce blocks backward inside the hook
    params = [p for p in params if p.requires_grad]
    buckets, current = [], []
    for p in reversed(params):
        current.append(p)
        if sum(q.numel() * q.element_size() for q in current) >= cap_bytes:
            buckets.append(current)
            current = []
    buckets += [current] if current else []
    for bucket in buckets:
        ready = set()

        def hook(p, bucket=bucket, ready=ready):
            ready.add(id(p))
            if len(ready) == len(bucket):
                ready.clear()
                flat = torch.cat([q.grad.reshape(-1) for q in bucket])
                dist.all_reduce(flat)
                flat /= dist.get_world_size()
                offset = 0
                for q in bucket:
                    q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                    offset += q.numel()
        for p in bucket:
            p.register_post_accumulate_grad_hook(hook)


def identity(x, group=None):
    return x


def all_reduce(x, group=None):
    x = x.clone()
    dist.all_reduce(x, group=group)
    return x


def ring_with_helper(tensor, group=None):
    return exchange(tensor, group)  # noqa: F821 - defined in another cell: only this function's source travels


def mlp_bias_every_rank(x, w1, b1, w2, b2, group, f, g):
    return g(torch.nn.functional.gelu(f(x, group) @ w1.T + b1) @ w2.T + b2, group)  # b2 summed t times


CASES = [
    ("ddp_buckets", [ddp_all_at_the_end], 60, "but no all-reduce left before the next gradient"),
    ("ddp_buckets", [ddp_blocking], 60, "was blocking (async_op=False): it held up backward inside the hook"),
    ("ring_all_reduce", [ring_receive_first], 15, "timed out (limit 15 s)"),
    ("ddp_buckets", [ddp_sum_not_mean], 60, "bucket 0 was full"),   # its one bucket leaves too late to be summed
    ("ddp_buckets", [ddp_per_parameter], 60, "One all-reduce per parameter is what buckets avoid"),
    ("tp_f_g", [all_reduce, identity, identity, all_reduce], 60, "f and g are swapped?"),  # f ↔ g
    ("tp_mlp", [mlp_bias_every_rank], 60, "b2 went into g on each of the"),
    ("ring_all_reduce", [ring_with_helper], 60, "NameError: name 'exchange' is not defined — only your function's"),
]


@pytest.mark.parametrize("name, functions, timeout, words", CASES, ids=[f"{c[0]}-{c[1][0].__name__}" for c in CASES])
def test_wrong_answer_on_ranks_is_caught(name, functions, timeout, words):
    result = run_check(name, *functions, timeout=timeout)
    assert not result.passed
    assert words in result.message, result.message
    assert result.message.count("\n") < 12  # one readable verdict, not a wall of tracebacks
    assert "partrain_edu" not in result.message and "File " not in result.message  # no grader frames, no paths


def ring_half_done(tensor, group=None):
    n = dist.get_world_size(group)  # some work first: the error is raised on the ranks, not spotted up front
    raise NotImplementedError(f"write your answer here ({n} ranks)")


def ring_not_started(tensor, group=None):
    """Docstring kept by the generator."""
    # YOUR CODE HERE
    raise NotImplementedError("write your answer here, then run the check below")


def test_not_implemented_is_a_clean_failure_on_ranks_and_up_front():
    result = run_check("ring_all_reduce", ring_half_done, timeout=60)
    assert not result.passed
    assert "not implemented yet: write your answer here (4 ranks)" in result.message, result.message
    result = run_check("ring_all_reduce", ring_not_started)  # no launch needed
    assert "ring_not_started: not implemented yet: write your answer here, then run" in result.message
