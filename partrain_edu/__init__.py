"""partrain_edu — learn data, tensor and pipeline parallelism by running them.

In a notebook, `%load_ext partrain_edu` adds the `%%torchrun` cell magic (fresh ranks for each cell, see
`partrain_edu.launch`) and `%dist` / `%%dist` (ranks kept warm between cells, see `partrain_edu.warm`).
"""
__version__ = "0.1.0"


def load_ipython_extension(ipython):  # `%load_ext partrain_edu`
    from partrain_edu.launch import load_ipython_extension as load

    load(ipython)
