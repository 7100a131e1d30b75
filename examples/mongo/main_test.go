package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/256dpi/lungo"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/examples/internal/demo"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/onlungo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the example against the server in LEADERFEED_MONGO_URL when
// one is given, and otherwise the same demo on lungo's in-process engine
// (the stand-in of CI) through package mongo/onlungo: the same backend
// logic on another adapter.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if url := os.Getenv("LEADERFEED_MONGO_URL"); url != "" {
		if err := run(ctx, &out, url, "leaderfeed_test", basetest.Election()); err != nil {
			t.Fatal(err)
		}
		check(t, out.String())
		return
	}
	client, engine, err := lungo.Open(ctx, lungo.Options{Store: lungo.NewMemoryStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	db, election := client.Database("example"), basetest.Election()
	err = demo.Run(ctx, &out, func() (backend.Election, error) {
		return onlungo.New(db, election, mongo.Options{})
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t, out.String())
}

func check(t *testing.T, out string) {
	t.Helper()
	t.Log("\n" + out)
	for _, want := range []string{"node-1: elected, term 1", "node-2: elected, term 2", "both stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
