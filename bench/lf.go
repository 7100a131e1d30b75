package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// opener returns a backend for one node of an election, and a function
// that releases what it opened once the feed has stopped. own asks for
// connections of the node's own, as a node in a process of its own would
// have; otherwise the backend shares the system's client with the other
// nodes opened that way (the 1,000 followers of the fan-out scenario).
type opener func(ctx context.Context, election string, own bool) (backend.Election, func(), error)

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

	mu        sync.Mutex
	endTerm   uint64 // of the last EventUnelected read
	endReason base.Reason
}

// ended says why the node's leadership of term ended, for a lost round's
// cause: the reason of its EventUnelected for that term, waiting a moment
// for the event (it may be read after Resign has returned).
func (n *lfNode) ended(ctx context.Context, term uint64) string {
	for range 100 {
		n.mu.Lock()
		t, r := n.endTerm, n.endReason
		n.mu.Unlock()
		if t >= term {
			return "unelected: " + r.String()
		}
		if sleep(ctx, 10*time.Millisecond) != nil {
			break
		}
	}
	return "its EventUnelected not read within 1s"
}

// electedEv is an EventElected as the application received it.
type electedEv struct {
	node *lfNode
	recv time.Time // when the application read the event
	term uint64
}

// startNode starts a feed. Its EventElected go to elected (if not nil),
// its EventNewLeader to obs (if not nil), both stamped when read.
// participate makes the node participate, with the default
// PresenceInterval.
func (s *lfSystem) startNode(ctx context.Context, election, id string, tm heartbeat.Timing, observeOnly, own, participate bool, elected chan<- electedEv, obs *observer) (*lfNode, error) {
	b, release, err := s.open(ctx, election, own)
	if err != nil {
		return nil, err
	}
	fb := faulty.Wrap(b)
	f, err := base.New(fb, id, base.Options{Timing: tm, ObserveOnly: observeOnly, Participate: participate})
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
			case base.EventUnelected:
				n.mu.Lock()
				n.endTerm, n.endReason = e.Term, e.Reason
				n.mu.Unlock()
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

// waitElected returns the next election of a node other than not to a
// term above after: events of earlier terms (a leadership lost and won
// again under load, read late) are not this round's.
func waitElected(ctx context.Context, ch <-chan electedEv, not *lfNode, after uint64, d time.Duration) (electedEv, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case ev := <-ch:
			if ev.node != not && ev.term > after {
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
func (s *lfSystem) startCandidates(ctx context.Context, election string, n int, tm heartbeat.Timing, participate bool, elected chan<- electedEv) ([]*lfNode, error) {
	var nodes []*lfNode
	for i := range n {
		nd, err := s.startNode(ctx, election, fmt.Sprintf("node-%d", i+1), tm, false, true, participate, elected, nil)
		if err != nil {
			stopAll(nodes)
			return nil, err
		}
		nodes = append(nodes, nd)
	}
	return nodes, nil
}

// settle waits until exactly one of nodes leads and every node (nil ones
// skipped) has observed its record, and returns the leader and its term.
// Rounds start from there, and start again from there after a lost round,
// whoever leads by then.
func settle(ctx context.Context, nodes []*lfNode, d time.Duration) (*lfNode, uint64, error) {
	deadline := time.Now().Add(d)
	for {
		var leader *lfNode
		var term uint64
		leaders := 0
		for _, n := range nodes {
			if n == nil {
				continue
			}
			if t, ok := n.feed.Term(); ok {
				leader, term = n, t
				leaders++
			}
		}
		if leaders == 1 && allSee(nodes, leader.id, term) {
			return leader, term, nil
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("no leader observed by every node within %v", d)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return nil, 0, err
		}
	}
}

func allSee(nodes []*lfNode, leader string, term uint64) bool {
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if rec, ok := n.feed.Leader(); !ok || rec.Leader != leader || rec.Term != term {
			return false
		}
	}
	return true
}

// resignRound has old, leader of term, resign, and waits (at most d) for
// another node's election. It returns that election, or why the round is
// lost: the lease ran out before the resign (ErrNotLeader), the resign's
// write failed, or no new leader came within d.
func resignRound(ctx context.Context, old *lfNode, term uint64, elected <-chan electedEv, d time.Duration, t0 *time.Time, resign *[]time.Duration) (electedEv, string, error) {
	*t0 = time.Now()
	err := old.feed.Resign(ctx)
	*resign = append(*resign, time.Since(*t0))
	switch {
	case ctx.Err() != nil:
		return electedEv{}, "", ctx.Err()
	case errors.Is(err, base.ErrNotLeader):
		return electedEv{}, "leadership lost before the resign (" + old.ended(ctx, term) + ")", nil
	case err != nil:
		return electedEv{}, "resign failed: " + err.Error(), nil
	}
	ev, err := waitElected(ctx, elected, old, term, d)
	switch {
	case ctx.Err() != nil:
		return ev, "", ctx.Err()
	case err != nil:
		return ev, err.Error() + " of the resign", nil
	}
	return ev, "", nil
}

// handover: 3 candidates and one observe-only node. Each round the leader
// resigns; the sample is from just before Resign is called until the next
// leader's application reads its EventElected, and until the observer's
// application reads the EventNewLeader naming it. A round lost under load
// (see resignRound) is counted and retried.
func (s *lfSystem) handover(ctx context.Context, cfg config) (hand, obs series, err error) {
	hand = series{scenario: "handover", system: s.name}
	obs = series{scenario: "observer", system: s.name}
	election := electionName("handover")
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, cfg.timing, !cfg.noPresence, elected)
	if err != nil {
		return hand, obs, err
	}
	col := newCollector()
	o, err := s.startNode(ctx, election, "observer", cfg.timing, true, true, false, nil, col.add())
	if err != nil {
		stopAll(nodes)
		return hand, obs, err
	}
	all := append(slices.Clip(nodes), o)
	defer stopAll(all)
	// A new leader comes within the election timeout even if the vacancy
	// is missed.
	wait := cfg.within(cfg.timing.ElectionTimeoutMax)
	cur, term, err := settle(ctx, all, wait)
	if err != nil {
		return hand, obs, err
	}
	for len(hand.samples) < cfg.samples {
		if err := hand.tooManyLost(cfg.samples); err != nil {
			return hand, obs, err
		}
		if err := sleep(ctx, cfg.settle); err != nil {
			return hand, obs, err
		}
		old := cur
		done := col.arm(1, func(l string) bool { return l != "" && l != old.id })
		var t0 time.Time
		ev, lost, err := resignRound(ctx, old, term, elected, wait, &t0, &hand.resign)
		if err != nil {
			col.collect()
			return hand, obs, err
		}
		if lost != "" {
			col.collect()
			hand.lose(lost)
			obs.lost.add(lost) // the same round, logged once
			if cur, term, err = settle(ctx, all, wait); err != nil {
				return hand, obs, err
			}
			continue
		}
		hand.samples = append(hand.samples, ev.recv.Sub(t0))
		ok := waitDone(ctx, done, wait)
		if ts := col.collect(); ok {
			obs.samples = append(obs.samples, ts[0].Sub(t0))
		} else {
			obs.failed++
		}
		cur, term = ev.node, ev.term
	}
	return hand, obs, nil
}

// crash: 3 candidates. Each round, after a random pause, the leader's
// backend is partitioned (every call fails, its feed breaks: it can
// neither renew nor resign, as if its process died); the sample is from
// the partition until the next leader's application reads EventElected.
// The crashed node is then stopped and replaced by a fresh one. A round
// in which the leader had lost its lease before the partition, or no new
// leader came within -slack election timeouts, is counted and retried.
func (s *lfSystem) crash(ctx context.Context, cfg config, tm heartbeat.Timing, scenario string) (series, error) {
	out := series{scenario: scenario, system: s.name}
	election := electionName(scenario)
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, tm, false, elected)
	if err != nil {
		return out, err
	}
	defer func() { stopAll(nodes) }()
	wait := cfg.within(tm.ElectionTimeoutMax)
	cur, term, err := settle(ctx, nodes, wait)
	if err != nil {
		return out, err
	}
	for r := 1; len(out.samples) < cfg.crashSamples; r++ {
		if err := out.tooManyLost(cfg.crashSamples); err != nil {
			return out, err
		}
		if err := sleep(ctx, crashPause()); err != nil {
			return out, err
		}
		old := cur
		t0 := time.Now()
		old.faulty.Partition()
		// Leading after the partition began, it led at t0, so no other
		// node can have been elected before t0. If it lost its lease in
		// the pause, another node may lead since before t0: no sample.
		if t, ok := old.feed.Term(); !ok || t != term {
			out.lose("leadership lost before the crash (" + old.ended(ctx, term) + ")")
		} else if ev, err := waitElected(ctx, elected, old, term, wait); ctx.Err() != nil {
			return out, ctx.Err()
		} else if err != nil {
			out.lose(err.Error() + " of the crash")
		} else {
			out.samples = append(out.samples, ev.recv.Sub(t0))
		}
		i := slices.Index(nodes, old)
		old.stop()
		nodes[i] = nil
		nn, err := s.startNode(ctx, election, fmt.Sprintf("node-r%d", r), tm, false, true, false, elected, nil)
		if err != nil {
			return out, err
		}
		nodes[i] = nn
		if cur, term, err = settle(ctx, nodes, wait); err != nil {
			return out, err
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

// fanout: 2 candidates with their own connections and n observe-only
// followers sharing one client. Each round the leader resigns and the other
// candidate takes over; a sample is, for each follower, from just before
// Resign is called until the follower's application reads the
// EventNewLeader naming the new leader. A round lost under load (see
// resignRound), or whose deliveries did not all come because the new
// leader lost its leadership meanwhile, is counted and retried once every
// follower has observed the leader of then.
func (s *lfSystem) fanout(ctx context.Context, cfg config, n int) (series, error) {
	out := series{scenario: fmt.Sprintf("fanout-%d", n), system: s.name}
	election := electionName(fmt.Sprintf("fanout%d", n))
	elected := make(chan electedEv, 256)
	cands, err := s.startCandidates(ctx, election, 2, cfg.timing, false, elected)
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
			f, err := s.startNode(ctx, election, fmt.Sprintf("follower-%d", i+1), cfg.timing, true, false, false, nil, obs)
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
	wait := cfg.within(cfg.timing.ElectionTimeoutMax)
	cur, term, err := settle(ctx, cands, wait)
	if err != nil {
		return out, err
	}
	if err := col.waitAll(ctx, n, cur.id, 60*time.Second); err != nil {
		return out, err
	}
	// resync finds the leader after a lost round and waits until every
	// follower has observed it.
	resync := func() error {
		for {
			if cur, term, err = settle(ctx, cands, wait); err != nil {
				return err
			}
			err := col.waitAll(ctx, n, cur.id, wait)
			if err == nil || ctx.Err() != nil {
				return err
			}
			out.lose(fmt.Sprintf("followers did not all observe the leader within %v after a lost round", wait))
			if err := out.tooManyLost(cfg.fanoutRounds); err != nil {
				return err
			}
		}
	}
	for rounds := 0; rounds < cfg.fanoutRounds; {
		if err := out.tooManyLost(cfg.fanoutRounds); err != nil {
			return out, err
		}
		if err := sleep(ctx, cfg.settle); err != nil {
			return out, err
		}
		old, next := cands[0], cands[1]
		if cur == cands[1] {
			old, next = cands[1], cands[0]
		}
		done := col.arm(n, func(l string) bool { return l == next.id })
		var (
			t0     time.Time
			resign []time.Duration
		)
		ev, lost, err := resignRound(ctx, old, term, elected, wait, &t0, &resign)
		if err != nil {
			col.collect()
			return out, err
		}
		if lost == "" && !waitDone(ctx, done, wait) {
			if ctx.Err() != nil {
				col.collect()
				return out, ctx.Err()
			}
			if t, ok := ev.node.feed.Term(); !ok || t != ev.term {
				lost = "leadership changed during the round (" + ev.node.ended(ctx, ev.term) + ")"
			}
		}
		ts := col.collect()
		if lost != "" {
			out.lose(lost)
			if err := resync(); err != nil {
				return out, err
			}
			continue
		}
		for _, t := range ts {
			out.samples = append(out.samples, t.Sub(t0))
		}
		out.failed += n - len(ts)
		cur, term = ev.node, ev.term
		rounds++
	}
	return out, nil
}

// writeCounts is how many times writes counts before it gives up waiting
// for a count without a change of leadership.
const writeCounts = 5

// writes: 3 candidates and one observer, left alone for cfg.intervals
// heartbeat intervals; the wrapper counts each node's Heartbeat (every
// write leaderfeed makes) and Get calls. A count during which the
// leadership changed (a lease lost under load, with its claim) is counted
// and done again, at most writeCounts times; if every one changed, the
// last is reported, marked unsettled.
func (s *lfSystem) writes(ctx context.Context, cfg config) (writesRow, error) {
	row := writesRow{system: s.name}
	election := electionName("writes")
	elected := make(chan electedEv, 256)
	nodes, err := s.startCandidates(ctx, election, 3, cfg.timing, false, elected)
	if err != nil {
		return row, err
	}
	o, err := s.startNode(ctx, election, "observer", cfg.timing, true, true, false, nil, nil)
	if err != nil {
		stopAll(nodes)
		return row, err
	}
	all := append(slices.Clip(nodes), o)
	defer stopAll(all)
	count := func(m faulty.Method) []int {
		c := make([]int, len(all))
		for i, n := range all {
			c[i] = n.faulty.Calls(m)
		}
		return c
	}
	for attempt := 1; ; attempt++ {
		cur, term, err := settle(ctx, all, cfg.within(cfg.timing.ElectionTimeoutMax))
		if err != nil {
			return row, err
		}
		// Start the count half an interval off the renewal phase, so that no
		// renewal races with either end of the window.
		if err := sleep(ctx, 2*cfg.timing.HeartbeatInterval+cfg.timing.HeartbeatInterval/2); err != nil {
			return row, err
		}
		hb0, get0 := count(faulty.MethodHeartbeat), count(faulty.MethodGet)
		t0 := time.Now()
		if err := sleep(ctx, time.Duration(cfg.intervals)*cfg.timing.HeartbeatInterval); err != nil {
			return row, err
		}
		hb1, get1 := count(faulty.MethodHeartbeat), count(faulty.MethodGet)
		iv := float64(time.Since(t0)) / float64(cfg.timing.HeartbeatInterval)
		if t, ok := cur.feed.Term(); !ok || t != term {
			row.lost.add("leadership changed during the count (" + cur.ended(ctx, term) + ")")
			if attempt < writeCounts {
				logf("  writes %s: leadership changed during the count, counting again (%s)", s.name, row.lost)
				continue
			}
			row.unsettled = true
		}
		var reads int
		for i, n := range all {
			w := float64(hb1[i]-hb0[i]) / iv
			reads += get1[i] - get0[i]
			switch {
			case n == cur:
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
		if row.unsettled {
			row.note += fmt.Sprintf("; the leadership changed during each of %d counts (leases lost under load), so these figures are of the last one and include its claims", writeCounts)
		}
		return row, nil
	}
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
