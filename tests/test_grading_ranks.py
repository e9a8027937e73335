"""Grading on ranks: deliberately wrong answers (off-by-one chunk, missing average, per-parameter all-reduce,
the wrong shard, too many bytes, swapped f/g, a deadlocking receive order, a helper left outside the function)
are caught with the message that names the mistake, showing only the learner's own frames — and a deadlock
ends in a timeout message, not a hang. Each case is one torchrun launch."""
import pytest
import torch
import torch.distributed as dist

from partrain_edu.grading import run_check


def ring_uneven_chunks(tensor, group=None):
    # off by one: every chunk numel // n long, so the last numel % n elements are never reduced
    n, me = dist.get_world_size(group), dist.get_rank(group)
    flat, size = tensor.view(-1), tensor.numel() // n
    bounds = [(k * size, (k + 1) * size) for k in range(n)]
    for phase in ("reduce", "gather"):
        for step in range(n - 1):
            send = (me - step - 1) % n if phase == "reduce" else (me - step) % n
            recv = (send - 1) % n
            incoming = torch.empty(size)
            works = [dist.irecv(incoming, src=(me - 1) % n), dist.isend(flat[bounds[send][0]:bounds[send][1]],
                                                                          dst=(me + 1) % n)]
            for w in works:
                w.wait()
            if phase == "reduce":
                flat[bounds[recv][0]:bounds[recv][1]] += incoming
            else:
                flat[bounds[recv][0]:bounds[recv][1]] = incoming
    return tensor


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


def zero1_wrong_shard(param, grad, momentum, group=None, lr=0.1, beta=0.9):
    n, me = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // n
    total = grad.clone()
    dist.all_reduce(total)
    other = (me + 1) % n  # off by one: updates the neighbour's shard
    momentum.mul_(beta).add_(total[other * shard:(other + 1) * shard] / n)
    param[other * shard:(other + 1) * shard] -= lr * momentum


def zero1_all_reduce(param, grad, momentum, group=None, lr=0.1, beta=0.9):
    n, me = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // n
    total = grad.clone()
    dist.all_reduce(total)  # correct values, but every rank receives every entry: twice the traffic needed
    momentum.mul_(beta).add_(total[me * shard:(me + 1) * shard] / n)
    mine = (param[me * shard:(me + 1) * shard] - lr * momentum).contiguous()
    gathered = torch.empty_like(param)
    dist.all_gather_into_tensor(gathered, mine)
    param.copy_(gathered)


def ring_reversed(tensor, group=None):
    # right values and bytes, wrong direction: every rank sends left and receives from the right
    n, me = dist.get_world_size(group), dist.get_rank(group)
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), n)  # noqa: F821 - given on the ranks
    for phase in ("reduce", "gather"):
        for step in range(n - 1):
            send = (me + step + 1) % n if phase == "reduce" else (me + step) % n
            recv = (send + 1) % n
            incoming = torch.empty(bounds[recv][1] - bounds[recv][0])
            works = [dist.irecv(incoming, src=(me + 1) % n)] if incoming.numel() else []
            if bounds[send][1] > bounds[send][0]:
                works.append(dist.isend(flat[bounds[send][0]:bounds[send][1]], dst=(me - 1) % n))
            for w in works:
                w.wait()
            if phase == "reduce":
                flat[bounds[recv][0]:bounds[recv][1]] += incoming
            else:
                flat[bounds[recv][0]:bounds[recv][1]] = incoming
    return tensor


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


def zero1_full_momentum(param, grad, momentum, group=None, lr=0.1, beta=0.9):
    # ZeRO-1's bytes (one all-reduce = reduce-scatter + all-gather), but every rank keeps the full momentum
    n, me = dist.get_world_size(), dist.get_rank()
    state = zero1_full_momentum.__dict__.setdefault("m", torch.zeros_like(param))
    total = grad.clone()
    dist.all_reduce(total)
    state.mul_(beta).add_(total / n)
    param -= lr * state
    shard = param.numel() // n
    momentum.copy_(state[me * shard:(me + 1) * shard])


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
    ("ring_all_reduce", [ring_uneven_chunks], 60, "length 7 on 3 ranks"),
    ("ring_all_reduce", [ring_reversed], 60, "rank 0 sent to rank(s) [2] and received from [1]; in a ring"),
    ("ddp_buckets", [ddp_all_at_the_end], 60, "no bucket's all-reduce had left when the last gradient"),
    ("ddp_buckets", [ddp_blocking], 60, "blocked inside the hook, stalling backward: pass async_op=True"),
    ("zero1_step", [zero1_full_momentum], 60, "ZeRO-1 reduce-scatters the gradients"),
    ("ring_all_reduce", [ring_receive_first], 15, "timed out (limit 15 s)"),
    ("ddp_buckets", [ddp_sum_not_mean], 60, "Missing average: divide the summed bucket by the world size 2"),
    ("ddp_buckets", [ddp_per_parameter], 60, "one per parameter is what buckets avoid"),
    ("zero1_step", [zero1_wrong_shard], 60, "That is rank 1's shard"),
    ("zero1_step", [zero1_all_reduce], 60, "an all-reduce of the gradients sends twice"),
    ("tp_f_g", [all_reduce, identity, identity, all_reduce], 60, "f and g are swapped?"),  # f ↔ g
    ("tp_mlp", [mlp_bias_every_rank], 60, "the bias b2 is added once, after g"),
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
    assert "not implemented yet: write your answer here (3 ranks)" in result.message, result.message
    result = run_check("ring_all_reduce", ring_not_started)  # no launch needed
    assert "ring_not_started: not implemented yet: write your answer here, then run" in result.message
