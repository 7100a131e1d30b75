package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// opener returns a backend for one node of an election, and a function
// that releases what it opened once the feed has stopped. own asks for
// connections of the node's own, as a node in a process of its own would
// have; otherwise the backend shares the system's client with the other
// nodes opened that way (the 1,000 followers of the fan-out scenario).
type opener func(ctx context.Context, election string, own bool) (base.Backend, func(), error)

// lfSystem is leaderfeed on one backend.
type lfSystem struct {
	name string
	open opener
}

type lfNode struct {
	id      string
	feed    *base.Feed
	faulty  *faulty.Backend
	release func()
}

// electedEv is an EventElected as the application received it.
type electedEv struct {
	node *lfNode
	recv time.Time // when the application read the event
	term uint64
}

// startNode starts a feed. Its EventElected go to elected (if not nil),
// its EventNewLeader to obs (if not nil), both stamped when read.
func (s *lfSystem) startNode(ctx context.Context, election, id string, tm heartbeat.Timing, observeOnly, own bool, elected chan<- electedEv, obs *observer) (*lfNode, error) {
	b, release, err := s.open(ctx, election, own)
	if err != nil {
		return nil, err
	}
	fb := faulty.Wrap(b)
	f, err := base.New(fb, id, base.Options{Timing: tm, ObserveOnly: observeOnly})
	if err != nil {
		_ = b.Close()
		release()
		return nil, err
	}
	n := &lfNode{id: id, feed: f, faulty: fb, release: release}
	events := f.Events()
	go func() {
		for e := range events {
			now := time.Now()
			switch e.Type {
			case base.EventElected:
				if elected != nil {
					select {
					case elected <- electedEv{node: n, recv: now, term: e.Term}:
					default: // nobody is listening any more
					}
				}
			case base.EventNewLeader:
				if obs != nil {
					obs.saw(e.Leader, now)
				}
			}
		}
	}()
	if err := f.Start(ctx); err != nil {
		_ = f.Stop(context.Background())
		release()
		return nil, fmt.Errorf("%s: start %s: %w", s.name, id, err)
	}
	return n, nil
}

func (n *lfNode) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = n.feed.Stop(ctx)
	n.release()
}

func stopAll(ns []*lfNode) {
	var wg sync.WaitGroup
	for _, n := range ns {
		if n != nil {
			wg.Go(n.stop)
		}
	}
	wg.Wait()
}

// waitElected returns the next election of a node other than not.
func waitElected(ctx context.Context, ch <-chan electedEv, not *lfNode, d time.Duration) (electedEv, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case ev := <-ch:
			if ev.node != not {
				return ev, nil
			}
		case <-t.C:
			return electedEv{}, fmt.Errorf("no new leader within %v", d)
		case <-ctx.Done():
			return electedEv{}, ctx.Err()
		}
	}
}

var nameSeq atomic.Int64

func electionName(scenario string) string {
	return fmt.Sprintf("bench-%s-%d-%d", scenario, time.Now().UnixMilli()%1_000_000_000, nameSeq.Add(1))
}

// startCandidates starts n campaigning nodes, each with its own connections.
func (s *lfSystem) startCandidates(ctx context.Context, election string, n int, tm heartbeat.Timing, elected chan<- electedEv) ([]*lfNode, error) {
	var nodes []*lfNode
	for i := range n {
		nd, err := s.startNode(ctx, election, fmt.Sprintf("node-%d", i+1), tm, false, true, elected, nil)
		if err != nil {
			stopAll(nodes)
			return nil, err
		}
		nodes = append(nodes, nd)
	}
	return nodes, nil
}

