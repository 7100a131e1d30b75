package memory_test

import (
	"context"
	"fmt"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/memory"
)

// next returns the next event of type t, skipping the others.
func next(events <-chan base.Event, t base.EventType) base.Event {
	for e := range events {
		if e.Type == t {
			return e
		}
	}
	panic("events closed while waiting for " + t.String())
}

// stop stops f while something reads its remaining events, which Stop
// delivers before it returns.
func stop(f *base.Feed, events <-chan base.Event) {
	if err := f.Stop(context.Background()); err != nil {
		panic(err)
	}
	for range events {
	}
}

// Several feeds of one process share a DB; each needs a Backend of its
// own. When the leader stops, it writes a vacant record and the other node
// takes over at once.
func ExampleDB() {
	ctx := context.Background()
	store := memory.NewDB()
	start := func(id string) (*base.Feed, <-chan base.Event) {
		b, err := store.Election("jobs")
		if err != nil {
			panic(err)
		}
		f, err := base.New(b, id, base.Options{})
		if err != nil {
			panic(err)
		}
		events := f.Subscribe(context.Background()).C
		if err := f.Start(ctx); err != nil {
			panic(err)
		}
		return f, events
	}
	a, aEvents := start("node-a")
	fmt.Println("node-a elected, term", next(aEvents, base.EventElected).Term)
	b, bEvents := start("node-b")
	fmt.Println("node-b sees", next(bEvents, base.EventNewLeader).Leader)

	stop(a, aEvents)
	fmt.Println("node-b elected, term", next(bEvents, base.EventElected).Term)
	stop(b, bEvents)
	// Output:
	// node-a elected, term 1
	// node-b sees node-a
	// node-b elected, term 2
}

// Put and Delete write records of the application beside the election
// records; every feed on the DB receives them as EventChange events.
func ExampleDB_Put() {
	ctx := context.Background()
	store := memory.NewDB()
	b, err := store.Election("jobs")
	if err != nil {
		panic(err)
	}
	f, err := base.New(b, "node-a", base.Options{ObserveOnly: true})
	if err != nil {
		panic(err)
	}
	events := f.Subscribe(context.Background()).C
	if err := f.Start(ctx); err != nil {
		panic(err)
	}
	next(events, base.EventSubscribeStarted) // changes before this are not seen

	if err := store.Put("job-1", map[string]string{"state": "queued"}); err != nil {
		panic(err)
	}
	if err := store.Put("job-1", map[string]string{"state": "done"}); err != nil {
		panic(err)
	}
	store.Delete("job-1")
	for range 3 {
		c := next(events, base.EventChange).Change
		fmt.Printf("%s %s %s old=%s new=%s\n", c.Table, c.Op, c.Key, c.Old, c.New)
	}
	stop(f, events)
	// Output:
	// memory insert "job-1" old= new={"state":"queued"}
	// memory update "job-1" old={"state":"queued"} new={"state":"done"}
	// memory delete "job-1" old={"state":"done"} new=
}
