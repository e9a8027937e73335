"""The launcher stands on public ground (issue 39): no write to /proc, no assignment to anything of torch's (a
monkeypatch), and no read of a torch attribute or module whose name starts with an underscore (torch's private
surface, which any release may change). The detector is checked on samples of each kind first."""
import ast
from pathlib import Path

import partrain_edu

LAUNCHER = Path(partrain_edu.__file__).parent / "launcher"


def torch_names(tree: ast.AST) -> set[str]:
    """The local names bound to torch or to anything imported from it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> tuple[str | None, list[str]]:
    """The name an attribute chain starts from, and the attributes read along it."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def offences(source: str) -> list[str]:
    tree = ast.parse(source)
    torch = torch_names(tree)
    found = []
    if "/proc/self/mem" in source:
        found.append("writes /proc/self/mem")
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            imported = [] if isinstance(node, ast.Import) else [a.name for a in node.names]
            if any(m.split(".")[0] == "torch" and any(map(_private, m.split("."))) for m in modules) or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch")
                    and any(map(_private, imported))):
                found.append(f"line {line}: imports a private torch module or name")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target)[0] in torch:
                found.append(f"line {line}: assigns to torch's {ast.unparse(target)}")
        if isinstance(node, ast.Attribute):
            root, attrs = _root(node)
            if root in torch and any(map(_private, attrs)):
                found.append(f"line {line}: reads torch's private {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "getattr") \
                and node.args and _root(node.args[0])[0] in torch:
            found.append(f"line {line}: {node.func.id} on torch's {ast.unparse(node.args[0])}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("torch.") \
                and any(map(_private, node.value.split("."))):
            found.append(f"line {line}: names torch's private {node.value}")
    return found


def test_the_detector_finds_each_kind_of_offence():
    samples = {
        "import torch.distributed as dist\ndist.TCPStore = object\n": "assigns to torch's dist.TCPStore",
        "from torch.distributed.elastic.multiprocessing import api\napi.MultiprocessContext._poll = None\n":
            "assigns to torch's api.MultiprocessContext._poll",
        "import torch\nx = torch._C\n": "reads torch's private torch._C",
        "def f():\n    from torch import nn\n    return nn.Module._apply\n": "reads torch's private nn.Module._apply",
        "import torch._dynamo\n": "imports a private torch module",
        "from torch.distributed import _functional_collectives\n": "imports a private torch module or name",
        "import torch\nsetattr(torch.distributed, 'x', 1)\n": "setattr on torch's torch.distributed",
        "open('/proc/self/mem', 'r+b')\n": "writes /proc/self/mem",
        "PRELOAD = ['torch._dynamo']\n": "names torch's private torch._dynamo",
    }
    for source, words in samples.items():
        assert any(words in found for found in offences(source)), (source, offences(source))
    clean = "import torch\nimport torch.distributed as dist\nstore = dist.TCPStore('127.0.0.1', 0)\nt = torch.ones(1)\n"
    assert offences(clean) == []


def test_the_launcher_uses_no_private_torch_surface_and_writes_nothing_to_proc():
    found = {path.relative_to(LAUNCHER).as_posix(): offences(path.read_text()) for path in LAUNCHER.rglob("*.py")}
    assert {path: lines for path, lines in found.items() if lines} == {}
