// Command changes shows a follower consuming the change events of the
// watched table while another node leads.
//
// Besides the election record, the table a backend watches may hold
// records of the application's own; every node receives their inserts,
// updates and deletes as EventChange events, from the same changefeed that
// carries the heartbeats. Here node-1 leads and node-2 follows; the
// application writes orders into the table, and node-2 keeps a local view
// of them from the events alone. The demo runs on the in-process memory
// backend; with postgres the watched table is Options.WatchTable, with
// mongo and rethink it is the election's own collection or table.
//
//	go run ./examples/changes
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/memory"
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Order is a record of the application, stored in the watched table.
type Order struct {
	Item   string `json:"item"`
	Status string `json:"status"`
}

func run(w io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := memory.NewDB()

	// node-1 leads. Nobody reads its events, so it does not ask for them:
	// a Feed queues events only once Events has been called.
	b1, err := store.Election("orders")
	if err != nil {
		return err
	}
	leader, err := base.New(b1, "node-1", base.Options{})
	if err != nil {
		return err
	}
	if err := leader.Start(ctx); err != nil {
		return err
	}
	defer leader.Stop(context.Background()) //nolint:errcheck // Stop is idempotent
	for !leader.IsLeader() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("node-1 was not elected: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}

	// node-2 follows and consumes every event.
	b2, err := store.Election("orders")
	if err != nil {
		return err
	}
	follower, err := base.New(b2, "node-2", base.Options{})
	if err != nil {
		return err
	}
	events := follower.Subscribe(context.Background()).C // before Start, to miss nothing
	if err := follower.Start(ctx); err != nil {
		return err
	}
	defer follower.Stop(context.Background()) //nolint:errcheck // as above

	view := map[string]Order{}         // node-2's view of the orders, from events only
	subscribed := make(chan struct{})  // closed at the first EventSubscribeStarted
	leaderKnown := make(chan struct{}) // closed when node-2 has learned who leads
	var once, knownOnce sync.Once
	wrote := make(chan struct{}) // closed when the last write arrived
	ended := make(chan struct{}) // closed when Events is closed
	go func() {
		defer close(ended)
		for e := range events {
			switch e.Type {
			case base.EventNewLeader:
				fmt.Fprintf(w, "node-2: leader is %s (term %d)\n", e.Leader, e.Term)
				if e.Leader != "" {
					knownOnce.Do(func() { close(leaderKnown) })
				}
			case base.EventSubscribeStarted:
				// From now on every change reaches node-2: let the
				// application write. (A feed that broke and was reopened
				// starts again; this demo's does not break.)
				once.Do(func() { close(subscribed) })
			case base.EventChange:
				c := e.Change
				var key string
				if err := json.Unmarshal(c.Key, &key); err != nil {
					fmt.Fprintf(w, "node-2: change with key %s: %v\n", c.Key, err)
					continue
				}
				switch {
				case c.Op == backend.Delete:
					delete(view, key)
					fmt.Fprintf(w, "node-2: %s %s\n", c.Op, key)
				case c.Partial:
					// The record was too big for the notification: a real
					// application fetches it by key.
					fmt.Fprintf(w, "node-2: %s %s (fetch it)\n", c.Op, key)
				default:
					var o Order
					if err := json.Unmarshal(c.New, &o); err != nil {
						fmt.Fprintf(w, "node-2: %s %s: %v\n", c.Op, key, err)
						continue
					}
					view[key] = o
					fmt.Fprintf(w, "node-2: %s %s: %s is %s\n", c.Op, key, o.Item, o.Status)
				}
				if key == "order-3" && c.Op == backend.Insert {
					close(wrote) // the last write of the application
				}
			}
		}
	}()
	for _, c := range []chan struct{}{subscribed, leaderKnown} {
		select {
		case <-c:
		case <-ctx.Done():
			return fmt.Errorf("node-2 did not subscribe and learn the leader: %w", ctx.Err())
		}
	}

	// The application writes to the table, from any process or client.
	for _, put := range []struct {
		key   string
		order Order
	}{
		{"order-1", Order{"tea", "new"}},
		{"order-2", Order{"cake", "new"}},
		{"order-1", Order{"tea", "paid"}},
	} {
		if err := store.Put(put.key, put.order); err != nil {
			return err
		}
	}
	store.Delete("order-2")
	if err := store.Put("order-3", Order{"soup", "new"}); err != nil {
		return err
	}
	select {
	case <-wrote:
	case <-ctx.Done():
		return fmt.Errorf("node-2 missed changes: %w", ctx.Err())
	}

	if err := follower.Stop(ctx); err != nil {
		return err
	}
	<-ended // the event loop has ended: view is ours to read
	keys := make([]string, 0, len(view))
	for k := range view {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "view: %s = %s, %s\n", k, view[k].Item, view[k].Status)
	}
	fmt.Fprintf(w, "node-1 led throughout: %v\n", leader.IsLeader())
	return leader.Stop(ctx)
}
