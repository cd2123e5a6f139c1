#!/usr/bin/env bash
# Ensures a Redis and a Postgres are reachable and tells the caller where.
#
#   scripts/services.sh [--allow-embedded] [--with-redis-server] [ENVFILE]
#       Prints `export REDIS_URL=...` and `export DATABASE_URL=...` (or
#       writes them to ENVFILE). For each service, in order:
#         1. REDIS_URL / DATABASE_URL from the environment, when set;
#         2. the local server on $CREDITD_PROBE_HOST (127.0.0.1) port
#            $CREDITD_PROBE_REDIS_PORT (6379) / $CREDITD_PROBE_PG_PORT (5432)
#            when it answers (Postgres: user postgres, trust auth, database
#            postgres);
#         3. a private server under $CREDITD_DATA_DIR (./.data) on a free
#            port, started (or reused) by this script: redis-server with AOF
#            in .data/redis, an initdb'd cluster in .data/pg.
#       Missing binaries are installed with apt-get when running as root;
#       otherwise the script names the package to install and exits 1.
#       --allow-embedded: with no redis-server to be had, print
#         REDIS_URL=embedded (creditd then runs on in-process miniredis and
#         warns that nothing is durable) instead of failing. For `make run`.
#       --with-redis-server: also make sure the redis-server binary is
#         installed even when an existing Redis is used (tests start their
#         own private servers for crash tests). For `make test`.
#
#   scripts/services.sh stop [--purge]
#       Stops the private servers (and any test Redis Cluster left under
#       .data); --purge also deletes their data.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_TAG=services
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

DATA=${CREDITD_DATA_DIR:-$ROOT/.data}
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd)
REDIS_DIR=$DATA/redis
PG_DIR=$DATA/pg
PROBE_HOST=${CREDITD_PROBE_HOST:-127.0.0.1}
PROBE_REDIS_PORT=${CREDITD_PROBE_REDIS_PORT:-6379}
PROBE_PG_PORT=${CREDITD_PROBE_PG_PORT:-5432}

# One instance at a time: concurrent `make run` / `make test` must not race
# to start two private servers on one data directory. The servers this
# script starts must not inherit fd 9, or they would hold the lock forever.
lock() {
	if have flock; then
		exec 9>"$DATA/.services.lock"
		flock -w 300 9 || die "timed out waiting for $DATA/.services.lock"
	fi
}

# --- Postgres helpers --------------------------------------------------------

