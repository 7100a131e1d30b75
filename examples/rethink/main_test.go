package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the example against the server in LEADERFEED_RETHINK_ADDR
// (CI starts reqlite), on an election of its own. The demo never has two
// nodes claim at once, so reqlite's non-atomic updates do not matter here.
func TestRun(t *testing.T) {
	addr := os.Getenv("LEADERFEED_RETHINK_ADDR")
	if addr == "" {
		testenv.Unavailable(t, "no RethinkDB: LEADERFEED_RETHINK_ADDR is unset")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out, addr, basetest.Election()); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"node-1: elected, term 1", "node-2: elected, term 2", "both stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
