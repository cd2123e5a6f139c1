#!/usr/bin/env bash
# `make fleet`: a whole creditd fleet on this machine (issue 11).
#
#   scripts/fleet.sh start
#       1. Redis Cluster of 3 masters + 3 replicas, AOF everysec
#          (scripts/redis-cluster.sh, data in .data/fleet/redis);
#       2. Postgres: DATABASE_URL, else database creditd_fleet (created
#          when missing) on the local server or a private one
#          (scripts/services.sh, which installs it when missing);
#       3. 3 creditd nodes (bin/creditd serve) on free ports, the first in
#          dev mode so it makes the dev tenant and its keys;
#       4. HAProxy (deploy/haproxy.cfg; apt-get installs it when missing)
#          on 127.0.0.1:$FLEET_PORT (default 8090), round robin over the
#          nodes that pass /readyz.
#       Prints the URL, the sandbox key and how to stop. Logs, pidfiles and
#       keys live in .data/fleet (CREDITD_DATA_DIR/fleet).
#   scripts/fleet.sh stop
#       Stops HAProxy, the nodes and the Redis Cluster by their pidfiles
#       (Postgres is shared with `make run`/`make test`: `make clean` stops
#       it). Data stays; `scripts/fleet.sh stop --purge` deletes it.
#   scripts/fleet.sh status
#       Says what runs.
#   scripts/fleet.sh start-node N
#       Starts creditd node N (1-3) of a running fleet again, with the
#       command line and address `start` gave it, and waits until it is
#       ready (`make chaos` kills nodes with kill -9 and restarts them).
#   scripts/fleet.sh stop-node N
#       Stops creditd node N gracefully (SIGTERM: it finishes the requests
#       in flight and writes what its persister holds), waiting up to 60 s;
#       `make upgrade-test` replaces nodes so, one at a time.
#   CREDITD_BIN=PATH (start, start-node): the creditd binary to run
#       instead of bin/creditd, so one fleet can mix versions in a rolling
#       upgrade (`make upgrade-test`).
#   scripts/fleet.sh check
#       Checks deploy/haproxy.cfg with `haproxy -c` and placeholder
#       addresses (installing HAProxy when missing, as start does).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_TAG=fleet
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

DATA=${CREDITD_DATA_DIR:-$ROOT/.data}
FLEET=$DATA/fleet
NODES=3
PORT=${FLEET_PORT:-8090}
BIN=${CREDITD_BIN:-bin/creditd}

node_pid() { echo "$FLEET/creditd-$1.pid"; }

# running PID: the process exists and is not a zombie. One read of its
# state: an exited node is a zombie until its parent (init, or whatever
# reaps orphans here) collects it, which may happen between two looks.
running() {
	local st
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $st && $st != Z ]]
}

# wait_ready URL SECONDS [PIDFILE]: URL answers 200 within SECONDS; with
# PIDFILE, gives up at once when that process has exited (a binary that
# refuses the schema, say, is not worth a minute's wait).
wait_ready() {
	local url=$1 secs=$2 pidfile=${3:-} i
	for ((i = 0; i < secs * 10; i++)); do
		# /readyz may take up to 2.1 s (each check is bounded at 2 s).
		[[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null) == 200 ]] && return 0
		if [[ -n $pidfile ]] && ! running "$(cat "$pidfile" 2>/dev/null)"; then
			log "the process of $pidfile exited"
			return 1
		fi
		sleep 0.1
	done
	return 1
}

cmd_stop() {
	local i
	[[ -d $FLEET ]] || { log "nothing to stop ($FLEET does not exist)"; return 0; }
	if pid_alive "$FLEET/haproxy.pid" haproxy; then log "stopping HAProxy"; fi
	kill_pidfile "$FLEET/haproxy.pid" haproxy
	for ((i = 1; i <= NODES; i++)); do
		if pid_alive "$(node_pid "$i")" creditd; then log "stopping creditd node $i"; fi
		kill_pidfile "$(node_pid "$i")" creditd
	done
	if [[ -d $FLEET/redis ]]; then
		log "stopping the Redis Cluster"
		"$ROOT/scripts/redis-cluster.sh" stop "$FLEET/redis"
	fi
	if [[ ${1:-} == --purge ]]; then
		log "deleting $FLEET"
		rm -rf "$FLEET"
	fi
}

