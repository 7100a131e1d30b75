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
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// The server the tests use, looked up once: LEADERFEED_POSTGRES_URL, then a
// testcontainers-go container when Docker works, else none.
var server struct {
	once      sync.Once
	url       string
	reason    string
	container *tcpostgres.PostgresContainer
}

func TestMain(m *testing.M) {
	code := m.Run()
	usedContainer := server.container != nil
	if usedContainer {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := server.container.Terminate(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "postgres: terminating the test container:", err)
		}
		cancel()
	}
	// testcontainers-go leaves goroutines of its own behind; check for
	// leaks only when it was not used.
	if code == 0 && !usedContainer {
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
		if u := os.Getenv("LEADERFEED_POSTGRES_URL"); u != "" {
			server.url = u
			return
		}
		if !testenv.DockerWorks() {
			server.reason = "no PostgreSQL: LEADERFEED_POSTGRES_URL is unset and Docker does not work (source .ci/postgres.sh)"
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
			tcpostgres.WithDatabase("leaderfeed"),
			tcpostgres.WithUsername("leaderfeed"),
			tcpostgres.WithPassword("leaderfeed"),
			tcpostgres.BasicWaitStrategies(),
		)
		if err != nil {
			server.reason = fmt.Sprintf("no PostgreSQL: starting a container failed: %v", err)
			if c != nil {
				server.container = c
			}
			return
		}
		server.container = c
		u, err := c.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			server.reason = fmt.Sprintf("no PostgreSQL: container connection string: %v", err)
			return
		}
		server.url = u
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
