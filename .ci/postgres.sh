# shellcheck shell=bash
# .ci/postgres.sh: start a throwaway PostgreSQL server for the tests of
# package postgres (and integration/). Meant to be sourced by .ci/run:
#
#	source .ci/postgres.sh || exit 1
#
# It installs Debian's postgresql package only when no server binaries are
# found (without letting the package start the system's own cluster: a
# policy-rc.d refuses the start during the install, and a cluster the install
# left running is stopped), initdb's a cluster in a fresh temporary directory,
# starts it on 127.0.0.1 on a port found free at run time (unix socket in the
# temporary directory), waits until it is ready, creates the database
# "leaderfeed" and exports LEADERFEED_POSTGRES_URL. Sourcing it again stops
# the instance this clone started before and starts a new one; the state file
# is inside the clone (.ci/tmp), so clones on one machine never touch each
# other's servers (LEADERFEED_POSTGRES_STATE names another one: bench/run.sh
# keeps its server apart from the tests' that way). The data directory is under $TMPDIR, not in the clone,
# because the server runs as the user postgres, who may not be able to enter
# the clone. The password is random, goes only into the exported URL and is
# never printed.
#
# leaderfeed_postgres_stop stops the server and removes its directory.

leaderfeed_postgres_state="${LEADERFEED_POSTGRES_STATE:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tmp/postgres.state}"
mkdir -p "$(dirname "$leaderfeed_postgres_state")"

# leaderfeed_postgres_as runs a command as the user that owns the cluster.
leaderfeed_postgres_as() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

leaderfeed_postgres_bin() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v initdb)"
		return 0
	fi
	return 1
}

leaderfeed_postgres_stop() {
	local dir bin
	[ -f "$leaderfeed_postgres_state" ] || return 0
	dir="$(cat "$leaderfeed_postgres_state")"
	bin="$(leaderfeed_postgres_bin)" || bin=""
	if [ -n "$dir" ] && [ -d "$dir/data" ] && [ -n "$bin" ]; then
		leaderfeed_postgres_as "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	case "$dir" in
	*/leaderfeed-pg.*) rm -rf -- "$dir" ;;
	esac
	rm -f -- "$leaderfeed_postgres_state"
}

# leaderfeed_postgres_install installs Debian's postgresql package without
# leaving the system's cluster running: policy-rc.d answers 101 ("action
# forbidden") to the package's start request, and any cluster that runs
# anyway afterwards is stopped.
leaderfeed_postgres_install() {
	local sudo="" policy=/usr/sbin/policy-rc.d had_policy=0 rc=0
	[ "$(id -u)" = 0 ] || sudo="sudo -E"
	echo "postgres: server binaries missing, installing Debian's postgresql package"
	export DEBIAN_FRONTEND=noninteractive
	if [ -e "$policy" ]; then
		had_policy=1
	else
		printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy"
	fi
	$sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq postgresql >/dev/null || rc=1
	[ "$had_policy" = 1 ] || $sudo rm -f "$policy"
	if [ "$rc" != 0 ]; then
		echo "postgres: apt-get install postgresql failed" >&2
		return 1
	fi
	if command -v pg_lsclusters >/dev/null 2>&1; then
		pg_lsclusters -h 2>/dev/null | while read -r ver name _ status _; do
			[ "$status" = online ] && $sudo pg_ctlcluster "$ver" "$name" stop || true
		done
	fi
}

# leaderfeed_postgres_free_port prints a TCP port free on 127.0.0.1, tried
# from a random start so that runs side by side rarely meet.
leaderfeed_postgres_free_port() {
	local p i
	p=$((20000 + RANDOM % 20000))
	for i in $(seq 1 200); do
		if ! leaderfeed_postgres_port_busy "$p"; then
			echo "$p"
			return 0
		fi
		p=$((p + 1))
	done
	return 1
}

leaderfeed_postgres_port_busy() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

leaderfeed_postgres_start() {
	local bin dir port pass p
	if ! bin="$(leaderfeed_postgres_bin)"; then
		leaderfeed_postgres_install || return 1
		bin="$(leaderfeed_postgres_bin)" || {
			echo "postgres: no initdb/pg_ctl found after installing postgresql" >&2
			return 1
		}
	fi
	if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
		echo "postgres: running as root but there is no user postgres to run the server" >&2
		return 1
	fi

	leaderfeed_postgres_stop

	port="${LEADERFEED_POSTGRES_PORT:-}"
	if [ -z "$port" ] && ! port="$(leaderfeed_postgres_free_port)"; then
		echo "postgres: found no free port on 127.0.0.1" >&2
		return 1
	fi

	dir="$(mktemp -d "${TMPDIR:-/tmp}/leaderfeed-pg.XXXXXX")" || return 1
	echo "$dir" >"$leaderfeed_postgres_state"
	chmod 700 "$dir"
	[ "$(id -u)" = 0 ] && chown postgres: "$dir"

	pass="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
	(umask 077 && printf '%s\n' "$pass" >"$dir/pwfile")
	[ "$(id -u)" = 0 ] && chown postgres: "$dir/pwfile"

	if ! leaderfeed_postgres_as "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" \
		--auth-host=scram-sha-256 --auth-local=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1; then
		echo "postgres: initdb failed; last lines of $dir/initdb.log:" >&2
		tail -n 20 "$dir/initdb.log" >&2
		return 1
	fi
	rm -f -- "$dir/pwfile"

	if ! leaderfeed_postgres_as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
		-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
		start >/dev/null 2>&1; then
		echo "postgres: server did not start; last lines of $dir/server.log:" >&2
		tail -n 20 "$dir/server.log" >&2
		return 1
	fi

	for _ in $(seq 1 100); do
		leaderfeed_postgres_as "$bin/pg_isready" -q -h "$dir" -p "$port" && break
		sleep 0.1
	done
	if ! leaderfeed_postgres_as "$bin/pg_isready" -q -h "$dir" -p "$port"; then
		echo "postgres: server on port $port is not ready" >&2
		return 1
	fi
	if ! leaderfeed_postgres_as "$bin/createdb" -h "$dir" -p "$port" -U postgres leaderfeed >/dev/null; then
		echo "postgres: createdb leaderfeed failed" >&2
		return 1
	fi

	export LEADERFEED_POSTGRES_URL="postgres://postgres:${pass}@127.0.0.1:${port}/leaderfeed?sslmode=disable"
	export LEADERFEED_POSTGRES_DIR="$dir"
	echo "postgres: $("$bin/postgres" --version) ready on 127.0.0.1:$port (data in $dir)"
}

leaderfeed_postgres_start
