# Everything runs from the project's own virtual environment; a machine needs only python3 with venv.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.unison-installed
# The CPU build of this torch release (a bare `torch` would pull a multi-GB CUDA build).
TORCH_PIN = torch==2.13.0

.PHONY: venv demo check test test-large lint bench bench-quick bench-multihost proto clean distclean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Keras 2 for the tf_keras tests and example (tf.keras under TF_USE_LEGACY_KERAS=1): the tf-keras
# release of the installed tensorflow-cpu's minor version, without its dependency on the `tensorflow`
# package (a second, full TensorFlow over tensorflow-cpu's files).
TF_KERAS_PIN = tf-keras==$$($(VPY) -c 'import importlib.metadata as m; print(".".join(m.version("tensorflow-cpu").split(".")[:2]) + ".*")')

# The frameworks whose launchers the tests start unison jobs under (tests/launch, tests/ray, tests/spark), at
# the releases tested; with the pinned torch, pip keeps torch and NumPy as they are.
INTEGRATION_PINS = 'ray[train]==2.60.0' 'pyspark==4.3.0' 'pytorch-lightning==2.6.6' 'accelerate==1.15.0'

# Reinstalls whenever pyproject.toml changes.
$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install -e '.[mpi,grpc,dev,tensorflow]' '$(TORCH_PIN)'
	$(VPY) -m pip install --no-deps "$(TF_KERAS_PIN)"
	$(VPY) -m pip install $(INTEGRATION_PINS) '$(TORCH_PIN)'
	touch $@

demo: venv
	$(VENV)/bin/mpiexec -n 2 $(VPY) examples/pytorch_mnist.py

# Day-to-day work, in under 5 minutes on 2 cores: lint; the unit tests in two workers, less the Keras 2
# file and the Keras-on-torch 2-rank job (Keras jobs in child processes: 2-3 minutes of one worker);
# the whole multi-rank suite at 1 rank; at 2 ranks the suite without the TensorFlow and Keras files
# (they ran at 1 rank; 2 ranks add little but time) and without the convergence tests (hundreds of
# training steps). `make test` runs all of them. Measured: 98 s at load average 1.2 (244 s at 5.4).
check: lint
	$(VPY) -m pytest tests/unit -q -n 2 --dist loadfile $(CHECK_LEAVES_OUT)
	$(VPY) tests/run_multirank.py -n 1
	$(VPY) tests/run_multirank.py -n 2 -m "not convergence" $(MULTIRANK_WITHOUT_TF)

CHECK_LEAVES_OUT = --ignore=tests/unit/adapters/test_tf_keras_legacy.py \
	--deselect=tests/unit/adapters/test_tf_keras_torch_backend.py::test_keras_torch_backend_two_ranks_match_one_process

# The whole matrix, as CI runs it. The tests in three workers (a file stays in one worker; the files
# marked long_jobs go out first, tests/conftest.py): their jobs wait on timers, and a third worker fills
# that time (the tier: 744 s in two workers, 679 s in three, user+sys 1.58 and 1.70 cores). The fault
# and control-plane tests apart from the heavy training tests, in two workers, since they check how soon
# a failure is noticed, with bounds that hold on a loaded 2-core machine. Then the multi-rank suite at 1
# to 4 ranks, on the gRPC control plane, and started by torchrun.
test: venv
	$(VPY) -m pytest tests/unit tests/examples tests/launcher tests/multihost tests/elastic tests/ps tests/launch tests/ray tests/spark -q -n 3 --dist loadfile --no-loadscope-reorder
	$(VPY) -m pytest tests/service tests/faults tests/torchrun -q -n 2 --dist loadfile --no-loadscope-reorder
	$(VPY) tests/run_multirank.py -n 1
	$(VPY) tests/run_multirank.py -n 2
	$(VPY) tests/run_multirank.py -n 3 $(MULTIRANK_AT_3)
	$(VPY) tests/run_multirank.py -n 4 tests/multirank/test_adasum.py tests/multirank/test_torch_distributed.py::test_a_two_dimensional_device_mesh
	UNISON_CONTROLLER=grpc UNISON_SERVICE_HOST_AGGREGATION=0 $(VPY) tests/run_multirank.py -n 2 $(CONTROL_PLANE_TESTS)
	UNISON_CONTROLLER=grpc $(VPY) tests/run_multirank.py -n 3 $(CONTROL_PLANE_TESTS)
	$(VPY) tests/run_multirank.py --torchrun -n 2 $(TORCHRUN_AT_2)
	$(VPY) tests/run_multirank.py --torchrun -n 3 $(TORCHRUN_TESTS)

