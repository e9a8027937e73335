"""Real shaped links: two emulated nodes on one machine, each in a network namespace, joined by a veth pair
whose bandwidth `tc` limits — the network complement of the clock-based `partrain_edu.emulated` links.

    from partrain_edu import netem
    ok, why = netem.available()                  # root (CAP_NET_ADMIN), iproute2, namespaces
    with netem.TwoNodes(rate="1gbit") as nodes:  # delay="0.1ms" too, where the kernel has netem
        print(nodes.command(0, 2))               # torchrun --nnodes 2 ... --rdzv-endpoint 10.199.x.y:29500 script.py
        result = nodes.run("script.py", nproc_per_node=2, timeout=120)

Time on these links is real: TCP through the kernel at the configured rate, with this machine's CPU cost on top.
Without root every entry point raises `NetemUnavailable`, naming the emulated links as the fallback.
Files: links.py (namespaces, veth, tc), nodes.py (TwoNodes, the two torchruns), _node.py (one node's process).
"""
from partrain_edu.netem.links import available

_FROM_NODES = ("NetemUnavailable", "NodesResult", "TwoNodes")


def __getattr__(name: str):
    # Imported on first use: nodes.py pulls in torch (through the launcher), and each node's process starts as
    # `python -m partrain_edu.netem._node`, which runs this file and must stay light (PEP 562).
    if name in _FROM_NODES:
        from partrain_edu.netem import nodes

        return getattr(nodes, name)
    raise AttributeError(f"module 'partrain_edu.netem' has no attribute {name!r}")


__all__ = ["available", *_FROM_NODES]
