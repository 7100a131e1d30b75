#!/usr/bin/env bash
# bench/run.sh: run the leaderfeed-vs-etcd benchmark with one command.
#
#	bash bench/run.sh [flags of the benchmark program...]
#
# Embedded etcd and the memory backend need nothing. PostgreSQL: if
# LEADERFEED_POSTGRES_URL is set it is used as it is; otherwise a throwaway
# server is started with ../.ci/postgres.sh (installing Debian's postgresql
# package if needed) and stopped again at exit. Its state lives in a private
# temporary directory, so it never touches a server that the test scripts
# started. MongoDB and RethinkDB are benchmarked when LEADERFEED_MONGO_URL or
# LEADERFEED_RETHINK_ADDR is set (see -h).
#
# Output: docs/bench/results.md, latency.png and compare.png, where the
# docs link them (docs/BENCHMARKS.md), so a run's figures can be committed
# as they are; -out DIR writes them elsewhere (bench/out is ignored by
# git). results.md is printed at the end as well.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if [ -z "${LEADERFEED_POSTGRES_URL:-}" ]; then
	pgtmp="$(mktemp -d "${TMPDIR:-/tmp}/leaderfeed-bench-pg.XXXXXX")"
	chmod 755 "$pgtmp" # the server runs as user postgres when we are root
	cleanup() {
		leaderfeed_postgres_stop || true
		rm -rf -- "$pgtmp"
	}
	trap cleanup EXIT
	set +e
	# shellcheck source=../.ci/postgres.sh
	# A state file of its own: a test run in this clone that sources
	# .ci/postgres.sh meanwhile must not stop the benchmark's server.
	LEADERFEED_POSTGRES_STATE="$pgtmp/postgres.state" TMPDIR="$pgtmp" source ../.ci/postgres.sh
	set -e
	if [ -z "${LEADERFEED_POSTGRES_URL:-}" ]; then
		echo "run.sh: could not start PostgreSQL; set LEADERFEED_POSTGRES_URL" >&2
		exit 1
	fi
	# The cost comparison counts statements with pg_stat_statements, which
	# must be preloaded: set it and restart the throwaway server (pg_ctl
	# restart keeps the options it was started with). Without it the
	# program counts committed transactions instead, and says so.
	if psql "$LEADERFEED_POSTGRES_URL" -qXc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" &&
		leaderfeed_postgres_as "$(leaderfeed_postgres_bin)/pg_ctl" -D "$LEADERFEED_POSTGRES_DIR/data" \
			-l "$LEADERFEED_POSTGRES_DIR/server.log" -w -t 60 restart >/dev/null; then
		echo "run.sh: PostgreSQL restarted with pg_stat_statements"
	else
		echo "run.sh: could not load pg_stat_statements; statements will be counted as committed transactions" >&2
	fi
fi

# The docs' folder unless the caller gives -out (the last -out wins).
go run . -out "$here/../docs/bench" "$@"
