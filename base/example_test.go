package base_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/memory"
)

// waitFor returns the next event of type t, skipping the others.
func waitFor(events <-chan base.Event, t base.EventType) base.Event {
	for e := range events {
		if e.Type == t {
			return e
		}
	}
	panic("events closed while waiting for " + t.String())
}

// stop stops f, then takes the events left (Stop never waits for a
// reader; the subscription ends once they are taken).
func stop(f *base.Feed, events <-chan base.Event) {
	if err := f.Stop(context.Background()); err != nil {
		panic(err)
	}
	for range events {
	}
}

// One node on the in-process memory backend: create the Feed, ask for its
// events before Start so that none is missed, start it, and follow the
// election. A node alone is elected at once: an election that has never had
// a record is claimed without waiting for an election timeout.
func Example() {
	ctx := context.Background()
	store := memory.NewDB() // with a database: postgres.New, mongo.New, rethink.New
	b, err := store.Election("scheduler")
	if err != nil {
		panic(err)
	}
	feed, err := base.New(b, "node-1", base.Options{Value: []byte("10.0.0.1:8080")})
	if err != nil {
		panic(err)
	}
	events := feed.Subscribe(context.Background()).C
	if err := feed.Start(ctx); err != nil {
		panic(err)
	}

	for e := range events {
		switch e.Type {
		case base.EventNewLeader:
			fmt.Printf("leader: %q, term %d, value %q\n", e.Leader, e.Term, e.Value)
		case base.EventElected:
			fmt.Printf("elected, term %d\n", e.Term)
		}
		if e.Type == base.EventNewLeader && e.Leader == "node-1" {
			break
		}
	}
	term, leading := feed.Term()
	fmt.Println("IsLeader:", feed.IsLeader(), "Term:", term, leading)

	// Stop resigns first, so that another node would take over at once.
	go func() {
		if err := feed.Stop(ctx); err != nil {
			panic(err)
		}
	}()
	for e := range events { // closed when Stop has delivered the last event
		if e.Type == base.EventUnelected {
			fmt.Printf("unelected from term %d: %s\n", e.Term, e.Reason)
		}
	}
	<-feed.Done()
	fmt.Println("IsLeader:", feed.IsLeader())
	// Output:
	// leader: "", term 0, value ""
	// elected, term 1
	// leader: "node-1", term 1, value "10.0.0.1:8080"
	// IsLeader: true Term: 1 true
	// unelected from term 1: stopped
	// IsLeader: false
}

