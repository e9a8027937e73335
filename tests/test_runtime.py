import dataclasses

import pytest
import torch
import torch.distributed as dist

from partrain_edu import runtime


@pytest.fixture(autouse=True)
def clean_group():
    yield
    runtime.shutdown()


def test_standalone_init_is_a_world_of_one_on_gloo(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = runtime.init(backend="gloo")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.backend) == (0, 1, 0, "gloo")
    assert ctx.device == torch.device("cpu") and ctx.timeout_s == runtime.DEFAULT_TIMEOUT_S
    t = torch.tensor([3.0])
    dist.all_reduce(t)  # a collective works in a world of one
    assert t.item() == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.rank = 1  # type: ignore[misc]


def test_init_twice_replaces_the_group_and_shutdown_is_idempotent():
    runtime.init(backend="gloo")
    first = dist.group.WORLD
    runtime.init(backend="gloo", timeout=5)
    assert dist.is_initialized() and dist.group.WORLD is not first
    runtime.shutdown()
    runtime.shutdown()
    assert not dist.is_initialized()


def test_auto_backend_is_gloo_without_gpus():
    assert runtime._choose_backend("auto", 2) == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")


@pytest.mark.parametrize("kwargs, words", [({"backend": "mpi"}, "backend must be"),
                                           ({"timeout": 0}, "positive number of seconds")])
def test_bad_arguments_name_the_fix(kwargs, words):
    with pytest.raises(ValueError, match=words):
        runtime.init(**kwargs)


def test_publish_standalone_and_rejects_bad_names():
    runtime.publish("answer", torch.tensor([1.0, 2.0]))
    assert torch.equal(runtime.standalone_published["answer"], torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="identifier"):
        runtime.publish("not a name", 1)


def test_timeout_errors_are_recognised():
    assert runtime.is_timeout_error(RuntimeError("Timed out waiting 1000ms for recv operation to complete"))
    assert not runtime.is_timeout_error(RuntimeError("Connection closed by peer"))
