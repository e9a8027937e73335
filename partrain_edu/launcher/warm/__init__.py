"""`%dist`: ranks kept running between cells, variables and all (ipyparallel's engines, on torchrun).

| module      | process    | what it does                                                                        |
|-------------|------------|-------------------------------------------------------------------------------------|
| `pool`      | kernel     | `Pool(nproc)`: start the ranks once, `pool.run(code)` per cell, stop them             |
| `link`      | kernel     | the torchrun process and the ranks' sockets, read by one poll loop                    |
| `rank_loop` | each rank  | `python -m partrain_edu.launcher.warm.rank_loop`: run cell after cell in one namespace |

    with Pool(2) as pool:            # in a notebook: %dist start -n 2, then %%dist cells
        pool.run("x = rank")
"""