# pg_bindir: the directory holding initdb/pg_ctl/pg_isready, preferring the
# major version the existing private cluster was made with, else the newest.
pg_bindir() {
	local want="" d
	[[ -r $PG_DIR/PG_VERSION ]] && want=$(<"$PG_DIR/PG_VERSION")
	if [[ -n $want && -x /usr/lib/postgresql/$want/bin/pg_ctl ]]; then
		echo "/usr/lib/postgresql/$want/bin"
		return 0
	fi
	for d in $(printf '%s\n' /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [[ -x $d/initdb && -x $d/pg_ctl ]]; then
			echo "$d"
			return 0
		fi
	done
	if have initdb && have pg_ctl; then
		dirname "$(readlink -f "$(command -v initdb)")"
		return 0
	fi
	return 1
}

# PG_USER is the OS user the private cluster runs as: initdb and pg_ctl
# refuse root, so root runs them as `postgres` (or a system user made for
# it); anyone else runs them as themselves.
PG_USER=""
pick_pg_user() {
	[[ $(id -u) -eq 0 ]] || return 0
	local owner=""
	[[ -d $PG_DIR ]] && owner=$(stat -L -c %U "$PG_DIR" 2>/dev/null || true)
	if [[ -n $owner && $owner != root && $owner != UNKNOWN ]]; then
		PG_USER=$owner
	elif id -u postgres >/dev/null 2>&1; then
		PG_USER=postgres
	else
		if ! id -u creditd-pg >/dev/null 2>&1; then
			log "creating system user creditd-pg to run the private Postgres"
			useradd --system --no-create-home --home-dir /nonexistent \
				--shell /usr/sbin/nologin creditd-pg >&2 ||
				die "could not create a system user for Postgres (initdb refuses root)"
		fi
		PG_USER=creditd-pg
	fi
}

# as_pg CMD...: run CMD as PG_USER (from /, which that user can enter).
as_pg() {
	if [[ -z $PG_USER ]]; then
		"$@"
	elif have runuser; then
		(cd / && runuser -u "$PG_USER" -- "$@")
	else
		(cd / && su -s /bin/sh "$PG_USER" -c "$(printf '%q ' "$@")")
	fi
}

pg_url() { echo "postgres://postgres@$1:$2/postgres?sslmode=disable"; }

# pg_answers HOST PORT [BINDIR]: a Postgres accepts connections there and,
# when psql is available, user postgres logs in without a password.
pg_answers() {
	local h=$1 p=$2 bin=${3:-} isready psql
	isready=$( [[ -n $bin && -x $bin/pg_isready ]] && echo "$bin/pg_isready" || { have pg_isready && command -v pg_isready; } || true)
	psql=$( [[ -n $bin && -x $bin/psql ]] && echo "$bin/psql" || { have psql && command -v psql; } || true)
	if [[ -n $isready ]]; then
		"$isready" -q -h "$h" -p "$p" -t 5 >/dev/null 2>&1 || return 1
	else
		[[ $h == 127.0.0.1 || $h == localhost ]] && port_in_use "$p" || return 1
	fi
	if [[ -n $psql ]]; then
		PGCONNECT_TIMEOUT=5 "$psql" -w -X -q -At -d "$(pg_url "$h" "$p")" -c 'select 1' \
			</dev/null >/dev/null 2>&1 || {
			log "Postgres at $h:$p answers but user postgres cannot log in without a password; not using it"
			return 1
		}
	fi
}

# pg_datadir_ready: $PG_DIR exists, belongs to PG_USER with mode 0700, and
# PG_USER can reach it. When PG_USER cannot traverse the path to the work
# tree (a checkout under /root, say), the cluster lives in a private
# directory under /var/tmp and .data/pg is a symlink to it.
pg_datadir_ready() {
	if [[ ! -e $PG_DIR ]]; then
		mkdir -p "$PG_DIR"
		[[ -n $PG_USER ]] && chown "$PG_USER:" "$PG_DIR"
		chmod 700 "$PG_DIR"
	fi
	if [[ -n $PG_USER ]] && ! as_pg test -w "$(readlink -f "$PG_DIR")/." 2>/dev/null; then
		if [[ -L $PG_DIR ]]; then
			die "$PG_DIR points to a directory $PG_USER cannot write"
		fi
		if [[ -n $(ls -A "$PG_DIR") ]]; then
			die "$PG_USER cannot reach $PG_DIR; remove it (make clean) and retry"
		fi
		local alt
		alt=/var/tmp/creditd-pg-$(printf '%s' "$DATA" | cksum | cut -d' ' -f1)
		log "$PG_USER cannot reach $PG_DIR; keeping the cluster in $alt (linked from .data/pg)"
		rmdir "$PG_DIR"
		mkdir -p "$alt"
		chown "$PG_USER:" "$alt"
		chmod 700 "$alt"
		ln -s "$alt" "$PG_DIR"
		as_pg test -w "$alt/." || die "$PG_USER cannot write $alt"
	fi
}

start_private_pg() {
	local bin port
	if ! bin=$(pg_bindir); then
		if can_install; then
			apt_install postgresql || log "apt-get install postgresql reported an error"
			hash -r
			bin=$(pg_bindir) || die "initdb/pg_ctl still not found after apt-get install postgresql"
		else
			die "no Postgres answers and initdb/pg_ctl are not installed: install PostgreSQL
  (Debian/Ubuntu: sudo apt-get install postgresql; macOS: brew install postgresql),
  or set DATABASE_URL to a server where user postgres logs in without a password"
		fi
	fi
	pick_pg_user
	pg_datadir_ready
	# The pg tools get the resolved path: PG_USER may not traverse a
	# symlink's own location.
	local PGD
	PGD=$(readlink -f "$PG_DIR")

	if [[ ! -s $PGD/PG_VERSION ]]; then
		log "initdb a private Postgres cluster in $PG_DIR (as ${PG_USER:-$(id -un)})"
		as_pg "$bin/initdb" -D "$PGD" -U postgres --auth=trust -E UTF8 --no-locale >"$DATA/pg-initdb.log" 2>&1 ||
			{ cat "$DATA/pg-initdb.log" >&2; die "initdb failed"; }
		# Settings of this dev/test cluster; the port is given at start.
		as_pg sh -c "cat >>'$PGD/postgresql.conf'" <<-'EOF'

			# creditd private cluster (scripts/services.sh)
			listen_addresses = '127.0.0.1'
			unix_socket_directories = ''
			max_connections = 300
			shared_buffers = 128MB
		EOF
	fi

	# Reuse the running one.
	if [[ -s $PGD/postmaster.pid ]] && as_pg "$bin/pg_ctl" status -D "$PGD" >/dev/null 2>&1; then
		port=$(sed -n 4p "$PGD/postmaster.pid")
		if [[ $port =~ ^[0-9]+$ ]] && pg_answers 127.0.0.1 "$port" "$bin"; then
			log "using private Postgres on 127.0.0.1:$port ($PG_DIR)"
			PG_PORT=$port
			return 0
		fi
		log "private Postgres in $PG_DIR runs but does not answer; restarting it"
		as_pg "$bin/pg_ctl" stop -D "$PGD" -m fast -w >/dev/null 2>&1 || true
	fi

	port=""
	[[ -s $DATA/pg.port ]] && port=$(<"$DATA/pg.port")
	if ! [[ $port =~ ^[0-9]+$ ]] || port_in_use "$port"; then
		port=$(free_port 15000 32000)
	fi
	log "starting private Postgres on 127.0.0.1:$port ($PG_DIR)"
	if ! as_pg "$bin/pg_ctl" start -D "$PGD" -w -t 60 -l "$PGD/server.log" -o "-p $port" >/dev/null 2>&1 9>&-; then
		tail -n 30 "$PGD/server.log" >&2 2>/dev/null || true
		die "private Postgres did not start (log: $PG_DIR/server.log)"
	fi
	echo "$port" >"$DATA/pg.port"
	pg_answers 127.0.0.1 "$port" "$bin" || die "private Postgres on port $port does not answer"
	PG_PORT=$port
}

stop_private_pg() {
	[[ -e $PG_DIR/PG_VERSION ]] || return 0
	local bin
	bin=$(pg_bindir) || { log "pg_ctl not found; cannot stop the Postgres in $PG_DIR"; return 0; }
	pick_pg_user
	local PGD
	PGD=$(readlink -f "$PG_DIR")
	if as_pg "$bin/pg_ctl" status -D "$PGD" >/dev/null 2>&1; then
		log "stopping private Postgres ($PG_DIR)"
		as_pg "$bin/pg_ctl" stop -D "$PGD" -m fast -w -t 60 >/dev/null
	fi
}

# --- Redis helpers -----------------------------------------------------------

# start_private_redis: starts (or reuses) the private Redis and sets
# REDIS_PORT.
start_private_redis() {
	local port
	mkdir -p "$REDIS_DIR"
	if pid_alive "$REDIS_DIR/redis.pid" redis && [[ -s $REDIS_DIR/port ]]; then
		port=$(<"$REDIS_DIR/port")
		if redis_ping 127.0.0.1 "$port"; then
			log "using private Redis on 127.0.0.1:$port ($REDIS_DIR)"
			REDIS_PORT=$port
			return 0
		fi
		log "private Redis in $REDIS_DIR runs but does not answer; restarting it"
		kill_pidfile "$REDIS_DIR/redis.pid" redis
	fi
	ensure_redis_bins || die "redis-server is not installed (sudo apt-get install redis-server)"
	port=""
	[[ -s $REDIS_DIR/port ]] && port=$(<"$REDIS_DIR/port")
	if ! [[ $port =~ ^[0-9]+$ ]] || port_in_use "$port"; then
		port=$(free_port 15000 32000)
	fi
	log "starting private Redis on 127.0.0.1:$port ($REDIS_DIR, AOF everysec)"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$REDIS_DIR" \
		--appendonly yes --appendfsync everysec --save "" \
		--daemonize yes --pidfile "$REDIS_DIR/redis.pid" \
		--logfile "$REDIS_DIR/redis.log" >&2 9>&- ||
		die "redis-server failed to start (log: $REDIS_DIR/redis.log)"
	echo "$port" >"$REDIS_DIR/port"
	local i
	for ((i = 0; i < 300; i++)); do
		# A restarted server answers LOADING while it replays its AOF.
		redis_ping 127.0.0.1 "$port" && { REDIS_PORT=$port; return 0; }
		sleep 0.1
	done
	tail -n 20 "$REDIS_DIR/redis.log" >&2 2>/dev/null || true
	die "private Redis on port $port does not answer (log: $REDIS_DIR/redis.log)"
}

stop_private_redis() {
	if pid_alive "$REDIS_DIR/redis.pid" redis; then
		log "stopping private Redis ($REDIS_DIR)"
	fi
	kill_pidfile "$REDIS_DIR/redis.pid" redis
}

# --- commands ----------------------------------------------------------------

shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

cmd_stop() {
	local purge=""
	[[ ${1:-} == --purge ]] && purge=1
	lock
	local d
	for d in "$DATA"/cluster-*; do
		[[ -d $d ]] && "$ROOT/scripts/redis-cluster.sh" stop "$d" >&2 || true
	done
	stop_private_redis
	stop_private_pg
	if [[ -n $purge ]]; then
		log "deleting private data in $DATA"
		if [[ -L $PG_DIR ]]; then
			rm -rf "$(readlink -f "$PG_DIR")"
		fi
		rm -rf "$PG_DIR" "$REDIS_DIR" "$DATA"/cluster-* "$DATA/pg.port" "$DATA/pg-initdb.log" "$DATA/services.env"
	fi
}

cmd_ensure() {
	local allow_embedded="" with_redis_server="" out=""
	while (($#)); do
		case $1 in
		--allow-embedded) allow_embedded=1 ;;
		--with-redis-server) with_redis_server=1 ;;
		-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
		-*) die "unknown option $1" ;;
		*) out=$1 ;;
		esac
		shift
	done
	lock

	local redis_url database_url
	REDIS_PORT="" PG_PORT=""
	if [[ -n ${REDIS_URL:-} ]]; then
		log "using REDIS_URL from the environment"
		redis_url=$REDIS_URL
	elif redis_ping "$PROBE_HOST" "$PROBE_REDIS_PORT"; then
		log "using local Redis on $PROBE_HOST:$PROBE_REDIS_PORT"
		redis_url="redis://$PROBE_HOST:$PROBE_REDIS_PORT/0"
	elif pid_alive "$REDIS_DIR/redis.pid" redis || ensure_redis_bins; then
		start_private_redis
		redis_url="redis://127.0.0.1:$REDIS_PORT/0"
	elif [[ -n $allow_embedded ]]; then
		log "WARNING: no Redis and no redis-server to start (install redis-server);"
		log "WARNING: falling back to embedded Redis: NOT DURABLE, state lives in the process"
		redis_url=embedded
	else
		die "no Redis answers and redis-server is not installed: install Redis
  (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis),
  or set REDIS_URL"
	fi
	if [[ -n $with_redis_server ]] && ! ensure_redis_bins; then
		die "redis-server and redis-cli are needed (tests start private servers and a cluster):
  install Redis (Debian/Ubuntu: sudo apt-get install redis-server)"
	fi

	if [[ -n ${DATABASE_URL:-} ]]; then
		log "using DATABASE_URL from the environment"
		database_url=$DATABASE_URL
	elif pg_answers "$PROBE_HOST" "$PROBE_PG_PORT" "$(pg_bindir 2>/dev/null || true)"; then
		log "using local Postgres on $PROBE_HOST:$PROBE_PG_PORT"
		database_url=$(pg_url "$PROBE_HOST" "$PROBE_PG_PORT")
	else
		start_private_pg
		database_url=$(pg_url 127.0.0.1 "$PG_PORT")
	fi

	local text
	text="export REDIS_URL=$(shq "$redis_url")
export DATABASE_URL=$(shq "$database_url")"
	if [[ -n $out ]]; then
		mkdir -p "$(dirname "$out")"
		printf '%s\n' "$text" >"$out.tmp.$$"
		mv -f "$out.tmp.$$" "$out"
		log "wrote $out"
	else
		printf '%s\n' "$text"
	fi
}

case ${1:-} in
stop) shift; cmd_stop "$@" ;;
*) cmd_ensure "$@" ;;
esac
