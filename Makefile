# Everything runs from the project's own virtual environment; a machine needs only python3 with venv.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.unison-installed
# The CPU build of this torch release (a bare `torch` would pull a multi-GB CUDA build).
TORCH_PIN = torch==2.13.0

.PHONY: venv demo test lint bench bench-multihost proto clean distclean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Keras 2 for the tf_keras tests and example (tf.keras under TF_USE_LEGACY_KERAS=1): the tf-keras
# release of the installed tensorflow-cpu's minor version, without its dependency on the `tensorflow`
# package (a second, full TensorFlow over tensorflow-cpu's files).
TF_KERAS_PIN = tf-keras==$$($(VPY) -c 'import importlib.metadata as m; print(".".join(m.version("tensorflow-cpu").split(".")[:2]) + ".*")')

# Reinstalls whenever pyproject.toml changes.
$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install -e '.[mpi,grpc,dev,tensorflow]' '$(TORCH_PIN)'
	$(VPY) -m pip install --no-deps "$(TF_KERAS_PIN)"
	touch $@

demo: venv
	$(VENV)/bin/mpiexec -n 2 $(VPY) examples/pytorch_mnist.py

# Most tests in two workers (a file stays in one worker); the fault and control-plane tests one at a
# time, since they check how soon a failure is noticed and a second busy worker delays that.
test: venv
	$(VPY) -m pytest tests/unit tests/examples tests/launcher tests/multihost tests/elastic tests/ps -q -n 2 --dist loadfile
	$(VPY) -m pytest tests/service tests/faults -q
	$(VPY) tests/run_multirank.py -n 1
	UNISON_TEST_LARGE=1 $(VPY) tests/run_multirank.py -n 2
	$(VPY) tests/run_multirank.py -n 3
	$(VPY) tests/run_multirank.py -n 4 tests/multirank/test_adasum.py
	UNISON_CONTROLLER=grpc UNISON_SERVICE_HOST_AGGREGATION=0 $(VPY) tests/run_multirank.py -n 2
	UNISON_CONTROLLER=grpc $(VPY) tests/run_multirank.py -n 3

lint: venv
	$(VENV)/bin/ruff check unison benchmarks tests
	$(VENV)/bin/mypy unison benchmarks

bench: venv
	$(VPY) benchmarks/run_all.py

bench-multihost: venv
	$(VPY) benchmarks/multihost.py --train --compression

# Regenerate the gRPC modules of the coordinator service (committed; needs grpcio-tools).
proto: venv
	$(VPY) -m pip install grpcio-tools
	$(VPY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. unison/service/coordinator.proto
	$(VPY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. unison/ps/ps.proto

# Build outputs and tool caches; `distclean` also removes the virtual environment.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
