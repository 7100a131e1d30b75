package base_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// batchReturns counts the batches of writes a faulty.Store has returned
// from, hung or not.
type batchReturns struct {
	*faulty.Store
	returned atomic.Int64
}

func (s *batchReturns) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	defer s.returned.Add(1)
	return s.Store.HeartbeatBatch(ctx, writes)
}

// A batch of several writes in flight ends once every write in it has
// been answered, whoever answered it: its deadline, its caller's context.
// A store that hangs every batch (until the batch's context ends) then
// keeps no slot of the maxInFlight: a later write goes out at once. Each
// batch holds a renewal and a vacancy (window 0: it sends the batch at
// once); with no deadline on the vacancy, the batch had only the
// Elections' context and lasted until Close (issue 40's report).
func TestElectionsBatchEndsWhenEveryWriteIsAnswered(t *testing.T) {
	for _, tc := range []struct {
		name            string
		vacancyDeadline time.Duration // 0: none, as Stop's
		wait            time.Duration // until every write is answered
	}{
		// The renewal is answered at its deadline, the vacancy when its
		// caller gives up before.
		{name: "vacancy without deadline", wait: time.Second},
		// Both callers give up long before their deadlines.
		{name: "callers gone before deadlines", vacancyDeadline: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				testBatchEnds(t, tc.vacancyDeadline, tc.wait)
			})
		})
	}
}

func testBatchEnds(t *testing.T, vacancyDeadline, wait time.Duration) {
	store := memory.NewDB()
	fs := &batchReturns{Store: faulty.WrapStore(store.Conn())}
	els, err := base.NewElections(fs, base.ElectionsOptions{BatchWindow: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer els.Close()
	claim := func(name string) (backend.Election, heartbeat.Record) {
		t.Helper()
		b, err := els.Election(name)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := b.Heartbeat(context.Background(), heartbeat.Record{}, heartbeat.Record{Election: name, Leader: "node", Term: 1, Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return b, rec
	}
	type result struct {
		what string
		err  error
	}
	results := make(chan result, 2*base.MaxInFlight)
	var gone []context.CancelFunc // the vacancies' callers
	defer func() {
		for _, cancel := range gone {
			cancel()
		}
	}()
	type pair struct {
		r, v       backend.Election
		rRec, vRec heartbeat.Record
	}
	pairs := make([]pair, base.MaxInFlight)
	for i := range pairs {
		p := &pairs[i]
		p.r, p.rRec = claim(fmt.Sprintf("r%d", i))
		p.v, p.vRec = claim(fmt.Sprintf("v%d", i))
	}
	fs.Inject(faulty.Fault{Method: faulty.MethodHeartbeatBatch, Hang: true})
	renewCtx, renewCancel := context.WithTimeout(context.Background(), time.Second)
	defer renewCancel()
	for i, p := range pairs {
		go func() {
			next := p.rRec
			next.Revision = 0
			_, err := p.r.Heartbeat(renewCtx, p.rRec, next)
			results <- result{"renewal " + p.r.Name(), err}
		}()
		synctest.Wait() // the renewal waits its window
		vctx, vcancel := context.WithCancel(context.Background())
		if vacancyDeadline > 0 {
			vctx, vcancel = context.WithTimeout(context.Background(), vacancyDeadline)
		}
		gone = append(gone, vcancel)
		go func() {
			_, err := p.v.Heartbeat(vctx, p.vRec, heartbeat.Record{Election: p.v.Name(), Term: p.vRec.Term})
			results <- result{"vacancy " + p.v.Name(), err}
		}()
		synctest.Wait() // the vacancy sends both at once
		// (A write alone would go out as a Heartbeat, not hung.)
		if n := fs.Calls(faulty.MethodHeartbeatBatch); n != i+1 {
			t.Fatalf("%d batches sent after %d renewals and vacancies, want %d", n, i+1, i+1)
		}
	}
	for _, cancel := range gone {
		cancel()
	}
	if wait > 0 {
		time.Sleep(wait)
	} else {
		renewCancel()
	}
	synctest.Wait()
	for range 2 * len(pairs) {
		select {
		case r := <-results:
			if r.err == nil {
				t.Errorf("the %s written through a hung store", r.what)
			}
		default:
			t.Fatal("a write of a hung batch is not answered")
		}
	}
	if n := fs.returned.Load(); n != int64(len(pairs)) {
		t.Errorf("%d of %d hung batches returned once every write in them was answered", n, len(pairs))
	}
	// Every slot is free: a later write goes out at once.
	fs.Heal()
	late, err := els.Election("late")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if _, err := late.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "late", Leader: "node", Term: 1, Lease: time.Second}); err != nil || time.Since(start) > 0 {
		t.Errorf("a later claim: %v after %v, want it written at once (%d batches in flight)", err, time.Since(start), base.MaxInFlight-int(fs.returned.Load()))
	}
}