// handover: 3 candidates and one observe-only node. Each round the leader
// resigns; the sample is from just before Resign is called until the next
// leader's application reads its EventElected, and until the observer's
// application reads the EventNewLeader naming it.
func (s *lfSystem) handover(ctx context.Context, cfg config) (hand, obs series, err error) {
	hand = series{scenario: "handover", system: s.name}
	obs = series{scenario: "observer", system: s.name}
	election := electionName("handover")
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, cfg.timing, elected)
	if err != nil {
		return hand, obs, err
	}
	col := newCollector()
	o, err := s.startNode(ctx, election, "observer", cfg.timing, true, true, nil, col.add())
	if err != nil {
		stopAll(nodes)
		return hand, obs, err
	}
	defer stopAll(append(nodes, o))
	cur, err := waitElected(ctx, elected, nil, 10*time.Second)
	if err != nil {
		return hand, obs, err
	}
	if err := col.waitAll(ctx, 1, cur.node.id, 10*time.Second); err != nil {
		return hand, obs, err
	}
	for range cfg.samples {
		if err := sleep(ctx, cfg.settle); err != nil {
			return hand, obs, err
		}
		old := cur.node
		done := col.arm(1, func(l string) bool { return l != "" && l != old.id })
		t0 := time.Now()
		err := old.feed.Resign(ctx)
		hand.resign = append(hand.resign, time.Since(t0))
		if err != nil {
			col.collect()
			if ctx.Err() != nil {
				return hand, obs, ctx.Err()
			}
			hand.failed++
			obs.failed++
			if errors.Is(err, base.ErrNotLeader) { // lost it meanwhile: find the leader
				if cur, err = waitElected(ctx, elected, nil, 10*time.Second); err != nil {
					return hand, obs, err
				}
			}
			continue
		}
		ev, err := waitElected(ctx, elected, old, 5*time.Second)
		if err != nil {
			col.collect()
			return hand, obs, err
		}
		hand.samples = append(hand.samples, ev.recv.Sub(t0))
		ok := waitDone(ctx, done, 5*time.Second)
		if ts := col.collect(); ok {
			obs.samples = append(obs.samples, ts[0].Sub(t0))
		} else {
			obs.failed++
		}
		cur = ev
	}
	return hand, obs, nil
}

// crash: 3 candidates. Each round, after a random pause, the leader's
// backend is partitioned (every call fails, its feed breaks: it can
// neither renew nor resign, as if its process died); the sample is from
// the partition until the next leader's application reads EventElected.
// The crashed node is then stopped and replaced by a fresh one.
func (s *lfSystem) crash(ctx context.Context, cfg config, tm heartbeat.Timing, scenario string) (series, error) {
	out := series{scenario: scenario, system: s.name}
	election := electionName(scenario)
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, tm, elected)
	if err != nil {
		return out, err
	}
	defer func() { stopAll(nodes) }()
	cur, err := waitElected(ctx, elected, nil, 10*time.Second)
	if err != nil {
		return out, err
	}
	for r := range cfg.crashSamples {
		if err := sleep(ctx, crashPause()); err != nil {
			return out, err
		}
		old := cur.node
		t0 := time.Now()
		old.faulty.Partition()
		ev, err := waitElected(ctx, elected, old, 10*time.Second)
		if err != nil {
			return out, err
		}
		out.samples = append(out.samples, ev.recv.Sub(t0))
		cur = ev
		for i, n := range nodes {
			if n == old {
				old.stop()
				nodes[i] = nil
				nn, err := s.startNode(ctx, election, fmt.Sprintf("node-r%d", r+1), tm, false, true, elected, nil)
				if err != nil {
					return out, err
				}
				nodes[i] = nn
				if err := waitSees(ctx, nn, cur.node.id, 5*time.Second); err != nil {
					return out, err
				}
			}
		}
	}
	return out, nil
}

// crashPause is the random pause before a crash, so that crashes fall at
// every phase of the leader's renewal cycle (leaderfeed's heartbeat,
// etcd's keepalive).
func crashPause() time.Duration {
	return rand.N(500 * time.Millisecond)
}

