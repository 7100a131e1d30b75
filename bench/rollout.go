package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// Rolling restarts (issue 41): -rollout-nodes node processes of one
// elector kind in one election; a rollout starts a new node, waits until
// it participates (leaderfeed: its own read of Participants lists it; the
// others: they have tried for the lock or the lease once), SIGTERMs the oldest old node and
// waits for its exit, and so on until every node is new, as a
// Deployment's rolling update (maxSurge 1, maxUnavailable 0) does. The
// leader at the start is an old node, since every node is. Per rollout,
// from just before the first new node starts until a new node leads:
// how many times leadership moved to another node, and for how long no
// node believed it led (the nodes' own reports, on the machine's
// monotonic clock).

// rolloutResult is what the rollouts of one elector kind measured.
type rolloutResult struct {
	kind    string
	moves   []int           // leader changes per rollout
	gaps    []time.Duration // total leaderless time per rollout
	longest []time.Duration // longest leaderless gap per rollout
	took    []time.Duration // from the first start until a new node led
	ended   map[string]int  // why leaderships ended during the rollouts
	checks  overlapStats
	lost    losses // rollouts without a leader to start from, retried
	joined  string // leaderfeed: what the store's Presence.Joined held
	err     error
}

type rolloutReport struct {
	nodes, rollouts int
	pause           time.Duration
	bound           time.Duration
	timing          heartbeat.Timing
	advRetry        time.Duration
	results         []*rolloutResult
}

// rolloutConfig is cfg at the rollout's dead-leader bound (-rollout-ttl):
// leaderfeed's timing scaled as -ttl scales it (4 s: the default timing),
// the advisory lock's retry and the lease's TTL at the bound.
func rolloutConfig(cfg config) config {
	rc := cfg
	rc.ttl = cfg.rolloutTTL
	b := rc.bound()
	rc.timing = heartbeat.Timing{HeartbeatInterval: b / 4, ElectionTimeoutMin: b / 2, ElectionTimeoutMax: b}.WithDefaults()
	rc.advRetry = b
	return rc
}

func runRollouts(ctx context.Context, cfg config, pool *pgxpool.Pool) *rolloutReport {
	rc := rolloutConfig(cfg)
	rep := &rolloutReport{nodes: cfg.rolloutNodes, rollouts: cfg.rollouts, pause: cfg.rolloutPause, bound: rc.bound(), timing: rc.timing, advRetry: rc.advRetry}
	if err := createLeaseTable(ctx, pool); err != nil {
		rep.results = append(rep.results, &rolloutResult{kind: kindLease, err: err})
		return rep
	}
	logf("rolling restarts: %d nodes, %d rollouts per elector, bound %v (load %s)", cfg.rolloutNodes, cfg.rollouts, rc.bound(), loadNow())
	for _, kind := range electorKinds {
		r := &rolloutResult{kind: kind, ended: map[string]int{}}
		r.err = rollouts(ctx, rc, pool, r)
		rep.results = append(rep.results, r)
		logRollout(r)
		if ctx.Err() != nil {
			break
		}
	}
	return rep
}

func logRollout(r *rolloutResult) {
	if r.err != nil {
		logf("  rollout %s: FAILED: %v", r.kind, r.err)
	}
	if len(r.moves) == 0 {
		return
	}
	logf("  rollout %s: %d rollouts; leader changes p50 %d max %d; leaderless p50 %s max %s ms; leaderships ended: %s; overlaps %d%s",
		r.kind, len(r.moves), quantileInt(r.moves, 0.5), slices.Max(r.moves), ms(summarize(r.gaps).p50), ms(summarize(r.gaps).max), fmtReasons(r.ended), r.checks.count, r.joined)
}

// quantileInt is the nearest-rank quantile of counts.
func quantileInt(s []int, q float64) int {
	d := make([]time.Duration, len(s))
	for i, v := range s {
		d[i] = time.Duration(v)
	}
	return int(quantile(slices.Sorted(slices.Values(d)), q))
}

