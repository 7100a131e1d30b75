// Command custombackend runs an election of two nodes on logstore, the
// backend that docs/EXTENDING.md builds step by step, and shows that the
// Feed needs nothing else from a backend: the first node is elected, the
// other follows, sees a change to an application document, and takes over
// at once when the leader resigns. It needs no server and exits by itself.
//
//	go run ./examples/custombackend
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/examples/custombackend/logstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := logstore.NewLog()

	start := func(id string) (*base.Feed, <-chan base.Event, error) {
		b, err := store.Election("reports")
		if err != nil {
			return nil, nil, err
		}
		f, err := base.New(b, id, base.Options{Value: []byte(id + ":8080")})
		if err != nil {
			return nil, nil, err
		}
		events := f.Subscribe(ctx).C // before Start, to see every event
		return f, events, f.Start(ctx)
	}
	// wait prints id's events until one of type want arrives.
	wait := func(id string, events <-chan base.Event, want base.EventType) error {
		for {
			select {
			case e, ok := <-events:
				if !ok {
					return fmt.Errorf("%s: events ended", id)
				}
				switch e.Type {
				case base.EventElected, base.EventUnelected, base.EventNewLeader, base.EventChange:
					fmt.Printf("%s: %v\n", id, e)
				}
				if e.Type == want {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("%s: no %v event: %w", id, want, ctx.Err())
			}
		}
	}

	// stop stops a feed. Stop never waits for a reader of events; the
	// subscriptions end with ctx.
	stop := func(f *base.Feed, _ <-chan base.Event) error { return f.Stop(ctx) }

	a, aEvents, err := start("node-a")
	if err != nil {
		return err
	}
	defer stop(a, aEvents) //nolint:errcheck // Stop is idempotent; this one is for early returns
	if err := wait("node-a", aEvents, base.EventElected); err != nil {
		return err
	}
	b, bEvents, err := start("node-b")
	if err != nil {
		return err
	}
	defer stop(b, bEvents) //nolint:errcheck // as above
	if err := wait("node-b", bEvents, base.EventSubscribeStarted); err != nil {
		return err
	}

	// An application document in the same table reaches every node.
	if err := store.Put("report-1", map[string]string{"status": "queued"}); err != nil {
		return err
	}
	if err := wait("node-b", bEvents, base.EventChange); err != nil {
		return err
	}

	fmt.Println("node-a resigns")
	if err := a.Resign(ctx); err != nil {
		return err
	}
	if err := wait("node-b", bEvents, base.EventElected); err != nil {
		return err
	}
	if err := stop(a, aEvents); err != nil {
		return err
	}
	return stop(b, bEvents)
}