// waitSees waits until n has observed leader.
func waitSees(ctx context.Context, n *lfNode, leader string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if rec, ok := n.feed.Leader(); ok && rec.Leader == leader {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not observe leader %s within %v", n.id, leader, d)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// fanout: 2 candidates with their own connections and n observe-only
// followers sharing one client. Each round the leader resigns and the other
// candidate takes over; a sample is, for each follower, from just before
// Resign is called until the follower's application reads the
// EventNewLeader naming the new leader.
func (s *lfSystem) fanout(ctx context.Context, cfg config, n int) (series, error) {
	out := series{scenario: fmt.Sprintf("fanout-%d", n), system: s.name}
	election := electionName(fmt.Sprintf("fanout%d", n))
	elected := make(chan electedEv, 256)
	cands, err := s.startCandidates(ctx, election, 2, cfg.timing, elected)
	if err != nil {
		return out, err
	}
	col := newCollector()
	followers := make([]*lfNode, n)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		sem      = make(chan struct{}, 16)
	)
	for i := range n {
		obs := col.add()
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			f, err := s.startNode(ctx, election, fmt.Sprintf("follower-%d", i+1), cfg.timing, true, false, nil, obs)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			followers[i] = f
		})
	}
	wg.Wait()
	defer func() { stopAll(append(cands, followers...)) }()
	if firstErr != nil {
		return out, firstErr
	}
	cur, err := waitElected(ctx, elected, nil, 10*time.Second)
	if err != nil {
		return out, err
	}
	if err := col.waitAll(ctx, n, cur.node.id, 60*time.Second); err != nil {
		return out, err
	}
	for range cfg.fanoutRounds {
		if err := sleep(ctx, cfg.settle); err != nil {
			return out, err
		}
		old, next := cands[0], cands[1]
		if cur.node == cands[1] {
			old, next = cands[1], cands[0]
		}
		done := col.arm(n, func(l string) bool { return l == next.id })
		t0 := time.Now()
		if err := old.feed.Resign(ctx); err != nil {
			col.collect()
			return out, fmt.Errorf("resign: %w", err)
		}
		ev, err := waitElected(ctx, elected, old, 5*time.Second)
		if err != nil {
			col.collect()
			return out, err
		}
		waitDone(ctx, done, 10*time.Second)
		ts := col.collect()
		for _, t := range ts {
			out.samples = append(out.samples, t.Sub(t0))
		}
		out.failed += n - len(ts)
		cur = ev
	}
	return out, nil
}

// writes: 3 candidates and one observer, left alone for cfg.intervals
// heartbeat intervals; the wrapper counts each node's Heartbeat (every
// write leaderfeed makes) and Get calls.
func (s *lfSystem) writes(ctx context.Context, cfg config) (writesRow, error) {
	row := writesRow{system: s.name}
	election := electionName("writes")
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, cfg.timing, elected)
	if err != nil {
		return row, err
	}
	o, err := s.startNode(ctx, election, "observer", cfg.timing, true, true, nil, nil)
	if err != nil {
		stopAll(nodes)
		return row, err
	}
	all := append(nodes, o)
	defer stopAll(all)
	cur, err := waitElected(ctx, elected, nil, 10*time.Second)
	if err != nil {
		return row, err
	}
	// Start the count half an interval off the renewal phase, so that no
	// renewal races with either end of the window.
	if err := sleep(ctx, 2*cfg.timing.HeartbeatInterval+cfg.timing.HeartbeatInterval/2); err != nil {
		return row, err
	}
	count := func(m faulty.Method) []int {
		c := make([]int, len(all))
		for i, n := range all {
			c[i] = n.faulty.Calls(m)
		}
		return c
	}
	hb0, get0 := count(faulty.MethodHeartbeat), count(faulty.MethodGet)
	t0 := time.Now()
	if err := sleep(ctx, time.Duration(cfg.intervals)*cfg.timing.HeartbeatInterval); err != nil {
		return row, err
	}
	hb1, get1 := count(faulty.MethodHeartbeat), count(faulty.MethodGet)
	iv := float64(time.Since(t0)) / float64(cfg.timing.HeartbeatInterval)
	if !cur.node.feed.IsLeader() {
		return row, errors.New("leadership changed during the count")
	}
	var reads int
	for i, n := range all {
		w := float64(hb1[i]-hb0[i]) / iv
		reads += get1[i] - get0[i]
		switch {
		case n == cur.node:
			row.leader = w
		case n == o:
			row.observer = w
		default:
			row.follower = max(row.follower, w)
		}
	}
	row.reads = float64(reads) / iv
	row.intervals = iv
	row.note = "Heartbeat calls (each one compare-and-set write) counted per node by faulty.Wrap"
	return row, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
