"""Small models the library has never seen, each with one thing a wrapper can get wrong. Tests build them on
every rank from the same seed and compare a wrapped run with one process (and with PyTorch's own wrapper).

`batch(step, n)` is the same global batch everywhere; `loss(model, x, y, step)` the mean loss of a batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F

IN, OUT = 8, 4


class FrozenMLP(nn.Module):
    """The first layer is frozen (requires_grad=False): no gradient, no weight decay, no optimizer state."""

    def __init__(self):
        super().__init__()
        self.frozen, self.out = nn.Linear(IN, 16), nn.Linear(16, OUT)
        self.frozen.requires_grad_(False)

    def forward(self, x, step=0):
        return self.out(torch.relu(self.frozen(x)))


class BranchMLP(nn.Module):
    """`rare` is used on every third step only: the other steps it gets no gradient and must not move."""

    def __init__(self):
        super().__init__()
        self.common, self.rare, self.out = nn.Linear(IN, 12), nn.Linear(IN, 12), nn.Linear(12, OUT)

    def forward(self, x, step=0):
        h = self.common(x)
        if step % 3 == 0:
            h = h + self.rare(x)
        return self.out(torch.tanh(h))


class TiedLM(nn.Module):
    """The output head is the embedding (GPT-2's tying): one parameter, two uses, one gradient."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb, self.mid = nn.Embedding(vocab, dim), nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x, step=0):                 # x: (B,) token ids
        return self.head(torch.tanh(self.mid(self.emb(x))))


class BatchNormNet(nn.Module):
    """BatchNorm's running statistics are buffers: trained by forward, not by the optimizer."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = nn.Linear(IN, 10), nn.BatchNorm1d(10), nn.Linear(10, OUT)

    def forward(self, x, step=0):
        return self.out(torch.relu(self.bn(self.fc(x))))


class MixedDtype(nn.Module):
    """An fp32 layer and a bf16 layer: each parameter must keep its dtype."""

    def __init__(self):
        super().__init__()
        self.fc32, self.fc16 = nn.Linear(IN, 10), nn.Linear(10, OUT).to(torch.bfloat16)

    def forward(self, x, step=0):
        return self.fc16(torch.relu(self.fc32(x)).to(torch.bfloat16)).float()


class Uneven(nn.Module):
    """Odd sizes (Ψ = 7·5 + 5 + 5·3 + 3 = 58 is no multiple of 4): shards are padded, parameters straddle ranks."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(7, 5), nn.Linear(5, 3)

    def forward(self, x, step=0):
        return self.b(torch.sigmoid(self.a(x[:, :7])))[:, :OUT - 1].sum(-1, keepdim=True).expand(-1, OUT)


MODELS = {"frozen": FrozenMLP, "branch": BranchMLP, "tied": TiedLM, "batchnorm": BatchNormNet,
          "mixed": MixedDtype, "uneven": Uneven}


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(name: str, step: int, n: int = 8):
    g = torch.Generator().manual_seed(1000 + step)
    if name == "tied":
        return torch.randint(0, 11, (n,), generator=g), torch.randint(0, 11, (n,), generator=g)
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)


def loss(model: nn.Module, name: str, x, y, step: int) -> torch.Tensor:
    out = model(x, step)
    return F.cross_entropy(out, y) if name == "tied" else F.mse_loss(out, y)


def param_groups(model: nn.Module, weight_decay: float = 0.1) -> list[dict]:
    """AdamW's usual two groups: decay on matrices, none on biases and norms (1-D parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]


def rank_slice(name: str, x, y, rank: int, world: int):
    """Rank `rank`'s 1/world of a batch. BatchNorm's model sees the whole batch on every rank: its statistics
    are then one process's (a data-parallel BatchNorm without SyncBatchNorm normalises each slice on its own)."""
    if name == "batchnorm" or world == 1:
        return x, y
    b = x.size(0) // world
    return x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]


def train(name: str, model: nn.Module, opt, part: tuple[int, int] = (0, 1), microbatches: int = 1, steps: int = 4):
    """`steps` optimizer steps on batches 0, 1, …, sliced to part = (rank, world), each in `microbatches`."""
    for step in range(steps):
        x, y = rank_slice(name, *batch(name, step), *part)
        opt.zero_grad()
        for xb, yb in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            (loss(model, name, xb, yb, step) / microbatches).backward()
        opt.step()
    return model


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| relative to the largest |b| (bf16 compared in float32)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0
