"""`%dist`: ranks kept running between cells, variables and all (ipyparallel's engines, on torch's agent).

| module      | process    | what it does                                                                        |
|-------------|------------|-------------------------------------------------------------------------------------|
| `pool`      | kernel     | `Pool(nproc)`: start the ranks once, `pool.run(code)` per cell, stop them             |
| `link`      | kernel     | the launch, the ranks' output files, and cells and answers through the run's store     |
| `rank_loop` | each rank  | run cell after cell in one namespace (started by its worker, `launcher.nanny`)       |

    with Pool(2) as pool:            # in a notebook: %dist start -n 2, then %%dist cells
        pool.run("x = rank")
"""
