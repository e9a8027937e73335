"""The rendezvous of a one-node launch: torch's agent meets only itself, on a store that listens on 127.0.0.1 alone.

    LaunchConfig(..., rdzv_backend=BACKEND)          (`launcher.start`; importing this module registers it)

torch's own backends host their TCPStore on every interface, whatever host they are given (`0.0.0.0` / `::`), and
the c10d backend unpickles what it reads from that store: on a shared server that is an open door into the run.
torch's public extension point for this is a `RendezvousHandler` registered under a name of our own
(`torch.distributed.elastic.rendezvous`, "Rendezvous" in torch's elastic docs). This one creates the store on a
socket already bound to 127.0.0.1 (TCPStore's `master_listen_fd`), hands it to the agent as the rendezvous store,
and shares it with the ranks (`use_agent_store`: torchrun's workers then join it as clients, through
MASTER_ADDR/MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE=True; no rank hosts a store of its own).
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


class LoopbackRendezvous(RendezvousHandler):
    """One node (this process's agent), rank 0 of a world of one, on a fresh loopback store."""

    def __init__(self, params: RendezvousParameters):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((HOST, 0))  # port 0: the OS picks a free one, so two launches never collide
        self.port = listener.getsockname()[1]
        self.store = dist.TCPStore(HOST, self.port, is_master=True, master_listen_fd=listener.detach(),
                                   wait_for_workers=False)  # the store owns the socket from now on
        self.run_id = params.run_id
        self.closed = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(self.store, 0, 1, RendezvousStoreInfo(HOST, self.port))

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
