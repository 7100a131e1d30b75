// Package demo is the quickstart that the database examples
// (examples/postgres, examples/mongo, examples/rethink) run on their
// backend: two nodes, an election, and a handover on Resign.
package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

// Run runs two nodes of one election, each on a backend from open: node-1
// is elected, node-2 follows it, node-1 resigns and node-2 takes over at
// once; then both stop. It writes what happens to w. ctx bounds the whole
// demo.
func Run(ctx context.Context, w io.Writer, open func() (backend.Election, error)) error {
	type node struct {
		id     string
		feed   *base.Feed
		events <-chan base.Event
	}
	start := func(id string) (*node, error) {
		b, err := open()
		if err != nil {
			return nil, err
		}
		f, err := base.New(b, id, base.Options{Value: []byte(id + ".internal:8080")})
		if err != nil {
			_ = b.Close()
			return nil, err
		}
		n := &node{id: id, feed: f, events: f.Subscribe(context.Background()).C}
		if err := f.Start(ctx); err != nil {
			_ = f.Stop(ctx)
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		return n, nil
	}
	// wait returns n's next event that pass accepts.
	wait := func(n *node, what string, pass func(base.Event) bool) (base.Event, error) {
		for {
			select {
			case e := <-n.events:
				if e.Type == base.EventError || e.Type == base.EventSubscribeError || e.Type == base.EventIgnored {
					fmt.Fprintf(w, "%s: %v\n", n.id, e)
				}
				if pass(e) {
					return e, nil
				}
			case <-ctx.Done():
				return base.Event{}, fmt.Errorf("%s: no %s: %w", n.id, what, ctx.Err())
			}
		}
	}
	// stop stops n while reading its last events, which Stop delivers.
	stop := func(n *node) error {
		go func() {
			for range n.events {
			}
		}()
		return n.feed.Stop(ctx)
	}

	n1, err := start("node-1")
	if err != nil {
		return err
	}
	defer stop(n1) //nolint:errcheck // for early returns; Stop is idempotent
	e, err := wait(n1, "election", func(e base.Event) bool { return e.Type == base.EventElected })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "node-1: elected, term %d\n", e.Term)

	n2, err := start("node-2")
	if err != nil {
		return err
	}
	defer stop(n2) //nolint:errcheck // as above
	e, err = wait(n2, "leader", func(e base.Event) bool { return e.Type == base.EventNewLeader && e.Leader != "" })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "node-2: leader is %s (term %d) at %s\n", e.Leader, e.Term, e.Value)

	resigned := time.Now()
	if err := n1.feed.Resign(ctx); err != nil {
		return err
	}
	fmt.Fprintln(w, "node-1: resigned")
	e, err = wait(n2, "election", func(e base.Event) bool { return e.Type == base.EventElected })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "node-2: elected, term %d, %v after the resignation\n", e.Term, time.Since(resigned).Round(time.Millisecond))

	if err := stop(n1); err != nil {
		return err
	}
	if err := stop(n2); err != nil {
		return err
	}
	fmt.Fprintln(w, "both stopped")
	return nil
}
