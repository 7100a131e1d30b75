package memory_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// benchNodes starts n nodes of one election on a memory store and returns
// them with a channel of every node's Elected events.
func benchNodes(b *testing.B, tm heartbeat.Timing, n int) ([]*benchNode, <-chan elected) {
	b.Helper()
	store := memory.NewStore()
	ch := make(chan elected, 64)
	var nodes []*benchNode
	for i := range n {
		be, err := store.Backend("bench")
		if err != nil {
			b.Fatal(err)
		}
		link := faulty.Wrap(be)
		id := fmt.Sprintf("node-%d", i)
		f, err := base.New(link, id, base.Options{Timing: tm})
		if err != nil {
			b.Fatal(err)
		}
		node := &benchNode{id: id, feed: f, link: link}
		events := f.Subscribe(context.Background()).C
		done := make(chan struct{})
		go func() {
			defer close(done)
			for e := range events {
				if e.Type == base.EventElected {
					ch <- elected{node: node, at: e.At}
				}
			}
		}()
		if err := f.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		node.done = done
		nodes = append(nodes, node)
	}
	b.Cleanup(func() {
		for _, n := range nodes {
			_ = n.feed.Stop(context.Background())
			<-n.done
		}
	})
	return nodes, ch
}

type benchNode struct {
	id   string
	feed *base.Feed
	link *faulty.Backend
	done chan struct{}
}

type elected struct {
	node *benchNode
	at   time.Time
}

func nextElected(b *testing.B, ch <-chan elected, except *benchNode) elected {
	b.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-ch:
			if e.node != except {
				return e
			}
		case <-timeout:
			b.Fatal("no leader elected within 10 s")
		}
	}
}

// report adds p50, p99 and max of samples as metrics in milliseconds.
func report(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	q := func(p float64) float64 {
		i := int(p * float64(len(samples)-1))
		return float64(samples[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op") // the per-op time is the sample itself
}

// BenchmarkHandover measures a clean handover: from the call of Resign on
// the leader to the moment the next leader is elected (its Elected event's
// At). Three nodes, default timings.
//
//	go test -run '^$' -bench Handover -benchtime 500x ./memory/
func BenchmarkHandover(b *testing.B) {
	nodes, ch := benchNodes(b, heartbeat.Timing{}, 3)
	leader := nextElected(b, ch, nil).node
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := leader.feed.Resign(context.Background()); err != nil {
			b.Fatal(err)
		}
		e := nextElected(b, ch, leader)
		samples = append(samples, e.at.Sub(start))
		leader = e.node
	}
	b.StopTimer()
	_ = nodes
	report(b, samples)
}

// BenchmarkCrashFailover measures failover after a crash: the leader is cut
// off its store (it can neither renew nor resign), and the time to the next
// leader's election is compared with the configured election timeout.
// Timings are shrunk tenfold from the defaults: heartbeat 100 ms, election
// timeout 200..400 ms. Each sample takes about one election timeout.
//
//	go test -run '^$' -bench CrashFailover -benchtime 200x ./memory/
func BenchmarkCrashFailover(b *testing.B) {
	tm := heartbeat.Timing{HeartbeatInterval: 100 * time.Millisecond, ElectionTimeoutMin: 200 * time.Millisecond, ElectionTimeoutMax: 400 * time.Millisecond}
	_, ch := benchNodes(b, tm, 3)
	leader := nextElected(b, ch, nil).node
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		leader.link.Partition()
		e := nextElected(b, ch, leader)
		samples = append(samples, e.at.Sub(start))
		leader.link.Heal()
		leader = e.node
	}
	b.StopTimer()
	report(b, samples)
	b.ReportMetric(float64(tm.ElectionTimeoutMin)/float64(time.Millisecond), "timeout-min-ms")
	b.ReportMetric(float64(tm.ElectionTimeoutMax)/float64(time.Millisecond), "timeout-max-ms")
}
