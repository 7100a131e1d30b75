# shellcheck shell=bash
# Sourced by .ci/run: installs reqlite@2.3.0 (a RethinkDB 2.0-protocol server
# in JavaScript, the stand-in for RethinkDB in CI), starts it on 127.0.0.1 and
# exports LEADERFEED_RETHINK_ADDR and LEADERFEED_RETHINK_REQLITE=1 for the
# tests of rethink/. Needs Node.js and npm. Safe to source again: it kills
# the instance it started before (pid file) and starts a fresh one.
#
# reqlite keeps data in memory only and is no proof of atomicity: see
# rethink/doc.go. Its quirks met by the tests: update functions are not
# atomic across connections (the tests serialize writes); the V1.0 handshake
# sends an invalid salt (patched below); --driver-port is an offset added to
# 28015; it binds every interface and writes responses with Nagle's
# algorithm on, 40 ms per query against delayed ACKs (both fixed by
# .ci/reqlite-preload.js); a taken port makes it print and exit 0;
# table.wait() and .status() give a response type the driver does not know,
# .config() is "not implemented"; changefeeds ignore include_states,
# include_types and include_initial and carry no "type" field; r.error()
# messages get a trailing period; there is no "test" database and the
# password must be empty. The port is found free at run time (from a random
# start, so clones side by side rarely meet); LEADERFEED_RETHINK_PORT fixes it.

# leaderfeed_rethink_stop kills the reqlite this script started (pid file
# .ci/tmp/reqlite.pid), if it still runs; it never touches other processes.
leaderfeed_rethink_stop() {
  local pidfile pid i
  pidfile="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tmp/reqlite.pid" || return 1
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    grep -q reqlite "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

leaderfeed_rethink_start() {
  local root ci dir pkg log pidfile port offset pid i
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  ci="$root/.ci"
  dir="$ci/reqlite"              # node_modules/ inside is gitignored
  pkg="$dir/node_modules/reqlite"
  mkdir -p "$ci/tmp" || return 1
  log="$ci/tmp/reqlite.log"
  pidfile="$ci/tmp/reqlite.pid"
  port="${LEADERFEED_RETHINK_PORT:-}"
  if [ -z "$port" ]; then
    port=$((29000 + RANDOM % 20000))
    for i in $(seq 1 200); do
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break
      port=$((port + 1))
    done
  fi
  offset=$((port - 28015))       # reqlite's --driver-port is an offset added to 28015
  if [ "$offset" -lt 0 ]; then
    echo "rethink.sh: LEADERFEED_RETHINK_PORT must be >= 28015, got $port" >&2
    return 1
  fi

  command -v node >/dev/null || { echo "rethink.sh: node not found" >&2; return 1; }
  command -v npm >/dev/null || { echo "rethink.sh: npm not found" >&2; return 1; }

  # Install (only if missing or another version).
  if [ "$(node -p "try{require('$pkg/package.json').version}catch(e){''}" 2>/dev/null)" != "2.3.0" ]; then
    echo "rethink.sh: installing reqlite@2.3.0 into $dir/node_modules" >&2
    (cd "$dir" && npm install --no-package-lock --no-audit --no-fund --loglevel=error) || {
      echo "rethink.sh: npm install of reqlite failed" >&2; return 1; }
  fi

  # The salt fix: reqlite's V1.0 handshake appends '==' to an already padded
  # base64 salt, which every driver rejects. Patch it once; fail loudly if the
  # line is not what we expect.
  local conn="$pkg/lib/connection.js"
  local bad="self.salt = new Buffer(crypto.randomBytes(16)).toString('base64')+'=='"
  local good="self.salt = new Buffer(crypto.randomBytes(16)).toString('base64')"
  if grep -qF "$bad" "$conn"; then
    sed -i "s/toString('base64')+'=='\$/toString('base64')/" "$conn"
  fi
  if grep -qF "$bad" "$conn" || ! grep -qxF "  $good" "$conn"; then
    echo "rethink.sh: could not apply the salt fix to $conn (unexpected content)" >&2
    return 1
  fi

  # Kill the instance this script started before.
  leaderfeed_rethink_stop || return 1

  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "rethink.sh: port $port is taken by something else; set LEADERFEED_RETHINK_PORT to a free one" >&2
    return 1
  fi

  # Start on loopback only (the preload forces host 127.0.0.1). A taken port
  # makes reqlite print and exit 0, so wait for the port, not the exit code.
  nohup node -r "$ci/reqlite-preload.js" "$pkg/bin/reqlite" --driver-port "$offset" \
    >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "rethink.sh: reqlite exited; log:" >&2; cat "$log" >&2; return 1
    fi
    sleep 0.1
  done
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "rethink.sh: reqlite does not accept on 127.0.0.1:$port after 10 s; log:" >&2
    cat "$log" >&2
    return 1
  fi

  export LEADERFEED_RETHINK_ADDR="127.0.0.1:$port"
  export LEADERFEED_RETHINK_REQLITE=1
  export LEADERFEED_RETHINK_PID="$pid"
  echo "rethink.sh: reqlite pid $pid on $LEADERFEED_RETHINK_ADDR" >&2
}

leaderfeed_rethink_start || return 1 2>/dev/null || exit 1
