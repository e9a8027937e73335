"""Why a run failed, told as one error that names the rank that caused it (torch.distributed.elastic's `errors/`).

| module     | what it explains                                                                           |
|------------|--------------------------------------------------------------------------------------------|
| `oneshot`  | a `%%torchrun` run: the first failure, mismatched collectives, a timeout (`TorchrunError`)  |
| `warm`     | the same stories for a `%%dist` cell on warm ranks (`DistError`)                            |
| `findings` | what the ranks' call records show: who waits in which collective, who never came          |
"""
