// Command quickstart runs an election of three nodes in one process on the
// in-memory backend and shows what leaderfeed does: one leader with a
// fencing token (the term), failover when the leader crashes, and an
// immediate handover when it resigns. It needs no server and exits by
// itself after a few seconds.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// Shrunk timings so the demo is quick: renew every 100 ms, take over after
// 300..600 ms of silence. The defaults are 1 s and 2..4 s.
var timing = heartbeat.Timing{
	HeartbeatInterval:  100 * time.Millisecond,
	ElectionTimeoutMin: 300 * time.Millisecond,
	ElectionTimeoutMax: 600 * time.Millisecond,
}

type node struct {
	id   string
	feed *base.Feed
	// link cuts the node off the store, which to the others is exactly what
	// a crash looks like: no more heartbeats, no resignation.
	link *faulty.Backend
}

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer) error {
	ctx := context.Background()
	start := time.Now()
	var printMu sync.Mutex
	say := func(who, format string, args ...any) {
		printMu.Lock()
		defer printMu.Unlock()
		fmt.Fprintf(out, "%6.3fs  %-7s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	store := memory.NewDB()
	var nodes []*node
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("node-%d", i)
		b, err := store.Election("scheduler")
		if err != nil {
			return err
		}
		link := faulty.Wrap(b)
		f, err := base.New(link, id, base.Options{Timing: timing, Value: []byte(id + ".internal:8080")})
		if err != nil {
			return err
		}
		events := f.Subscribe(context.Background()).C
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range events {
				switch e.Type {
				case base.EventElected:
					say(id, "elected, term %d (the fencing token)", e.Term)
				case base.EventUnelected:
					say(id, "unelected from term %d: %s", e.Term, e.Reason)
				case base.EventNewLeader:
					if e.Leader == "" {
						say(id, "sees no leader")
					} else {
						say(id, "sees leader %s (term %d, value %q)", e.Leader, e.Term, e.Value)
					}
				}
			}
		}()
		nodes = append(nodes, &node{id: id, feed: f, link: link})
	}
	for _, n := range nodes {
		if err := n.feed.Start(ctx); err != nil {
			return err
		}
	}

	leader, err := waitLeader(nodes, nil, 5*time.Second)
	if err != nil {
		return err
	}
	time.Sleep(3 * timing.HeartbeatInterval)

	say(leader.id, "*** crashes (cut off the store without resigning)")
	crashed := leader
	crashed.link.Partition()
	crashAt := time.Now()
	leader, err = waitLeader(nodes, crashed, 5*time.Second)
	if err != nil {
		return err
	}
	// The election timeout counts from the last heartbeat a follower saw,
	// up to one interval before the crash, so this can be under its minimum.
	say(leader.id, "*** took over %v after the crash (election timeout %v..%v from the last heartbeat seen)",
		time.Since(crashAt).Round(time.Millisecond), timing.ElectionTimeoutMin, timing.ElectionTimeoutMax)
	crashed.link.Heal()
	say(crashed.id, "*** is back, as a follower")
	time.Sleep(3 * timing.HeartbeatInterval)

	say(leader.id, "*** resigns")
	resignAt := time.Now()
	resigned := leader
	if err := resigned.feed.Resign(ctx); err != nil {
		return err
	}
	leader, err = waitLeader(nodes, resigned, 5*time.Second)
	if err != nil {
		return err
	}
	say(leader.id, "*** took over %v after the resignation", time.Since(resignAt).Round(time.Microsecond))
	time.Sleep(3 * timing.HeartbeatInterval)

	say("all", "*** stop")
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, n := range nodes {
		if err := n.feed.Stop(stopCtx); err != nil {
			return err
		}
	}
	wg.Wait()
	return nil
}

// waitLeader waits until a node other than except leads.
func waitLeader(nodes []*node, except *node, d time.Duration) (*node, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n != except && n.feed.IsLeader() {
				return n, nil
			}
		}
		time.Sleep(time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "no leader elected")
	return nil, fmt.Errorf("no leader within %v", d)
}
