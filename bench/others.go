package main

import (
	"context"
	"fmt"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/rethink"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// The MongoDB and RethinkDB backends are measured only on a server given
// by URL or address: their in-process stand-ins (lungo, reqlite) say
// nothing about the real servers' latency.

const benchName = "leaderfeed_bench"

// mongoSystem returns leaderfeed on MongoDB at url (a replica set, for
// change streams) and a function that disconnects the shared client.
func mongoSystem(ctx context.Context, url string) (*lfSystem, func(), error) {
	connect := func(ctx context.Context) (*mongodrv.Client, error) {
		c, err := mongodrv.Connect(options.Client().ApplyURI(url))
		if err != nil {
			return nil, fmt.Errorf("mongo: %w", err)
		}
		return c, nil
	}
	disconnect := func(c *mongodrv.Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	}
	shared, err := connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Create the collection once; the nodes only check it.
	b, err := mongo.New(shared.Database(benchName), "bench-setup", mongo.Options{Collection: benchName})
	if err == nil {
		if err = b.Start(ctx); err == nil {
			err = b.Create(ctx)
		}
		_ = b.Close()
	}
	if err != nil {
		disconnect(shared)
		return nil, nil, err
	}
	open := func(ctx context.Context, election string, own bool) (backend.Election, func(), error) {
		c, release := shared, func() {}
		if own {
			var err error
			if c, err = connect(ctx); err != nil {
				return nil, nil, err
			}
			release = func() { disconnect(c) }
		}
		b, err := mongo.New(c.Database(benchName), election, mongo.Options{Collection: benchName, NoCreate: true})
		if err != nil {
			release()
			return nil, nil, err
		}
		return b, release, nil
	}
	return &lfSystem{name: "leaderfeed/mongo", open: open}, func() { disconnect(shared) }, nil
}

// rethinkSystem returns leaderfeed on RethinkDB at addr and a function that
// closes the shared session.
func rethinkSystem(ctx context.Context, addr string) (*lfSystem, func(), error) {
	connect := func() (*r.Session, error) {
		s, err := r.Connect(r.ConnectOpts{Address: addr, Timeout: 5 * time.Second})
		if err != nil {
			return nil, fmt.Errorf("rethink: %w", err)
		}
		return s, nil
	}
	shared, err := connect()
	if err != nil {
		return nil, nil, err
	}
	opts := rethink.Options{Database: benchName, Table: benchName}
	st, err := rethink.NewStore(shared, opts)
	if err == nil {
		if err = st.Start(ctx); err == nil {
			err = st.Create(ctx)
		}
		_ = st.Close()
	}
	if err != nil {
		_ = shared.Close()
		return nil, nil, err
	}
	open := func(_ context.Context, election string, own bool) (backend.Election, func(), error) {
		s, release := shared, func() {}
		if own {
			var err error
			if s, err = connect(); err != nil {
				return nil, nil, err
			}
			release = func() { _ = s.Close() }
		}
		b, err := rethink.New(s, election, opts)
		if err != nil {
			release()
			return nil, nil, err
		}
		return b, release, nil
	}
	return &lfSystem{name: "leaderfeed/rethink", open: open}, func() { _ = shared.Close() }, nil
}
