package basetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// FastTiming is the timing of the Feed scenarios unless the harness gives
// one: tens of milliseconds, with a wide margin between lease and election
// timeout so that a loaded CI machine does not make them flaky.
var FastTiming = heartbeat.Timing{
	HeartbeatInterval:  25 * time.Millisecond,
	ElectionTimeoutMin: 300 * time.Millisecond,
	ElectionTimeoutMax: 500 * time.Millisecond,
	LeaseDuration:      150 * time.Millisecond,
}

// ScaleEnv names the environment variable that scales every timing of the
// suite for a slow machine or store: the Feed timing of the scenarios
// (FastTiming or the harness's), the presence and hysteresis times, and
// every bound a rule waits for. It is a number of at least 1 (default 1);
// 3 makes each of them three times longer. The rules stay the same: safety
// is checked as strictly at every scale, and a liveness bound is always
// derived from the timing in use. Backends' own timed tests take it through
// Scaled and ScaledTiming.
const ScaleEnv = "LEADERFEED_TEST_SCALE"

var scale, scaleErr = readScale()

func readScale() (float64, error) {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 1 && f <= 100) {
		return 1, fmt.Errorf("basetest: %s=%q: want a number from 1 to 100", ScaleEnv, v)
	}
	return f, nil
}

// Scale returns the factor of ScaleEnv (1 when it is unset), and an error
// naming the variable when its value is not a number from 1 to 100.
func Scale() (float64, error) { return scale, scaleErr }

// Scaled returns d times the factor of ScaleEnv.
func Scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }

// ScaledTiming returns tm, its zero fields filled from FastTiming, with
// every duration times the factor of ScaleEnv.
func ScaledTiming(tm heartbeat.Timing) heartbeat.Timing {
	tm = fillTiming(tm)
	return heartbeat.Timing{
		HeartbeatInterval:  Scaled(tm.HeartbeatInterval),
		ElectionTimeoutMin: Scaled(tm.ElectionTimeoutMin),
		ElectionTimeoutMax: Scaled(tm.ElectionTimeoutMax),
		LeaseDuration:      Scaled(tm.LeaseDuration),
	}
}

// callTimeout bounds every single call the suite makes; a backend that
// takes longer is hung.
var callTimeout = Scaled(10 * time.Second)

// Run runs the whole conformance suite against the backends h opens.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("basetest: Harness.Open is nil")
	}
	if h.SerializedWrites {
		t.Log("basetest: the harness serializes writes; the concurrency cases prove nothing about the store's atomicity")
	}
	if _, err := Scale(); err != nil {
		t.Fatal(err)
	}
	if scale != 1 {
		t.Logf("basetest: every timing scaled by %s=%v", ScaleEnv, scale)
	}
	s := &suite{h: h}
	s.h.Timing = ScaledTiming(h.Timing)
	t.Run("Contract", s.contract)
	t.Run("Feed", s.feeds)
	t.Run("Transfer", s.transfers)
	if h.OpenStore != nil {
		t.Run("Store", s.stores)
		t.Run("PresenceStore", s.presenceStore)
		t.Run("PresenceBatchStore", s.presenceBatchStore)
		t.Run("GuardStore", s.guardStore)
		t.Run("BatchSuccessor", s.batchSuccessor)
		t.Run("BatchHandover", s.batchHandover)
	} else {
		t.Log("basetest: Harness.OpenStore is nil; the Store rules (many elections, one changefeed, batches) did not run")
	}
}

type suite struct{ h Harness }

// rule runs a case whose name is the rule it checks.
func rule(t *testing.T, sentence string, f func(t *testing.T)) {
	t.Helper()
	t.Run(sentence, func(t *testing.T) {
		t.Helper()
		defer func() {
			if t.Failed() {
				t.Logf("the rule broken: %s", sentence)
			}
		}()
		f(t)
	})
}

// ruleUnderLoad runs a rule that a loaded machine can disturb twice: as it
// is, and with one renewal delayed past the lease (f's late), to show that
// it asserts only what the guarantee promises when a lease runs out.
func ruleUnderLoad(t *testing.T, sentence string, f func(t *testing.T, late bool)) {
	t.Helper()
	rule(t, sentence, func(t *testing.T) {
		t.Run("renewals on time", func(t *testing.T) { f(t, false) })
		t.Run("one renewal delayed past the lease", func(t *testing.T) { f(t, true) })
	})
}

