# Two commands: `make run` (main job on the paper baseline) and `make test`.
# Each creates the virtual environment on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test docs bench bench-long calibrate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/comoe-opt paper instances/paper-baseline.toml --out out/paper

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

docs: $(STAMP)  # regenerate the instance-key reference in docs/instances.md
	$(BIN)/python -m comoe_opt.docs docs/instances.md

# every top-level benchmark script is in one of the two lists or is `calibrate`'s (a test checks);
# each writes its table to benchmarks/results/ with the machine it ran on
BENCHMARKS := bench_tracegen bench_mapping bench_residency bench_scenarios bench_runner real_trace scenario_sampling
LONG_BENCHMARKS := bench_dropin bench_scale bench_certificate regimes regime_map

bench: $(STAMP)  # the quick ones: about half an hour on two cores
	set -e; for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py; done

bench-long: $(STAMP)  # the long studies: several hours on two cores
	set -e; for b in $(LONG_BENCHMARKS); do echo "== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py; done

calibrate: $(STAMP)  # the paper baseline's one calibration, on the static strategy
	$(BIN)/python benchmarks/calibrate_static.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
