# shellcheck shell=bash
# Helpers shared by the scripts in this folder. Sourced, never run.
# Everything here logs to stderr: stdout of the scripts is for their
# machine-readable answer only (export lines, cluster seeds).

# have BIN: BIN is on PATH and executable (bash's `command -v` also answers
# with a file it found but cannot execute).
have() {
	local p
	p=$(command -v "$1" 2>/dev/null) && [[ -x $p ]]
}

log() { printf '%s: %s\n' "${LOG_TAG:-creditd}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# port_in_use PORT: something accepts connections on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port LO HI [OFFSET]: a port in [LO, HI) that nothing listens on (and,
# with OFFSET, nothing listens on PORT+OFFSET either: Redis Cluster's bus
# port). The range stays below Linux's ephemeral ports (32768+).
free_port() {
	local lo=$1 hi=$2 off=${3:-} p i
	for ((i = 0; i < 500; i++)); do
		p=$((lo + RANDOM % (hi - lo)))
		port_in_use "$p" && continue
		[[ -n $off ]] && port_in_use $((p + off)) && continue
		echo "$p"
		return 0
	done
	die "no free TCP port found in $lo-$hi"
}

# pid_alive PIDFILE [NAME]: the process in PIDFILE runs (and its command
# name contains NAME, so a recycled pid is not mistaken for ours).
pid_alive() {
	local f=$1 name=${2:-} pid
	[[ -s $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	if [[ -n $name && -r /proc/$pid/comm ]]; then
		grep -q -- "$name" "/proc/$pid/comm" || return 1
	fi
}

# kill_pidfile PIDFILE NAME: SIGTERM the process, wait up to 15 s, then
# SIGKILL; removes the pidfile.
kill_pidfile() {
	local f=$1 name=$2 pid i
	if pid_alive "$f" "$name"; then
		pid=$(<"$f")
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < 150; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$f"
}

# redis_ping HOST PORT: a Redis answers PONG there (no auth needed).
redis_ping() {
	local h=$1 p=$2
	if have redis-cli; then
		[[ $(timeout 5 redis-cli -h "$h" -p "$p" ping 2>/dev/null) == PONG ]]
	else
		# shellcheck disable=SC2016
		timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
			printf "PING\r\n" >&3
			IFS= read -r line <&3
			[[ $line == +PONG* ]]' "$h" "$p" 2>/dev/null
	fi
}

# can_install: root with apt-get, so missing server binaries can be installed.
can_install() { [[ $(id -u) -eq 0 ]] && have apt-get; }

# apt_install PKG...: install Debian packages quietly (apt-get update once
# per script run). All output goes to stderr.
apt_install() {
	can_install || return 1
	if [[ -z ${_CREDITD_APT_UPDATED:-} ]]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || return 1
		_CREDITD_APT_UPDATED=1
	fi
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"$@" </dev/null >&2
}

# ensure_redis_bins: redis-server and redis-cli on PATH, installing the
# Debian package redis-server (which brings redis-tools) when root.
# Returns 1 when they are missing and cannot be installed.
ensure_redis_bins() {
	if have redis-server && have redis-cli; then
		return 0
	fi
	if can_install; then
		# A postinst that cannot start the distro service (no init system)
		# fails the install although the binaries are in place: judge by them.
		apt_install redis-server redis-tools || log "apt-get install redis-server reported an error"
		hash -r
		have redis-server && have redis-cli && return 0
	fi
	return 1
}