cmd_status() {
	local i up=0
	pid_alive "$FLEET/haproxy.pid" haproxy && { echo "haproxy: running (pid $(<"$FLEET/haproxy.pid")), $(<"$FLEET/url")"; up=1; } ||
		echo "haproxy: stopped"
	for ((i = 1; i <= NODES; i++)); do
		if pid_alive "$(node_pid "$i")" creditd; then
			echo "creditd node $i: running (pid $(<"$(node_pid "$i")")) on $(<"$FLEET/creditd-$i.addr")"
			up=1
		else
			echo "creditd node $i: stopped"
		fi
	done
	local f redis=0
	for f in "$FLEET"/redis/node-*.pid; do
		pid_alive "$f" redis && redis=$((redis + 1))
	done
	if ((redis)); then
		echo "redis cluster: $redis nodes running, seeds $(<"$FLEET/redis/seeds")"
		up=1
	else
		echo "redis cluster: stopped"
	fi
	((up)) || return 3
}

ensure_haproxy() {
	have haproxy && return 0
	if can_install; then
		apt_install haproxy || log "apt-get install haproxy reported an error"
		hash -r
		have haproxy && return 0
	fi
	die "haproxy is not installed and cannot be installed here: install it
  (Debian/Ubuntu: sudo apt-get install haproxy)"
}

# cmd_check: deploy/haproxy.cfg parses and is valid for this HAProxy.
cmd_check() {
	ensure_haproxy
	FLEET_LISTEN=127.0.0.1:$PORT FLEET_NODE1=127.0.0.1:1 FLEET_NODE2=127.0.0.1:2 FLEET_NODE3=127.0.0.1:3 \
		haproxy -c -f "$ROOT/deploy/haproxy.cfg"
}