// ruleRetried runs a rule whose leader must still lead when the rule makes
// the call it is about (Resign, TransferTo). f returns false when that
// leader's lease ran out first, or the store did not answer the claims in
// time, which a loaded machine may do, and the rule runs again on a fresh
// cluster, three times at most.
func ruleRetried(t *testing.T, sentence string, f func(t *testing.T) bool) {
	t.Helper()
	rule(t, sentence, func(t *testing.T) {
		t.Helper()
		retried(t, f)
	})
}

// retried runs f until it returns true, three times at most: f returns
// false when a lease ran out or the store did not answer in time, and
// builds a fresh cluster each time.
func retried(t *testing.T, f func(t *testing.T) bool) {
	t.Helper()
	for attempt := 1; !f(t); attempt++ {
		if attempt == 3 {
			t.Fatalf("a lease ran out or the store did not answer in time in %d attempts: the machine or store is too slow for this timing (%s scales it)", attempt, ScaleEnv)
		}
		t.Logf("attempt %d: a lease ran out or the store did not answer in time (allowed on a loaded machine); again on a fresh cluster", attempt)
	}
}

// Election returns a fresh election name, safe for every backend.
func Election() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "lfe_" + hex.EncodeToString(b[:])
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// open opens, starts and creates a backend for election, closed at cleanup.
func (s *suite) open(t *testing.T, election string) backend.Election {
	t.Helper()
	b := s.openRaw(t, election)
	ctx := ctxFor(t)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := b.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return b
}

func (s *suite) openRaw(t *testing.T, election string) backend.Election {
	t.Helper()
	b, err := s.h.Open(t, election)
	if err != nil {
		t.Fatalf("Harness.Open(%q): %v", election, err)
	}
	if b == nil {
		t.Fatalf("Harness.Open(%q) returned a nil backend", election)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// write writes leader, term and value on the write expected (the zero
// Record: none) and fails the test if that is refused.
func write(t *testing.T, b backend.Election, expected heartbeat.Record, leader string, term uint64, value []byte) heartbeat.Record {
	t.Helper()
	r, err := b.Heartbeat(ctxFor(t), expected, heartbeat.Record{Election: b.Name(), Leader: leader, Term: term, Value: value})
	if err != nil {
		t.Fatalf("Heartbeat(expected %v, leader %q, term %d): %v", expected, leader, term, err)
	}
	return r
}

func subscribe(t *testing.T, b backend.Election) (<-chan backend.Notification, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := b.Subscribe(ctx)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch, cancel
}

// next returns the next notification that pass accepts, failing the test
// after d.
func next(t *testing.T, ch <-chan backend.Notification, d time.Duration, what string, pass func(backend.Notification) bool) backend.Notification {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				t.Fatalf("feed closed while waiting for %s", what)
			}
			if n.Type == backend.Failed {
				t.Fatalf("feed failed while waiting for %s: %v", what, n.Err)
			}
			if pass(n) {
				return n
			}
		case <-timer.C:
			t.Fatalf("no %s within %v", what, d)
		}
	}
}

var feedWait = Scaled(5 * time.Second)

