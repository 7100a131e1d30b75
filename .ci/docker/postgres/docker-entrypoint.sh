#!/bin/sh
# docker-entrypoint.sh of the leaderfeed/postgres image that .ci/docker.sh
# builds (Debian bookworm, Debian's postgresql-15; no registry is reachable
# in CI, so the official image cannot be pulled; see Dockerfile). It does what the official
# image's entrypoint does for the tests, and no more:
#
#   - POSTGRES_USER (default postgres) is the superuser, POSTGRES_PASSWORD its
#     password (required unless POSTGRES_HOST_AUTH_METHOD=trust),
#     POSTGRES_DB (default: the user's name) is created;
#   - on the first start it initdb's $PGDATA, runs a server on the unix
#     socket only to create the database, stops it, then starts the real
#     server listening on every interface: "database system is ready to
#     accept connections" is printed twice, as testcontainers-go's postgres
#     module waits for;
#   - arguments after "postgres" go to the server (e.g. -c fsync=off);
#   - docker stop sends the image's STOPSIGNAL, SIGINT (fast shutdown, as the
#     official image); this script is PID 1 and passes SIGINT and SIGTERM on
#     to the server as SIGINT (SIGTERM would be a "smart" shutdown that
#     waits for every client to leave).
set -eu

bin=/usr/lib/postgresql/15/bin
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
export PGDATA

if [ "${1:-}" != postgres ]; then
	exec "$@"
fi
shift

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		echo "docker-entrypoint: POSTGRES_PASSWORD is empty (set it, or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
		exit 1
	fi
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
	chown postgres "$pwfile"
	as_postgres "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
		--auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD" -E UTF8 --no-locale >/dev/null
	rm -f "$pwfile"
	printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	as_postgres "$bin/pg_ctl" -D "$PGDATA" -w -o "-c listen_addresses='' -k /var/run/postgresql" start
	if [ "$POSTGRES_DB" != postgres ]; then
		as_postgres "$bin/createdb" -h /var/run/postgresql -U "$POSTGRES_USER" "$POSTGRES_DB"
	fi
	as_postgres "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop
fi

# Not through the function: a function in the background runs in a subshell,
# which (an asynchronous list) ignores SIGINT, so $! would not be the server.
setpriv --reuid=postgres --regid=postgres --init-groups -- \
	"$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -k /var/run/postgresql "$@" &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null' TERM INT
# wait returns early when a trapped signal arrives: wait again until the
# server has ended, and exit with its status.
while :; do
	status=0
	wait "$pid" || status=$?
	kill -0 "$pid" 2>/dev/null || break
done
exit "$status"
