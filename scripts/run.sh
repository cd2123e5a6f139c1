#!/usr/bin/env bash
# `make run`: ensures Redis and Postgres (scripts/services.sh, which installs
# them when missing) and execs creditd in dev mode. Arguments go to
# `creditd serve`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

[[ -x bin/creditd ]] || { echo "run: bin/creditd missing; run \`make run\` (it builds first)" >&2; exit 1; }

envfile=${CREDITD_DATA_DIR:-$ROOT/.data}/services.env
# With no redis-server to be had, creditd runs on embedded miniredis and
# warns loudly that nothing is durable.
scripts/services.sh --allow-embedded "$envfile"
# shellcheck disable=SC1090
. "$envfile"

export REDIS_URL DATABASE_URL
export CREDITD_DEV=1
# creditd refuses an admin token under 32 characters; dev mode makes one
# once and keeps it next to the dev tenant's keys, so it survives restarts.
if [[ -z ${CREDITD_ADMIN_TOKEN:-} ]]; then
  tokenfile=$(dirname "$envfile")/admin-token
  if [[ ! -s $tokenfile ]]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$tokenfile")
  fi
  CREDITD_ADMIN_TOKEN=$(<"$tokenfile")
fi
export CREDITD_ADMIN_TOKEN
export CREDITD_WEBHOOK_ALLOW_PRIVATE=true
export CREDITD_ADDR=${CREDITD_ADDR:-:8080}

echo "run: REDIS_URL=$REDIS_URL" >&2
echo "run: DATABASE_URL=$DATABASE_URL" >&2
echo "run: CREDITD_ADDR=$CREDITD_ADDR CREDITD_ADMIN_TOKEN=$CREDITD_ADMIN_TOKEN" >&2
# The web console (console/): sign in with the admin token above, or a tenant's API key.
console_host=${CREDITD_ADDR%:*}
case $console_host in "" | 0.0.0.0 | "[::]") console_host=localhost ;; esac
echo "run: console at http://$console_host:${CREDITD_ADDR##*:}/console (sign in with CREDITD_ADMIN_TOKEN)" >&2
exec bin/creditd serve "$@"
