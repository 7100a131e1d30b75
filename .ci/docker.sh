# shellcheck shell=bash
# .ci/docker.sh: a Docker engine and a locally built PostgreSQL image, so that
# the container tests (containertest/, integration/partition_test.go) run for
# real. Meant to be sourced by scripts/test.sh:
#
#	source .ci/docker.sh || exit 1
#	stops+=(leaderfeed_docker_stop)
#
# What it does, in order:
#
#  1. If a Docker engine already answers (`docker info`), it is used and
#     left alone: nothing is installed, started or stopped.
#  2. Otherwise, as root (or with passwordless sudo), it installs Debian's
#     docker.io when dockerd is missing (the package's own start of the
#     service is refused, as .ci/postgres.sh does for postgresql) and starts
#     dockerd in the background with Docker's default data root
#     (/var/lib/docker) and pid file (/var/run/docker.pid), logging to
#     .ci/tmp/dockerd.log. The default data root is what makes the image a
#     once-per-machine cost shared by every clone and run (a data root in
#     .ci/tmp would rebuild it per clone and may sit on a file system where
#     overlay2 does not work); the default pid file keeps a second dockerd
#     from starting beside it. leaderfeed_docker_stop stops that dockerd
#     when the last leaderfeed run on the machine that uses it ends (runs
#     register in /var/run/leaderfeed-docker.users), and never one it did
#     not start.
#  3. It builds the image leaderfeed/postgres:15-<hash> unless it exists, in
#     two steps, each named by a hash of its recipe so that a changed recipe
#     builds a new image and an unchanged one is never rebuilt: the base
#     leaderfeed/postgres-base:15-<hash> (`debootstrap --variant=minbase
#     bookworm`, Debian's postgresql-15 inside, `docker import`: minutes,
#     changes rarely), then the image from .ci/docker/postgres (Dockerfile
#     and our entrypoint, which honours POSTGRES_USER, POSTGRES_PASSWORD,
#     POSTGRES_DB like the official image: seconds). No registry is
#     reachable, so nothing is pulled. The image is also tagged
#     leaderfeed/postgres:15. The work directory (.ci/tmp/docker-build) is
#     removed afterwards; only the images stay (those of older recipes are
#     removed when a new one is built).
#  4. It exports LEADERFEED_DOCKER=1 (the container tests then fail, not
#     skip, when a container does not start), LEADERFEED_POSTGRES_IMAGE (the
#     image the tests ask for; the official postgres image is not shadowed
#     by a tag of ours), and TESTCONTAINERS_* only where needed (see below).
#
# When Docker cannot be made to work: with LEADERFEED_NO_DOCKER=1 set, or
# when neither root nor passwordless sudo can start dockerd (no permission:
# not a regression, the machine never gave us Docker), it prints a warning
# and returns 0; the tests then skip the container tests and PostgreSQL runs
# on the bare server (.ci/postgres.sh). Anything else that fails (apt,
# dockerd not answering, the image build) is a regression on a machine
# where we can run Docker: it returns 1 in CI (CI=true), and outside CI
# warns and returns 0.

leaderfeed_docker_ci="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
leaderfeed_docker_users=/var/run/leaderfeed-docker.users
leaderfeed_docker_started_marker=/var/run/leaderfeed-docker.started
leaderfeed_docker_sudo=""

leaderfeed_docker_answers() { timeout 10 docker info >/dev/null 2>&1; }

# leaderfeed_docker_fail prints why Docker does not work and returns 1 in
# CI, 0 elsewhere.
leaderfeed_docker_fail() {
	echo "docker: $*" >&2
	if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
		echo "docker: CI=true and this machine can run Docker (we have the rights), so this is a failure, not a fallback; LEADERFEED_NO_DOCKER=1 opts out" >&2
		return 1
	fi
	echo "docker: WARNING: container tests will be skipped; PostgreSQL runs on the bare server" >&2
	return 0
}

leaderfeed_docker_install() {
	local policy=/usr/sbin/policy-rc.d had_policy=0 rc=0 s=$leaderfeed_docker_sudo
	echo "docker: dockerd missing, installing Debian's docker.io"
	export DEBIAN_FRONTEND=noninteractive
	if [ -e "$policy" ]; then
		had_policy=1
	else
		printf '#!/bin/sh\nexit 101\n' | $s tee "$policy" >/dev/null && $s chmod 755 "$policy"
	fi
	# The docker client already on the machine (/usr/local/bin/docker)
	# comes first on PATH and talks to the older daemon by itself.
	$s apt-get update -qq >/dev/null && $s apt-get install -y -qq docker.io >/dev/null || rc=1
	[ "$had_policy" = 1 ] || $s rm -f "$policy"
	return "$rc"
}

# leaderfeed_docker_register notes this run as a user of the engine.
leaderfeed_docker_register() {
	echo "$$" | $leaderfeed_docker_sudo tee -a "$leaderfeed_docker_users" >/dev/null
}

