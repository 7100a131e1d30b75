#!/usr/bin/env bash
# scripts/test.sh: the whole test suite, with the servers it needs.
#
# It installs what is missing (Debian's postgresql, npm's reqlite@2.3.0,
# gotestsum into .ci/tmp/bin, Debian's docker.io), starts PostgreSQL and
# reqlite on 127.0.0.1 on ports found free at run time and a Docker engine
# with a PostgreSQL image built on the machine (.ci/docker.sh), and runs the
# tests of every Go module of the repository (scripts/modules.sh; bench/ is
# vetted by .ci/run, not tested) with the race detector. It prints a line per test as it ends and a summary
# at the end. MongoDB runs in-process (lungo), so it needs nothing.
#
# Servers given in the environment are used instead of starting new ones:
#   LEADERFEED_POSTGRES_URL, LEADERFEED_RETHINK_ADDR, LEADERFEED_MONGO_URL
# Extra arguments go to every `go test` (for example -run or -short).
# LEADERFEED_TEST_FORMAT picks gotestsum's output format (default testname).
#
# State (pid files, logs, tools) lives in .ci/tmp of this clone, so two
# clones can run it at the same time; the servers it starts are stopped when
# it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"

# shellcheck source=../.ci/tools.sh
source .ci/tools.sh

stops=()
cleanup() {
	local s
	for s in "${stops[@]}"; do $s >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

# A Docker engine and the locally built PostgreSQL image for the container
# tests (containertest/, integration's partitions); it fails CI only where
# Docker could run but does not (see the script). LEADERFEED_NO_DOCKER=1
# opts out: the container tests then skip.
# shellcheck source=../.ci/docker.sh
source .ci/docker.sh
stops+=(leaderfeed_docker_stop)

if [ -z "${LEADERFEED_POSTGRES_URL:-}" ]; then
	# shellcheck source=../.ci/postgres.sh
	source .ci/postgres.sh
	stops+=(leaderfeed_postgres_stop)
fi
if [ -z "${LEADERFEED_RETHINK_ADDR:-}" ]; then
	# shellcheck source=../.ci/rethink.sh
	source .ci/rethink.sh
	stops+=(leaderfeed_rethink_stop)
fi

mkdir -p .ci/tmp
gotestsum --format "${LEADERFEED_TEST_FORMAT:-testname}" --format-hide-empty-pkg \
	--jsonfile .ci/tmp/test.json --raw-command -- scripts/gotest-json.sh "$@"
