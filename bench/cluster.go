package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A cluster is three node processes (bench node) of one elector kind in
// one election (or -elections of them), each behind a silentProxy of its
// own. It records every belief the nodes report; overlaps() is the
// leadership checker, which looks only at those reports, not at how any
// elector works.

type nodeProc struct {
	slot     int
	name     string // unique per process, e.g. "advisory-lock/n2#3"
	cmd      *exec.Cmd
	stdin    *os.File
	ready    chan struct{}
	joined   chan struct{} // closed on its P line: it participates
	counts   chan int64
	exited   chan struct{}
	killedAt int64 // monotonic, when kill(2) returned
	endAt    int64 // monotonic, when the exit was noticed
}

type nodeEvent struct {
	p      *nodeProc
	kind   byte // 'E', 'U', 'S'
	mono   int64
	idx    int
	reason string
}

// belief is one interval during which a node believed it led an election.
type belief struct {
	proc       string
	idx        int
	start, end int64 // end 0: still open
	reason     string
}

type cluster struct {
	kind      string
	election  string
	elections int
	cfg       config
	pgURL     *url.URL
	proxies   []*silentProxy // one per slot; nil: the nodes connect to the server itself
	procs     []*nodeProc
	events    chan nodeEvent
	starts    int
	extra     []string // more flags of every node
	idFormat  string   // fmt format of a node's id from its slot + 1; "" is "n%d"

	mu      sync.Mutex
	beliefs []*belief
	open    map[string]*belief // proc/idx → open belief
}

// newCluster starts three nodes. With proxied, each reaches the server
// through a silentProxy of its own (the cut needs one); without, directly,
// as the floor's connections do: a proxy adds a hop through this process
// to every statement and notification of a handover.
func newCluster(ctx context.Context, cfg config, kind, scenario string, elections int, proxied bool, extra ...string) (*cluster, error) {
	u, err := url.Parse(cfg.pgURL)
	if err != nil {
		return nil, fmt.Errorf("-postgres: %w", err)
	}
	c := &cluster{kind: kind, election: electionName(scenario + "-" + shortKind(kind)), elections: elections, cfg: cfg, pgURL: u,
		events: make(chan nodeEvent, 65536), open: map[string]*belief{}, extra: extra}
	for slot := range 3 {
		if proxied {
			px, err := newSilentProxy(u.Host, cfg.serverKeepalive)
			if err != nil {
				c.close()
				return nil, err
			}
			c.proxies = append(c.proxies, px)
		}
		c.procs = append(c.procs, nil)
		if err := c.start(ctx, slot); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func shortKind(kind string) string {
	switch kind {
	case kindAdvisory:
		return "adv"
	case kindLease:
		return "lease"
	case kindEtcd:
		return "etcd"
	}
	return "lf"
}

// start starts a node process in slot and waits until it is ready.
func (c *cluster) start(ctx context.Context, slot int) error {
	c.starts++
	u := *c.pgURL
	if c.proxies != nil {
		u.Host = c.proxies[slot].addr()
	}
	b := c.cfg.bound()
	idFormat := c.idFormat
	if idFormat == "" {
		idFormat = "n%d"
	}
	id := fmt.Sprintf(idFormat, slot+1)
	cmd := exec.Command(selfExe, "node", "-kind", c.kind, "-election", c.election, "-elections", strconv.Itoa(c.elections),
		"-id", id, "-bound", b.String(), "-heartbeat", c.cfg.timing.HeartbeatInterval.String(),
		"-emin", c.cfg.timing.ElectionTimeoutMin.String(), "-adv-retry", c.cfg.advRetry.String())
	cmd.Args = append(cmd.Args, c.extra...)
	if c.cfg.nodeDebug {
		cmd.Args = append(cmd.Args, "-debug")
	}
	cmd.Env = append(os.Environ(), nodeURLEnv+"="+u.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start node: %w", err)
	}
	r.Close()
	p := &nodeProc{slot: slot, name: fmt.Sprintf("%s/%s#%d", c.kind, id, c.starts), cmd: cmd, stdin: w,
		ready: make(chan struct{}), joined: make(chan struct{}), counts: make(chan int64, 4), exited: make(chan struct{})}
	c.procs[slot] = p
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.line(p, sc.Text())
		}
		_ = cmd.Wait()
		p.endAt = monotonic()
		c.closeBeliefs(p)
		close(p.exited)
	}()
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return fmt.Errorf("%s: node process exited before it was ready", p.name)
	case <-t.C:
		c.kill(p)
		return fmt.Errorf("%s: node not ready within 15 s", p.name)
	case <-ctx.Done():
		c.kill(p)
		return ctx.Err()
	}
}

func (c *cluster) line(p *nodeProc, s string) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case "R":
		close(p.ready)
		return
	case "P":
		close(p.joined)
		return
	case "C":
		if len(f) == 2 {
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				p.counts <- n
			}
		}
		return
	}
	if len(f) < 3 || len(f[0]) != 1 {
		return
	}
	mono, err1 := strconv.ParseInt(f[1], 10, 64)
	idx, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		logf("  %s: bad line %q", p.name, s)
		return
	}
	ev := nodeEvent{p: p, kind: f[0][0], mono: mono, idx: idx}
	if len(f) > 3 {
		ev.reason = f[3]
	}
	key := p.name + "/" + f[2]
	c.mu.Lock()
	switch ev.kind {
	case 'E':
		b := &belief{proc: p.name, idx: idx, start: mono}
		c.beliefs = append(c.beliefs, b)
		c.open[key] = b
	case 'U':
		if b := c.open[key]; b != nil {
			b.end, b.reason = mono, ev.reason
			delete(c.open, key)
		}
	}
	c.mu.Unlock()
	select {
	case c.events <- ev:
	default: // nobody reads (the cost scenario)
	}
}

