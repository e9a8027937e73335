"""What a notebook cell sees: the `%%torchrun` and `%dist` / `%%dist` magics (thin, like ipyparallel's client magics).

| module        | what it does                                                                              |
|---------------|-------------------------------------------------------------------------------------------|
| `magics`      | parse the magic's line, call `launcher.oneshot` or the warm `launcher.warm.Pool`, publish  |
| `live_output` | the rank lines under the cell: live while it runs, grouped by rank when it ends             |

    %load_ext partrain_edu
"""


def load_ipython_extension(ipython):  # `%load_ext partrain_edu.notebook` works as well as `%load_ext partrain_edu`
    from partrain_edu.notebook.magics import load_ipython_extension as load

    load(ipython)