func rollouts(ctx context.Context, rc config, pool *pgxpool.Pool, r *rolloutResult) error {
	u, err := url.Parse(rc.pgURL)
	if err != nil {
		return err
	}
	var extra []string
	if r.kind == kindLeaderfeed {
		extra = []string{"-participate"}
	}
	// Node ids in start order (n001, n002, ...): when the store gives no
	// Joined time, leaderfeed's successor is the lowest id, the oldest.
	c := &cluster{kind: r.kind, election: electionName("rollout-" + shortKind(r.kind)), elections: 1, cfg: rc, pgURL: u,
		events: make(chan nodeEvent, 65536), open: map[string]*belief{}, extra: extra, idFormat: "n%03d"}
	defer func() {
		c.close()
		r.checks = c.overlaps()
	}()
	wait := rc.within(rc.bound())
	startNode := func() (*nodeProc, error) {
		slot := len(c.procs)
		c.procs = append(c.procs, nil)
		if err := c.start(ctx, slot); err != nil {
			return nil, err
		}
		p := c.procs[slot]
		select {
		case <-p.joined:
			return p, nil
		case <-p.exited:
			return nil, fmt.Errorf("%s exited before it participated", p.name)
		case <-time.After(wait):
			return nil, fmt.Errorf("%s did not participate within %v", p.name, wait)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	for range rc.rolloutNodes {
		if _, err := startNode(); err != nil {
			return err
		}
	}
	for len(r.moves) < rc.rollouts {
		if err := r.lost.tooMany(rc.rollouts); err != nil {
			return err
		}
		if _, err := c.waitLeader(ctx, 0, wait); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.lost.lose("rollout "+r.kind, fmt.Sprintf("no leader within %v", wait))
			continue
		}
		// A pause, so that the rollout starts at any phase of the nodes'
		// timers and the participants' records are fresh.
		if err := sleep(ctx, rc.settle+rand.N(rc.timing.HeartbeatInterval)); err != nil {
			return err
		}
		if r.kind == kindLeaderfeed && r.joined == "" {
			r.joined = joinedNote(ctx, pool, c.election)
		}
		var old []*nodeProc
		for _, p := range c.procs {
			if p != nil && !isClosed(p.exited) {
				old = append(old, p)
			}
		}
		t0 := monotonic()
		for i, o := range old {
			if i > 0 {
				if err := sleep(ctx, rc.rolloutPause); err != nil {
					return err
				}
			}
			if _, err := startNode(); err != nil {
				return err
			}
			c.terminate(o, 10*time.Second)
		}
		if _, err := c.waitLeader(ctx, 0, wait); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.lost.lose("rollout "+r.kind, fmt.Sprintf("no new node led within %v of the rollout's end", wait))
			continue
		}
		// The new leader's report is in; give the other processes' pipes
		// a moment for theirs.
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
		t1 := monotonic()
		bs := c.beliefsOf(t0, t1)[0]
		for _, b := range bs {
			if b.end < t1 && b.reason != "" {
				r.ended[b.reason]++
			}
		}
		moves, gaps, longest := leadershipOf(bs, t0, t1)
		r.moves = append(r.moves, moves)
		r.gaps = append(r.gaps, gaps)
		r.longest = append(r.longest, longest)
		r.took = append(r.took, time.Duration(t1-t0))
	}
	return nil
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// beliefsOf returns copies of the beliefs open at some time between t0
// and t1, by election, the open ones ending at t1.
func (c *cluster) beliefsOf(t0, t1 int64) map[int][]belief {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int][]belief{}
	for _, b := range c.beliefs {
		v := *b
		if v.end == 0 {
			v.end = t1
		}
		if v.start < t1 && v.end > t0 {
			out[v.idx] = append(out[v.idx], v)
		}
	}
	return out
}

// leadershipOf reads one election's beliefs between t0 and t1: how many
// times leadership moved to another process (a belief that starts after
// t0 in a process other than the one before), how long no process
// believed it led, and the longest such gap.
func leadershipOf(bs []belief, t0, t1 int64) (moves int, leaderless, longest time.Duration) {
	slices.SortFunc(bs, func(a, b belief) int { return int(a.start - b.start) })
	prev := ""
	for _, b := range bs {
		if b.start > t0 && b.proc != prev && prev != "" {
			moves++
		}
		prev = b.proc
	}
	at := t0 // covered until at
	gap := func(until int64) {
		if until > at {
			d := time.Duration(until - at)
			leaderless += d
			longest = max(longest, d)
			at = until
		}
	}
	for _, b := range bs {
		gap(min(b.start, t1))
		at = max(at, min(b.end, t1))
	}
	gap(t1)
	return moves, leaderless, longest
}

