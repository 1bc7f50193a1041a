# MCP Mesh. `make demo` runs the main job, `make test` runs every test;
# both set up everything first (Debian packages, .venv/, the Wasm filter).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
DEBS := clang lld wasi-libc python3-bpfcc bpfcc-tools linux-headers-amd64 nghttp2-client chromium iproute2 libclang-rt-14-dev-wasm32 python3-venv libb64-0d redis-server
PYTEST_ARGS ?=

.PHONY: install debs venv kernel-headers wasm test demo demo-lite bench clean proto web perf-analyzer wheel

install: debs kernel-headers venv wasm web perf-analyzer

# Debian packages: installed only when one is missing, so re-runs are fast.
debs:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make install: need root to apt-get install $$missing" >&2; exit 1; fi; \
	  echo "installing Debian packages: $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# bcc compiles against /lib/modules/$(uname -r)/build; where the running
# kernel's own headers are not packaged, point it at the packaged ones.
kernel-headers: debs
	@k=/lib/modules/$$(uname -r); \
	if [ ! -e $$k/build ] && [ "$$(id -u)" = 0 ]; then \
	  hdr=$$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1); \
	  common=$$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1); \
	  if [ -n "$$hdr" ]; then mkdir -p $$k && ln -sfn $$hdr $$k/build && ln -sfn $$common $$k/source; \
	    echo "linked $$k/build -> $$hdr"; fi; \
	fi

venv: .venv/.installed

.venv/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,dev]'
	@# bcc is Debian's (python3-bpfcc): make just that package importable.
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	if [ -d /usr/lib/python3/dist-packages/bcc ]; then ln -sfn /usr/lib/python3/dist-packages/bcc $$site/bcc; fi
	@touch $@

# Triton's perf_analyzer (tritonclient 2.50.0's binary, in a venv of its own: it would replace
# the project's tritonclient) for tests/e2e/test_perf_analyzer.py; it links Debian's libb64-0d.
perf-analyzer: .cache/perf-analyzer-venv/bin/perf_analyzer

.cache/perf-analyzer-venv/bin/perf_analyzer: | .venv/.installed
	$(PY) -c 'from harness import perf_analyzer; perf_analyzer.install()'

wasm: venv
	@if [ -f wasm-filters/Makefile ]; then $(MAKE) -s -C wasm-filters; fi

# The console page (xds-server/console/web): `npm ci` only when package-lock.json
# changed, TS generated from the backend's proto by protoc-gen-es, the bundle
# rebuilt only when a source changed. Node and npm come from the machine.
WEB := xds-server/console/web
WEB_SRC := $(shell find $(WEB)/src -name '*.ts' -not -path '*/gen/*' 2>/dev/null) $(WEB)/tsconfig.json

web: $(WEB)/dist/console.js

$(WEB)/node_modules/.installed: $(WEB)/package-lock.json
	@command -v npm >/dev/null || { echo "make web: npm (Node.js 20+) is needed for the console page" >&2; exit 1; }
	cd $(WEB) && npm ci --no-audit --no-fund
	@touch $@

$(WEB)/src/gen/grpc_service_pb.ts: inference-backend/protos/grpc_service.proto $(WEB)/node_modules/.installed | .venv/.installed
	@mkdir -p $(@D)
	$(PY) -m grpc_tools.protoc --plugin=protoc-gen-es=$(WEB)/node_modules/.bin/protoc-gen-es \
	  --es_out=$(@D) --es_opt=target=ts -I inference-backend/protos grpc_service.proto

$(WEB)/dist/console.js: $(WEB_SRC) $(WEB)/src/gen/grpc_service_pb.ts $(WEB)/node_modules/.installed
	cd $(WEB) && node_modules/.bin/tsc -p . && node_modules/.bin/esbuild src/main.ts --bundle \
	  --format=esm --target=es2020 --minify --sourcemap --outfile=dist/console.js --log-level=warning

# KServe v2 gRPC modules of inference-backend (committed; rerun after editing the .proto).
proto: venv
	$(PY) inference-backend/protos/build_gencode.py

# A wheel for `pip install` outside the checkout: the Wasm module and the console bundle are
# built first, since the wheel carries them as package data.
wheel: wasm web
	rm -rf build
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	.venv/bin/mcpctl demo

# The demo without root, kernel headers or Chromium (no Debian packages, no eBPF, no
# browser): the venv from PyPI alone; the console bundle when npm is there, the Wasm
# filter when its toolchain is (the header-contract step says it skipped otherwise).
demo-lite: venv
	@if command -v npm >/dev/null; then $(MAKE) -s web; else echo "demo-lite: no npm: the console page has no bundle"; fi
	@if command -v clang >/dev/null && [ -f wasm-filters/Makefile ]; then $(MAKE) -s -C wasm-filters || true; fi
	.venv/bin/mcpctl demo $(DEMO_ARGS)

bench: install
	$(PY) -m benchmarks $(BENCH)

clean:
	rm -rf .venv build dist artifacts .pytest_cache $(WEB)/src/gen $(WEB)/dist/console.js*
	@if [ -f wasm-filters/Makefile ]; then $(MAKE) -s -C wasm-filters clean; fi