# At 3 ranks (odd sizes, uneven splits) every file but the Keras and TensorFlow training-level ones:
# their numerics do not depend on the number of ranks and ran at 1 and 2; TensorFlow's collectives,
# whose splits do, stay (the Keras files took 37 s of the tier's 90 on 2 cores).
MULTIRANK_AT_3 = $(filter-out tests/multirank/test_keras% tests/multirank/test_tf_graph_mode.py \
	tests/multirank/test_tf_broadcast_object_fn.py tests/multirank/test_compression_tf.py,$(wildcard tests/multirank/test_*.py))
# The other control plane changes how requests and responses travel, not what the framework adapters
# submit: its tiers leave out the TensorFlow, Keras and torch adapter files, which the MPI tiers run
# (the torch ones under torchrun too); torch.distributed's file stays, for its mismatches.
MULTIRANK_WITHOUT_TF = $(filter-out tests/multirank/test_keras% tests/multirank/test_tf_% tests/multirank/test_compression_tf.py,$(wildcard tests/multirank/test_*.py))
CONTROL_PLANE_TESTS = $(filter-out $(addprefix tests/multirank/,test_torch_collectives.py test_torch_optimizer.py \
	test_torch_state.py test_torch_join.py test_compression_torch.py),$(MULTIRANK_WITHOUT_TF))
# Jobs started by torchrun (no MPI: the gloo transport, the plugin's barrier over torch's store): the
# collectives, the torch adapter and torch.distributed files. Files that call mpi4py themselves (the
# MPI contract, Adasum's sizes, the harness's own MPI checks, timelines sent over MPI) stay in the MPI tiers.
TORCHRUN_TESTS = $(addprefix tests/multirank/,test_collectives.py test_torch_collectives.py \
	test_torch_optimizer.py test_torch_state.py test_torch_join.py test_compression_torch.py test_errors.py \
	test_naming.py test_join_collectives.py test_torch_distributed.py test_gpu_arrays_engine.py test_gloo_backend.py)
# At 2 ranks (the MPI tiers run every file at 2), the transport's own files, torch.distributed's and the
# steady state's (its summary over gloo).
TORCHRUN_AT_2 = $(addprefix tests/multirank/,test_collectives.py test_gloo_backend.py test_torch_distributed.py \
	test_steady_state.py)

# The benchmarks' quick runs (benchmarks/run_all.py --quick) and their checks alone: `make test` runs
# them once, in its first tier; `make check` leaves them out.
bench-quick: venv
	$(VPY) -m pytest tests/examples/test_benchmarks.py -q

# Tensors over 2 GiB (32-bit MPI counts): about 9 GiB of memory, 6 s on the 2-core machine; they skip,
# saying why, where less than 10 GiB is available. CI runs it after `make test`.
test-large: venv
	UNISON_TEST_LARGE=1 $(VPY) tests/run_multirank.py -n 2 tests/multirank/test_large.py

lint: venv
	$(VENV)/bin/ruff check unison unison_torch_backend benchmarks tests
	$(VENV)/bin/mypy unison unison_torch_backend benchmarks

bench: venv
	$(VPY) benchmarks/run_all.py

bench-multihost: venv
	$(VPY) benchmarks/multihost.py --train --compression

# Regenerate the gRPC modules of the coordinator service (committed; needs grpcio-tools).
proto: venv
	$(VPY) -m pip install grpcio-tools
	$(VPY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. unison/service/coordinator.proto
	$(VPY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. unison/ps/ps.proto

# Build outputs and tool caches; `distclean` also removes the virtual environment.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