leaderfeed_docker_start() {
	local i log
	if leaderfeed_docker_answers; then
		# Registered, if we may, in case a run of ours started it.
		leaderfeed_docker_register 2>/dev/null || true
		echo "docker: using the engine that answers ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
		return 0
	fi
	if [ "$(id -u)" != 0 ]; then
		if sudo -n true 2>/dev/null; then
			leaderfeed_docker_sudo="sudo -n"
		else
			echo "docker: WARNING: no engine answers and neither root nor passwordless sudo can start dockerd; container tests will be skipped, PostgreSQL runs on the bare server" >&2
			return 2
		fi
	fi
	leaderfeed_docker_register
	if ! command -v dockerd >/dev/null 2>&1; then
		leaderfeed_docker_install || { leaderfeed_docker_fail "apt-get install docker.io failed"; return; }
		command -v dockerd >/dev/null 2>&1 || { leaderfeed_docker_fail "no dockerd after installing docker.io"; return; }
	fi
	log="$leaderfeed_docker_ci/tmp/dockerd.log"
	mkdir -p "$(dirname "$log")"
	echo "docker: starting $(dockerd --version) (log in $log)"
	# setsid: dockerd must not get the terminal's signals, nor die with
	# this shell before leaderfeed_docker_stop has stopped it.
	$leaderfeed_docker_sudo setsid dockerd >"$log" 2>&1 </dev/null &
	for i in $(seq 1 300); do
		leaderfeed_docker_answers && break
		sleep 0.1
	done
	if ! leaderfeed_docker_answers; then
		tail -n 20 "$log" >&2
		leaderfeed_docker_fail "dockerd did not answer within 30 s"
		return
	fi
	echo "$$" | $leaderfeed_docker_sudo tee "$leaderfeed_docker_started_marker" >/dev/null
	echo "docker: engine $(docker version -f '{{.Server.Version}}') up"
}

# leaderfeed_docker_stop removes this run from the engine's users and, if
# leaderfeed started the engine and no other run uses it, stops it.
leaderfeed_docker_stop() {
	local s=$leaderfeed_docker_sudo live="" p pid
	[ -f "$leaderfeed_docker_users" ] || return 0
	for p in $(cat "$leaderfeed_docker_users"); do
		[ "$p" = "$$" ] && continue
		kill -0 "$p" 2>/dev/null && live="$live$p"$'\n'
	done
	printf '%s' "$live" | $s tee "$leaderfeed_docker_users" >/dev/null
	[ -z "$live" ] || return 0
	[ -f "$leaderfeed_docker_started_marker" ] || return 0
	pid=$(cat /var/run/docker.pid 2>/dev/null) || return 0
	echo "docker: stopping the engine leaderfeed started (pid $pid)"
	$s kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 150); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	$s rm -f "$leaderfeed_docker_started_marker" "$leaderfeed_docker_users"
}

