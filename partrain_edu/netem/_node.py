"""One emulated node's torchrun: the process `netem.TwoNodes.run` starts for each node.

    python -m partrain_edu.netem._node LAUNCHER_PID HOSTNAME NETNS [torchrun options] \\
        -m partrain_edu.launcher.nanny RUN_DIR partrain_edu.launcher.rank

It becomes `ip netns exec NETNS python -m torch.distributed.run [torchrun options] ...` (torchrun itself; exec,
same process) after two things a real node has and a namespace alone does not:
1. it dies with the launcher (PR_SET_PDEATHSIG, kept across exec), and the ranks' watchdogs (`launcher.rank`)
   then stop the rest of the run;
2. a hostname of its own (a UTS namespace): torchrun's c10d rendezvous hosts its store on the node whose name
   resolves to the endpoint's address (`_matches_machine_hostname`), orders nodes by name (node0's ranks come
   first), and hands the ranks MASTER_ADDR = rank 0's `socket.getfqdn()`. `ip netns exec` mounts
   /etc/netns/NETNS/hosts over /etc/hosts, where `links.Links` wrote node0's and node1's addresses.
"""
from __future__ import annotations

import ctypes
import os
import sys

from partrain_edu.launcher import cgroup
from partrain_edu.launcher.processes import die_with_parent
from partrain_edu.netem.links import IP

CLONE_NEWUTS = 0x04000000  # <linux/sched.h>


def own_hostname(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0 or libc.sethostname(name.encode(), len(name.encode())) != 0:
        raise OSError(ctypes.get_errno(), f"cannot give this node the hostname {name!r} (needs CAP_SYS_ADMIN)")


def main(argv: list[str]) -> None:
    launcher = int(argv[0])
    hostname = argv[1]
    netns = argv[2]
    torchrun_args = argv[3:]
    die_with_parent(launcher)
    cgroup.join(os.environ.get(cgroup.ENV))  # before torchrun starts: all the ranks start stays in the run's cgroup
    own_hostname(hostname)
    os.execv(IP, [IP, "netns", "exec", netns, sys.executable, "-m", "torch.distributed.run",
                  *torchrun_args])


if __name__ == "__main__":
    main(sys.argv[1:])
