"""From `nn.DataParallel` to `DistributedDataParallel`: the same small GPU training loop both ways (notebook 02).

    from partrain_edu.lessons.dp_to_ddp import migration_diff
    print(migration_diff())         # a unified diff: the lines that change, and the ones that stay

The loops are for GPUs (NCCL), plain PyTorch; run the DDP one with `torchrun --nproc-per-node 8 train.py`.
"""
from __future__ import annotations

import difflib

DATAPARALLEL_LOOP = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.DataParallel(Net().cuda())          # one process drives every GPU
loader = DataLoader(dataset, batch_size=256, shuffle=True)
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(epochs):
    for x, y in loader:
        loss = loss_fn(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

DDP_LOOP = """\
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")                        # torchrun set RANK, WORLD_SIZE, LOCAL_RANK
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = torch.nn.parallel.DistributedDataParallel(Net().cuda(), device_ids=[local_rank])
sampler = DistributedSampler(dataset)                  # this rank's share of the indices
loader = DataLoader(dataset, batch_size=256 // dist.get_world_size(), sampler=sampler)
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(epochs):
    sampler.set_epoch(epoch)                           # a new shuffle every epoch
    for x, y in loader:
        loss = loss_fn(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
"""


def migration_diff() -> str:
    """The unified diff from the DataParallel loop to the DDP one (whole files as context)."""
    lines = difflib.unified_diff(DATAPARALLEL_LOOP.splitlines(), DDP_LOOP.splitlines(), "dataparallel.py",
                                 "ddp.py", n=20, lineterm="")
    return "\n".join(lines)


def changed_lines() -> tuple[int, int]:
    """(lines removed, lines added) by the migration."""
    diff = migration_diff().splitlines()[2:]
    return sum(line.startswith("-") for line in diff), sum(line.startswith("+") for line in diff)
