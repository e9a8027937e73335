# The course's kernels know its magics from the start: after Kernel → Restart, `%dist` and `%%torchrun` work
# without running `%load_ext partrain_edu` again. `make install` copies this file to .venv/etc/ipython/, which
# IPython reads for the kernels of this venv only (a learner's other environments are untouched). The magics are
# registered directly, not through `%load_ext`, so a notebook's own `%load_ext partrain_edu` stays silent.
c = get_config()  # noqa: F821 (IPython's config files get `get_config` from their loader)
c.InteractiveShellApp.exec_lines = [
    "import partrain_edu.notebook.magics as _partrain_magics; _partrain_magics.load_ipython_extension(get_ipython()); "
    "del _partrain_magics",
]
