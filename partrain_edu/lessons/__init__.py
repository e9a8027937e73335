"""What single notebooks call to keep their cells short: a lesson's rank program, its bookkeeping, its table.

Each module serves one notebook and says which; the pieces several lessons share live in the library
(`partrain_edu.gaps`, `runtime.publish_every_rank`, `partrain_edu.viz`). Harness level: these import the
strategies and the launcher, and nothing in the library imports them.
"""
