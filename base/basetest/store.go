package basetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// openStore opens, starts and creates a Store, closed at cleanup.
func (s *suite) openStore(t *testing.T) backend.Store {
	t.Helper()
	st, err := s.h.OpenStore(t)
	if err != nil {
		t.Fatalf("Harness.OpenStore: %v", err)
	}
	if st == nil {
		t.Fatal("Harness.OpenStore returned a nil store")
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := ctxFor(t)
	if err := st.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := st.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return st
}

func storeWrite(t *testing.T, st backend.Store, expected heartbeat.Record, election, leader string, term uint64) heartbeat.Record {
	t.Helper()
	r, err := st.Heartbeat(ctxFor(t), expected, heartbeat.Record{Election: election, Leader: leader, Term: term})
	if err != nil {
		t.Fatalf("Heartbeat(%s, expected %v): %v", election, expected, err)
	}
	if r.Election != election {
		t.Fatalf("Heartbeat of %s returned a record of %q", election, r.Election)
	}
	return r
}

func storeSubscribe(t *testing.T, st backend.Store) <-chan backend.Notification {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := st.Subscribe(ctx)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch
}

// stores runs the rules of the Store contract (Harness.OpenStore set).
func (s *suite) stores(t *testing.T) {
	rule(t, "A Store's changefeed carries the records of every election, each with its election", func(t *testing.T) {
		st := s.openStore(t)
		ch := storeSubscribe(t, st)
		e1, e2 := Election(), Election()
		r1 := storeWrite(t, st, heartbeat.Record{}, e1, "a", 1)
		r2 := storeWrite(t, st, heartbeat.Record{}, e2, "b", 1)
		r1b := storeWrite(t, st, r1, e1, "a", 1)
		want := map[string][]uint64{e1: {r1.Revision, r1b.Revision}, e2: {r2.Revision}}
		got := map[string][]uint64{}
		deadline := time.After(feedWait)
		for len(got[e1]) < 2 || len(got[e2]) < 1 {
			select {
			case n, ok := <-ch:
				if !ok || n.Type == backend.Failed {
					t.Fatalf("feed ended: %v", n.Err)
				}
				if n.Type == backend.RecordChanged && (n.Record.Election == e1 || n.Record.Election == e2) {
					got[n.Record.Election] = append(got[n.Record.Election], n.Record.Revision)
				}
			case <-deadline:
				t.Fatalf("within %v the feed gave %v, want %v", feedWait, got, want)
			}
		}
		for e, revs := range want {
			for i, rev := range revs {
				if got[e][i] != rev {
					t.Fatalf("election %s: revisions %v on the feed, want %v in commit order", e, got[e], revs)
				}
			}
		}
	})

	rule(t, "Writes and conflicts of one election never touch another", func(t *testing.T) {
		st := s.openStore(t)
		e1, e2 := Election(), Election()
		r1 := storeWrite(t, st, heartbeat.Record{}, e1, "a", 1)
		r2 := storeWrite(t, st, heartbeat.Record{}, e2, "a", 1)
		// A conflict in e2 (a stale claim) leaves e1 alone, and e1's
		// revision means nothing to e2.
		_, err := st.Heartbeat(ctxFor(t), heartbeat.Record{}, heartbeat.Record{Election: e2, Leader: "b", Term: 2})
		var ce *backend.ConflictError
		if !errors.As(err, &ce) || !ce.Current.Equal(r2) {
			t.Fatalf("stale claim of %s: %v, want a conflict carrying %v", e2, err, r2)
		}
		r1b := storeWrite(t, st, r1, e1, "a", 1)
		got2, err := st.Get(ctxFor(t), e2)
		if err != nil || !got2.Equal(r2) {
			t.Fatalf("Get(%s) = %v, %v after writes of %s; want %v unchanged", e2, got2, err, e1, r2)
		}
		if got1, err := st.Get(ctxFor(t), e1); err != nil || !got1.Equal(r1b) {
			t.Fatalf("Get(%s) = %v, %v; want %v", e1, got1, err, r1b)
		}
	})

	if s.h.WriteMalformed != nil {
		rule(t, "A malformed record of one election touches no other: reads, writes and the feed go on", func(t *testing.T) {
			st := s.openStore(t)
			ch := storeSubscribe(t, st)
			bad, good := Election(), Election()
			if err := s.h.WriteMalformed(ctxFor(t), bad); err != nil {
				t.Fatalf("WriteMalformed: %v", err)
			}
			n := nextStore(t, ch, "the malformed record reported", func(n backend.Notification) bool {
				return n.Type == backend.Ignored || (n.Type == backend.RecordChanged && n.Record.Election == bad)
			})
			if n.Type != backend.Ignored || !errors.Is(n.Err, backend.ErrMalformedRecord) {
				t.Fatalf("malformed record of %s arrived as %v (%v), want Ignored matching ErrMalformedRecord", bad, n.Type, n.Err)
			}
			if n.Election != bad {
				t.Fatalf("Ignored notification names election %q, want %q", n.Election, bad)
			}
			r := storeWrite(t, st, heartbeat.Record{}, good, "a", 1)
			nextStore(t, ch, "the other election's record after the malformed one", func(n backend.Notification) bool {
				return n.Type == backend.RecordChanged && n.Record.Election == good && n.Record.Revision == r.Revision
			})
			if _, err := st.Get(ctxFor(t), bad); !errors.Is(err, backend.ErrMalformedRecord) {
				t.Fatalf("Get(%s): %v, want ErrMalformedRecord", bad, err)
			}
		})
	}

	rule(t, "A batched write gives each election exactly what a single compare-and-set would", func(t *testing.T) {
		st := s.openStore(t)
		bs, ok := st.(backend.BatchStore)
		if !ok {
			t.Skip("skipped: the store does not batch (backend.BatchStore); Elections writes one record at a time")
		}
		renewed, created, stale := Election(), Election(), Election()
		r1 := storeWrite(t, st, heartbeat.Record{}, renewed, "a", 1)
		s1 := storeWrite(t, st, heartbeat.Record{}, stale, "a", 1)
		s2 := storeWrite(t, st, s1, stale, "b", 2)
		writes := []backend.Write{
			{Expected: r1, Next: heartbeat.Record{Election: renewed, Leader: "a", Term: 1, Value: []byte("v"), Lease: time.Second}},
			{Expected: heartbeat.Record{}, Next: heartbeat.Record{Election: created, Leader: "c", Term: 1}},
			{Expected: s1, Next: heartbeat.Record{Election: stale, Leader: "a", Term: 1}},
		}
		var bad string
		if s.h.WriteMalformed != nil {
			bad = Election()
			if err := s.h.WriteMalformed(ctxFor(t), bad); err != nil {
				t.Fatalf("WriteMalformed: %v", err)
			}
			writes = append(writes, backend.Write{Expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, Next: heartbeat.Record{Election: bad, Leader: "a", Term: 2}})
		}
		res, err := bs.HeartbeatBatch(ctxFor(t), writes)
		if err != nil {
			t.Fatalf("HeartbeatBatch: %v", err)
		}
		if len(res) != len(writes) {
			t.Fatalf("%d results for %d writes", len(res), len(writes))
		}
		if r := res[0]; r.Err != nil || r.Record.Revision != r1.Revision+1 || r.Record.Election != renewed || string(r.Record.Value) != "v" || r.Record.Lease != time.Second || r.Record.Timestamp.IsZero() {
			t.Errorf("renewal in a batch: %+v, %v; want revision %d with value v, lease 1s and a store timestamp", r.Record, r.Err, r1.Revision+1)
		}
		if r := res[1]; r.Err != nil || r.Record.Revision != 1 || r.Record.Leader != "c" || r.Record.Election != created {
			t.Errorf("creation in a batch: %+v, %v; want revision 1 led by c", r.Record, r.Err)
		}
		var ce *backend.ConflictError
		if r := res[2]; !errors.As(r.Err, &ce) || !ce.Current.Equal(s2) {
			t.Errorf("stale write in a batch: %+v, %v; want a conflict carrying %v", r.Record, r.Err, s2)
		}
		if bad != "" {
			if r := res[3]; !errors.Is(r.Err, backend.ErrMalformedRecord) {
				t.Errorf("write over a malformed record in a batch: %+v, %v; want ErrMalformedRecord", r.Record, r.Err)
			}
		}
		for i, e := range []string{renewed, created} {
			if got, err := st.Get(ctxFor(t), e); err != nil || !got.Equal(res[i].Record) {
				t.Errorf("Get(%s) = %+v, %v; the batch returned %+v", e, got, err, res[i].Record)
			}
		}
		if got, err := st.Get(ctxFor(t), stale); err != nil || !got.Equal(s2) {
			t.Errorf("Get(%s) = %+v, %v after a refused write; want %+v unchanged", stale, got, err, s2)
		}
	})

	rule(t, "A batched read gives each election exactly what a single Get would, absent elections as ErrNotFound", func(t *testing.T) {
		st := s.openStore(t)
		br, ok := st.(backend.BatchReader)
		if !ok {
			t.Skip("skipped: the store does not read in batches (backend.BatchReader); Elections reads one record at a time")
		}
		a, b, missing := Election(), Election(), Election()
		ra := storeWrite(t, st, heartbeat.Record{}, a, "a", 1)
		rb := storeWrite(t, st, storeWrite(t, st, heartbeat.Record{}, b, "a", 1), b, "b", 2)
		names := []string{b, missing, a}
		var bad string
		if s.h.WriteMalformed != nil {
			bad = Election()
			if err := s.h.WriteMalformed(ctxFor(t), bad); err != nil {
				t.Fatalf("WriteMalformed: %v", err)
			}
			names = append(names, bad)
		}
		res, err := br.GetBatch(ctxFor(t), names)
		if err != nil {
			t.Fatalf("GetBatch: %v", err)
		}
		if len(res) != len(names) {
			t.Fatalf("%d results for %d elections", len(res), len(names))
		}
		for i, want := range []heartbeat.Record{rb, {}, ra} {
			if i == 1 {
				if !errors.Is(res[i].Err, backend.ErrNotFound) {
					t.Errorf("GetBatch of an election without a record: %+v, %v; want ErrNotFound", res[i].Record, res[i].Err)
				}
				continue
			}
			single, serr := st.Get(ctxFor(t), names[i])
			if res[i].Err != nil || !res[i].Record.Equal(want) || serr != nil || !single.Equal(res[i].Record) {
				t.Errorf("GetBatch(%s) = %+v, %v; Get = %+v, %v; want both %+v", names[i], res[i].Record, res[i].Err, single, serr, want)
			}
		}
		if bad != "" {
			if r := res[3]; !errors.Is(r.Err, backend.ErrMalformedRecord) {
				t.Errorf("GetBatch of a malformed record: %+v, %v; want ErrMalformedRecord for it alone", r.Record, r.Err)
			}
		}
		if res, err := br.GetBatch(ctxFor(t), nil); err != nil || len(res) != 0 {
			t.Errorf("GetBatch of no election: %v, %v; want no results and no error", res, err)
		}
	})

	rule(t, "HeartbeatBatch and GetBatch store and return each write's Incarnation exactly, as Heartbeat and Get do; a write with Incarnation 0 clears it, and one over MaxToken fails alone", func(t *testing.T) {
		st := s.openStore(t)
		bs, ok := st.(backend.BatchStore)
		if !ok {
			t.Skip("skipped: the store does not batch (backend.BatchStore); Elections writes one record at a time")
		}
		renewed, cleared, created, bad := Election(), Election(), Election(), Election()
		r1 := storeWrite(t, st, heartbeat.Record{}, renewed, "a", 1)
		c1, err := st.Heartbeat(ctxFor(t), heartbeat.Record{}, heartbeat.Record{Election: cleared, Leader: "a", Term: 1, Incarnation: 7})
		if err != nil || c1.Incarnation != 7 {
			t.Fatalf("Heartbeat with incarnation 7: %+v, %v", c1, err)
		}
		res, err := bs.HeartbeatBatch(ctxFor(t), []backend.Write{
			{Expected: r1, Next: heartbeat.Record{Election: renewed, Leader: "a", Term: 1, Lease: time.Second, Incarnation: heartbeat.MaxToken}},
			{Expected: c1, Next: heartbeat.Record{Election: cleared, Leader: "a", Term: 1}},
			{Next: heartbeat.Record{Election: created, Leader: "c", Term: 1, Incarnation: 1}},
			{Next: heartbeat.Record{Election: bad, Leader: "d", Term: 1, Incarnation: heartbeat.MaxToken + 1}},
		})
		if err != nil || len(res) != 4 {
			t.Fatalf("HeartbeatBatch: %+v, %v", res, err)
		}
		for i, want := range []uint64{heartbeat.MaxToken, 0, 1} {
			if res[i].Err != nil || res[i].Record.Incarnation != want || res[i].Record.Vacant() {
				t.Fatalf("write %d: %+v, %v; want a led record with incarnation %d", i, res[i].Record, res[i].Err, want)
			}
			got, err := st.Get(ctxFor(t), res[i].Record.Election)
			if err != nil || !got.Equal(res[i].Record) {
				t.Fatalf("Get = %+v, %v; the batch returned %+v", got, err, res[i].Record)
			}
		}
		if !errors.Is(res[3].Err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("write 3: %+v, %v; want an error matching heartbeat.ErrInvalidRecord", res[3].Record, res[3].Err)
		}
		// A stale write in a batch gets a conflict carrying the incarnation.
		stale, err := bs.HeartbeatBatch(ctxFor(t), []backend.Write{{Expected: r1, Next: heartbeat.Record{Election: renewed, Leader: "a", Term: 1, Incarnation: 2}}})
		var ce *backend.ConflictError
		if err != nil || len(stale) != 1 || !errors.As(stale[0].Err, &ce) || !ce.Current.Equal(res[0].Record) {
			t.Fatalf("stale write in a batch: %+v, %v; want a conflict carrying %+v", stale, err, res[0].Record)
		}
		br, ok := st.(backend.BatchReader)
		if !ok {
			return
		}
		rs, err := br.GetBatch(ctxFor(t), []string{created, renewed, cleared})
		if err != nil || len(rs) != 3 || rs[0].Err != nil || !rs[0].Record.Equal(res[2].Record) ||
			rs[1].Err != nil || !rs[1].Record.Equal(res[0].Record) || rs[2].Err != nil || !rs[2].Record.Equal(res[1].Record) {
			t.Fatalf("GetBatch = %+v, %v; want %+v, %+v and %+v as written, incarnations included", rs, err, res[2].Record, res[0].Record, res[1].Record)
		}
	})

	for _, batch := range []bool{true, false} {
		name := "batched"
		if !batch {
			name = "one write at a time"
		}
		ruleUnderLoad(t, "Twenty elections on one Elections share one changefeed, each elects its node and hands over on Stop ("+name+")", func(t *testing.T, late bool) {
			st, err := s.h.OpenStore(t)
			if err != nil || st == nil {
				t.Fatalf("Harness.OpenStore: %v", err)
			}
			// faulty.Store forwards every capability of st (a wrapper of
			// our own would hide those it lacks) and counts its Subscribes.
			fs := faulty.WrapStore(st)
			//lint:ignore SA1019 the conformance of a Store shared by many elections without batching
			els, err := base.NewElections(fs, base.ElectionsOptions{NoBatch: !batch})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = els.Close() })
			// Twenty leaders renew at once: four times the harness's timing
			// gives a store that serializes writes (reqlite) room for them.
			tm := fillTiming(s.h.Timing)
			tm = heartbeat.Timing{HeartbeatInterval: 4 * tm.HeartbeatInterval, LeaseDuration: 4 * tm.LeaseDuration,
				ElectionTimeoutMin: 4 * tm.ElectionTimeoutMin, ElectionTimeoutMax: 4 * tm.ElectionTimeoutMax}
			const n = 20
			feeds := make([]*base.Feed, n)
			names := make([]string, n)
			ends := make([]leadershipEnds, n)
			for i := range feeds {
				names[i] = Election()
				f, err := els.Feed(names[i], "node", base.Options{Timing: tm})
				if err != nil {
					t.Fatalf("Feed %d: %v", i, err)
				}
				feeds[i] = f
				ends[i].watch(f)
				if err := f.Start(ctxFor(t)); err != nil {
					t.Fatalf("Start %d: %v", i, err)
				}
			}
			if _, err := els.Election(names[0]); !errors.Is(err, base.ErrInvalidConfig) {
				t.Errorf("a second Backend of one election on one Elections: %v, want ErrInvalidConfig", err)
			}
			deadline := time.Now().Add(tm.ElectionTimeoutMax + feedWait)
			for i, f := range feeds {
				for !f.IsLeader() {
					if time.Now().After(deadline) {
						t.Fatalf("election %d of %d has no leader", i, n)
					}
					time.Sleep(time.Millisecond)
				}
			}
			if late {
				// One renewal of the first election comes after its lease;
				// batched, the whole batch that carries it does.
				m := faulty.MethodHeartbeat
				if batch {
					m = faulty.MethodHeartbeatBatch
				}
				fs.Inject(faulty.Fault{Method: m, Election: names[0], Nth: 1, Delay: tm.LeaseDuration + tm.HeartbeatInterval})
				deadline := time.Now().Add(tm.LeaseDuration + feedWait)
				for len(ends[0].get()) == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("election 0 still leads %v after its renewal was delayed past the lease", feedWait)
					}
					time.Sleep(time.Millisecond)
				}
			}
			// Renewals go on for a few intervals; every election keeps its
			// node leading. A term may end only by a lease that ran out
			// (twenty renewals at once on a loaded machine); the node then
			// wins its election again.
			time.Sleep(5 * tm.HeartbeatInterval)
			deadline = time.Now().Add(tm.ElectionTimeoutMax + feedWait)
			for i, f := range feeds {
				for !f.IsLeader() {
					if time.Now().After(deadline) {
						t.Fatalf("election %d of %d has no leader after 5 intervals", i, n)
					}
					time.Sleep(time.Millisecond)
				}
				for _, e := range ends[i].get() {
					if e.Reason != base.ReasonLeaseExpired && e.Reason != base.ReasonDeposed {
						t.Errorf("election %d: %v without a call that ends leadership", i, e)
					} else {
						t.Logf("election %d: %v (a lease that ran out is allowed)", i, e)
					}
				}
			}
			if got := fs.Calls(faulty.MethodSubscribe); got != 1 {
				t.Errorf("%d changefeeds opened for %d elections, want 1", got, n)
			}
			var wg sync.WaitGroup
			for i, f := range feeds {
				wg.Go(func() {
					if err := f.Stop(ctxFor(t)); err != nil {
						t.Errorf("Stop %d: %v", i, err)
					}
				})
			}
			wg.Wait()
			for _, e := range names {
				if r, err := st.Get(ctxFor(t), e); err != nil || !r.Vacant() {
					t.Errorf("election %s after Stop: %v, %v; want a vacant record", e, r, err)
				}
			}
		})
	}
}

// leadershipEnds collects the EventUnelected of one Feed.
type leadershipEnds struct {
	mu   sync.Mutex
	ends []base.Event
}

// watch reads f's events until f stops.
func (l *leadershipEnds) watch(f *base.Feed) {
	sub := f.Subscribe(context.Background())
	go func() {
		for e := range sub.C {
			if e.Type == base.EventUnelected {
				l.mu.Lock()
				l.ends = append(l.ends, e)
				l.mu.Unlock()
			}
		}
	}()
}

func (l *leadershipEnds) get() []base.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]base.Event(nil), l.ends...)
}

func nextStore(t *testing.T, ch <-chan backend.Notification, what string, pass func(backend.Notification) bool) backend.Notification {
	t.Helper()
	timer := time.NewTimer(feedWait)
	defer timer.Stop()
	for {
		select {
		case n, ok := <-ch:
			if !ok || n.Type == backend.Failed {
				t.Fatalf("feed ended while waiting for %s: %v", what, n.Err)
			}
			if pass(n) {
				return n
			}
		case <-timer.C:
			t.Fatalf("no %s within %v", what, feedWait)
		}
	}
}