// joinedNote says whether the store gives the participants' Joined
// times, on which leaderfeed's choice of successor rests.
func joinedNote(ctx context.Context, pool *pgxpool.Pool, election string) string {
	b, err := postgres.New(pool, election, pgOptions)
	if err != nil {
		return "; Joined: " + err.Error()
	}
	defer b.Close()
	pe, ok := b.(backend.PresenceElection)
	if !ok {
		return "; Joined: no presence capability"
	}
	ps, _, err := pe.Participants(ctx)
	if err != nil {
		return "; Joined: " + err.Error()
	}
	zero := 0
	for _, p := range ps {
		if p.Joined.IsZero() {
			zero++
		}
	}
	if zero > 0 {
		return fmt.Sprintf("; Joined zero in %d of %d presence records: the successor is the lowest node id, here the oldest", zero, len(ps))
	}
	return fmt.Sprintf("; Joined set in all %d presence records", len(ps))
}

// markdown is the rollout section of results.md.
func (m *rolloutReport) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	t, lt := m.timing, riverTiming(m.bound)
	p("## Rolling restarts (issue 41)\n\n")
	p("%d node processes of one elector in one election; a rollout starts a new node, waits until it participates, SIGTERMs the oldest old node and waits for its exit, and %v later the next step (a real node takes that long to start and be ready), until all %d are new (a Deployment's rolling update with maxSurge 1, maxUnavailable 0). Every node stops as a service does on SIGTERM: leaderfeed `Stop` (which hands over to the live participant that joined last), the advisory lock closes its session, the polling lease deletes its row. Dead-leader bound %v: leaderfeed participates (`Options.Participate`, default PresenceInterval) with heartbeat %v, election timeout %v–%v, lease %v, and \"participates\" means its own read of `Participants` lists it; the advisory lock retries every %v; the polling lease polls every %v + up to %v (TTL %v); those two participate once they have tried for the lock or lease once. Measured per rollout, from just before the first new node starts until a new node leads: leader changes (a node other than the last one begins to believe it leads) and the time no node believed it led, from the nodes' reports on the machine's monotonic clock. %d rollouts per elector, one after the other.\n\n",
		m.nodes, m.pause, m.nodes, m.bound, t.HeartbeatInterval, t.ElectionTimeoutMin, t.ElectionTimeoutMax, t.LeaseDuration, m.advRetry, lt.interval, lt.jitter, lt.ttl, m.rollouts)
	p("%s", m.table())
	p("\n")
	for _, r := range m.results {
		if r.joined != "" {
			p("- %s%s.\n", r.kind, r.joined)
		}
		if n := r.lost.total(); n > 0 {
			p("- %s: lost rollouts: %d, retried (%s).\n", r.kind, n, r.lost)
		}
		if r.err != nil {
			p("- %s failed: %v.\n", r.kind, r.err)
		}
	}
	return b.String()
}

// table is the rollouts' table, one row per elector.
func (m *rolloutReport) table() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("| elector | rollouts | leader changes per rollout, p50 / max | leaderless ms per rollout, p50 / max | longest gap ms | rollout s, p50 | leaderships ended (why) | overlaps |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	for _, r := range m.results {
		if len(r.moves) == 0 {
			p("| %s | 0 | – | – | – | – | – | %d |\n", r.kind, r.checks.count)
			continue
		}
		p("| %s | %d | %d / %d | %s / %s | %s | %.1f | %s | %d |\n", r.kind, len(r.moves), quantileInt(r.moves, 0.5), slices.Max(r.moves),
			ms(summarize(r.gaps).p50), ms(summarize(r.gaps).max), ms(summarize(r.longest).max), summarize(r.took).p50.Seconds(), fmtReasons(r.ended), r.checks.count)
	}
	return b.String()
}
