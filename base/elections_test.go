package base_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
	"go.uber.org/goleak"
)

// callCounter wraps a BatchStore and counts its write calls (statements).
type callCounter struct {
	backend.BatchStore
	singles, batches, batched, subscribes atomic.Int64
}

func (c *callCounter) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	c.singles.Add(1)
	return c.BatchStore.Heartbeat(ctx, expected, next)
}

func (c *callCounter) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	c.batches.Add(1)
	c.batched.Add(int64(len(writes)))
	return c.BatchStore.HeartbeatBatch(ctx, writes)
}

func (c *callCounter) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	c.subscribes.Add(1)
	return c.BatchStore.Subscribe(ctx)
}

func (c *callCounter) statements() int64 { return c.singles.Load() + c.batches.Load() }

// startFeeds starts n Feeds of node "node" on els, elections e00, e01...
func startFeeds(t *testing.T, els *base.Elections, n int) []*base.Feed {
	t.Helper()
	feeds := make([]*base.Feed, n)
	for i := range feeds {
		f, err := els.Feed(fmt.Sprintf("e%02d", i), "node", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		feeds[i] = f
	}
	return feeds
}

// stopAndClose stops feeds at once, as a process that shuts down would,
// then closes els.
func stopAndClose(t *testing.T, els *base.Elections, feeds []*base.Feed) {
	t.Helper()
	var wg sync.WaitGroup
	for _, f := range feeds {
		wg.Go(func() {
			if err := f.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := els.Close(); err != nil {
		t.Fatal(err)
	}
}

// newElections returns an Elections on a connection of its own to store,
// with the default options; the caller closes it.
func newElections(t *testing.T, store *memory.DB) *base.Elections {
	t.Helper()
	els, err := base.NewElections(store.Conn(), base.ElectionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return els
}

func TestElectionsRejectsBadInput(t *testing.T) {
	if _, err := base.NewElections(nil, base.ElectionsOptions{}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("nil store: %v, want ErrInvalidConfig", err)
	}
	if _, err := base.NewElections(memory.NewDB().Conn(), base.ElectionsOptions{MaxBatch: -1}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("negative MaxBatch: %v, want ErrInvalidConfig", err)
	}
	els, err := base.NewElections(memory.NewDB().Conn(), base.ElectionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer els.Close()
	if _, err := els.Election("bad\x00name"); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("unsafe election name: %v, want ErrInvalidConfig", err)
	}
	b, err := els.Election("e")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := els.Election("e"); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("second Backend of one election: %v, want ErrInvalidConfig", err)
	}
	if _, err := b.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Election: "other", Leader: "n", Term: 1}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("a record of another election: %v, want ErrInvalidConfig", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := els.Election("e"); err != nil {
		t.Errorf("Backend after the first was closed: %v", err)
	}
	if err := els.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := els.Election("f"); !errors.Is(err, base.ErrClosed) {
		t.Errorf("Backend on a closed Elections: %v, want ErrClosed", err)
	}
}

// Renewals of many elections led by one process are aligned and batched:
// at most two write statements per heartbeat interval, one changefeed.
func TestElectionsBatchRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		cc := &callCounter{BatchStore: store.Conn()}
		els, err := base.NewElections(cc, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 50
		feeds := make([]*base.Feed, n)
		// No fault: no renewal may fail (a batched write's own watcher
		// once answered it with its context's error as it was answered).
		var failed atomic.Int64
		trace := &base.Trace{RenewDone: func(ri base.RenewInfo) {
			if ri.Err != nil {
				failed.Add(1)
			}
		}}
		for i := range feeds {
			f, err := els.Feed(fmt.Sprintf("e%02d", i), "node", base.Options{Timing: timing, Trace: trace})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			feeds[i] = f
			// Start them at scattered times, as a real process would.
			time.Sleep(timing.HeartbeatInterval / 7)
		}
		for _, f := range feeds {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(2 * timing.HeartbeatInterval) // renewals fall into step
		synctest.Wait()
		before, recs := cc.statements(), store.Writes()
		const intervals = 20
		time.Sleep(intervals * timing.HeartbeatInterval)
		synctest.Wait()
		stmts, written := cc.statements()-before, store.Writes()-recs
		if written < n*intervals {
			t.Fatalf("%d records written in %d intervals by %d leaders, want at least %d (one renewal each per interval)", written, intervals, n, n*intervals)
		}
		if stmts > 2*intervals+1 {
			t.Fatalf("%d write statements in %d heartbeat intervals for %d elections, want at most two per interval", stmts, intervals, n)
		}
		if got := cc.subscribes.Load(); got != 1 {
			t.Fatalf("%d changefeeds for %d elections, want 1", got, n)
		}
		if got := failed.Load(); got != 0 {
			t.Fatalf("%d renewals failed with no fault in force", got)
		}
		for i, f := range feeds {
			if term, ok := f.Term(); !ok || term != 1 {
				t.Fatalf("election %d lost its term (%d, %v) while renewals were batched", i, term, ok)
			}
		}
		stopAndClose(t, els, feeds)
		t.Logf("%d elections: %d statements for %d records in %d intervals", n, stmts, written, intervals)
	})
}

// Two processes (two Elections on one store) with many elections: each
// election has one leader, and a Stop of one process hands every election
// it led to the other at once.
func TestElectionsHandOverBetweenProcesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		const n = 20
		start := func(node string) (*base.Elections, []*base.Feed) {
			els := newElections(t, store)
			feeds := make([]*base.Feed, n)
			for i := range feeds {
				f, err := els.Feed(fmt.Sprintf("e%02d", i), node, base.Options{Timing: timing})
				if err != nil {
					t.Fatal(err)
				}
				if err := f.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				feeds[i] = f
			}
			return els, feeds
		}
		elsA, a := start("a")
		for _, f := range a {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		elsB, b := start("b")
		time.Sleep(5 * timing.HeartbeatInterval)
		for i := range a {
			if !a[i].IsLeader() || b[i].IsLeader() {
				t.Fatalf("election %d: a leads %v, b leads %v; want a only", i, a[i].IsLeader(), b[i].IsLeader())
			}
		}
		stopped := time.Now()
		if err := elsA.Close(); err != nil { // the process ends: stores close
			t.Fatal(err)
		}
		for _, f := range a {
			ctx, cancel := context.WithTimeout(context.Background(), timing.HeartbeatInterval)
			err := f.Stop(ctx)
			cancel()
			if err != nil && !errors.Is(err, base.ErrClosed) {
				t.Fatalf("Stop after its store closed: %v", err)
			}
		}
		for i, f := range b {
			for !f.IsLeader() {
				if time.Since(stopped) > 2*timing.ElectionTimeoutMax {
					t.Fatalf("election %d has no leader %v after process a closed", i, time.Since(stopped))
				}
				time.Sleep(time.Millisecond)
			}
		}
		for _, f := range b {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if err := elsB.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// Observers of one election share an Elections (and its one changefeed)
// with the node that campaigns, and write nothing.
func TestElectionsObservers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		cc := &callCounter{BatchStore: store.Conn()}
		els, err := base.NewElections(cc, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		leader, err := els.Feed("e", "leader", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		var observers []*base.Feed
		for i := range 10 {
			f, err := els.Feed("e", fmt.Sprintf("observer-%d", i), base.Options{Timing: timing, ObserveOnly: true})
			if err != nil {
				t.Fatalf("observer %d: %v", i, err)
			}
			observers = append(observers, f)
		}
		for _, f := range append(observers, leader) {
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for !leader.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(timing.HeartbeatInterval)
		synctest.Wait()
		for i, f := range observers {
			if r, ok := f.Leader(); !ok || r.Leader != "leader" {
				t.Errorf("observer %d sees %v, want the leader", i, r)
			}
		}
		if got := cc.subscribes.Load(); got != 1 {
			t.Errorf("%d changefeeds for a leader and 10 observers, want 1", got)
		}
		ob, _ := els.Observer("e")
		if _, err := ob.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Leader: "x", Term: 9}); !errors.Is(err, base.ErrObserveOnly) {
			t.Errorf("Heartbeat of an Observer backend: %v, want ErrObserveOnly", err)
		}
		_ = ob.Close()
		for _, f := range append(observers, leader) {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// readCounter counts a store's reads; every Get waits for gate, so that
// once the Elections has as many reads in flight as it allows, the reads
// of the other elections pile up behind them.
type readCounter struct {
	*memory.Conn
	gate            chan struct{}
	gets, getBatchs atomic.Int64
	batchedReads    atomic.Int64
}

func (c *readCounter) Get(ctx context.Context, election string) (heartbeat.Record, error) {
	c.gets.Add(1)
	<-c.gate
	return c.Conn.Get(ctx, election)
}

func (c *readCounter) GetBatch(ctx context.Context, elections []string) ([]backend.ReadResult, error) {
	c.getBatchs.Add(1)
	c.batchedReads.Add(int64(len(elections)))
	return c.Conn.GetBatch(ctx, elections)
}

// Elections whose Feeds read their records at once (all starting, or all
// reopening the shared changefeed after it failed) read them in one
// GetBatch while a read is in flight, not one Get each.
func TestElectionsBatchReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rc := &readCounter{Conn: memory.NewDB().Conn(), gate: make(chan struct{})}
		els, err := base.NewElections(rc, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 40
		feeds := startFeeds(t, els, n)
		synctest.Wait() // every Feed waits for its read; the reads in flight hold the store
		held := rc.gets.Load()
		if held >= n {
			t.Fatalf("all %d reads in flight at once, as single Gets: no bound on the reads in flight", held)
		}
		close(rc.gate)
		synctest.Wait() // the reads that waited are answered; no time has passed
		gets, batches, batched := rc.gets.Load(), rc.getBatchs.Load(), rc.batchedReads.Load()
		// The reads that waited behind those in flight went out in
		// batches; reads that find a batch free to start (a Feed's second
		// read, when its feed is open) go alone at once, as they should.
		if batches == 0 || batched < n-held {
			t.Errorf("%d elections read in %d Gets (%d held) and %d GetBatch calls of %d elections; want the %d reads that waited in batches", n, gets, held, batches, batched, n-held)
		}
		t.Logf("%d elections: %d Gets, %d GetBatch calls of %d elections", n, gets, batches, batched)
		for _, f := range feeds {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		stopAndClose(t, els, feeds)
	})
}

// checkingStore fails the test if a batch carries a write that breaks the
// record rules: Elections checks them once, for every store.
type checkingStore struct {
	*callCounter
	t *testing.T
}

func (c checkingStore) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	for _, w := range writes {
		if err := w.Next.Validate(); err != nil {
			c.t.Errorf("the store was sent a write that breaks the record rules: %v", err)
		}
	}
	return c.callCounter.HeartbeatBatch(ctx, writes)
}

func TestElectionsValidateBatchOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		cs := checkingStore{&callCounter{BatchStore: store.Conn()}, t}
		els, err := base.NewElections(cs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			b, err := els.Election(fmt.Sprintf("e%d", i))
			if err != nil {
				t.Fatal(err)
			}
			next := heartbeat.Record{Election: b.Name(), Leader: "node", Term: 1, Lease: time.Second}
			claimed, err := b.Heartbeat(context.Background(), heartbeat.Record{}, next)
			if err != nil {
				t.Fatal(err)
			}
			if i == 3 {
				next.Value = make([]byte, heartbeat.MaxValueLen+1) // breaks the rules
			}
			// Renewals, unlike claims, wait to share a batch.
			wg.Go(func() { _, errs[i] = b.Heartbeat(context.Background(), claimed, next) })
		}
		wg.Wait()
		for i, err := range errs {
			switch {
			case i == 3 && !errors.Is(err, base.ErrInvalidConfig):
				t.Errorf("the write breaking the rules: %v, want an error matching ErrInvalidConfig", err)
			case i != 3 && err != nil:
				t.Errorf("write %d failed beside one that breaks the rules: %v", i, err)
			}
		}
		if cs.batches.Load() == 0 {
			t.Fatalf("the %d writes were sent one by one (%d statements), not in a batch", n, cs.statements())
		}
	})
}

// The channel of an election's Subscribe coalesces the records its reader
// has not taken (it sees at most two older records before the latest), and
// a reader that lets more than maxFeedQueue other changes wait gets one
// Failed instead of them, after which the channel closes.
func TestElectionsSubscribeCoalescesAndFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		els := newElections(t, store)
		defer els.Close()
		b, err := els.Election("e")
		if err != nil {
			t.Fatal(err)
		}
		ch, err := b.Subscribe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var last heartbeat.Record
		for i := range 50 {
			next := heartbeat.Record{Election: "e", Leader: "n", Term: 1, Lease: time.Second, Value: fmt.Appendf(nil, "%d", i)}
			if last, err = b.Heartbeat(t.Context(), last, next); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		var got []heartbeat.Record
		for len(ch) > 0 || len(got) == 0 {
			n := <-ch
			if n.Type != backend.RecordChanged {
				t.Fatalf("notification %v, want RecordChanged", n)
			}
			got = append(got, n.Record)
			synctest.Wait()
		}
		if len(got) > 3 || got[len(got)-1].Revision != last.Revision {
			t.Fatalf("the reader got %d records, the last of revision %d; want at most 3, the last of revision %d", len(got), got[len(got)-1].Revision, last.Revision)
		}

		for i := range 5000 {
			if err := store.Put(fmt.Sprintf("k%d", i), i); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		changes, failed := 0, 0
		for n := range ch {
			switch n.Type {
			case backend.OtherChanged:
				changes++
			case backend.Failed:
				failed++
			default:
				t.Fatalf("notification %v, want changes then Failed", n)
			}
		}
		if failed != 1 || changes > 4097 || changes == 5000 {
			t.Fatalf("%d changes and %d Failed, want at most 4097 changes, then one Failed", changes, failed)
		}
	})
}

// Close leaves no goroutine of the Elections behind once its Feeds have
// stopped: the goroutines its elections share have ended when it returns
// (goleak, which waits for goroutines on their way out, checks the rest).
func TestElectionsCloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := memory.NewDB()
	for range 5 {
		els := newElections(t, store)
		feeds := startFeeds(t, els, 20)
		for _, f := range feeds {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		stopAndClose(t, els, feeds)
		if n := base.SharedGoroutines(els); n != 0 {
			t.Fatalf("%d shared goroutines still serve after Close", n)
		}
	}
}

// funcStore gives a store the changefeed of backend.FuncSubscriber, as
// package postgres's Store has (each notification handed to a function on
// the store's goroutine): it reads the store's channel on a goroutine of
// its own. It records how many of its feeds were still open when it was
// closed.
type funcStore struct {
	backend.BatchStore
	open, openAtClose atomic.Int64
}

func (s *funcStore) Close() error {
	s.openAtClose.Store(s.open.Load())
	return s.BatchStore.Close()
}

func (s *funcStore) SubscribeFunc(ctx context.Context, deliver func(backend.Notification)) (func(), error) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := s.Subscribe(fctx)
	if err != nil {
		cancel()
		return nil, err
	}
	s.open.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := range ch {
			deliver(n)
			if n.Type == backend.Failed {
				break
			}
		}
		cancel()
		for range ch {
		}
	}()
	var once sync.Once
	return func() {
		cancel()
		<-done
		once.Do(func() { s.open.Add(-1) })
	}, nil
}

