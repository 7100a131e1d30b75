package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// The server the tests use: LEADERFEED_POSTGRES_URL (scripts/test.sh starts
// one and sets it). The same tests run against a PostgreSQL container from the
// containertest module, which sets the variable for them.
var server struct {
	once   sync.Once
	url    string
	reason string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// serverURL returns the URL of the test server, or marks the test
// unavailable (failed in CI, skipped elsewhere).
func serverURL(t testing.TB) string {
	t.Helper()
	server.once.Do(func() {
		server.url = os.Getenv("LEADERFEED_POSTGRES_URL")
		server.reason = "no PostgreSQL: LEADERFEED_POSTGRES_URL is unset (scripts/test.sh starts one)"
	})
	if server.url == "" {
		testenv.Unavailable(t, server.reason)
	}
	return server.url
}

// newPool returns a pool on the test server, closed at cleanup (after the
// backends, which register their cleanups later).
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatalf("parse LEADERFEED_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = 32
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// uniqueName returns a table (or election) name no other test uses.
func uniqueName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return "t_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(b[:])
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
