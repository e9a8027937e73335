# Two commands a newcomer needs:  make lab  (open the course)   make test  (run every test)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.partrain-installed
# Extra flags for `jupyter lab`, e.g. LAB_FLAGS="--no-browser --port 8899" (the lab test uses this).
LAB_FLAGS ?=
# The learner's own copy of the course, which the lab opens (git-ignored; see partrain_edu/workspace.py).
WORKSPACE ?= workspace
SYNC := $(BIN)/python -m partrain_edu.workspace --course "$(CURDIR)" --workspace "$(WORKSPACE)"
# The course's JupyterLab defaults (no news pop-up), for this server only: the user's own config is untouched.
LAB_CONFIG := JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter_config$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"
# Jupyter refuses to start as root (containers, CI) unless told that it is on purpose.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# PyPI's torch for Linux x86-64 is the CUDA build: ~2.9 GB of wheels, a 5.3 GB .venv. Without an NVIDIA GPU,
# `make lab TORCH=cpu` installs PyTorch's CPU build (~190 MB) from PyTorch's own CPU index, as the install
# selector on pytorch.org gives it; every other platform's PyPI wheel is already CPU-only (or MPS on macOS).
TORCH ?=
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
PLATFORM := $(shell uname -sm 2>/dev/null)
ifeq ($(TORCH),cpu)
FETCH := about 380 MB to fetch with PyTorch's CPU build
else ifeq ($(PLATFORM),Linux x86_64)
FETCH := about 2.9 GB to fetch: PyPI's PyTorch for Linux is the CUDA build; without an NVIDIA GPU, stop (Ctrl-C) and run \
	make $(or $(MAKECMDGOALS),install) TORCH=cpu for about 380 MB
else
FETCH := about 300 MB to fetch
endif
# nbval compares every cell's saved output; timings and addresses are masked by the sanitize file.
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: install lab refresh test notebooks exercises clean browser

# The course's kernels register its magics at start (jupyter_config/ipython_kernel_config.py says why).
KERNEL_CONFIG := $(VENV)/etc/ipython/ipython_kernel_config.py

install: $(STAMP) $(KERNEL_CONFIG)

$(KERNEL_CONFIG): jupyter_config/ipython_kernel_config.py | $(STAMP)
	@mkdir -p $(dir $@) && cp $< $@

# Re-installs only when pyproject.toml changed: seconds when everything is up to date. Each phase says in one
# line what it does; pip's own output goes to $(VENV)/pip.log. `make install VENV=/tmp/v` sets up elsewhere.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "install: creating the virtual environment $(VENV)/ ($(PYTHON) -m venv)"; \
		$(PYTHON) -m venv $(VENV); }
	@echo "install: installing PyTorch 2.13.0 and the course's packages into $(VENV)/ ($(FETCH);"
	@echo "         3-8 minutes on 2 cores and a fast network); pip's log: $(VENV)/pip.log (tail -f it to watch)"
	@: > $(VENV)/pip.log
	@$(if $(filter cpu,$(TORCH)),$(BIN)/python -m pip install --disable-pip-version-check "torch==2.13.0" \
		--index-url $(TORCH_CPU_INDEX) >> $(VENV)/pip.log 2>&1 \
		|| { tail -n 40 $(VENV)/pip.log; echo "install: pip failed; its whole log is $(VENV)/pip.log"; exit 1; },:)
	@$(BIN)/python -m pip install --disable-pip-version-check -e ".[dev]" >> $(VENV)/pip.log 2>&1 \
		|| { tail -n 40 $(VENV)/pip.log; echo "install: pip failed; its whole log is $(VENV)/pip.log"; exit 1; }
	@echo "install: checking that torch 2.13.0 and partrain_edu import"
	@$(BIN)/python -c "import torch, partrain_edu; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $(STAMP)
	@echo "install: done ($(VENV)/ is ready; later runs skip this until pyproject.toml changes)"

# Opens the workspace, created on first use; each time it also brings in what the course added or changed,
# except where the learner changed their copy (named, and left alone). The lab's terminals get the venv on their
# PATH, so `partrain-edu` works there as the notebooks say: they run the user's shell as it is, not as a login
# shell (which Jupyter picks when make's output is not a terminal, and whose /etc/profile resets PATH).
lab: install
	$(SYNC) sync
	$(LAB_CONFIG) PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))" \
		$(BIN)/jupyter lab --ServerApp.root_dir="$(abspath $(WORKSPACE))" \
		--ServerApp.terminado_settings="shell_command=$${SHELL:-sh}" \
		--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb $(ROOT_FLAG) $(LAB_FLAGS)

# After `git pull`: take the course's newer notebooks even where you changed yours (yours go to workspace/backups/).
refresh: install
	$(SYNC) refresh

# Three workers on two cores: the tests wait a good part of their time (emulated devices keep wall-clock rhythm,
# failure tests wait for timeouts), and a third file's work fills it. A test's verdict never depends on load.
# The lint (ruff, configured in pyproject.toml; notebooks are not linted) comes first: a finding fails the target.
# Then the launcher, warm-pool, diagnosis and grading tests once more on the portable path, as macOS starts ranks
# (every rank afresh: README, "Where it runs"); the few that test the forkserver itself skip there.
PORTABLE := tests/test_launch.py tests/test_launch_failures.py tests/test_warm.py tests/test_warm_ended.py \
	tests/test_status_line.py tests/test_grading_hostile.py tests/test_grading_ranks.py tests/test_containment.py
test: install browser
	$(BIN)/ruff check partrain_edu tests && $(BIN)/python -m pytest tests notebooks $(NBVAL) -n 3 --dist loadfile --durations=25
	PARTRAIN_START_METHOD=spawn $(BIN)/python -m pytest $(PORTABLE) -n 3 --dist loadfile

# The browser test drives Debian's Chromium (Playwright's own browser download is not used), and the notebooks'
# Chinese terms need a CJK font there (fonts-noto-cjk; without one each character is an empty box). Each is
# installed with apt only when missing: nothing to do, and no network, when /usr/bin/chromium is there and
# `fc-list :lang=zh` lists a font (fc-list is Debian's fontconfig, installed with the font when absent).
browser:
	@missing=; test -x /usr/bin/chromium || missing=" chromium"; \
	command -v fc-list >/dev/null || missing="$$missing fontconfig"; \
	fc-list :lang=zh 2>/dev/null | grep -q . || missing="$$missing fonts-noto-cjk"; \
	if [ -n "$$missing" ]; then \
		echo "browser: installing$$missing with apt (for tests/test_browser_playground.py)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing; \
	fi

# Re-execute every notebook in place (they are committed with outputs; nbval compares them in `make test`).
notebooks: install
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb

# Regenerate exercises/ from solutions/ (answers stripped); a test fails when they are out of date.
exercises: install
	$(BIN)/python -m partrain_edu.grading.authoring.make_exercises

clean:
	rm -rf $(VENV) .pytest_cache