// An Elections on a store whose changefeed calls a function dispatches the
// notifications on that store's goroutine: one store feed serves every
// subscription; when it fails, each subscription gets Failed and the next
// Subscribe opens a new one; Close ends it.
func TestElectionsFuncFeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.NewDB()
		store := &funcStore{BatchStore: db.Conn()}
		// faulty forwards the func feed (and breaks it: BreakFeed).
		fs := faulty.WrapStore(store)
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		writer := db.Conn()
		var last heartbeat.Record
		write := func(value string) heartbeat.Record {
			t.Helper()
			next := heartbeat.Record{Election: "e", Leader: "n", Term: 1, Lease: time.Second, Value: []byte(value)}
			if last, err = writer.Heartbeat(t.Context(), last, next); err != nil {
				t.Fatal(err)
			}
			return last
		}
		election := func(name string) backend.Election {
			t.Helper()
			b, err := els.Election(name)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		e, f := election("e"), election("f")
		subscribe := func(b backend.Election) <-chan backend.Notification {
			t.Helper()
			ch, err := b.Subscribe(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		recv := func(ch <-chan backend.Notification) backend.Notification {
			t.Helper()
			synctest.Wait()
			select {
			case n := <-ch:
				return n
			default:
				t.Fatal("no notification")
				return backend.Notification{}
			}
		}
		e1, e2, other := subscribe(e), subscribe(e), subscribe(f)
		r := write("1")
		for i, ch := range []<-chan backend.Notification{e1, e2} {
			if n := recv(ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
				t.Fatalf("subscription %d: %v %+v, want the record", i, n.Type, n.Record)
			}
		}
		synctest.Wait()
		if len(other) != 0 {
			t.Fatal("a record of election e reached a subscription of f")
		}
		if n := fs.Calls(faulty.MethodSubscribe); n != 1 {
			t.Fatalf("%d store feeds for three subscriptions, want 1", n)
		}

		fs.BreakFeed(nil)
		for i, ch := range []<-chan backend.Notification{e1, e2, other} {
			if n := recv(ch); n.Type != backend.Failed || !errors.Is(n.Err, faulty.ErrInjected) {
				t.Fatalf("subscription %d after the break: %v (%v), want Failed", i, n.Type, n.Err)
			}
			if _, ok := <-ch; ok {
				t.Fatalf("subscription %d: a notification after Failed", i)
			}
		}
		e3 := subscribe(e)
		if n := fs.Calls(faulty.MethodSubscribe); n != 2 {
			t.Fatalf("%d store feeds after the break, want 2", n)
		}
		r = write("2")
		if n := recv(e3); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
			t.Fatalf("after reopening: %v %+v, want the record", n.Type, n.Record)
		}

		if err := els.Close(); err != nil {
			t.Fatal(err)
		}
		if n := recv(e3); n.Type != backend.Failed || !errors.Is(n.Err, base.ErrClosed) {
			t.Fatalf("after Close: %v (%v), want Failed matching ErrClosed", n.Type, n.Err)
		}
		if n := store.openAtClose.Load(); n != 0 {
			t.Fatalf("%d store feeds not cancelled before the store closed", n)
		}
		// synctest.Test fails if the store feed's goroutine outlives it.
	})
}

