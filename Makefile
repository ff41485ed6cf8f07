# The two commands: `make serve` and `make test`. Each bootstraps what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make serve` installs the service alone; `make test` adds the test toolchain on top.
SERVICE_STAMP := $(VENV)/.installed-service

.PHONY: test test-fast test-cluster test-gpu screenshots serve install lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch/torchvision first, pinned to the releases this machine's pip cache holds,
# so the resolver does not go looking for a newer multi-GB wheel. The editable build's
# own box ("Editable installation ... be careful with folders in your working directory")
# is setuptools' warning, not news to anyone running from a checkout: not shown.
QUIET_BUILD := PYTHONWARNINGS=ignore::UserWarning
$(SERVICE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "torch==2.14.1" "torchvision==0.29.1" || $(BIN)/pip install --quiet torch torchvision
	$(QUIET_BUILD) $(BIN)/pip install --quiet -e ".[service]"
	touch $(SERVICE_STAMP)

$(STAMP): pyproject.toml $(SERVICE_STAMP)
	$(QUIET_BUILD) $(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

# corel's fused nodes compiled for this environment (corel/native; about 40 s on 2 cores). Where
# no C++ compiler is at hand it says so and the Python nodes run (the same numbers, slower);
# the library's tests then fail, asking for it.
NATIVE := $(VENV)/.native-built
$(NATIVE): corel/native/fused.cpp corel/native/__init__.py $(SERVICE_STAMP)
	$(BIN)/python -m corel.native build --optional
	touch $(NATIVE)

install: $(STAMP) $(NATIVE)

lint: $(STAMP)
	$(BIN)/ruff check corel app worker tests bench harness
	$(BIN)/mypy

# The library's numeric tests (marked `kernels`: their figures come out of torch's or MKL's
# kernels) once more on other kernels than this CPU's own: torch's non-vectorised ones and
# MKL's reproducible path, so that a test that holds only on one CPU's rounding fails here,
# not on the next machine. It runs beside the main pass, at a low priority (below).
KERNELS := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE

#
# The passes run on two processes (pytest-xdist; tests/conftest.py keeps a file's tests on
# one process, so its module fixtures are made once; it also orders the work, longest first),
# then the tests marked `serial` (they
# measure time, or load the whole machine) run alone.
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder
# Each pass ends with its 25 slowest tests (setup and teardown included), and with the
# leftover check (tests/leftovers.py): a process or thread the pass left running fails it.
DURATIONS := --durations=25

# The main and serial passes act for a user with a write token (tests/app/conftest.py): every
# route through the owner, sharing and access checks. The open pass runs, in the open mode
# `make serve` starts in, the tests that set up their own authentication and the API's own
# tests (no worker) once more. It runs beside the main pass, on Redis databases of its own
# (14, 15; the main pass has 12, 13): alone it left the cores idle a third of its time (the
# schemathesis runs: a fuzzer and a server taking turns).
# The library's lane starts with them, at the lowest CPU priority (LANE_NICE): the kernel pass
# with mypy beside it (one process, about 100 s from an empty cache), then the library pass
# (tests/corel on this CPU's own kernels; the main pass leaves them out). Neither needs a
# service nor times anything: they are the work that can wait, and they take the cores the
# main pass's waits leave idle (its two test processes waiting on workers, servers and the
# browser kept a 2-core machine 1.2 cores busy alone), so that the main pass, the longest,
# runs at nearly its own pace. The open pass's and the lane's output is in build/open-pass.log,
# build/kernel-pass.log and build/library-pass.log, shown once the main pass, the open pass
# and the lane have all ended.
LANE_NICE := 19
OPEN := COREL_TEST_OPEN_MODE=1 COREL_TEST_REDIS_URL=redis://127.0.0.1:6379/13
OPEN_LOG := build/open-pass.log
KERNEL_LOG := build/kernel-pass.log
LIBRARY_LOG := build/library-pass.log
test: $(STAMP) $(NATIVE)
	$(BIN)/ruff check corel app worker tests bench harness
	@mkdir -p build
	nice -n $(LANE_NICE) sh -c '{ $(BIN)/mypy & mypy=$$!; \
	    $(KERNELS) $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(DURATIONS) -m kernels tests/corel; \
	    kernels=$$?; wait $$mypy && [ $$kernels -eq 0 ]; } > $(KERNEL_LOG) 2>&1; lane=$$?; \
	  $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(DURATIONS) -m "not serial" tests/corel \
	    > $(LIBRARY_LOG) 2>&1; library=$$?; [ $$lane -eq 0 ] && [ $$library -eq 0 ]' & lane=$$!; \
	$(OPEN) $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(DURATIONS) -m "not serial" tests/app \
		> $(OPEN_LOG) 2>&1 & open=$$!; \
	$(BIN)/python -m pytest -q $(XDIST) $(DURATIONS) -m "not serial" --ignore=tests/corel; main=$$?; \
	wait $$open; open=$$?; wait $$lane; lane=$$?; echo "--- the open pass ($(OPEN_LOG)):"; cat $(OPEN_LOG); \
	echo "--- the kernel pass and mypy ($(KERNEL_LOG)):"; cat $(KERNEL_LOG); \
	echo "--- the library pass ($(LIBRARY_LOG)):"; cat $(LIBRARY_LOG); \
	[ $$main -eq 0 ] && [ $$open -eq 0 ] && [ $$lane -eq 0 ]
	$(BIN)/python -m pytest -q $(DURATIONS) -m serial tests/app/processes

# The edit loop's pass: ruff, then the tests that need no worker or browser (the library's,
# the worker's own units, the API tier on PostgreSQL and Redis, the repository's checks) on
# this CPU's kernels, once. docs/development.md says what each tier holds and costs.
FAST := tests/corel tests/worker tests/app/api tests/test_architecture.py tests/test_docs_links.py \
	tests/test_leftovers.py
test-fast: $(STAMP) $(NATIVE)
	$(BIN)/ruff check corel app worker tests bench harness
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(DURATIONS) -m "not serial" $(FAST)

# Hosts of their own (tests/cluster): network namespaces joined by veth pairs, a database
# host, an API host and two worker hosts; needs root. CI runs it after `make test`.
test-cluster: $(STAMP) $(NATIVE)
	COREL_TEST_CLUSTER=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/cluster

# The tests that need CUDA (tests/gpu); fails on a machine where torch sees no GPU.
test-gpu: $(STAMP) $(NATIVE)
	COREL_REQUIRE_CUDA=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m gpu tests/gpu

# The dashboard's screenshots (the README's and docs/service.md's): its browser tests take them (into
# build/screenshots/, as on every `make test`) and this copies them into docs/screenshots/.
SHOTS := $(CURDIR)/build/screenshots
screenshots: $(STAMP) $(NATIVE)
	rm -rf $(SHOTS)
	COREL_SCREENSHOTS_DIR=$(SHOTS) $(BIN)/python -m pytest -q -p no:cacheprovider tests/app/stack/test_dashboard.py
	COREL_SCREENSHOTS_DIR=$(SHOTS) $(OPEN) $(BIN)/python -m pytest -q -p no:cacheprovider tests/app/stack/test_dashboard.py
	cp $(SHOTS)/*.png docs/screenshots/

# MNIST and AG News's test split, where a checkout has ../shared/datasets beside it (unless
# COREL_DATA_DIR says otherwise).
SHARED_DATA := $(wildcard $(CURDIR)/../shared/datasets)

# exec: the service is make's own child, so the SIGTERM make passes on reaches it (a shell
# between them died of it, "Error 143", and left the service running); a SIGINT to make
# alone, which make does not pass on, `corel serve` notices itself (app/cli/service.py).
serve: $(SERVICE_STAMP) $(NATIVE)
	@echo "corel is installed in $(VENV): '. $(VENV)/bin/activate' puts the corel command on your PATH"
	exec env COREL_DATA_DIR="$${COREL_DATA_DIR:-$(SHARED_DATA)}" $(BIN)/corel serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
