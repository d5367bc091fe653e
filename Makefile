# The two commands of the README. Each does its own set-up on a fresh clone with
# only python3 present: a virtualenv in .venv, torch's CPU wheel first (a bare
# `torch` requirement resolves a multi-GB CUDA build), then the project.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench bench-charmap fixtures artifacts

# TORCH_INDEX: where torch comes from. Empty (the default) is pip's own index, which on Linux
# serves torch==2.13.0 as its CUDA build (several GB with its nvidia-* wheels); for the CPU build
# there: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH_FROM) torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[test,plots]"
	touch $(STAMP)

setup: $(STAMP)

# The main job: every document in the corpus run through pytest on the shipped models, held to
# its expectations and its committed baselines (documents/*/baselines/). Writes the HTML report
# to report/index.html and prints its path last, even when a document fails (pytest's status kept).
demo: $(STAMP)
	$(BIN)/python -m pytest documents/ -rs --causalab-summary --causalab-report=report; \
	status=$$?; echo "report: $(CURDIR)/report/index.html"; exit $$status

# The project's own test suite.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests

# The benchmarks, one after the other in one recipe (never side by side under -j: they time the
# cores); each prints its variants side by side and asserts no time.
bench: $(STAMP)
	$(BIN)/python benchmarks/charmap.py
	$(BIN)/python benchmarks/featurizers.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/huge_documents.py
	$(BIN)/python benchmarks/attribution.py

# The resolver's character map, fast against the growing-prefix definition (under a minute).
bench-charmap: $(STAMP)
	$(BIN)/python benchmarks/charmap.py

# Rebuild the shipped models and datasets (deterministic; a few minutes on CPU).
fixtures: $(STAMP)
	$(BIN)/python scripts/build_fixtures.py

# Rebuild the featurizer bundles the corpus loads (documents/v2/artifacts/): runs das and
# pca_harvest, and trains the SAE on tiny-llama's own activations (under a minute).
artifacts: $(STAMP)
	$(BIN)/python scripts/build_artifacts.py
