#!/usr/bin/env bash
# Lints api/openapi.json with Redocly CLI, pinned in tools/openapi's
# package-lock.json: every recommended rule as an error, the exceptions (each
# with its reason) in tools/openapi/.redocly.lint-ignore.yaml. Installs the
# npm packages with `npm ci` only when node_modules is missing, and Node.js
# with apt-get when it is missing and we are root on Debian.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$ROOT/tools/openapi

if ! command -v npm >/dev/null 2>&1; then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "openapi-lint: installing nodejs and npm" >&2
		DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm </dev/null >/dev/null
	else
		echo "openapi-lint: npm not found; install Node.js 20.19 or later (or run as root on Debian)" >&2
		exit 1
	fi
fi
# @redocly/cli 2.x needs Node.js 20.19+ (or 22.12+); say so rather than
# fail inside npm.
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)'; then
	echo "openapi-lint: Node.js $(node --version) is too old for @redocly/cli; install 20.19 or later (nodesource)" >&2
	exit 1
fi
if [[ ! -x $dir/node_modules/.bin/redocly ]]; then
	(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
cd "$dir"
# The summary names each rule broken; the exit status fails on any problem.
exec node_modules/.bin/redocly lint --config redocly.yaml --format=codeframe ../../api/openapi.json
