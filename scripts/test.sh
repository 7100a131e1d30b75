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
# Timing: LEADERFEED_TEST_SCALE (basetest.ScaleEnv) scales every timing of
# the conformance rules and of the real-server tests, for a slow machine or
# store. Unless it is set, this script measures how much slower than its
# CPU time a busy loop of about a second runs right now (other processes
# taking the cores), and uses that, from 1 to 8.
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

t0=$SECONDS
phase_start=$SECONDS
# phase NAME prints how long the phase that just ended took.
phase() {
	echo "== phase $1 took $((SECONDS - phase_start)) s"
	phase_start=$SECONDS
}

# leaderfeed_slowdown prints wall time / CPU time of a busy loop of about a
# second: 1 on an idle machine, about 5 when ten other processes want the
# two cores. Bounded to [1, 8].
leaderfeed_slowdown() {
	local out
	out=$({
		TIMEFORMAT='%R %U %S'
		time {
			i=0
			while [ $i -lt 400000 ]; do i=$((i + 1)); done
		}
	} 2>&1)
	awk '{ cpu = $2 + $3; s = cpu > 0 ? $1 / cpu : 1; if (s < 1) s = 1; if (s > 8) s = 8; printf "%.1f\n", s }' <<<"$out"
}

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
phase docker

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

phase "postgres and reqlite"

if [ -z "${LEADERFEED_TEST_SCALE:-}" ]; then
	LEADERFEED_TEST_SCALE=$(leaderfeed_slowdown)
	echo "== timing scale $LEADERFEED_TEST_SCALE (a busy loop ran that much slower than its CPU time; load $(cut -d' ' -f1-3 /proc/loadavg))"
else
	echo "== timing scale $LEADERFEED_TEST_SCALE (LEADERFEED_TEST_SCALE)"
fi
export LEADERFEED_TEST_SCALE

mkdir -p .ci/tmp
set +e
gotestsum --format "${LEADERFEED_TEST_FORMAT:-testname}" --format-hide-empty-pkg \
	--jsonfile .ci/tmp/test.json --raw-command -- scripts/gotest-json.sh "$@"
status=$?
set -e
phase tests
echo "== scripts/test.sh took $((SECONDS - t0)) s"
exit "$status"
