//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// A service started beside its database waits for it: a Feed whose
// PostgreSQL address refuses connections (nothing listens on it yet) runs
// until a Proxy to the real server starts listening there 5 s later (2 s
// with -short), and leads within a second of that (times basetest's
// ScaleEnv), having logged the wait.
func TestStartWaitsForPostgres(t *testing.T) {
	cfg := pgConfig(t)
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port; nothing listens on it once closed
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", uint16(addr.Port), nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	election := fmt.Sprintf("startwait-%d", time.Now().UnixNano())
	b, err := postgres.New(pool, election, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	tm := basetest.ScaledTiming(heartbeat.Timing{
		HeartbeatInterval:  50 * time.Millisecond,
		ElectionTimeoutMin: 250 * time.Millisecond,
		ElectionTimeoutMax: 500 * time.Millisecond,
	})
	feed, err := base.New(b, "n1", base.Options{Timing: tm, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elected := make(chan time.Time, 1)
	ran := make(chan error, 1)
	go func() {
		ran <- feed.Run(ctx, func(ctx context.Context, term uint64) error {
			elected <- time.Now()
			<-ctx.Done()
			return nil
		})
	}()

	delay := 5 * time.Second
	if testing.Short() {
		delay = 2 * time.Second
	}
	select {
	case err := <-ran:
		t.Fatalf("Run returned while nothing listened at the store's address: %v", err)
	case <-elected:
		t.Fatal("elected while nothing listened at the store's address")
	case <-time.After(delay):
	}
	p, err := ListenProxy(addr.String(), target)
	if err != nil {
		t.Fatalf("listen at the store's address %s, free %v ago: %v", addr, delay, err)
	}
	defer p.Close()
	up := time.Now()

	bound := basetest.Scaled(time.Second)
	select {
	case at := <-elected:
		took := at.Sub(up)
		t.Logf("led %v after the address accepted connections (bound %v)", took.Round(time.Millisecond), bound)
		if took > bound {
			t.Errorf("led %v after the address accepted connections, want within %v", took, bound)
		}
	case err := <-ran:
		t.Fatalf("Run returned: %v", err)
	case <-time.After(10 * bound):
		t.Fatalf("not elected %v after the address accepted connections; log:\n%s", 10*bound, logs.String())
	}
	if !strings.Contains(logs.String(), `msg="leaderfeed: store not reached, waiting"`) {
		t.Errorf("the wait is not logged; log:\n%s", logs.String())
	}
	cancel()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if _, err := pool.Exec(context.Background(), "DELETE FROM leaderfeed WHERE election = $1", election); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// pgConfig returns the pool configuration of a PostgreSQL server reached
// over TCP: LEADERFEED_POSTGRES_URL's, else a private server's (startPG).
func pgConfig(t *testing.T) *pgxpool.Config {
	t.Helper()
	if u := os.Getenv("LEADERFEED_POSTGRES_URL"); u != "" {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			t.Fatalf("LEADERFEED_POSTGRES_URL: %v", err)
		}
		if !strings.HasPrefix(cfg.ConnConfig.Host, "/") { // not a unix socket
			return cfg
		}
	}
	s := startPG(t)
	cfg, err := pgxpool.ParseConfig(s.url(s.target()))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for a log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
