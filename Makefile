# The two commands a new machine needs: `make demo` and `make test`. Everything else is a building block.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
# where that torch comes from: empty, pip's own indexes (the test machines keep a CPU build of 2.13.0 on
# disk, which pip takes; elsewhere PyPI's torch is the CUDA build, several GB): `make test
# TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU build there
TORCH_INDEX ?=
# the main suite runs in parallel workers, one per core up to four (more workers mostly add vaults and
# torch copies in memory); PARALLEL= runs it in one process
PARALLEL ?= -n auto --maxprocesses 4 --dist loadgroup

.PHONY: demo test bytecode docs lint typecheck proto proto-check test-fast test-vllm test-vllm-compat test-mlx test-llamacpp bench bench-vllm bench-redis clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so the [hf] extra does not pick a release of its own (see TORCH_INDEX)
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev,hf,docs]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/tierkv demo

test: $(STAMP) lint typecheck proto-check docs bytecode
	scripts/setup-test-tools.sh
	$(PY) -m pytest -q -p no:cacheprovider $(PARALLEL)
	$(MAKE) test-vllm
	$(MAKE) test-vllm-compat
	$(MAKE) test-mlx
	$(MAKE) test-llamacpp
	$(MAKE) test-sglang

test-fast: $(STAMP) bytecode
	$(PY) -m pytest -q -m "not slow and not vllm and not mlx" $(PARALLEL)

# tierkv's own modules as bytecode (an editable install compiles nothing): each process the suite starts,
# some three hundred vaults among them, then reads them instead of compiling about seventy modules again
# whenever PYTHONDONTWRITEBYTECODE is set. A stale .pyc is never used: Python checks it against its source.
bytecode: $(STAMP)
	$(PY) -m compileall -q tierkv

lint: $(STAMP)
	$(VENV)/bin/ruff check tierkv tests benchmarks scripts
	$(VENV)/bin/ruff format --check tierkv tests benchmarks scripts
	@# no runtime function above radon rank C (generated protobuf code excluded)
	@out=$$($(VENV)/bin/radon cc -n D -s -e 'tierkv/wire/_proto/*' tierkv) && \
	  if [ -n "$$out" ]; then echo "functions above rank C:"; echo "$$out"; exit 1; fi && \
	  echo "complexity: every function rank C or better"
	@# no runtime file below maintainability rank B
	@out=$$($(VENV)/bin/radon mi -n C -s -e 'tierkv/wire/_proto/*' tierkv) && \
	  if [ -n "$$out" ]; then echo "files below maintainability rank B:"; echo "$$out"; exit 1; fi && \
	  echo "maintainability: every file rank B or better"
	@# the import contract: arrows point down only (tests/test_layers.py lists what may import what)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layers.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy tierkv

# the documentation site: broken links, missing pages and undocumented settings fail the build
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

proto: $(STAMP)
	PYTHON=$(PY) scripts/gen-proto.sh

# generated code must match proto/: regenerate into a temp dir and compare
proto-check: $(STAMP)
	@tmp=$$(mktemp -d) && PYTHON=$(PY) scripts/gen-proto.sh $$tmp && \
	  diff -q $$tmp/vault_pb2.py tierkv/wire/_proto/vault_pb2.py && \
	  diff -q $$tmp/vault_pb2.pyi tierkv/wire/_proto/vault_pb2.pyi && rm -rf $$tmp && \
	  echo "generated protobuf code is up to date"

test-vllm: $(STAMP)
	@if [ -x scripts/setup-vllm-env.sh ]; then \
	  scripts/setup-vllm-env.sh && .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/connectors/vllm tests/conformance/test_vllm.py tests/routing tests/bench/test_engine_vllm.py tests/docs; \
	else echo "vLLM tier not present"; fi

# the connector's tests that need vLLM's Python code but no engine, against vLLM 0.33 (Python code over
# the CPU tier's dependencies: docs/engines/vllm-versions.md); test-vllm runs them against 0.32
VLLM_COMPAT_TESTS := tests/connectors/vllm/test_scheduler_vllm.py tests/connectors/vllm/test_secondary_tier.py \
	tests/connectors/vllm/test_eviction_logic.py tests/connectors/vllm/test_protect.py
test-vllm-compat: $(STAMP)
	@if [ -x scripts/setup-vllm-compat-env.sh ]; then \
	  scripts/setup-vllm-env.sh && scripts/setup-vllm-compat-env.sh && \
	  .venv-vllm033/bin/python -m pytest -q -p no:cacheprovider -m vllm $(VLLM_COMPAT_TESTS); \
	else echo "vLLM compatibility tier not present"; fi

test-mlx: $(STAMP)
	@if [ -x scripts/setup-mlx-env.sh ]; then \
	  scripts/setup-mlx-env.sh && .venv-mlx/bin/python -m pytest -q -p no:cacheprovider -m mlx tests/connectors/mlx tests/connectors/exo tests/conformance tests/docs; \
	else echo "MLX tier not present"; fi

test-llamacpp: $(STAMP)
	@if [ -x scripts/setup-llamacpp-env.sh ]; then \
	  scripts/setup-llamacpp-env.sh && \
	  .venv-llamacpp/bin/python -m pytest -q -p no:cacheprovider -m llamacpp tests/connectors/llamacpp tests/conformance; \
	else echo "llama.cpp tier not present"; fi

test-sglang: $(STAMP)
	scripts/setup-sglang-env.sh && .venv-sglang/bin/python -m pytest -q -p no:cacheprovider -m "sglang or lmcache" tests/connectors/sglang tests/connectors/lmcache tests/conformance

bench: $(STAMP)
	$(VENV)/bin/tierkv bench

bench-vllm: $(STAMP)
	scripts/setup-vllm-env.sh && .venv-vllm/bin/python -m benchmarks.vllm_restore_ttft

bench-redis: $(STAMP)
	benchmarks/setup-redis.sh
	$(PY) benchmarks/vault_vs_redis.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm033 .venv-mlx .venv-llamacpp .state build site *.egg-info
