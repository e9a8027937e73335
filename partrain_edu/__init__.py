"""partrain_edu — learn data, tensor and pipeline parallelism by running them.

In a notebook, `%load_ext partrain_edu` adds the `%%torchrun` cell magic (fresh ranks for each cell, see
`launcher.oneshot`) and `%dist` / `%%dist` (ranks kept warm between cells, `launcher.warm`);
both live in `partrain_edu.notebook`.
"""
__version__ = "0.1.0"


def load_ipython_extension(ipython):  # `%load_ext partrain_edu`
    from partrain_edu.notebook.magics import load_ipython_extension as load

    load(ipython)