// closeBeliefs ends p's open beliefs when its process has ended: at the
// kill, if it was killed (a dead process does not act), else at its exit.
func (c *cluster) closeBeliefs(p *nodeProc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end, reason := p.endAt, "exited"
	if p.killedAt != 0 {
		end, reason = p.killedAt, "killed"
	}
	for key, b := range c.open {
		if b.proc == p.name {
			b.end, b.reason = end, reason
			delete(c.open, key)
		}
	}
}

// kill sends SIGKILL to p and notes when kill(2) returned.
func (c *cluster) kill(p *nodeProc) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	c.mu.Lock()
	p.killedAt = monotonic()
	c.mu.Unlock()
	<-p.exited
	p.stdin.Close()
}

// terminate sends SIGTERM to p, as a rolling restart stops a node, and
// waits (at most d, then SIGKILL) until it has exited.
func (c *cluster) terminate(p *nodeProc, d time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		p.stdin.Close()
	case <-time.After(d):
		c.kill(p)
	}
}

// stopProc ends p gracefully: end of stdin, then SIGKILL after 5 s.
func (c *cluster) stopProc(p *nodeProc) {
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		c.kill(p)
	}
}

func (c *cluster) close() {
	var wg sync.WaitGroup
	for _, p := range c.procs {
		if p != nil {
			wg.Go(func() { c.stopProc(p) })
		}
	}
	wg.Wait()
	for _, px := range c.proxies {
		px.close()
	}
}

func (c *cluster) send(p *nodeProc, cmd string) error {
	_, err := fmt.Fprintln(p.stdin, cmd)
	return err
}

// leaderOf returns the live process that believes it leads election idx.
func (c *cluster) leaderOf(idx int) *nodeProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.open {
		if b.idx != idx {
			continue
		}
		for _, p := range c.procs {
			if p != nil && p.name == b.proc && p.killedAt == 0 {
				return p
			}
		}
	}
	return nil
}

// waitLeader waits until some live process leads election idx.
func (c *cluster) waitLeader(ctx context.Context, idx int, d time.Duration) (*nodeProc, error) {
	deadline := time.Now().Add(d)
	for {
		if p := c.leaderOf(idx); p != nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: no leader of election %d within %v", c.kind, idx, d)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// drain drops the events received so far.
func (c *cluster) drain() {
	for {
		select {
		case <-c.events:
		default:
			return
		}
	}
}

var errNoEvent = errors.New("no such event in time")

// next returns the next event that match accepts, waiting until the
// monotonic deadline.
func (c *cluster) next(ctx context.Context, deadline int64, match func(nodeEvent) bool) (nodeEvent, error) {
	for {
		left := time.Duration(deadline - monotonic())
		if left <= 0 {
			return nodeEvent{}, errNoEvent
		}
		t := time.NewTimer(left)
		select {
		case ev := <-c.events:
			t.Stop()
			if match(ev) {
				return ev, nil
			}
		case <-t.C:
			return nodeEvent{}, errNoEvent
		case <-ctx.Done():
			t.Stop()
			return nodeEvent{}, ctx.Err()
		}
	}
}

// leaderless describes up to n elections without a live leader: how the
// last leadership of each ended (by whom, why, how long ago), so that a
// wait that timed out says where to look.
func (c *cluster) leaderless(n int) string {
	now := monotonic()
	var out []string
	for i := 0; i < c.elections && len(out) < n; i++ {
		if c.leaderOf(i) != nil {
			continue
		}
		c.mu.Lock()
		var last *belief
		for _, b := range c.beliefs {
			if b.idx == i && (last == nil || b.start > last.start) {
				l := *b
				last = &l
			}
		}
		c.mu.Unlock()
		switch {
		case last == nil:
			out = append(out, fmt.Sprintf("election %d: never led", i))
		case last.end == 0:
			out = append(out, fmt.Sprintf("election %d: last led by %s, a process no longer live", i, last.proc))
		default:
			out = append(out, fmt.Sprintf("election %d: last led by %s, ended (%s) %v ago", i, last.proc, last.reason,
				time.Duration(now-last.end).Round(time.Millisecond)))
		}
	}
	return strings.Join(out, "; ")
}

// beliefOf returns (a copy of) proc's belief of leading election idx that
// was open at t; the zero belief if there was none.
func (c *cluster) beliefOf(proc string, idx int, t int64) belief {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.beliefs {
		if b.proc == proc && b.idx == idx && b.start <= t && (b.end == 0 || b.end > t) {
			return *b
		}
	}
	return belief{}
}

// overlapStats is what the checker found.
type overlapStats struct {
	intervals int
	count     int
	durations []time.Duration
}

// overlaps compares every two beliefs of different processes in the same
// election. Call it after close, when every belief has ended.
func (c *cluster) overlaps() overlapStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	byIdx := map[int][]*belief{}
	for _, b := range c.beliefs {
		byIdx[b.idx] = append(byIdx[b.idx], b)
	}
	var st overlapStats
	for _, bs := range byIdx {
		slices.SortFunc(bs, func(a, b *belief) int { return int(a.start - b.start) })
		st.intervals += len(bs)
		for i, a := range bs {
			for _, b := range bs[i+1:] {
				if b.start >= a.end {
					break
				}
				if a.proc == b.proc {
					continue
				}
				st.count++
				st.durations = append(st.durations, time.Duration(min(a.end, b.end)-b.start))
			}
		}
	}
	return st
}