# leaderfeed_docker_build_base IMAGE makes the base image: Debian bookworm
# (debootstrap, minbase) with Debian's postgresql-15, by `docker import`.
# This is the slow part (minutes); it changes rarely.
leaderfeed_docker_build_base() {
	local image=$1 s=$leaderfeed_docker_sudo work="$leaderfeed_docker_ci/tmp/docker-build" root t=$SECONDS
	root="$work/rootfs"
	$s rm -rf "$work" && mkdir -p "$work" || return 1
	if ! command -v debootstrap >/dev/null 2>&1; then
		echo "docker: installing debootstrap"
		DEBIAN_FRONTEND=noninteractive $s apt-get install -y -qq debootstrap >/dev/null 2>&1 || return 1
	fi
	echo "docker: debootstrap --variant=minbase bookworm (log in $work/build.log)"
	$s debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$work/build.log" 2>&1 || {
		tail -n 20 "$work/build.log" >&2
		return 1
	}
	echo "docker: debootstrap took $((SECONDS - t)) s"
	t=$SECONDS
	# No service starts inside the chroot while installing, and dpkg does
	# not fsync every file (a build that crashes is started over anyway).
	printf '#!/bin/sh\nexit 101\n' | $s tee "$root/usr/sbin/policy-rc.d" >/dev/null
	$s chmod 755 "$root/usr/sbin/policy-rc.d"
	echo force-unsafe-io | $s tee "$root/etc/dpkg/dpkg.cfg.d/leaderfeed-unsafe-io" >/dev/null
	echo "docker: apt-get install postgresql-15 in the image"
	# The package's postinst makes a cluster "main"; the image's
	# entrypoint initdb's its own data directory, so that one is dropped.
	$s chroot "$root" /bin/sh -c 'export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -qq --no-install-recommends postgresql-15 || exit 1
		pg_dropcluster 15 main 2>/dev/null
		apt-get clean && rm -rf /var/lib/apt/lists/*' >>"$work/build.log" 2>&1 || {
		tail -n 20 "$work/build.log" >&2
		return 1
	}
	[ -x "$root/usr/lib/postgresql/15/bin/postgres" ] || {
		echo "docker: postgresql-15 is not in the image" >&2
		tail -n 20 "$work/build.log" >&2
		return 1
	}
	echo "docker: postgresql-15 took $((SECONDS - t)) s"
	t=$SECONDS
	$s rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/dpkg/dpkg.cfg.d/leaderfeed-unsafe-io"
	echo "docker: docker import as $image"
	$s tar -C "$root" -c . | docker import - "$image" >/dev/null || return 1
	echo "docker: docker import took $((SECONDS - t)) s"
	$s rm -rf "$work"
}

# leaderfeed_docker_image builds what is missing of the PostgreSQL image
# and exports its name. Each image is named by a hash of its recipe: the
# base by the function that makes it, the image by the base's name, the
# Dockerfile and the entrypoint (.ci/docker/postgres).
leaderfeed_docker_image() {
	local base image t0=$SECONDS dir="$leaderfeed_docker_ci/docker/postgres"
	base="leaderfeed/postgres-base:15-$(declare -f leaderfeed_docker_build_base | sha256sum | cut -c1-12)"
	image="leaderfeed/postgres:15-$({ echo "$base"; cat "$dir/Dockerfile" "$dir/docker-entrypoint.sh"; } | sha256sum | cut -c1-12)"
	# One build at a time on the machine (two clones may start together).
	exec {leaderfeed_docker_lock}>"${TMPDIR:-/tmp}/leaderfeed-docker-build.lock"
	flock "$leaderfeed_docker_lock"
	if ! docker image inspect "$base" >/dev/null 2>&1; then
		echo "docker: building $base (first run on this machine, or its recipe changed)"
		if ! leaderfeed_docker_build_base "$base"; then
			flock -u "$leaderfeed_docker_lock"
			return 1
		fi
		echo "docker: built $base in $((SECONDS - t0)) s"
	fi
	if ! docker image inspect "$image" >/dev/null 2>&1; then
		echo "docker: building $image"
		# The classic builder: it needs no registry when FROM is local
		# (BuildKit, the newer client's default, would look the base up).
		if ! DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$base" -t "$image" "$dir" >"$leaderfeed_docker_ci/tmp/docker-build.log" 2>&1; then
			cat "$leaderfeed_docker_ci/tmp/docker-build.log" >&2
			flock -u "$leaderfeed_docker_lock"
			return 1
		fi
		echo "docker: built $image in $((SECONDS - t0)) s"
		# Images of older recipes go (about 430 MB each); a clone still on
		# an older recipe builds its own again.
		docker images --format '{{.Repository}}:{{.Tag}}' 'leaderfeed/postgres*' |
			grep -E '^leaderfeed/postgres(-base)?:15-' | grep -vxF -e "$image" -e "$base" |
			xargs -r docker rmi >/dev/null 2>&1 || true
	fi
	flock -u "$leaderfeed_docker_lock"
	docker tag "$image" leaderfeed/postgres:15
	export LEADERFEED_POSTGRES_IMAGE="$image"
}

leaderfeed_docker_setup() {
	local rc=0
	if [ -n "${LEADERFEED_NO_DOCKER:-}" ]; then
		echo "docker: LEADERFEED_NO_DOCKER is set: no engine; container tests skip, PostgreSQL runs on the bare server"
		return 0
	fi
	leaderfeed_docker_start || rc=$?
	case $rc in
	0) ;;
	2) return 0 ;; # no permission: warned, not a regression
	*) return "$rc" ;;
	esac
	leaderfeed_docker_answers || return 0 # failed outside CI: warned
	if [ -z "${LEADERFEED_POSTGRES_IMAGE:-}" ]; then
		leaderfeed_docker_image || {
			leaderfeed_docker_fail "building the PostgreSQL image failed"
			return
		}
	fi
	export LEADERFEED_DOCKER=1
	# testcontainers-go starts its reaper (Ryuk) from an image it pulls,
	# and no registry is reachable: without the image, run without the
	# reaper (every test terminates its containers itself).
	if [ -z "$(docker images -q testcontainers/ryuk 2>/dev/null)" ]; then
		export TESTCONTAINERS_RYUK_DISABLED=true
	fi
	# Inside a container (/.dockerenv) testcontainers-go takes the default
	# gateway for the Docker host, but our dockerd runs in this very
	# container and publishes its ports on localhost.
	if [ -f /.dockerenv ] && [ -z "${DOCKER_HOST:-}" ]; then
		export TESTCONTAINERS_HOST_OVERRIDE=localhost
	fi
	echo "docker: LEADERFEED_POSTGRES_IMAGE=$LEADERFEED_POSTGRES_IMAGE${TESTCONTAINERS_RYUK_DISABLED:+ TESTCONTAINERS_RYUK_DISABLED=true}${TESTCONTAINERS_HOST_OVERRIDE:+ TESTCONTAINERS_HOST_OVERRIDE=localhost}"
}

leaderfeed_docker_setup
