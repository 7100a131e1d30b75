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
# Output: docs/bench/results.md, latency.png and compare.png, and the
# tables of docs/BENCHMARKS.md (between its "bench run" markers), so a
# run's figures can be committed as they are; -out DIR writes the files
# elsewhere (bench/out is ignored by git) and leaves docs/BENCHMARKS.md
# alone. results.md is printed at the end as well.
#
# It takes about 34 minutes on 2 cores: the comparison with etcd about 8,
# the advisory lock and the polling lease about 13 (6 of it the floors,
# paused as the handovers they bound), the fenced transactions 1, the
# rolling restarts 3, many elections across processes and beside busy
# loops 8, many elections on memory 1.
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

# The docs' folder and tables unless the caller gives -out.
docs=(-out "$here/../docs/bench" -docs "$here/../docs/BENCHMARKS.md")
for a in "$@"; do
	case "$a" in
	-out | --out | -out=* | --out=*) docs=() ;;
	esac
done
go run . "${docs[@]}" "$@"
