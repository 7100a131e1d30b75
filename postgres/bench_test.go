package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

func benchBackend(b *testing.B, pool *pgxpool.Pool, table, election string) backend.Election {
	b.Helper()
	be, err := New(pool, election, Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	if err := be.Create(context.Background()); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkHeartbeat measures one renewal: the compare-and-set round trip.
func BenchmarkHeartbeat(b *testing.B) {
	pool := newPool(b)
	be := benchBackend(b, pool, uniqueName(b), "e")
	ctx := context.Background()
	var rev heartbeat.Record
	for b.Loop() {
		r, err := be.Heartbeat(ctx, rev, heartbeat.Record{Leader: "a", Term: 1, Value: []byte("10.0.0.1:8080")})
		if err != nil {
			b.Fatal(err)
		}
		rev = r
	}
}

// BenchmarkHeartbeatElections measures renewals of many elections at once,
// one table, one pool.
func BenchmarkHeartbeatElections(b *testing.B) {
	pool := newPool(b)
	table := uniqueName(b)
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		be := benchBackend(b, pool, table, fmt.Sprintf("e%d", n.Add(1)))
		var rev heartbeat.Record
		for pb.Next() {
			r, err := be.Heartbeat(context.Background(), rev, heartbeat.Record{Leader: "a", Term: 1})
			if err != nil {
				b.Error(err)
				return
			}
			rev = r
		}
	})
}

// BenchmarkHeartbeatBatch measures one batched renewal of 500 elections:
// the round trip of HeartbeatBatch (b.N batches).
func BenchmarkHeartbeatBatch(b *testing.B) {
	pool := newPool(b)
	s, err := NewStore(pool, Options{Table: uniqueName(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if err := s.Create(ctx); err != nil {
		b.Fatal(err)
	}
	writes := make([]backend.Write, 500)
	for i := range writes {
		writes[i].Next = heartbeat.Record{Election: fmt.Sprintf("e%d", i), Leader: "a", Term: 1, Lease: time.Second}
	}
	for b.Loop() {
		res, err := s.HeartbeatBatch(ctx, writes)
		if err != nil {
			b.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
			writes[i].Expected = r.Record
		}
	}
}

// BenchmarkNotify measures from the start of a write to its notification
// on a subscription of another backend: what a follower waits to learn of
// a heartbeat.
func BenchmarkNotify(b *testing.B) {
	pool := newPool(b)
	table := uniqueName(b)
	writer := benchBackend(b, pool, table, "e")
	reader := benchBackend(b, pool, table, "e")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := reader.Subscribe(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var rev heartbeat.Record
	for b.Loop() {
		r, err := writer.Heartbeat(ctx, rev, heartbeat.Record{Leader: "a", Term: 1})
		if err != nil {
			b.Fatal(err)
		}
		rev = r
		for n := range ch {
			if n.Type == backend.RecordChanged && n.Record.Revision == rev.Revision {
				break
			}
		}
	}
}

// BenchmarkHandover measures a Feed-level handover on PostgreSQL: from the
// leader's Resign to another node leading, in a cluster of three.
func BenchmarkHandover(b *testing.B) {
	pool := newPool(b)
	table := uniqueName(b)
	c := basetest.NewCluster(b, func(e string) (backend.Election, error) {
		return New(pool, e, Options{Table: table})
	}, feedTiming, 3, 0)
	l := c.WaitLeader(b, 5*time.Second)
	for b.Loop() {
		if err := l.Feed.Resign(context.Background()); err != nil {
			b.Fatal(err)
		}
		l = c.WaitLeader(b, 5*time.Second, l)
	}
}

// BenchmarkTransfer measures a transfer on PostgreSQL: from the leader's
// TransferTo (which reads the participants, steps down and writes the
// vacancy reserved for the target) to the target's election (its Elected
// event's At), in a cluster of three participants, the target being the
// next node in turn. It reports p50, p99 and max.
//
//	go test -run '^$' -bench Transfer -benchtime 500x ./postgres/
func BenchmarkTransfer(b *testing.B) {
	pool := newPool(b)
	table := uniqueName(b)
	c := basetest.NewClusterWith(b, func(e string) (backend.Election, error) {
		return New(pool, e, Options{Table: table})
	}, feedTiming, 3, 0, func(_ int, o *base.Options) { o.Participate = true })
	l := c.WaitLeader(b, 5*time.Second)
	var samples []time.Duration
	for b.Loop() {
		to := c.Nodes[(slices.Index(c.Nodes, l)+1)%len(c.Nodes)]
		mark := len(to.Events())
		start := time.Now()
		if err := l.Feed.TransferTo(context.Background(), to.ID); err != nil {
			b.Fatal(err)
		}
		e, _ := to.WaitEvent(b, mark, 5*time.Second, "elected", func(e base.Event) bool { return e.Type == base.EventElected })
		samples = append(samples, e.At.Sub(start))
		l = to
	}
	slices.Sort(samples)
	q := func(p float64) float64 {
		return float64(samples[int(p*float64(len(samples)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}