// Issue 43: the elections of a process that crashed fail over in about
// the time one election does. Each follower would claim at a timeout
// drawn for it alone, and with a wide election timeout a thousand draws
// spread the failovers over all of it; a process judges a silent leader
// for all its elections at once instead (machine.onSilent): one new term
// each, no fight. Which process takes which election is not promised:
// an election that case 1 does not yet allow to be claimed when both
// processes hear of the silence is claimed by both at the first instant
// it allows, and one claim wins.
func TestElectionsMassFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tm := heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, LeaseDuration: 30 * time.Millisecond,
			ElectionTimeoutMin: 40 * time.Millisecond, ElectionTimeoutMax: 400 * time.Millisecond}
		store := memory.NewDB()
		const n = 50
		start := func(node string) (*base.Elections, *faulty.Store, []*base.Feed) {
			fs := faulty.WrapStore(store.Conn())
			els, err := base.NewElections(fs, base.ElectionsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			feeds := make([]*base.Feed, n)
			for i := range feeds {
				f, err := els.Feed(fmt.Sprintf("e%02d", i), node, base.Options{Timing: tm})
				if err != nil {
					t.Fatal(err)
				}
				if err := f.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				feeds[i] = f
			}
			return els, fs, feeds
		}
		elsA, fsA, a := start("a")
		for _, f := range a {
			for !f.IsLeader() {
				time.Sleep(time.Millisecond)
			}
		}
		elsB, _, b := start("b")
		elsC, _, c := start("c")
		time.Sleep(5 * tm.HeartbeatInterval)
		terms := make([]uint64, n)
		for i, f := range a {
			_, term, ok := f.LeaderContext()
			if !ok {
				t.Fatalf("election %d: a does not lead", i)
			}
			terms[i] = term
		}
		fsA.Partition() // a crashes: it writes nothing more
		crashed := time.Now()
		// Every election's wait runs from its last renewal, at most a
		// heartbeat before the crash. The first of a process's 50 timeouts
		// fires within an eighth of the span of ElectionTimeoutMin (all
		// 100 later: p < 2e-6), and the process hears of the silent
		// leader within a sixteenth more. Without that, all 50 failovers
		// within this bound would have p < 1e-29.
		span := tm.ElectionTimeoutMax - tm.ElectionTimeoutMin
		bound := tm.ElectionTimeoutMin + span/8 + span/16 + 2*tm.HeartbeatInterval
		var byB int
		for i := range n {
			for !b[i].IsLeader() && !c[i].IsLeader() {
				if time.Since(crashed) > bound {
					t.Fatalf("election %d has no leader %v after its leader crashed; want all within %v", i, time.Since(crashed), bound)
				}
				time.Sleep(time.Millisecond)
			}
			if b[i].IsLeader() {
				byB++
			}
		}
		took := time.Since(crashed)
		time.Sleep(5 * tm.HeartbeatInterval)
		for i := range n {
			f := b[i]
			if c[i].IsLeader() {
				f = c[i]
			}
			if _, term, ok := f.LeaderContext(); !ok || term != terms[i]+1 {
				t.Errorf("election %d: term %d (leading %v), want %d: one new term, no fight", i, term, ok, terms[i]+1)
			}
		}
		t.Logf("all %d elections failed over within %v; b took %d, c %d", n, took, byB, n-byB)
		for _, p := range []struct {
			els   *base.Elections
			feeds []*base.Feed
		}{{elsB, b}, {elsC, c}} {
			stopAndClose(t, p.els, p.feeds)
		}
		fsA.Heal()
		stopAndClose(t, elsA, a)
	})
}

