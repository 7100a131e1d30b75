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

// TestRun runs the example against the server in LEADERFEED_POSTGRES_URL
// (CI starts one), on an election of its own.
func TestRun(t *testing.T) {
	url := os.Getenv("LEADERFEED_POSTGRES_URL")
	if url == "" {
		testenv.Unavailable(t, "no PostgreSQL: LEADERFEED_POSTGRES_URL is unset")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out, url, basetest.Election()); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"node-1: elected, term 1", "node-2: elected, term 2", "both stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