# fleet_database: points DATABASE_URL (services.sh's, database postgres) at
# database $FLEET_DB on the same server, creating it when missing.
FLEET_DB=creditd_fleet
fleet_database() {
	local psql="" d
	if have psql; then
		psql=$(command -v psql)
	else
		for d in $(printf '%s\n' /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
			[[ -x $d/psql ]] && { psql=$d/psql; break; }
		done
	fi
	[[ -n $psql ]] || die "psql not found: it is needed to create the fleet's database (or set DATABASE_URL)"
	[[ $DATABASE_URL == *"/postgres?"* ]] || die "unexpected DATABASE_URL $DATABASE_URL from services.sh; set DATABASE_URL"
	if [[ -z $("$psql" -w -X -At -d "$DATABASE_URL" -c "select 1 from pg_database where datname = '$FLEET_DB'" </dev/null) ]]; then
		log "creating database $FLEET_DB"
		"$psql" -w -X -q -d "$DATABASE_URL" -c "create database $FLEET_DB" </dev/null >&2 ||
			die "could not create database $FLEET_DB"
	fi
	DATABASE_URL=${DATABASE_URL/\/postgres\?//$FLEET_DB?}
}

# launch_node N ADDR SEEDS DATABASE_URL TOKEN: creditd node N in the
# background, its pid in its pidfile.
launch_node() {
	local i=$1 addr=$2 seeds=$3 db=$4 token=$5
	log "starting creditd node $i on $addr (log: $FLEET/creditd-$i.log)"
	# Node 1 makes the dev tenant; the others start once it exists, so
	# two nodes never race to make two.
	REDIS_URL=$seeds DATABASE_URL=$db CREDITD_ADDR=$addr \
		CREDITD_ADMIN_TOKEN=$token CREDITD_INSTANCE=fleet-$i \
		CREDITD_DEV=$([[ $i == 1 ]] && echo 1 || echo 0) CREDITD_DEV_FILE=$FLEET/dev-tenant.json \
		CREDITD_WEBHOOK_ALLOW_PRIVATE=true \
		setsid "$BIN" serve </dev/null >>"$FLEET/creditd-$i.log" 2>&1 &
	echo $! >"$(node_pid "$i")"
}

# cmd_start_node N: node N again, as cmd_start started it.
cmd_start_node() {
	local i=${1:-} pid token
	[[ $i =~ ^[1-9]$ ]] && ((i <= NODES)) || die "usage: $0 start-node N (1-$NODES)"
	[[ -s $FLEET/creditd-$i.addr && -s $FLEET/database-url && -s $FLEET/redis/seeds ]] ||
		die "no fleet started in $FLEET"
	if pid_alive "$(node_pid "$i")" creditd; then
		pid=$(<"$(node_pid "$i")")
		# A killed node nobody reaped yet is a zombie: dead.
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] || die "creditd node $i still runs (pid $pid)"
	fi
	token=${CREDITD_ADMIN_TOKEN:-$(cat "$FLEET/admin-token" 2>/dev/null || true)}
	[[ -n $token ]] || die "no admin token: set CREDITD_ADMIN_TOKEN as for start"
	local addr
	addr=$(<"$FLEET/creditd-$i.addr")
	launch_node "$i" "$addr" "$(<"$FLEET/redis/seeds")" "$(<"$FLEET/database-url")" "$token"
	wait_ready "http://$addr/readyz" 60 "$(node_pid "$i")" ||
		{ tail -n 20 "$FLEET/creditd-$i.log" >&2; die "creditd node $i is not ready (log: $FLEET/creditd-$i.log)"; }
	log "creditd node $i ready on $addr"
}

# cmd_stop_node N: node N stopped with SIGTERM, waiting for it to exit:
# longer than kill_pidfile's 15 s, since a node drains its persister and
# the requests in flight (api/server.go bounds those at 30 s) first.
cmd_stop_node() {
	local i=${1:-} pid n
	[[ $i =~ ^[1-9]$ ]] && ((i <= NODES)) || die "usage: $0 stop-node N (1-$NODES)"
	pid_alive "$(node_pid "$i")" creditd || { log "creditd node $i is not running"; rm -f "$(node_pid "$i")"; return 0; }
	pid=$(<"$(node_pid "$i")")
	log "stopping creditd node $i (pid $pid, SIGTERM)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((n = 0; n < 600; n++)); do
		running "$pid" || break
		sleep 0.1
	done
	running "$pid" && die "creditd node $i (pid $pid) still runs 60 s after SIGTERM"
	rm -f "$(node_pid "$i")"
	log "creditd node $i stopped"
}

cmd_start() {
	[[ -x $BIN ]] || die "$BIN missing; run \`make fleet\` (it builds first)"
	have curl || die "curl is needed to check the nodes (Debian/Ubuntu: sudo apt-get install curl)"
	if pid_alive "$FLEET/haproxy.pid" haproxy || pid_alive "$(node_pid 1)" creditd; then
		cmd_status
		die "the fleet already runs; stop it first (make fleet-stop)"
	fi
	port_in_use "$PORT" && die "port $PORT is taken; set FLEET_PORT to a free one"
	ensure_haproxy
	mkdir -p "$FLEET"
	# A start that fails half-way stops what it started.
	trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping what started"; cmd_stop; fi' EXIT

	# 1. Redis Cluster, fresh each start: a cluster's node files name ports
	#    that are free no longer. The hot state is rebuilt from Postgres on
	#    demand (a customer missing from Redis is loaded on first use).
	"$ROOT/scripts/redis-cluster.sh" stop "$FLEET/redis"
	rm -rf "$FLEET/redis"
	local seeds
	seeds=$(REDIS_CLUSTER_REPLICAS=1 REDIS_CLUSTER_AOF=everysec \
		"$ROOT/scripts/redis-cluster.sh" start "$FLEET/redis")

	# 2. Postgres (REDIS_URL set: services.sh only looks for Postgres).
	local own_db=""
	[[ -z ${DATABASE_URL:-} ]] && own_db=1
	REDIS_URL=$seeds CREDITD_DATA_DIR=$DATA "$ROOT/scripts/services.sh" "$FLEET/services.env"
	# shellcheck disable=SC1091
	. "$FLEET/services.env"
	# The fleet keeps its own database: `make run` keeps its hot state in
	# another Redis, and two hot states over one ledger would disagree.
	[[ -n $own_db ]] && fleet_database

	# 3. creditd nodes. The admin token is made once and kept, as make run does.
	local token tokenfile=$FLEET/admin-token
	if [[ -n ${CREDITD_ADMIN_TOKEN:-} ]]; then
		token=$CREDITD_ADMIN_TOKEN
	else
		[[ -s $tokenfile ]] || (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$tokenfile")
		token=$(<"$tokenfile")
	fi
	# start-node reads the database back (the seeds and token have files).
	(umask 077 && echo "$DATABASE_URL" >"$FLEET/database-url")
	local i p addrs=()
	for ((i = 1; i <= NODES; i++)); do
		while :; do
			p=$(free_port 15000 22000)
			[[ " ${addrs[*]-} " == *" 127.0.0.1:$p "* ]] || break
		done
		addrs+=("127.0.0.1:$p")
		echo "127.0.0.1:$p" >"$FLEET/creditd-$i.addr"
		: >"$FLEET/creditd-$i.log"
		launch_node "$i" "127.0.0.1:$p" "$seeds" "$DATABASE_URL" "$token"
		if [[ $i == 1 ]]; then
			wait_ready "http://127.0.0.1:$p/readyz" 60 ||
				{ tail -n 20 "$FLEET/creditd-1.log" >&2; die "creditd node 1 is not ready after 60 s"; }
		fi
	done
	for ((i = 2; i <= NODES; i++)); do
		wait_ready "http://${addrs[i - 1]}/readyz" 60 ||
			{ tail -n 20 "$FLEET/creditd-$i.log" >&2; die "creditd node $i is not ready after 60 s"; }
	done

	# 4. HAProxy.
	log "starting HAProxy on 127.0.0.1:$PORT"
	FLEET_LISTEN=127.0.0.1:$PORT FLEET_NODE1=${addrs[0]} FLEET_NODE2=${addrs[1]} FLEET_NODE3=${addrs[2]} \
		haproxy -f "$ROOT/deploy/haproxy.cfg" -D -p "$FLEET/haproxy.pid" </dev/null >"$FLEET/haproxy.log" 2>&1 ||
		{ cat "$FLEET/haproxy.log" >&2; die "haproxy did not start"; }
	local url=http://127.0.0.1:$PORT
	echo "$url" >"$FLEET/url"
	wait_ready "$url/readyz" 30 || die "HAProxy on $url does not pass requests to a ready node"
	trap - EXIT

	local sandbox
	sandbox=$(sed -n 's/.*"sandbox": *"\([^"]*\)".*/\1/p' "$FLEET/dev-tenant.json")
	cat <<-EOF

		creditd fleet: ${NODES} nodes behind HAProxy, Redis Cluster 3 masters + 3 replicas (AOF everysec)
		  URL:         $url
		  sandbox key: $sandbox
		  admin token: $token
		  nodes:       ${addrs[*]}
		  redis:       $seeds
		  logs:        $FLEET/*.log

		Try it:
		  curl -s -X POST $url/v1/customers/alice/credits/grant \\
		    -H 'X-API-Key: $sandbox' -H 'Idempotency-Key: fleet-grant-1' -H 'Content-Type: application/json' \\
		    -d '{"credits": 10000, "source": "promotional", "reason": "welcome"}'
		  curl -s $url/v1/customers/alice/credits -H 'X-API-Key: $sandbox'

		Stop it: make fleet-stop   (or scripts/fleet.sh stop)
	EOF
}

case ${1:-start} in
start) cmd_start ;;
stop) shift; cmd_stop "$@" ;;
status) cmd_status ;;
start-node) cmd_start_node "${2:-}" ;;
stop-node) cmd_stop_node "${2:-}" ;;
check) cmd_check ;;
*) die "usage: $0 start|stop [--purge]|status|start-node N|stop-node N|check" ;;
esac
