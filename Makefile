# creditd: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Go may live in /usr/local/go/bin without being on PATH (CI, fresh machines).
export PATH := $(PATH):/usr/local/go/bin
GO ?= go

.PHONY: help build run test lint clean bench hostile fleet fleet-stop chaos upgrade-test

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "; printf "Targets:\n"} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-13s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Version stamp of `creditd version` (cmd/creditd/version.go); override on
# the command line, e.g. make build VERSION=v1.4.0 BUILD_DATE=$(date -u +%FT%TZ).
# BUILD_DATE defaults to the commit's time, not the clock: the same tree
# gives the same binary, and an unchanged tree is not linked again.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell TZ=UTC0 git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null || echo unknown)
LDFLAGS = -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(BUILD_DATE)

build: ## Build bin/creditd, stamped with version, commit and build date (creditd version)
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/creditd ./cmd/creditd

run: build ## Build, ensure Redis+Postgres (installing when missing), run creditd serve in dev mode on :8080
	scripts/run.sh

fleet: build ## Build, start 3 creditd nodes behind HAProxy on a Redis Cluster (3 masters + 3 replicas) and Postgres; prints URL and keys
	scripts/fleet.sh start

chaos: build ## Fleet chaos (issues 11, 25): money load and checks through HAProxy; kill -9 nodes and Redis masters (readiness and per-shard availability gated), one master refusing writes, an outage of its own private Postgres; checks nothing lost or doubled; CHAOS_RUNS runs (default 3, ~2.5 min each); report in bench/results/chaos-*.md
	$(GO) run ./bench/chaos -runs $${CHAOS_RUNS:-3} $(CHAOS_FLAGS)

upgrade-test: ## Rolling upgrade under load (issue 25): a fleet on the previous release (deploy/previous-release, built from its commit) has its nodes replaced one at a time by this tree's build while money load runs; checks nothing lost or doubled, no 5xx but 503; ~2 min; report in bench/results/upgrade-*.md (UPGRADE_FLAGS=-from COMMIT -to COMMIT)
	$(GO) run ./bench/chaos -upgrade $(UPGRADE_FLAGS)

fleet-stop: ## Stop what `make fleet` started (by pid; data stays in .data/fleet)
	scripts/fleet.sh stop

test: ## vet, gofmt check, go test -race on single Redis, then again on a Redis Cluster of 3 masters with a replica each
	GO=$(GO) scripts/test.sh

hostile: ## Long hostile-input property run: CREDITD_HOSTILE_N requests (default 20000), CREDITD_HOSTILE_SEED
	CREDITD_HOSTILE_N=$${CREDITD_HOSTILE_N:-20000} GO_TEST_FLAGS="-run TestHostile -timeout 90m" \
		TEST_PKGS=./internal/e2e GO=$(GO) scripts/test.sh

bench: ## Benchmark creditd vs raw Redis, HTTP+EVALSHA and Postgres-only, memory, rebuild, a Postgres outage; writes issue 26's and issue 10's goal tables to bench/results/latest.md (~20 min; BENCH_FLAGS=-quick for ~4 min)
	$(GO) run ./bench $(BENCH_FLAGS)

lint: ## gofmt -l and go vet
	@out=$$(gofmt -l $$($(GO) list -e -f '{{.Dir}}' ./...)); \
	if [ -n "$$out" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean: ## Stop the private services and the fleet and remove bin/ and .data/
	scripts/fleet.sh stop
	scripts/services.sh stop --purge
	rm -rf bin .data
