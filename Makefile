# Kiln gateway. The two commands: `make run` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO      ?= go
BIN     := bin
NPM     ?= npm
export CGO_ENABLED ?= 0

# Local run: the gateway on 127.0.0.1:8080, the model simulator on 127.0.0.1:8090 (where the
# reference catalog's backends point), the embedded store under ./.kiln.
KILN_ADDR           ?= 127.0.0.1:8080
KILN_SIMULATOR_ADDR ?= 127.0.0.1:8090
KILN_DATA_DIR       ?= ./.kiln

.PHONY: help build run test test-go test-e2e lint bench fuzz clean

help:
	@echo "make run    - the gateway on http://$(KILN_ADDR)/v1 with the model simulator and a demo key"
	@echo "make test   - every test (installs what the tests need)"
	@echo "make build  - bin/gateway and bin/kilnctl"
	@echo "make bench  - the gateway's overhead against the simulator alone (writes bench.txt)"
	@echo "make fuzz   - each fuzz target for FUZZTIME (default 30s)"

build:
	$(GO) build -trimpath -o $(BIN)/gateway ./functions/gateway
	$(GO) build -trimpath -o $(BIN)/kilnctl ./infra/kilnctl

run: build
	KILN_ADDR=$(KILN_ADDR) KILN_SIMULATOR_ADDR=$(KILN_SIMULATOR_ADDR) KILN_DATA_DIR=$(KILN_DATA_DIR) ./$(BIN)/gateway

# The official openai npm package, pinned in tests/js/package-lock.json, for the client tests.
tests/js/node_modules/.package-lock.json: tests/js/package.json tests/js/package-lock.json
	$(NPM) ci --prefix tests/js --no-audit --no-fund

test: lint test-go test-e2e

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './tests/js/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# Unit and package tests (real sockets, real SQLite, fuzz seed corpora), with the race detector.
test-go:
	CGO_ENABLED=1 $(GO) test -race -count=1 ./pkg/... ./infra/... ./functions/...

# End-to-end: the built binaries, the official OpenAI clients (openai-go, the openai npm package).
test-e2e: tests/js/node_modules/.package-lock.json
	$(GO) test -count=1 ./tests/...

bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./pkg/openai/ ./pkg/gateway/ ./pkg/store/sqlite/ | tee bench.txt

FUZZTIME ?= 30s
fuzz:
	@for pkg in ./pkg/openai ./pkg/catalog ./pkg/money; do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

clean:
	rm -rf $(BIN) bench.txt
