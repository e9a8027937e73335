"""The rendezvous of a one-node launch: torch's agent meets only itself, on a store that listens on 127.0.0.1 alone.

    store = open_store(run_id)        # the launcher (`launcher.start`), before the agent starts
    LaunchConfig(..., run_id=run_id, rdzv_backend=BACKEND)      (importing this module registers the backend)

torch's own backends host their TCPStore on every interface, whatever host they are given, and the c10d backend
unpickles what it reads from it: on a shared server, an open door into the run. torch's documented extension point
is a `RendezvousHandler` registered under a name of our own ("Rendezvous" in torch's elastic docs). Its store is
made on a socket already bound to 127.0.0.1 (TCPStore's `master_listen_fd`) and shared with the ranks
(`use_agent_store`: they join it as clients through MASTER_ADDR/MASTER_PORT; no rank hosts a store). The launcher
keeps a handle on it too: the warm pool sends its cells through it (`warm.link`).
"""
from __future__ import annotations

import socket

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

BACKEND = "partrain-loopback"
HOST = "127.0.0.1"
_OPEN: dict[str, dist.TCPStore] = {}  # run id -> its store, until its agent's rendezvous takes it


def open_store(run_id: str) -> dist.TCPStore:
    """A fresh store for the run `run_id` on a free port of 127.0.0.1 (port 0: two launches never collide)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    _OPEN[run_id] = dist.TCPStore(HOST, listener.getsockname()[1], is_master=True, master_listen_fd=listener.detach(),
                                  wait_for_workers=False)  # the store owns the socket from now on
    return _OPEN[run_id]


def close_store(run_id: str) -> None:
    """Forget the store of a launch whose agent never took it."""
    _OPEN.pop(run_id, None)


class LoopbackRendezvous(RendezvousHandler):
    """One node (this process's agent), rank 0 of a world of one, on the run's loopback store."""

    def __init__(self, params: RendezvousParameters):
        self.store = _OPEN.pop(params.run_id)
        self.run_id = params.run_id
        self.closed = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(self.store, 0, 1, RendezvousStoreInfo(HOST, self.store.port))

    def is_closed(self) -> bool:
        return self.closed

    def set_closed(self) -> None:
        self.closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        self.closed = True
        return True


# torch accepts the same creator twice: importing this module again (a reload) is harmless.
rendezvous_handler_registry.register(BACKEND, LoopbackRendezvous)
