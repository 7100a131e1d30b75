// Command leaderonly runs a job only while its node leads, and shows why
// the job must pass the term to what it writes.
//
// Two nodes share an election on the in-process memory backend. Each hands
// the job to Feed.Run, which runs it while the node leads, with the context
// of its term (cancelled the moment leadership ends) and the term, its
// fencing token, which the job stamps on every write to a ledger. The ledger refuses a write whose term is lower than one it
// has seen. Then the leader's job freezes between its check of the leader
// context and a write (a long GC pause, a swapped-out VM) while the node is
// cut off from the database: the other node takes over with a higher term,
// and when the frozen job wakes its write arrives late and is refused. The
// leader context alone cannot stop that write; the fencing token does.
//
//	go run ./examples/leaderonly
package main

import (
	"context"
	"errors"
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

// Shrunk timings so the demo is quick (the defaults are 1 s and 2..4 s).
var timing = heartbeat.Timing{
	HeartbeatInterval:  50 * time.Millisecond,
	ElectionTimeoutMin: 200 * time.Millisecond,
	ElectionTimeoutMax: 400 * time.Millisecond,
}

// ErrStaleTerm is what the ledger returns to a writer whose term is older
// than the newest it has seen.
var ErrStaleTerm = errors.New("ledger: stale fencing token")

// Ledger stands for any resource the leader writes to: a table, a bucket,
// a queue. It keeps the highest term it has seen and refuses lower ones.
// In a database this is one extra condition on the write, for example
// UPDATE ... SET ..., term = $term WHERE id = $id AND term <= $term.
type Ledger struct {
	mu      sync.Mutex
	highest uint64
	lines   []string
	wrote   chan struct{} // closed and replaced on every accepted write
}

// NewLedger returns an empty Ledger.
func NewLedger() *Ledger { return &Ledger{wrote: make(chan struct{})} }

// Append writes line on behalf of the leader of term, or refuses it with
// ErrStaleTerm when a later term has written already.
func (l *Ledger) Append(term uint64, line string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term < l.highest {
		return fmt.Errorf("%w: term %d, the ledger is at term %d", ErrStaleTerm, term, l.highest)
	}
	l.highest = term
	l.lines = append(l.lines, line)
	close(l.wrote)
	l.wrote = make(chan struct{})
	return nil
}

// waitTerm waits until a write of term has been accepted.
func (l *Ledger) waitTerm(ctx context.Context, term uint64) error {
	for {
		l.mu.Lock()
		highest, wrote := l.highest, l.wrote
		l.mu.Unlock()
		if highest >= term {
			return nil
		}
		select {
		case <-wrote:
		case <-ctx.Done():
			return fmt.Errorf("no write of term %d: %w", term, ctx.Err())
		}
	}
}

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// node is one process of the demo: a feed on a backend that the demo can
// cut off from the store, and Run running the job while the node leads.
type node struct {
	id     string
	feed   *base.Feed
	link   *faulty.Backend // Partition cuts the node off the store
	freeze chan chan struct{}
	stop   context.CancelFunc // ends Run
	result chan error         // Run's result

	endOnce sync.Once
	endErr  error
}

// end ends the node's Run and returns its result; later calls return the
// same.
func (n *node) end() error {
	n.endOnce.Do(func() {
		n.stop()
		n.endErr = <-n.result
	})
	return n.endErr
}

func run(w io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}

	store := memory.NewDB()
	ledger := NewLedger()

	elected := make(chan *node, 4)
	startNode := func(id string) (*node, error) {
		b, err := store.Election("billing")
		if err != nil {
			return nil, err
		}
		n := &node{id: id, link: faulty.Wrap(b), freeze: make(chan chan struct{}), result: make(chan error, 1)}
		if n.feed, err = base.New(n.link, id, base.Options{Timing: timing}); err != nil {
			return nil, err
		}
		runCtx, stop := context.WithCancel(ctx)
		n.stop = stop
		go func() {
			// Run starts the feed, runs the job each time the node is
			// elected and cancels it when leadership ends; when runCtx
			// ends it waits for the job and stops the feed.
			n.result <- n.feed.Run(runCtx, func(ctx context.Context, term uint64) error {
				say("%s: elected, term %d: starting the job", id, term)
				elected <- n
				n.job(ctx, term, ledger, say)
				return nil
			})
		}()
		return n, nil
	}
	a, err := startNode("node-a")
	if err != nil {
		return err
	}
	defer a.end() //nolint:errcheck // for early returns; a second call returns at once
	if got := <-elected; got != a {
		return fmt.Errorf("%s was elected first", got.id)
	}
	b, err := startNode("node-b")
	if err != nil {
		return err
	}
	defer b.end() //nolint:errcheck // as above
	if err := ledger.waitTerm(ctx, 1); err != nil {
		return err
	}

	// Freeze node-a's job between its check and its write, then cut node-a
	// off the store. Its lease runs out, its leader context is cancelled,
	// and node-b is elected with term 2 and writes.
	release := make(chan struct{})
	a.freeze <- release
	say("node-a: job frozen just before a write; node-a is cut off from the store")
	a.link.Partition()
	select {
	case got := <-elected:
		if got != b {
			return fmt.Errorf("%s was elected, want node-b", got.id)
		}
	case <-ctx.Done():
		return errors.New("node-b was not elected")
	}
	if err := ledger.waitTerm(ctx, 2); err != nil {
		return err
	}

	// The frozen job wakes up and finishes the write it had started.
	close(release)

	if err := a.end(); err != nil { // waits for node-a's job to return
		return err
	}
	if err := b.end(); err != nil { // cancels node-b's job and hands over
		return err
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	say("ledger: %d writes accepted, the last of term %d", len(ledger.lines), ledger.highest)
	return nil
}

// job is the work that only the leader may do. It runs until ctx, which
// Run cancels when leadership of term ends or the node stops, is done, and
// stamps every write with term.
func (n *node) job(ctx context.Context, term uint64, ledger *Ledger, say func(string, ...any)) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for batch := 1; ; batch++ {
		var release chan struct{}
		select {
		case <-ctx.Done():
			say("%s: job of term %d stopped: %v", n.id, term, context.Cause(ctx))
			return
		case <-tick.C:
		case release = <-n.freeze:
		}
		if ctx.Err() != nil { // still the leader? Yes, at this instant...
			continue
		}
		if release != nil {
			<-release // ...but a pause here outlasts the lease
		}
		err := ledger.Append(term, fmt.Sprintf("%s term %d batch %d", n.id, term, batch))
		if errors.Is(err, ErrStaleTerm) {
			say("%s: write refused: %v", n.id, err)
		} else if err != nil {
			say("%s: write failed: %v", n.id, err)
		}
		if batch == 1 && err == nil {
			say("%s: first write of term %d accepted", n.id, term)
		}
	}
}
