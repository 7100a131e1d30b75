// Command postgres runs the quickstart on PostgreSQL: two nodes of one
// election, each with its own backend on one *pgxpool.Pool, an election,
// and a handover on Resign. It creates the table "public"."leaderfeed" and
// its trigger if they are missing, so the role needs CREATE on the schema
// public; see the README's postgres section for the permissions.
//
//	go run ./examples/postgres -url 'postgres://user:pass@localhost:5432/db'
//
// Without -url it uses $LEADERFEED_POSTGRES_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/examples/internal/demo"
	"github.com/leaderfeed/leaderfeed/postgres"
)

func main() {
	url := flag.String("url", os.Getenv("LEADERFEED_POSTGRES_URL"), "PostgreSQL URL (default $LEADERFEED_POSTGRES_URL)")
	election := flag.String("election", "quickstart", "election name")
	flag.Parse()
	if *url == "" {
		log.Fatal("postgres: give -url or set LEADERFEED_POSTGRES_URL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *url, *election); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer, url, election string) error {
	pool, err := pgxpool.New(ctx, url) // the application's pool: the backend never closes it
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: cannot reach the server: %w", err)
	}
	err = demo.Run(ctx, w, func() (backend.Election, error) {
		return postgres.New(pool, election, postgres.Options{})
	})
	if errors.Is(err, backend.ErrUnsupported) {
		return fmt.Errorf("%w (leaderfeed needs PostgreSQL 12 or later)", err)
	}
	return err
}