// Run is the common case: it runs the leader's work each time the node is
// elected, under a context that ends with leadership, and campaigns again
// when leadership ends. When Run's context ends, it cancels the work, waits
// for it to return, and stops the Feed, which hands over at once: here
// node-b takes over the moment node-a's work has returned.
func ExampleFeed_Run() {
	store := memory.NewDB()
	leading := make(chan string)
	runNode := func(id string) (stop context.CancelFunc, done <-chan struct{}) {
		b, err := store.Election("scheduler")
		if err != nil {
			panic(err)
		}
		feed, err := base.New(b, id, base.Options{})
		if err != nil {
			panic(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			err := feed.Run(ctx, func(ctx context.Context, term uint64) error {
				leading <- fmt.Sprintf("%s leads, term %d", id, term)
				<-ctx.Done() // a real job works until then, passing term to what it writes
				fmt.Printf("%s: work of term %d stopped: %v\n", id, term, context.Cause(ctx))
				return nil
			})
			fmt.Printf("%s: Run returned %v\n", id, err)
		}()
		return cancel, ended
	}

	stopA, doneA := runNode("node-a")
	fmt.Println(<-leading)
	stopB, doneB := runNode("node-b") // follows node-a
	stopA()                           // node-a's program ends: it hands over
	<-doneA
	fmt.Println(<-leading)
	stopB()
	<-doneB
	// Output:
	// node-a leads, term 1
	// node-a: work of term 1 stopped: context canceled
	// node-a: Run returned <nil>
	// node-b leads, term 2
	// node-b: work of term 2 stopped: context canceled
	// node-b: Run returned <nil>
}

// Resign hands leadership over at once: the leader cancels its leader
// context, writes a vacant record, and a follower claims it without
// waiting for an election timeout. The node that resigned goes on as a
// follower and does not claim the vacancy it made.
func ExampleFeed_Resign() {
	ctx := context.Background()
	store := memory.NewDB()
	newNode := func(id string) (*base.Feed, <-chan base.Event) {
		b, err := store.Election("scheduler")
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

	a, aEvents := newNode("node-a")
	fmt.Println("node-a elected, term", waitFor(aEvents, base.EventElected).Term)
	b, bEvents := newNode("node-b")
	fmt.Println("node-b sees", waitFor(bEvents, base.EventNewLeader).Leader)

	if err := a.Resign(ctx); err != nil {
		panic(err)
	}
	e := waitFor(aEvents, base.EventUnelected)
	fmt.Printf("node-a unelected from term %d: %s\n", e.Term, e.Reason)
	fmt.Println("node-b elected, term", waitFor(bEvents, base.EventElected).Term)
	fmt.Printf("node-a sees %q\n", waitFor(aEvents, base.EventNewLeader).Leader) // its vacancy
	fmt.Printf("node-a sees %q\n", waitFor(aEvents, base.EventNewLeader).Leader)

	if err := a.Resign(ctx); errors.Is(err, base.ErrNotLeader) {
		fmt.Println("node-a:", err)
	}
	stop(a, aEvents)
	stop(b, bEvents)
	// Output:
	// node-a elected, term 1
	// node-b sees node-a
	// node-a unelected from term 1: resigned
	// node-b elected, term 2
	// node-a sees ""
	// node-a sees "node-b"
	// node-a: leaderfeed: not the leader
}

// The work that only the leader may do runs under the leader context of
// its term, which is cancelled the moment leadership ends: on Resign and
// Stop, when another node is seen to have taken over, and when renewals
// fail until the lease runs out. The term is the fencing token to pass to
// what the work writes.
func ExampleFeed_LeaderContext() {
	ctx := context.Background()
	b, err := memory.NewDB().Election("reports")
	if err != nil {
		panic(err)
	}
	feed, err := base.New(b, "node-1", base.Options{})
	if err != nil {
		panic(err)
	}
	events := feed.Subscribe(context.Background()).C
	if err := feed.Start(ctx); err != nil {
		panic(err)
	}
	waitFor(events, base.EventElected) // or read e.LeaderCtx from the event

	leaderCtx, term, ok := feed.LeaderContext()
	fmt.Println("leading:", ok, "term:", term)
	done := make(chan struct{})
	go func() { // the leader's work
		defer close(done)
		<-leaderCtx.Done() // a real job would do its work until then
		fmt.Println("work of term", term, "stopped:", leaderCtx.Err())
	}()

	if err := feed.Resign(ctx); err != nil {
		panic(err)
	}
	<-done
	_, _, ok = feed.LeaderContext()
	fmt.Println("leading:", ok)
	stop(feed, events)
	// Output:
	// leading: true term: 1
	// work of term 1 stopped: context canceled
	// leading: false
}

// Proclaim publishes a new value (here the leader's address) without a new
// election: the leader writes it at once, and every node announces it with
// an EventNewLeader of the same leader and term.
func ExampleFeed_Proclaim() {
	ctx := context.Background()
	store := memory.NewDB()
	newNode := func(id string, opts base.Options) (*base.Feed, <-chan base.Event) {
		b, err := store.Election("api")
		if err != nil {
			panic(err)
		}
		f, err := base.New(b, id, opts)
		if err != nil {
			panic(err)
		}
		events := f.Subscribe(context.Background()).C
		if err := f.Start(ctx); err != nil {
			panic(err)
		}
		return f, events
	}
	leader, lEvents := newNode("node-1", base.Options{Value: []byte("10.0.0.1:8080")})
	waitFor(lEvents, base.EventElected)
	observer, oEvents := newNode("observer", base.Options{ObserveOnly: true})
	e := waitFor(oEvents, base.EventNewLeader)
	fmt.Printf("observer: leader %s at %s\n", e.Leader, e.Value)

	if err := leader.Proclaim(ctx, []byte("10.0.0.2:8080")); err != nil {
		panic(err)
	}
	e = waitFor(oEvents, base.EventNewLeader)
	fmt.Printf("observer: leader %s at %s, term %d\n", e.Leader, e.Value, e.Term)
	stop(observer, oEvents)
	stop(leader, lEvents)
	// Output:
	// observer: leader node-1 at 10.0.0.1:8080
	// observer: leader node-1 at 10.0.0.2:8080, term 1
}

// An observe-only feed follows the election and reports its events, the
// table's changes included, but never campaigns: a dashboard, or a client
// that needs to know where the leader is.
func ExampleOptions_observeOnly() {
	ctx := context.Background()
	store := memory.NewDB()
	b, err := store.Election("scheduler")
	if err != nil {
		panic(err)
	}
	observer, err := base.New(b, "dashboard", base.Options{ObserveOnly: true})
	if err != nil {
		panic(err)
	}
	events := observer.Subscribe(context.Background()).C
	if err := observer.Start(ctx); err != nil {
		panic(err)
	}
	e := waitFor(events, base.EventNewLeader)
	fmt.Printf("leader %q: nobody leads, and the observer will not\n", e.Leader)
	err = observer.Resign(ctx)
	fmt.Println(err, errors.Is(err, base.ErrObserveOnly))
	fmt.Println("IsLeader:", observer.IsLeader())
	stop(observer, events)
	// Output:
	// leader "": nobody leads, and the observer will not
	// leaderfeed: observe-only feed true
	// IsLeader: false
}
