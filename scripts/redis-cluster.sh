#!/usr/bin/env bash
# A local 3-master Redis Cluster, with one replica per master for tests
# (scripts/test.sh) and for `make fleet` (scripts/fleet.sh).
#
#   scripts/redis-cluster.sh start DIR
#       Starts three redis-server masters (and REDIS_CLUSTER_REPLICAS
#       replicas of each, default 0) on free ports (data, logs, pidfiles and
#       cluster config files under DIR), creates the cluster, waits until
#       every node reports cluster_state:ok and every replica's link to its
#       master is up, and prints the seeds on stdout:
#       127.0.0.1:p1,127.0.0.1:p2,... (also written to DIR/seeds).
#       REDIS_CLUSTER_AOF=everysec|always turns the AOF on with that fsync
#       policy (default: no persistence, as tests need none).
#   scripts/redis-cluster.sh stop DIR
#       Stops the nodes by their pidfiles in DIR. Data stays; delete DIR.
#   scripts/redis-cluster.sh restart-node DIR PORT
#       Starts the node of PORT again, as `start` did (same port, node file
#       and AOF), after it died (`make chaos` kills masters with kill -9): it
#       rejoins the cluster from its node file, as a replica when its replica
#       was promoted meanwhile.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_TAG=redis-cluster
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

usage() { die "usage: $0 start|stop DIR | restart-node DIR PORT"; }
[[ $# -eq 2 || ($# -eq 3 && $1 == restart-node) ]] || usage
cmd=$1
dir=$2

stop() {
	[[ -d $dir ]] || return 0
	local f
	for f in "$dir"/node-*.pid; do
		[[ -e $f ]] || continue
		kill_pidfile "$f" redis
	done
}

# launch PORT AOF: one cluster node on PORT, data and files under $dir.
launch() {
	local p=$1 aof=$2
	local persist=(--appendonly no --save "")
	if [[ -n $aof ]]; then
		persist=(--appendonly yes --appendfsync "$aof" --appendfilename "appendonly-$p.aof"
			--appenddirname "aof-$p" --save "")
	fi
	log "starting node on 127.0.0.1:$p"
	# --cluster-require-full-coverage no: while one master is down and not
	# yet replaced, only its slots refuse (CLUSTERDOWN -> 503); with Redis'
	# default every slot of the cluster would, every tenant at once.
	# --repl-diskless-sync-delay 0: a master's full sync to its replica
	# starts at once instead of after Redis' default 5 s wait for more
	# replicas to join (each master has at most a few, all known at create):
	# the replicas are in sync 5 s sooner at start and after a failover.
	redis-server --port "$p" --bind 127.0.0.1 --dir "$dir" \
		--cluster-enabled yes --cluster-config-file "$dir/nodes-$p.conf" \
		--cluster-node-timeout 5000 \
		--repl-diskless-sync-delay 0 \
		--cluster-require-full-coverage no \
		"${persist[@]}" \
		--daemonize yes --pidfile "$dir/node-$p.pid" --logfile "$dir/node-$p.log" >&2 ||
		die "redis-server on port $p failed to start (log: $dir/node-$p.log)"
}

restart_node() {
	local p=$1 i
	[[ $p =~ ^[0-9]+$ && -e $dir/nodes-$p.conf ]] || die "no cluster node of port $p in $dir"
	if pid_alive "$dir/node-$p.pid" redis; then
		# A killed node nobody reaped yet is a zombie: dead.
		[[ $(awk '{print $3}' "/proc/$(<"$dir/node-$p.pid")/stat" 2>/dev/null) == Z ]] ||
			die "the node of port $p still runs"
	fi
	launch "$p" "$(cat "$dir/aof" 2>/dev/null || true)"
	for ((i = 0; i < 200; i++)); do
		redis_ping 127.0.0.1 "$p" && return 0
		sleep 0.1
	done
	die "node 127.0.0.1:$p does not answer (log: $dir/node-$p.log)"
}

start() {
	ensure_redis_bins || die "redis-server and redis-cli are not installed: install Redis
  (Debian/Ubuntu: sudo apt-get install redis-server)"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	# Clean up a half-started cluster if anything below fails.
	trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping the nodes"; stop; fi' EXIT

	local replicas=${REDIS_CLUSTER_REPLICAS:-0} aof=${REDIS_CLUSTER_AOF:-}
	[[ $replicas =~ ^[0-9]$ ]] || die "REDIS_CLUSTER_REPLICAS=$replicas: want 0-9"
	[[ -z $aof || $aof == everysec || $aof == always ]] || die "REDIS_CLUSTER_AOF=$aof: want everysec or always"
	# restart-node starts a node again with the same persistence.
	echo "$aof" >"$dir/aof"
	local ports=() p i
	for ((i = 1; i <= 3 * (1 + replicas); i++)); do
		while :; do
			# Cluster bus port is port+10000: both must be free, and distinct
			# from the nodes already picked.
			p=$(free_port 15000 22000 10000)
			[[ " ${ports[*]-} " == *" $p "* ]] && continue
			break
		done
		ports+=("$p")
		launch "$p" "$aof"
	done

	for p in "${ports[@]}"; do
		for ((i = 0; i < 200; i++)); do
			redis_ping 127.0.0.1 "$p" && break
			sleep 0.1
		done
		redis_ping 127.0.0.1 "$p" || die "node 127.0.0.1:$p does not answer (log: $dir/node-$p.log)"
	done

	local addrs=()
	for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
	log "creating cluster ${addrs[*]}"
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" --cluster-yes \
		</dev/null >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; die "redis-cli --cluster create failed"; }

	local ok repl
	for ((i = 0; i < 300; i++)); do
		ok=1
		for p in "${ports[@]}"; do
			if ! redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
				ok=""
				break
			fi
			# A replica counts once its first sync is done.
			if ((replicas > 0)); then
				repl=$(redis-cli -h 127.0.0.1 -p "$p" info replication 2>/dev/null || true)
				if grep -q '^role:slave' <<<"$repl" && ! grep -q '^master_link_status:up' <<<"$repl"; then
					ok=""
					break
				fi
			fi
		done
		[[ -n $ok ]] && break
		sleep 0.1
	done
	[[ -n $ok ]] || die "cluster did not reach cluster_state:ok (replicas in sync) within 30 s"

	local seeds
	seeds=$(IFS=,; echo "${addrs[*]}")
	echo "$seeds" >"$dir/seeds"
	log "cluster ok: $seeds"
	trap - EXIT
	echo "$seeds"
}

case $cmd in
start) start ;;
stop) stop ;;
restart-node) restart_node "$3" ;;
*) usage ;;
esac