// Issue 41: a participant's Resign on an Elections (presence batched)
// reads the participants for its handover without waiting for a batch
// window, and hands the election in one write to the participant that
// joined last.
func TestElectionsResignHandsOverAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		opts := base.Options{Timing: timing, Participate: true}
		start := func(node string) (*base.Elections, *base.Feed) {
			els := newElections(t, store)
			f, err := els.Feed("e", node, opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			return els, f
		}
		elsA, a := start("a")
		for !a.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		elsB, b := start("b")
		time.Sleep(timing.HeartbeatInterval)
		elsC, c := start("c") // joined last
		time.Sleep(2 * timing.HeartbeatInterval)
		_, term, _ := a.LeaderContext()
		t0 := time.Now()
		if err := a.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !c.IsLeader() {
			if b.IsLeader() {
				t.Fatal("b leads: the successor is not the participant that joined last")
			}
			if time.Since(t0) > timing.ElectionTimeoutMin {
				t.Fatalf("c does not lead %v after a's Resign", time.Since(t0))
			}
			time.Sleep(100 * time.Microsecond)
		}
		// No store call takes time here: what would is a batch window
		// (47 ms for this read's deadline).
		if d := time.Since(t0); d > time.Millisecond {
			t.Errorf("c leads %v after the Resign, want within the polling step (a batch window waited for?)", d)
		}
		if _, got, _ := c.LeaderContext(); got != term+1 {
			t.Errorf("c leads term %d, want %d: one write", got, term+1)
		}
		for _, p := range []struct {
			els *base.Elections
			f   *base.Feed
		}{{elsA, a}, {elsB, b}, {elsC, c}} {
			stopAndClose(t, p.els, []*base.Feed{p.f})
		}
	})
}

