# creditd: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Go may live in /usr/local/go/bin without being on PATH (CI, fresh machines).
export PATH := $(PATH):/usr/local/go/bin
GO ?= go

.PHONY: help build run test lint clean bench hostile

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "; printf "Targets:\n"} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build bin/creditd
	$(GO) build -o bin/creditd ./cmd/creditd

run: build ## Build, ensure Redis+Postgres (installing when missing), run creditd serve in dev mode on :8080
	scripts/run.sh

test: ## vet, gofmt check, go test -race on single Redis, then again on a 3-master Redis Cluster
	GO=$(GO) scripts/test.sh

hostile: ## Long hostile-input property run: CREDITD_HOSTILE_N requests (default 20000), CREDITD_HOSTILE_SEED
	CREDITD_HOSTILE_N=$${CREDITD_HOSTILE_N:-20000} GO_TEST_FLAGS="-run TestHostile -timeout 90m" \
		TEST_PKGS=./internal/e2e GO=$(GO) scripts/test.sh

bench: ## Benchmark creditd vs raw Redis, HTTP+EVALSHA and Postgres-only, memory, rebuild; writes the goal table to bench/results/latest.md (~15 min; BENCH_FLAGS=-quick for ~3 min)
	$(GO) run ./bench $(BENCH_FLAGS)

lint: ## gofmt -l and go vet
	@out=$$(gofmt -l $$($(GO) list -e -f '{{.Dir}}' ./...)); \
	if [ -n "$$out" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean: ## Stop the private services and remove bin/ and .data/
	scripts/services.sh stop --purge
	rm -rf bin .data