func (s *suite) contract(t *testing.T) {
	rule(t, "Get on an election that was never written returns ErrNotFound", func(t *testing.T) {
		b := s.open(t, Election())
		_, err := b.Get(ctxFor(t))
		if !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("Get: got %v, want an error matching backend.ErrNotFound", err)
		}
	})

	rule(t, "Election returns the name the backend was opened for", func(t *testing.T) {
		e := Election()
		if got := s.openRaw(t, e).Name(); got != e {
			t.Fatalf("Election() = %q, want %q", got, e)
		}
	})

	rule(t, "The first write, on expected revision 0, creates the record with revision 1 and a store timestamp", func(t *testing.T) {
		b := s.open(t, Election())
		before := time.Now()
		r := write(t, b, heartbeat.Record{}, "node-a", 1, []byte("addr-a"))
		if r.Revision != 1 || r.Leader != "node-a" || r.Term != 1 || !bytes.Equal(r.Value, []byte("addr-a")) || r.Election != b.Name() {
			t.Fatalf("stored %+v, want revision 1, leader node-a, term 1, value addr-a, election %q", r, b.Name())
		}
		if r.Timestamp.IsZero() {
			t.Fatal("the store set no Timestamp")
		}
		// The store's clock is another machine's; only a gross error is a failure.
		if d := r.Timestamp.Sub(before); d < -time.Hour || d > time.Hour {
			t.Errorf("store timestamp %v is more than an hour from this machine's %v", r.Timestamp, before)
		}
		got, err := b.Get(ctxFor(t))
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if !got.Equal(r) {
			t.Fatalf("Get returned %+v, Heartbeat returned %+v", got, r)
		}
	})

	rule(t, "A write on the stored revision stores revision+1 with the given leader, term and value", func(t *testing.T) {
		b := s.open(t, Election())
		r1 := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		r2 := write(t, b, r1, "node-a", 1, []byte("v2"))
		if r2.Revision != r1.Revision+1 || r2.Term != 1 || string(r2.Value) != "v2" {
			t.Fatalf("second write stored %+v, want revision %d, term 1, value v2", r2, r1.Revision+1)
		}
		r3 := write(t, b, r2, "", 1, nil)
		if !r3.Vacant() || r3.Term != 1 || len(r3.Value) != 0 {
			t.Fatalf("vacant write stored %+v, want no leader, term kept at 1, no value", r3)
		}
	})

	rule(t, "A write on a stale revision changes nothing and returns a *ConflictError carrying the current record", func(t *testing.T) {
		b := s.open(t, Election())
		r1 := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		r2 := write(t, b, r1, "node-a", 1, nil)
		r2plus5 := r2
		r2plus5.Revision += 5
		for _, expected := range []heartbeat.Record{{}, r1, r2plus5} {
			_, err := b.Heartbeat(ctxFor(t), expected, heartbeat.Record{Election: b.Name(), Leader: "node-b", Term: 2})
			var ce *backend.ConflictError
			if !errors.As(err, &ce) || !errors.Is(err, backend.ErrConflict) {
				t.Fatalf("write on expected revision %d (stored %d): got %v, want a *ConflictError", expected.Revision, r2.Revision, err)
			}
			if !ce.Current.Equal(r2) {
				t.Fatalf("conflict carries %+v, want the current record %+v", ce.Current, r2)
			}
		}
		got, err := b.Get(ctxFor(t))
		if err != nil || !got.Equal(r2) {
			t.Fatalf("after refused writes Get = %+v, %v; want %+v unchanged", got, err, r2)
		}
	})

	rule(t, "The compare-and-set compares the write's identity: the right revision with another leader or term is a conflict", func(t *testing.T) {
		// A store that lost an acknowledged write can hand one revision out
		// twice; a deposed writer that expects its own lost write must not
		// overwrite the new leader's record of the same revision.
		b := s.open(t, Election())
		r1 := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		r2 := write(t, b, r1, "node-b", 2, nil)
		for _, expected := range []heartbeat.Record{
			{Revision: r2.Revision, Leader: "node-a", Term: 2},
			{Revision: r2.Revision, Leader: "node-b", Term: 1},
			{Revision: r2.Revision, Leader: "", Term: 2},
		} {
			_, err := b.Heartbeat(ctxFor(t), expected, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 3})
			var ce *backend.ConflictError
			if !errors.As(err, &ce) {
				t.Fatalf("write expecting %v on stored %v: got %v, want a *ConflictError", expected, r2, err)
			}
			if !ce.Current.Equal(r2) {
				t.Fatalf("conflict carries %+v, want the current record %+v", ce.Current, r2)
			}
		}
		// The identity alone is what is compared: Value, Lease and
		// Timestamp of expected do not matter.
		r3 := write(t, b, heartbeat.Record{Revision: r2.Revision, Leader: "node-b", Term: 2, Value: []byte("other"), Lease: time.Hour}, "node-b", 2, nil)
		if r3.Revision != r2.Revision+1 {
			t.Fatalf("write on the stored identity stored %+v, want revision %d", r3, r2.Revision+1)
		}
	})

	rule(t, "Lease is stored and returned by Heartbeat, Get and the feed; a vacant record has none", func(t *testing.T) {
		b := s.open(t, Election())
		ch, _ := subscribe(t, b)
		const lease = 1500*time.Millisecond + 250*time.Microsecond
		r, err := b.Heartbeat(ctxFor(t), heartbeat.Record{}, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1, Lease: lease})
		if err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		if r.Lease != lease {
			t.Fatalf("Heartbeat returned lease %v, want %v", r.Lease, lease)
		}
		got, err := b.Get(ctxFor(t))
		if err != nil || got.Lease != lease {
			t.Fatalf("Get = %+v, %v; want lease %v", got, err, lease)
		}
		n := next(t, ch, feedWait, "the leased record", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Revision == r.Revision
		})
		if n.Record.Lease != lease {
			t.Fatalf("feed delivered lease %v, want %v", n.Record.Lease, lease)
		}
		v := write(t, b, r, "", 1, nil)
		if v.Lease != 0 {
			t.Fatalf("vacant record kept lease %v", v.Lease)
		}
		if _, err := b.Heartbeat(ctxFor(t), v, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 2, Lease: heartbeat.MaxLease + 1}); !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("a lease above MaxLease: got %v, want an error matching heartbeat.ErrInvalidRecord", err)
		}
	})

	rule(t, "A claim's or renewal's Incarnation is stored and returned exactly, up to MaxToken, by Heartbeat, Get, the feed and a conflict; a later write with Incarnation 0 reads 0, and one on a vacancy or over MaxToken is refused", func(t *testing.T) {
		// Two processes sharing a node id tell their writes apart by it
		// alone: a store that drops or rounds it makes each take the
		// other's record for its own.
		b := s.open(t, Election())
		ch, _ := subscribe(t, b)
		r1, err := b.Heartbeat(ctxFor(t), heartbeat.Record{}, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1, Lease: time.Second, Incarnation: heartbeat.MaxToken})
		if err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		if r1.Incarnation != heartbeat.MaxToken || r1.Leader != "node-a" || r1.Revision != 1 {
			t.Fatalf("Heartbeat returned %+v, want node-a's record of revision 1 with incarnation %d (MaxToken)", r1, uint64(heartbeat.MaxToken))
		}
		got, err := b.Get(ctxFor(t))
		if err != nil || !got.Equal(r1) {
			t.Fatalf("Get = %+v, %v; Heartbeat returned %+v", got, err, r1)
		}
		n := next(t, ch, feedWait, "the claim", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Revision == r1.Revision
		})
		if n.Record.Incarnation != heartbeat.MaxToken {
			t.Fatalf("the feed delivered incarnation %d, want %d", n.Record.Incarnation, uint64(heartbeat.MaxToken))
		}
		r2, err := b.Heartbeat(ctxFor(t), r1, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1, Lease: time.Second, Incarnation: 1})
		if err != nil || r2.Incarnation != 1 {
			t.Fatalf("a renewal with incarnation 1: %+v, %v", r2, err)
		}
		_, err = b.Heartbeat(ctxFor(t), r1, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1, Incarnation: 2})
		var ce *backend.ConflictError
		if !errors.As(err, &ce) || !ce.Current.Equal(r2) {
			t.Fatalf("a write on the revision before the renewal: %v, want a conflict carrying %+v", err, r2)
		}
		r3 := write(t, b, r2, "node-a", 1, nil)
		if r3.Incarnation != 0 {
			t.Fatalf("a write with incarnation 0 reads %d, want 0", r3.Incarnation)
		}
		n = next(t, ch, feedWait, "the write without an incarnation", func(n backend.Notification) bool {
			return n.Type == backend.RecordChanged && n.Record.Revision == r3.Revision
		})
		if n.Record.Incarnation != 0 {
			t.Fatalf("the feed delivered incarnation %d after a write with 0", n.Record.Incarnation)
		}
		if got, err := b.Get(ctxFor(t)); err != nil || !got.Equal(r3) {
			t.Fatalf("Get = %+v, %v; Heartbeat returned %+v", got, err, r3)
		}
		for _, bad := range []heartbeat.Record{
			{Election: b.Name(), Term: 1, Incarnation: 1},
			{Election: b.Name(), Leader: "node-a", Term: 1, Incarnation: heartbeat.MaxToken + 1},
		} {
			if _, err := b.Heartbeat(ctxFor(t), r3, bad); !errors.Is(err, heartbeat.ErrInvalidRecord) {
				t.Fatalf("writing %+v: %v, want an error matching heartbeat.ErrInvalidRecord", bad, err)
			}
		}
		if got, err := b.Get(ctxFor(t)); err != nil || !got.Equal(r3) {
			t.Fatalf("after refused writes Get = %+v, %v; want %+v unchanged", got, err, r3)
		}
	})

	rule(t, "A write on a revision other than 0 when no record exists is a conflict with an empty current record", func(t *testing.T) {
		b := s.open(t, Election())
		_, err := b.Heartbeat(ctxFor(t), heartbeat.Record{Revision: 3, Leader: "node-a", Term: 1}, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1})
		var ce *backend.ConflictError
		if !errors.As(err, &ce) || ce.Current.Revision != 0 {
			t.Fatalf("got %v, want a *ConflictError with Current.Revision 0", err)
		}
		if _, err := b.Get(ctxFor(t)); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("Get after the refused write: %v, want ErrNotFound", err)
		}
	})

	for _, tc := range []struct {
		name  string
		first bool
	}{{"creating the record", true}, {"updating the record", false}} {
		rule(t, "Of 20 concurrent claimants on one revision exactly one wins, "+tc.name, func(t *testing.T) {
			e := Election()
			const n = 20
			backends := make([]backend.Election, n)
			for i := range backends {
				backends[i] = s.open(t, e)
			}
			var expected heartbeat.Record
			if !tc.first {
				expected = write(t, backends[0], heartbeat.Record{}, "old", 1, nil)
			}
			var wg sync.WaitGroup
			wins := make(chan string, n)
			errs := make(chan error, n)
			start := make(chan struct{})
			for i, b := range backends {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					id := fmt.Sprintf("node-%02d", i)
					_, err := b.Heartbeat(ctxFor(t), expected, heartbeat.Record{Election: e, Leader: id, Term: 2})
					switch {
					case err == nil:
						wins <- id
					case !errors.Is(err, backend.ErrConflict):
						errs <- err
					}
				}()
			}
			close(start)
			wg.Wait()
			close(wins)
			close(errs)
			for err := range errs {
				t.Errorf("a claimant got %v, want success or ErrConflict", err)
			}
			var winners []string
			for w := range wins {
				winners = append(winners, w)
			}
			if len(winners) != 1 {
				t.Fatalf("%d winners %v, want exactly 1", len(winners), winners)
			}
			got, err := backends[0].Get(ctxFor(t))
			if err != nil || got.Leader != winners[0] || got.Revision != expected.Revision+1 {
				t.Fatalf("stored %+v, %v; want the winner %s at revision %d", got, err, winners[0], expected.Revision+1)
			}
		})
	}

	rule(t, "Revisions increase by one per write, and store timestamps never go backwards", func(t *testing.T) {
		b := s.open(t, Election())
		var prev heartbeat.Record
		for i := range 30 {
			term := uint64(i/3 + 1)
			r := write(t, b, prev, "node-a", term, nil)
			if r.Revision != prev.Revision+1 || r.Term != term {
				t.Fatalf("write %d stored revision %d term %d, want %d and %d", i, r.Revision, r.Term, prev.Revision+1, term)
			}
			if r.Timestamp.Before(prev.Timestamp) {
				t.Fatalf("write %d: store timestamp went back from %v to %v", i, prev.Timestamp, r.Timestamp)
			}
			prev = r
		}
	})

	rule(t, "Values of up to heartbeat.MaxValueLen bytes round-trip exactly", func(t *testing.T) {
		b := s.open(t, Election())
		v := make([]byte, heartbeat.MaxValueLen)
		for i := range v {
			v[i] = byte(i * 7)
		}
		r := write(t, b, heartbeat.Record{}, "node-a", 1, v)
		got, err := b.Get(ctxFor(t))
		if err != nil || !bytes.Equal(got.Value, v) || !bytes.Equal(r.Value, v) {
			t.Fatalf("value did not round-trip (Get err %v, lengths %d and %d)", err, len(got.Value), len(r.Value))
		}
	})

	rule(t, "The feed delivers every committed change of the record in commit order, ending with the latest", func(t *testing.T) {
		b := s.open(t, Election())
		ch, _ := subscribe(t, b)
		var last heartbeat.Record
		const writes = 40
		for i := range writes {
			last = write(t, b, last, "node-a", uint64(i/10+1), nil)
		}
		var prev uint64
		for prev < last.Revision {
			n := next(t, ch, feedWait, fmt.Sprintf("record revision %d", last.Revision), func(n backend.Notification) bool {
				return n.Type == backend.RecordChanged
			})
			if n.Record.Revision <= prev {
				t.Fatalf("feed delivered revision %d after %d", n.Record.Revision, prev)
			}
			if n.Record.Election != b.Name() {
				t.Fatalf("feed delivered a record of election %q as this election's", n.Record.Election)
			}
			prev = n.Record.Revision
		}
		if prev != last.Revision {
			t.Fatalf("feed ended at revision %d, want %d", prev, last.Revision)
		}
	})

	rule(t, "Writes to another election's record never arrive as this election's record", func(t *testing.T) {
		b := s.open(t, Election())
		other := s.open(t, Election())
		ch, _ := subscribe(t, b)
		write(t, other, heartbeat.Record{}, "node-x", 1, nil)
		mine := write(t, b, heartbeat.Record{}, "node-a", 1, nil)
		n := next(t, ch, feedWait, "this election's record", func(n backend.Notification) bool { return n.Type == backend.RecordChanged })
		if n.Record.Election != b.Name() || n.Record.Leader != "node-a" || n.Record.Revision != mine.Revision {
			t.Fatalf("feed delivered %+v, want this election's record %+v", n.Record, mine)
		}
	})

	rule(t, "Changes to other records of the table arrive as OtherChanged with their operation and key", func(t *testing.T) {
		if s.h.PutOther == nil || s.h.DeleteOther == nil {
			t.Skip("harness has no PutOther/DeleteOther")
		}
		e := Election()
		b := s.open(t, e)
		ch, _ := subscribe(t, b)
		ctx := ctxFor(t)
		key := "doc-" + e
		if err := s.h.PutOther(ctx, e, key, map[string]any{"n": 1}); err != nil {
			t.Fatalf("PutOther: %v", err)
		}
		if err := s.h.PutOther(ctx, e, key, map[string]any{"n": 2}); err != nil {
			t.Fatalf("PutOther: %v", err)
		}
		if err := s.h.DeleteOther(ctx, e, key); err != nil {
			t.Fatalf("DeleteOther: %v", err)
		}
		for _, want := range []backend.Op{backend.Insert, backend.Update, backend.Delete} {
			n := next(t, ch, feedWait, "a "+want.String()+" change", func(n backend.Notification) bool {
				return n.Type == backend.OtherChanged && bytes.Contains(n.Change.Key, []byte(key))
			})
			if n.Change.Op != want {
				t.Fatalf("change %s arrived as %s, want %s (changes must arrive in commit order)", n.Change.Key, n.Change.Op, want)
			}
			if want != backend.Delete && !n.Change.Partial && len(n.Change.New) == 0 {
				t.Fatalf("%s change carries no New record", want)
			}
			if want == backend.Update && !n.Change.Partial && !bytes.Contains(n.Change.New, []byte("2")) {
				t.Fatalf("update change New = %s, want the updated record", n.Change.New)
			}
		}
	})

	rule(t, "A malformed record under the election's key is reported as ErrMalformedRecord by Get and as Ignored by the feed", func(t *testing.T) {
		if s.h.WriteMalformed == nil {
			t.Skip("harness has no WriteMalformed")
		}
		e := Election()
		b := s.open(t, e)
		ch, _ := subscribe(t, b)
		if err := s.h.WriteMalformed(ctxFor(t), e); err != nil {
			t.Fatalf("WriteMalformed: %v", err)
		}
		n := next(t, ch, feedWait, "an Ignored notification", func(n backend.Notification) bool {
			if n.Type == backend.RecordChanged {
				t.Fatalf("a malformed record arrived as a record: %+v", n.Record)
			}
			return n.Type == backend.Ignored
		})
		if !errors.Is(n.Err, backend.ErrMalformedRecord) {
			t.Fatalf("Ignored carries %v, want an error matching ErrMalformedRecord", n.Err)
		}
		if _, err := b.Get(ctxFor(t)); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Fatalf("Get: %v, want an error matching ErrMalformedRecord", err)
		}
	})

	rule(t, "Create is idempotent, also when many backends run it at once", func(t *testing.T) {
		e := Election()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 4 {
			b := s.openRaw(t, e)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := ctxFor(t)
				if err := b.Start(ctx); err != nil {
					errs <- fmt.Errorf("start: %w", err)
					return
				}
				for range 2 {
					if err := b.Create(ctx); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Create: %v", err)
		}
	})

	rule(t, "Unsafe names and impossible options are refused with ErrInvalidConfig", func(t *testing.T) {
		if b, err := s.h.Open(t, ""); err == nil {
			if !isNil(b) {
				_ = b.Close()
			}
			t.Error("an empty election name was accepted")
		} else if !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("empty election name: %v, want an error matching ErrInvalidConfig", err)
		}
		if len(s.h.Invalid) == 0 {
			t.Log("harness lists no invalid constructor calls of its own")
		}
		for what, call := range s.h.Invalid {
			b, err := call()
			if err == nil || !errors.Is(err, base.ErrInvalidConfig) {
				t.Errorf("%s: got %v, want an error matching ErrInvalidConfig", what, err)
			}
			if !isNil(b) {
				t.Errorf("%s: returned a backend along with the error", what)
				_ = b.Close()
			}
		}
	})

	rule(t, "Calls with a cancelled context return an error matching context.Canceled", func(t *testing.T) {
		b := s.open(t, Election())
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := b.Get(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Get: %v", err)
		}
		if _, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: b.Name(), Leader: "node-a", Term: 1}); !errors.Is(err, context.Canceled) {
			t.Errorf("Heartbeat: %v", err)
		}
		if ch, err := b.Subscribe(ctx); err == nil {
			// Opening may succeed; the feed must then end at once.
			select {
			case <-drain(ch):
			case <-time.After(feedWait):
				t.Error("Subscribe with a cancelled context: feed did not close")
			}
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("Subscribe: %v", err)
		}
		if _, err := b.Get(ctxFor(t)); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("the cancelled write happened: Get = %v, want ErrNotFound", err)
		}
	})

	rule(t, "A feed closes its channel promptly when its context is cancelled", func(t *testing.T) {
		b := s.open(t, Election())
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := b.Subscribe(ctx)
		if err != nil {
			cancel()
			t.Fatalf("Subscribe: %v", err)
		}
		write(t, b, heartbeat.Record{}, "node-a", 1, nil) // leave something unread
		cancel()
		select {
		case <-drain(ch):
		case <-time.After(feedWait):
			t.Fatal("feed still open after its context was cancelled")
		}
	})

	rule(t, "Close is idempotent; afterwards calls fail with ErrClosed and open feeds end", func(t *testing.T) {
		b := s.open(t, Election())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := b.Subscribe(ctx)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		select {
		case <-drain(ch):
		case <-time.After(feedWait):
			t.Fatal("feed still open after Close")
		}
		if _, err := b.Get(ctxFor(t)); !errors.Is(err, base.ErrClosed) {
			t.Errorf("Get after Close: %v, want ErrClosed", err)
		}
		if _, err := b.Heartbeat(ctxFor(t), heartbeat.Record{}, heartbeat.Record{Election: b.Name(), Leader: "a", Term: 1}); !errors.Is(err, base.ErrClosed) {
			t.Errorf("Heartbeat after Close: %v, want ErrClosed", err)
		}
		if _, err := b.Subscribe(ctxFor(t)); !errors.Is(err, base.ErrClosed) {
			t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
		}
	})
}

// isNil reports whether b is nil, also when it is a nil pointer in a
// non-nil interface (a constructor returning (*T)(nil), err).
func isNil(b backend.Election) bool {
	if b == nil {
		return true
	}
	v := reflect.ValueOf(b)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// drain reads ch until it closes and then closes the returned channel.
func drain(ch <-chan backend.Notification) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for range ch {
		}
		close(done)
	}()
	return done
}