// Issue 41: a participant is a successor as soon as Start returned: its
// first presence write carries a token, so a leader stopped right after
// it joined hands the election to it in one write (a rolling restart
// stops the old leader as soon as the new node runs).
func TestStartedParticipantIsASuccessorAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		start := func(node string) *base.Feed {
			b, _ := store.Election("e")
			f, err := base.New(b, node, base.Options{Timing: timing, Participate: true, PresenceInterval: timing.LeaseDuration / 2})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			return f
		}
		a := start("a")
		for !a.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(timing.LeaseDuration) // a's Priority check read the participants
		b := start("b")                  // no refresh of its presence yet
		events := b.Events()
		_, term, _ := a.LeaderContext()
		if err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if _, got, ok := b.LeaderContext(); !ok || got != term+1 {
			t.Fatalf("b leads %v in term %d right after a stopped, want term %d", ok, got, term+1)
		}
		for e := range events {
			if e.Type == base.EventElected {
				if e.Record.Handover == 0 {
					t.Fatalf("b elected on %v: want the record a handed it over with, not a claim of a vacancy", e.Record)
				}
				break
			}
		}
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		for range events { // what Stop left for the reader
		}
	})
}

// startNode starts node id in election "e" of store, its backend wrapped
// in a fault injector.
func startNode(t *testing.T, store *memory.DB, id string, opts base.Options) (*base.Feed, *faulty.Backend) {
	t.Helper()
	e, _ := store.Election("e")
	fb := faulty.Wrap(e)
	f, err := base.New(fb, id, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, fb
}

// startLeader starts node id as startNode does, in a bubble, and waits
// until it leads.
func startLeader(t *testing.T, store *memory.DB, id string, opts base.Options) (*base.Feed, *faulty.Backend) {
	t.Helper()
	f, fb := startNode(t, store, id, opts)
	for !f.IsLeader() {
		time.Sleep(time.Millisecond)
	}
	return f, fb
}

// Issue 41: a stopping leader reads the participants for its handover
// only once the delete of its own presence record is done, one call after
// the other: side by side they needed two of a pool's connections at that
// moment, and a pgx pool holding one opened another (5-10 ms of the
// rollout's gap on PostgreSQL). The read is then never older than the
// withdrawal.
func TestStoppingLeaderReadsAfterItsWithdrawal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		opts := base.Options{Timing: timing, Participate: true}
		a, fa := startLeader(t, store, "a", opts)
		b, _ := startNode(t, store, "b", opts)
		time.Sleep(2 * timing.HeartbeatInterval)
		_, term, _ := a.LeaderContext()
		const deleteTakes = 10 * time.Millisecond
		fa.Inject(faulty.Fault{Method: faulty.MethodAbsent, Nth: 1, Delay: deleteTakes, Late: true})
		reads := fa.Calls(faulty.MethodParticipants)
		stopped := make(chan error, 1)
		go func() { stopped <- a.Stop(context.Background()) }()
		time.Sleep(deleteTakes / 2)
		synctest.Wait()
		if n := fa.Calls(faulty.MethodAbsent); n != 1 {
			t.Fatalf("%d deletes of a's presence under way, want 1", n)
		}
		if n := fa.Calls(faulty.MethodParticipants) - reads; n != 0 {
			t.Fatalf("%d reads of the participants while a's delete is under way, want 0", n)
		}
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if n := fa.Calls(faulty.MethodParticipants) - reads; n != 1 {
			t.Fatalf("%d reads of the participants for the handover, want 1", n)
		}
		synctest.Wait() // b takes the handover from its changefeed
		if _, got, ok := b.LeaderContext(); !ok || got != term+1 {
			t.Fatalf("b leads %v in term %d after a stopped, want term %d (a handover)", ok, got, term+1)
		}
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Issue 43: on a store with the guarded write (memory), Resign hands over
// from the leader's last read of the participants, with no read at that
// moment: the handover is one write. A participant that withdrew since
// that read (its Stop deleted its presence) is not named: the guarded
// write fails, the leader reads and hands over to the one still there.
func TestResignHandsOverWithoutARead(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("c stopped %v", stop), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewDB()
				opts := base.Options{Timing: timing, Participate: true}
				a, fa := startLeader(t, store, "a", opts)
				b, _ := startNode(t, store, "b", opts)
				c, _ := startNode(t, store, "c", opts) // joins last: the first choice
				time.Sleep(2 * timing.HeartbeatInterval)
				synctest.Wait() // a's Priority check has read b and c
				_, term, _ := a.LeaderContext()
				reads, guarded := fa.Calls(faulty.MethodParticipants), fa.Calls(faulty.MethodHeartbeatGuarded)
				want, wantReads, wantWrites, left := c, 0, 1, []*base.Feed{a, b, c}
				if stop {
					// c withdraws after a's last read: a's first write
					// names c, is refused, and a reads and hands over to b.
					if err := c.Stop(context.Background()); err != nil {
						t.Fatal(err)
					}
					want, wantReads, wantWrites, left = b, 1, 2, left[:2]
				}
				if err := a.Resign(context.Background()); err != nil {
					t.Fatalf("Resign: %v", err)
				}
				if n := fa.Calls(faulty.MethodParticipants) - reads; n != wantReads {
					t.Fatalf("%d reads of the participants for the handover, want %d", n, wantReads)
				}
				if n := fa.Calls(faulty.MethodHeartbeatGuarded) - guarded; n != wantWrites {
					t.Fatalf("%d guarded writes, want %d", n, wantWrites)
				}
				synctest.Wait() // the successor takes the handover from its changefeed
				if _, got, ok := want.LeaderContext(); !ok || got != term+1 {
					t.Fatalf("the successor leads %v in term %d, want term %d (the handover)", ok, got, term+1)
				}
				for _, f := range left {
					if err := f.Stop(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			})
		})
	}
}

