// Command rethink runs the quickstart on RethinkDB: two nodes of one
// election, each with its own backend on one session, an election, and a
// handover on Resign. It creates the database and the table "leaderfeed"
// if they are missing.
//
//	go run ./examples/rethink -addr localhost:28015
//
// Without -addr it uses $LEADERFEED_RETHINK_ADDR.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/examples/internal/demo"
	"github.com/leaderfeed/leaderfeed/rethink"
)

func main() {
	addr := flag.String("addr", os.Getenv("LEADERFEED_RETHINK_ADDR"), "RethinkDB host:port (default $LEADERFEED_RETHINK_ADDR)")
	election := flag.String("election", "quickstart", "election name")
	flag.Parse()
	if *addr == "" {
		log.Fatal("rethink: give -addr or set LEADERFEED_RETHINK_ADDR")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *addr, *election); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer, addr, election string) error {
	session, err := r.Connect(r.ConnectOpts{Address: addr}) // the application's session: never closed by the backend
	if err != nil {
		return fmt.Errorf("rethink: %w", err)
	}
	defer session.Close() //nolint:errcheck // nothing to do about it
	return demo.Run(ctx, w, func() (backend.Election, error) {
		return rethink.New(session, election, rethink.Options{})
	})
}
