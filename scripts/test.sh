#!/usr/bin/env bash
# scripts/test.sh: the whole test suite, with the servers it needs.
#
# It installs what is missing (Debian's postgresql, npm's reqlite@2.3.0),
# starts PostgreSQL and reqlite on 127.0.0.1, and runs every test with the
# race detector. MongoDB runs in-process (lungo), so it needs nothing.
# Servers given in the environment are used instead of starting new ones:
#   LEADERFEED_POSTGRES_URL, LEADERFEED_RETHINK_ADDR, LEADERFEED_MONGO_URL
# Extra arguments go to `go test` (for example -run or -v).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${LEADERFEED_POSTGRES_URL:-}" ]; then
	# shellcheck source=../.ci/postgres.sh
	source .ci/postgres.sh
	trap 'leaderfeed_postgres_stop >/dev/null 2>&1 || true' EXIT
fi
if [ -z "${LEADERFEED_RETHINK_ADDR:-}" ]; then
	# shellcheck source=../.ci/rethink.sh
	source .ci/rethink.sh
	trap 'leaderfeed_rethink_stop >/dev/null 2>&1 || true; leaderfeed_postgres_stop >/dev/null 2>&1 || true' EXIT
fi

go test -race -count=1 -timeout 25m "$@" ./...