// A Resign that reads the participants (no recent read of its own) on a
// store whose read hangs: a Stop meanwhile returns by its deadline. The
// read ends with the engine, not only after a presence interval: Resign's
// context may have no deadline, and Stop waits for the read's goroutine.
func TestStopEndsAResignsRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		a, fa := startLeader(t, store, "a", base.Options{Timing: timing, Participate: true, PresenceInterval: timing.LeaseDuration / 2})
		fa.Inject(faulty.Fault{Method: faulty.MethodParticipants, Hang: true})
		resigned := make(chan error, 1)
		go func() { resigned <- a.Resign(context.Background()) }()
		synctest.Wait() // the read hangs
		if n := fa.Calls(faulty.MethodParticipants); n == 0 {
			t.Fatal("Resign did not read the participants: the test needs a leader without a recent read")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := a.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop = %v, want its context's deadline", err)
		}
		if d := time.Since(start); d > time.Millisecond {
			t.Fatalf("Stop returned %v after it was called, %v after its deadline", d, d-time.Millisecond)
		}
		if err := <-resigned; !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Resign = %v, want ErrClosed", err)
		}
	})
}

// A transfer whose target withdraws while the guarded write is on its
// way: the store refuses the write, the leader reads the participants and
// hands the election to the next one, and TransferTo says the target left
// (ErrUnknownParticipant).
func TestTransferTargetWithdrawsBeforeTheWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		opts := base.Options{Timing: timing, Participate: true}
		a, fa := startLeader(t, store, "a", opts)
		feeds := map[string]*base.Feed{}
		for _, id := range []string{"b", "c"} {
			feeds[id], _ = startNode(t, store, id, opts)
		}
		time.Sleep(2 * timing.HeartbeatInterval)
		synctest.Wait() // a's Priority check has read b and c
		_, term, _ := a.LeaderContext()
		const writeTakes = 5 * time.Millisecond
		fa.Inject(faulty.Fault{Method: faulty.MethodHeartbeatGuarded, Nth: 1, Delay: writeTakes})
		done := make(chan error, 1)
		go func() { done <- a.TransferTo(context.Background(), "b") }()
		time.Sleep(writeTakes / 2)
		if err := feeds["b"].Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, base.ErrUnknownParticipant) {
			t.Fatalf("TransferTo b, which withdrew before the write = %v, want ErrUnknownParticipant", err)
		}
		synctest.Wait()
		if _, got, ok := feeds["c"].LeaderContext(); !ok || got != term+1 {
			t.Fatalf("c leads %v in term %d, want term %d: the next participant, handed the election", ok, got, term+1)
		}
		for _, f := range []*base.Feed{a, feeds["c"]} {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// unguarded is a wrapper that forwards an Election's presence capability
// but not its guarded write (backend.GuardElection), as a user's wrapper
// written before it might.
type unguarded struct{ backend.PresenceElection }

// Behind a wrapper without the guarded write, every Resign reads the
// participants at that moment and hands over in one unguarded write, as
// before the guard (the loop answers the guarded attempt with
// ErrUnsupported, without I/O).
func TestResignBehindAWrapperWithoutTheGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		opts := base.Options{Timing: timing, Participate: true}
		ea, _ := store.Election("e")
		fa := faulty.Wrap(ea)
		a, err := base.New(unguarded{fa}, "a", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !a.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		b, _ := startNode(t, store, "b", opts)
		for round := range 2 {
			time.Sleep(2 * timing.HeartbeatInterval)
			synctest.Wait() // a's Priority check has read b
			_, term, _ := a.LeaderContext()
			reads, writes := fa.Calls(faulty.MethodParticipants), fa.Calls(faulty.MethodHeartbeat)
			if err := a.Resign(context.Background()); err != nil {
				t.Fatalf("round %d: Resign: %v", round, err)
			}
			if n := fa.Calls(faulty.MethodParticipants) - reads; n != 1 {
				t.Fatalf("round %d: %d reads of the participants for the handover, want 1", round, n)
			}
			if n := fa.Calls(faulty.MethodHeartbeat) - writes; n != 1 {
				t.Fatalf("round %d: %d writes for the handover, want 1", round, n)
			}
			synctest.Wait()
			if r, _ := b.Leader(); r.Leader != "b" || r.Term != term+1 || r.Handover == 0 {
				t.Fatalf("round %d: the record is %v, want b handed term %d in one write", round, r, term+1)
			}
			if fa.Calls(faulty.MethodHeartbeatGuarded) != 0 {
				t.Fatal("the guarded write reached the store behind a wrapper that does not forward it")
			}
			time.Sleep(2 * timing.HeartbeatInterval)
			if err := b.TransferTo(context.Background(), "a"); err != nil {
				t.Fatalf("round %d: TransferTo a: %v", round, err)
			}
			synctest.Wait()
		}
		for _, f := range []*base.Feed{a, b} {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A participant's first presence refresh is due a PresenceInterval after
// Start sent its first presence write, not after Start returned: a node
// held up between the two (here the write's reply comes late; in a
// process, a stall under load) still offers a token at most about an
// interval old, young enough for a leader's handover in one write. Due an
// interval after Start returned, its token was almost two intervals old
// before the refresh replaced it.
func TestFirstPresenceRefreshFollowsTheJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		a, _ := startLeader(t, store, "a", base.Options{Timing: timing})
		pi := timing.LeaseDuration / 4
		late := pi * 9 / 10
		e, _ := store.Election("e")
		fb := faulty.Wrap(e)
		fb.Inject(faulty.Fault{Method: faulty.MethodPresent, Nth: 1, DelayReply: late})
		f, err := base.New(fb, "b", base.Options{Timing: timing, Participate: true, PresenceInterval: pi})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d != late {
			t.Fatalf("Start took %v, want the join write's late reply, %v", d, late)
		}
		fb.Heal()
		time.Sleep(pi - late - time.Millisecond)
		synctest.Wait()
		if n := fb.Calls(faulty.MethodPresent); n != 1 {
			t.Fatalf("%d presence writes %v after the join was sent, want the join alone", n, time.Since(t0))
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n := fb.Calls(faulty.MethodPresent); n != 2 {
			t.Fatalf("%d presence writes one PresenceInterval (%v) after the join was sent, want the join and the first refresh", n, pi)
		}
		if f.IsLeader() || !a.IsLeader() {
			t.Fatal("b leads: a leader reads the participants, and refreshes its presence, at once")
		}
		for _, f := range []*base.Feed{f, a} {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
