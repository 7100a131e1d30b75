// Command priority shows leadership transfer and preferred leaders.
//
// Three nodes of one election on the in-process memory backend
// participate (Options.Participate: each keeps a presence record) with
// priorities: a canary (-10) that should lead only when nothing else can,
// a node in another zone (0), and a node in the zone the clients are in
// (10). They start one after the other; each time the leader sees a live
// participant of higher priority that has been present for the hysteresis,
// it hands leadership over to it (a node never takes leadership because of
// its priority: it is handed over). Then an operator moves leadership by
// hand (TransferTo, for maintenance of the preferred node): the target
// leads within milliseconds, and the preferred node gets it back after the
// hysteresis. Finally the preferred node shuts down: Stop hands the
// election, in one write, to the live participant of the highest priority
// (not the canary), which leads at once.
//
//	go run ./examples/priority
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// Shrunk timings so the demo is quick (the defaults are 1 s and 2..4 s,
// presence every election timeout, a hysteresis of three of them).
var timing = heartbeat.Timing{
	HeartbeatInterval:  50 * time.Millisecond,
	ElectionTimeoutMin: 200 * time.Millisecond,
	ElectionTimeoutMax: 400 * time.Millisecond,
}

const (
	presenceInterval = 50 * time.Millisecond
	hysteresis       = 300 * time.Millisecond
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// node is one participant.
type node struct {
	id   string
	feed *base.Feed
}

func run(out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := memory.NewDB()
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			_ = n.feed.Stop(context.Background())
		}
	}()
	start := func(id string, priority int) (*node, error) {
		b, err := store.Election("scheduler")
		if err != nil {
			return nil, err
		}
		f, err := base.New(b, id, base.Options{
			Timing: timing, Value: []byte(id + ".internal:8080"),
			Participate: true, Priority: priority,
			PresenceInterval: presenceInterval, PriorityHysteresis: hysteresis,
		})
		if err != nil {
			return nil, err
		}
		n := &node{id: id, feed: f}
		nodes = append(nodes, n)
		fmt.Fprintf(out, "%s starts (priority %d)\n", id, priority)
		return n, f.Start(ctx)
	}
	// waitLeader waits until n leads and says so, with the time it took.
	waitLeader := func(n *node, since time.Time) error {
		for {
			if term, ok := n.feed.Term(); ok {
				fmt.Fprintf(out, "%s leads, term %d (%s)\n", n.id, term, round(time.Since(since)))
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s did not lead: %w", n.id, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}

	canary, err := start("canary", -10)
	if err != nil {
		return err
	}
	if err := waitLeader(canary, time.Now()); err != nil {
		return err
	}
	fmt.Fprintln(out, "-- the canary leads: nothing else can")

	t := time.Now()
	other, err := start("us-1", 0)
	if err != nil {
		return err
	}
	if err := waitLeader(other, t); err != nil {
		return err
	}
	fmt.Fprintln(out, "-- handed over by priority after the hysteresis")

	t = time.Now()
	preferred, err := start("eu-1", 10)
	if err != nil {
		return err
	}
	if err := waitLeader(preferred, t); err != nil {
		return err
	}

	ps, err := preferred.feed.Participants(ctx)
	if err != nil {
		return err
	}
	for _, p := range ps {
		fmt.Fprintf(out, "participant %s priority %d value %s\n", p.Node, p.Priority, p.Value)
	}

	fmt.Fprintln(out, "-- maintenance of eu-1: transfer to us-1 by hand")
	lctx, _, _ := preferred.feed.LeaderContext()
	t = time.Now()
	if err := preferred.feed.TransferTo(ctx, "us-1"); err != nil {
		return err
	}
	fmt.Fprintf(out, "eu-1's leader context ended: %v\n", context.Cause(lctx))
	if err := waitLeader(other, t); err != nil {
		return err
	}
	if !fast(time.Since(t)) {
		return fmt.Errorf("the transfer took %v", time.Since(t))
	}
	fmt.Fprintln(out, "-- the transfer took milliseconds; eu-1 is still present and preferred")
	// Counted from the transfer, which began us-1's term: us-1 sees eu-1
	// at once and hands back once it has seen it for the hysteresis.
	if err := waitLeader(preferred, t); err != nil {
		return err
	}

	// A participating leader that stops hands the election to the live
	// participant of the highest priority it read (without a recent read
	// of the participants it would leave an open vacancy, which any node
	// may win, the canary too).
	fmt.Fprintln(out, "-- eu-1 shuts down: Stop hands over to us-1")
	t = time.Now()
	if err := preferred.feed.Stop(ctx); err != nil {
		return err
	}
	if err := waitLeader(other, t); err != nil {
		return err
	}
	return nil
}

// fast says whether a transfer took less than an election timeout: it did
// not wait for one.
func fast(d time.Duration) bool { return d < timing.ElectionTimeoutMin }

// round describes d for the output: "at once" for a handover that took no
// election timeout, else "after the hysteresis".
func round(d time.Duration) string {
	switch {
	case fast(d):
		return "at once"
	case d >= hysteresis:
		return "after the hysteresis"
	}
	return "after " + d.Round(10*time.Millisecond).String()
}
