# shellcheck shell=bash
# .ci/tools.sh: install the Go tools the scripts use into .ci/tmp/bin inside
# the clone (never the user's GOPATH/bin), at versions the module proxy
# serves, and put that folder first on PATH. Meant to be sourced. A tool
# already there at the right version is kept.
#
# staticcheck v0.8.2 is release 2026.2.2: the proxy refuses the year-style
# version string, so the semantic one is used.

leaderfeed_tools_bin="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tmp/bin"
mkdir -p "$leaderfeed_tools_bin"
export PATH="$leaderfeed_tools_bin:$PATH"

# leaderfeed_tool NAME MODULE@VERSION installs MODULE@VERSION as NAME into
# .ci/tmp/bin unless the version recorded beside it is that one.
leaderfeed_tool() {
	local name=$1 pkg=$2 stamp="$leaderfeed_tools_bin/.$1.version"
	if [ -x "$leaderfeed_tools_bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkg" ]; then
		return 0
	fi
	echo "tools: installing $pkg into $leaderfeed_tools_bin"
	GOBIN="$leaderfeed_tools_bin" GOFLAGS= go install "$pkg" || {
		echo "tools: go install $pkg failed" >&2
		return 1
	}
	echo "$pkg" >"$stamp"
}

leaderfeed_tool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2 &&
	leaderfeed_tool gotestsum gotest.tools/gotestsum@v1.13.0
