#!/usr/bin/env bash
# `make test`: the whole gate, as CI runs it.
#   1. Redis and Postgres (scripts/services.sh; installs them when missing);
#   1b. python3 for the Python client's tests (apt-get, when missing and
#      root; they skip without it);
#   2. go vet ./... and a gofmt check;
#   3. Redocly lint of api/openapi.json (tools/openapi; npm ci when its
#      node_modules is missing), 0 errors and 0 warnings;
#   3b. the console's browser-test set-up: Debian's Chromium and Node
#      (apt-get, when missing and root) and console/e2e's npm packages (npm
#      ci, when missing or not the pinned version), so that
#      console.TestConsoleInBrowser runs in step 4 (it skips in step 5);
#   4. go test -race ./... on single Redis (TEST_REDIS_URL, TEST_DATABASE_URL);
#   5. go test -race again on a private Redis Cluster of 3 masters with one
#      replica each (TEST_REDIS_CLUSTER), always stopped afterwards: the
#      fleet's topology, so every money operation of the suite also waits
#      for a replica (CREDITD_REPLICA_ACKS auto, issue 11); and the e2e
#      suite's stacks are fleets of 3 nodes whose clients round-robin
#      consecutive requests over them, as HAProxy does in `make fleet`
#      (CREDITD_E2E_NODES=3, issue 25): a fleet must answer as one node.
# Each test phase prints how long it took. Exits non-zero on the first
# failure.
#
# Environment: TEST_REDIS_URL / TEST_DATABASE_URL, when set, name the servers
# to use instead; GO_TEST_FLAGS adds go test flags (say -run or -v);
# TEST_PKGS picks packages (default ./...); TEST_REDIS_CLUSTER_REPLICAS is
# the replicas per master of the cluster phase (default 1; 0 is the old
# replica-less cluster).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || { [[ -x /usr/local/go/bin/go ]] && export PATH=/usr/local/go/bin:$PATH; }
command -v "$GO" >/dev/null 2>&1 || { echo "test: go not found (install Go, or put /usr/local/go/bin on PATH)" >&2; exit 1; }

step() { printf '\n==> %s\n' "$*" >&2; }

# run CMD...: runs CMD in the background and waits, so a SIGTERM/SIGINT to
# this script is handled at once (forwarded to CMD, then the EXIT trap
# stops the cluster) rather than after CMD ends.
child=""
run() {
	local rc=0
	"$@" &
	child=$!
	wait "$child" || rc=$?
	child=""
	return "$rc"
}
on_signal() {
	[[ -n $child ]] && kill "-$1" "$child" 2>/dev/null || true
	wait 2>/dev/null || true
	exit "$2"
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
read -r -a pkgs <<<"${TEST_PKGS:-./...}"
read -r -a flags <<<"${GO_TEST_FLAGS:-}"
# A package's tests get 25 minutes rather than go test's 10: internal/e2e
# alone runs 5 to 6 minutes on a quiet two-core machine and went past 10 on
# a loaded one, and the bound is there to stop a hang, not to time a run.
flags=(-timeout 25m "${flags[@]}")

step "services"
data=${CREDITD_DATA_DIR:-$ROOT/.data}
mkdir -p "$data"
envfile=$data/services.test.env
REDIS_URL=${TEST_REDIS_URL:-} DATABASE_URL=${TEST_DATABASE_URL:-} \
	scripts/services.sh --with-redis-server "$envfile"
# shellcheck disable=SC1090
. "$envfile"
export TEST_REDIS_URL=$REDIS_URL TEST_DATABASE_URL=$DATABASE_URL
unset TEST_REDIS_CLUSTER REDIS_URL DATABASE_URL
echo "TEST_REDIS_URL=$TEST_REDIS_URL TEST_DATABASE_URL=$TEST_DATABASE_URL" >&2

# The TypeScript client (clients/typescript): its npm dependencies, from the
# lock file, when missing. client/typescript_test.go then runs its npm test
# against a real creditd in the single-Redis phase; without node it skips.
step "typescript client dependencies"
if ! command -v node >/dev/null 2>&1; then
	echo "node is not installed: the TypeScript client's tests are skipped" >&2
elif [[ ! -d clients/typescript/node_modules ]]; then
	(cd clients/typescript && npm ci --no-audit --no-fund)
else
	echo "clients/typescript/node_modules present" >&2
fi

# The Python client (clients/python) is standard library only: nothing to
# install but python3 itself, which a fresh Debian lacks. client/python_test.go
# runs its tests against a real creditd; without python3 it skips.
step "python client"
if command -v python3 >/dev/null 2>&1; then
	echo "python3 present" >&2
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
	echo "installing python3 (apt-get)" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >&2
else
	echo "python3 is not installed: the Python client's tests are skipped" >&2
fi

step "go vet"
"$GO" vet "${pkgs[@]}"

step "gofmt"
mapfile -t dirs < <("$GO" list -e -f '{{.Dir}}' "${pkgs[@]}")
unformatted=$( ((${#dirs[@]})) && gofmt -l "${dirs[@]}" || true)
if [[ -n $unformatted ]]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi

step "openapi lint (Redocly)"
scripts/openapi-lint.sh
step "console browser test set-up (Chromium, Node, console/e2e npm packages)"
# console/browser_test.go drives the console in Chromium through Playwright;
# CONSOLE_BROWSER_REQUIRED=1 makes it fail, not skip, when a piece is missing.
need=()
[[ -x /usr/bin/chromium ]] || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if ((${#need[@]})); then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "installing ${need[*]} (apt-get)" >&2
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
	else
		echo "test: the console browser test needs ${need[*]}: install them (apt-get install ${need[*]}) or run as root" >&2
		exit 1
	fi
fi
e2e=console/e2e
pinned=$(node -p "require('./$e2e/package-lock.json').packages['node_modules/playwright-core'].version")
installed=$(node -p "try { require('./$e2e/node_modules/playwright-core/package.json').version } catch { '' }")
if [[ $installed != "$pinned" ]]; then
	echo "installing $e2e npm packages (playwright-core $pinned; no browser download)" >&2
	(cd "$e2e" && npm ci --no-audit --no-fund >&2)
fi
export CONSOLE_BROWSER_REQUIRED=1

step "go test -race (single Redis)"
t0=$SECONDS
run "$GO" test -race -count=1 "${flags[@]}" "${pkgs[@]}"
echo "single Redis phase: $((SECONDS - t0)) s" >&2

replicas=${TEST_REDIS_CLUSTER_REPLICAS:-1}
step "go test -race (Redis Cluster, 3 masters x $replicas replica(s))"
t0=$SECONDS
cluster=$data/cluster-$$
cleanup() { scripts/redis-cluster.sh stop "$cluster" || true; rm -rf "$cluster"; }
trap cleanup EXIT
TEST_REDIS_CLUSTER=$(REDIS_CLUSTER_REPLICAS=$replicas scripts/redis-cluster.sh start "$cluster")
export TEST_REDIS_CLUSTER CREDITD_E2E_NODES=${CREDITD_E2E_NODES:-3}
echo "TEST_REDIS_CLUSTER=$TEST_REDIS_CLUSTER CREDITD_E2E_NODES=$CREDITD_E2E_NODES" >&2
run "$GO" test -race -count=1 "${flags[@]}" "${pkgs[@]}"
echo "Redis Cluster phase: $((SECONDS - t0)) s (cluster start included)" >&2

step "all passed"
