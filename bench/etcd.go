package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdSystem is etcd's concurrency.Election on an embedded single-member
// etcd server on loopback, with its data in a temporary directory.
type etcdSystem struct {
	srv       *embed.Etcd
	dir       string
	endpoints []string
	ttl       int // session TTL in seconds
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts the embedded server. Its raft tick is 10 ms and its
// election timeout 100 ms, so that the smallest lease TTL it grants
// (1.5 election timeouts, rounded up to whole seconds) is 1 s rather than
// the default 2 s. fsync is off, as on the benchmark's PostgreSQL.
func startEtcd(ttl int) (*etcdSystem, error) {
	dir, err := os.MkdirTemp("", "leaderfeed-bench-etcd.")
	if err != nil {
		return nil, err
	}
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", cport))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", pport))
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	// The server's log goes to a file in its data directory: it logs
	// harmless errors at start and stop. Failures reach the clients.
	logPath := filepath.Join(dir, "etcd.log")
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{logPath}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		log, _ := os.ReadFile(logPath)
		os.RemoveAll(dir)
		return nil, fmt.Errorf("etcd: start: %w\n%s", err, log[max(0, len(log)-2000):])
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		os.RemoveAll(dir)
		return nil, errors.New("etcd: server not ready within 30 s")
	}
	return &etcdSystem{srv: srv, dir: dir, endpoints: []string{cu.String()}, ttl: ttl}, nil
}

func (x *etcdSystem) close() {
	x.srv.Close()
	os.RemoveAll(x.dir)
}

func (x *etcdSystem) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: x.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// etcdCand is one candidate: its own client (its own connection, like a
// process of its own), session and election.
type etcdCand struct {
	id     string
	cli    *clientv3.Client
	sess   *concurrency.Session
	el     *concurrency.Election
	ctx    context.Context
	cancel context.CancelFunc
}

// etcdWon is the return of a Campaign, stamped when it returned.
type etcdWon struct {
	c  *etcdCand
	at time.Time
}

func (x *etcdSystem) newCand(ctx context.Context, prefix, id string) (*etcdCand, error) {
	cli, err := x.client()
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(x.ttl))
	if err != nil {
		cli.Close()
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	return &etcdCand{id: id, cli: cli, sess: sess, el: concurrency.NewElection(sess, prefix), ctx: cctx, cancel: cancel}, nil
}

// campaign campaigns in the background and reports the win on won.
func (c *etcdCand) campaign(won chan<- etcdWon) {
	go func() {
		if err := c.el.Campaign(c.ctx, c.id); err == nil {
			select {
			case won <- etcdWon{c: c, at: time.Now()}:
			default:
			}
		}
	}()
}

// close ends the candidate cleanly: the session's lease is revoked.
func (c *etcdCand) close() {
	c.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = c.cli.Revoke(ctx, c.sess.Lease())
	c.cli.Close()
}

// crash kills the candidate as a dying process would: the client is closed
// without closing the session, so the keepalives stop and the lease is not
// revoked; its key stays until the lease expires on the server.
func (c *etcdCand) crash() {
	c.cli.Close()
	c.cancel()
}

func closeCands(cs []*etcdCand) {
	var wg sync.WaitGroup
	for _, c := range cs {
		if c != nil {
			wg.Go(c.close)
		}
	}
	wg.Wait()
}

// waitWon returns the next win, at or after since, of a candidate other
// than not.
func waitWon(ctx context.Context, ch <-chan etcdWon, not *etcdCand, since time.Time, d time.Duration) (etcdWon, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case w := <-ch:
			if w.c != not && !w.at.Before(since) {
				return w, nil
			}
		case <-t.C:
			return etcdWon{}, fmt.Errorf("etcd: no new leader within %v", d)
		case <-ctx.Done():
			return etcdWon{}, ctx.Err()
		}
	}
}

// startCands starts n candidates one after the other (so the first wins
// and the others queue in order), named node-<first+1>, node-<first+2>...,
// and waits at most d for the first to win.
func (x *etcdSystem) startCands(ctx context.Context, prefix string, n, first int, won chan etcdWon, d time.Duration) ([]*etcdCand, etcdWon, error) {
	var cs []*etcdCand
	var leader etcdWon
	for i := range n {
		c, err := x.newCand(ctx, prefix, fmt.Sprintf("node-%d", first+i+1))
		if err != nil {
			closeCands(cs)
			return nil, leader, err
		}
		cs = append(cs, c)
		c.campaign(won)
		if i == 0 {
			if leader, err = waitWon(ctx, won, nil, time.Time{}, d); err != nil {
				closeCands(cs)
				return nil, leader, err
			}
		}
	}
	return cs, leader, nil
}

// etcdGroup is the candidates of one scenario. Under load a session's
// lease can expire (TTL 1 s, a keepalive every 500 ms): its key is gone,
// so the candidate can neither lead nor queue any more (its Campaign may
// even return without a key, when the key before it goes). A round that
// meets this, or whose resign fails, or that sees no new leader within the
// wait, is lost; reset then replaces every candidate, so that the next
// round starts from a clean queue.
type etcdGroup struct {
	x       *etcdSystem
	prefix  string
	n       int
	wait    time.Duration // for the first win after a reset
	started int           // candidates started, for unique ids
	cands   []*etcdCand
	won     chan etcdWon
}

func (x *etcdSystem) newGroup(ctx context.Context, prefix string, n int, wait time.Duration) (*etcdGroup, etcdWon, error) {
	g := &etcdGroup{x: x, prefix: prefix, n: n, wait: wait}
	w, err := g.reset(ctx)
	return g, w, err
}

// reset closes every candidate (revoking its lease, so its key goes at
// once) and starts n new ones; it returns the first one's win.
func (g *etcdGroup) reset(ctx context.Context) (etcdWon, error) {
	closeCands(g.cands)
	g.won = make(chan etcdWon, 256) // the old candidates' wins stay in the old one
	cands, first, err := g.x.startCands(ctx, g.prefix, g.n, g.started, g.won, g.wait)
	g.started += g.n
	g.cands = cands
	return first, err
}

// expired reports whether the session of a candidate has ended.
func (g *etcdGroup) expired() bool {
	for _, c := range g.cands {
		if c == nil {
			continue
		}
		select {
		case <-c.sess.Done():
			return true
		default:
		}
	}
	return false
}

// timedOut is the cause of a round that saw no new leader in time.
func (g *etcdGroup) timedOut(err error, of string) string {
	cause := err.Error() + " of the " + of
	if g.expired() {
		cause += " (a session had expired)"
	}
	return cause
}

func (g *etcdGroup) close() { closeCands(g.cands) }

// observers starts n Observe loops on one shared client; each reports to
// the collector when its application reads a response naming a leader.
func (x *etcdSystem) observers(ctx context.Context, prefix string, n int, col *collector) (func(), error) {
	cli, err := x.client()
	if err != nil {
		return nil, err
	}
	// Observe needs an Election, and an Election a Session; the session's
	// lease is never used to campaign.
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(x.ttl))
	if err != nil {
		cli.Close()
		return nil, err
	}
	octx, cancel := context.WithCancel(ctx)
	el := concurrency.NewElection(sess, prefix)
	var wg sync.WaitGroup
	for range n {
		obs := col.add()
		ch := el.Observe(octx)
		wg.Go(func() {
			for resp := range ch {
				now := time.Now()
				if len(resp.Kvs) > 0 {
					obs.saw(string(resp.Kvs[0].Value), now)
				}
			}
		})
	}
	return func() {
		cancel()
		_ = sess.Close()
		cli.Close()
		wg.Wait()
	}, nil
}

// handover: 3 candidates and one observer. Each round the leader calls
// Resign; the sample is from just before Resign until the Campaign of the
// next candidate returns, and until the observer reads the response naming
// it. The resigned candidate then campaigns again (after the sample). A
// round lost under load (see etcdGroup) is counted and retried.
func (x *etcdSystem) handover(ctx context.Context, cfg config) (hand, obs series, err error) {
	hand = series{scenario: "handover", system: "etcd"}
	obs = series{scenario: "observer", system: "etcd"}
	prefix := "/" + electionName("handover")
	wait := cfg.within(x.leaseBound())
	g, cur, err := x.newGroup(ctx, prefix, 3, wait)
	if err != nil {
		return hand, obs, err
	}
	defer func() { g.close() }()
	col := newCollector()
	stopObs, err := x.observers(ctx, prefix, 1, col)
	if err != nil {
		return hand, obs, err
	}
	defer stopObs()
	if err := col.waitAll(ctx, 1, cur.c.id, wait); err != nil {
		return hand, obs, err
	}
	for len(hand.samples) < cfg.samples {
		if err := hand.tooManyLost(cfg.samples); err != nil {
			return hand, obs, err
		}
		if err := sleep(ctx, cfg.settle); err != nil {
			return hand, obs, err
		}
		var (
			lost string
			w    etcdWon
			t0   time.Time
		)
		old := cur.c
		done := col.arm(1, func(l string) bool { return l != "" && l != old.id })
		if g.expired() {
			lost = "session expired before the resign"
		} else {
			t0 = time.Now()
			err := old.el.Resign(ctx)
			hand.resign = append(hand.resign, time.Since(t0))
			switch {
			case ctx.Err() != nil:
				return hand, obs, ctx.Err()
			case err != nil:
				lost = "resign failed: " + err.Error()
			default:
				if w, err = waitWon(ctx, g.won, old, t0, wait); ctx.Err() != nil {
					return hand, obs, ctx.Err()
				} else if err != nil {
					lost = g.timedOut(err, "resign")
				}
			}
		}
		if lost != "" {
			col.collect()
			hand.lose(lost)
			obs.lost.add(lost) // the same round, logged once
			if cur, err = g.reset(ctx); err != nil {
				return hand, obs, err
			}
			if err := col.waitAll(ctx, 1, cur.c.id, wait); err != nil {
				return hand, obs, err
			}
			continue
		}
		hand.samples = append(hand.samples, w.at.Sub(t0))
		ok := waitDone(ctx, done, wait)
		if ts := col.collect(); ok {
			obs.samples = append(obs.samples, ts[0].Sub(t0))
		} else {
			obs.failed++
		}
		old.campaign(g.won)
		cur = w
	}
	return hand, obs, nil
}

// leaseBound is the longest a dead session's key can stay: the TTL, plus
// up to 500 ms until the lessor's next expiry scan.
func (x *etcdSystem) leaseBound() time.Duration {
	return time.Duration(x.ttl)*time.Second + 500*time.Millisecond
}

// crash: 3 candidates with session TTL x.ttl. Each round, after a random
// pause, the leader's client is closed without revoking its lease; the
// sample is from then until the next candidate's Campaign returns, which
// happens when the server expires the lease and deletes the leader's key.
// The crashed candidate is replaced by a fresh one, which queues. A round
// lost under load (see etcdGroup) is counted and retried.
func (x *etcdSystem) crash(ctx context.Context, cfg config) (series, error) {
	out := series{scenario: "crash", system: "etcd"}
	prefix := "/" + electionName("crash")
	wait := cfg.within(x.leaseBound())
	g, cur, err := x.newGroup(ctx, prefix, 3, wait)
	if err != nil {
		return out, err
	}
	defer func() { g.close() }()
	for r := 1; len(out.samples) < cfg.crashSamples; r++ {
		if err := out.tooManyLost(cfg.crashSamples); err != nil {
			return out, err
		}
		if err := sleep(ctx, crashPause()); err != nil {
			return out, err
		}
		lost := ""
		if g.expired() {
			lost = "session expired before the crash"
		} else {
			old := cur.c
			t0 := time.Now()
			old.crash()
			w, err := waitWon(ctx, g.won, old, t0, wait)
			switch {
			case ctx.Err() != nil:
				return out, ctx.Err()
			case err != nil:
				lost = g.timedOut(err, "crash")
			default:
				out.samples = append(out.samples, w.at.Sub(t0))
				cur = w
				i := slices.Index(g.cands, old)
				g.cands[i] = nil
				nc, err := x.newCand(ctx, prefix, fmt.Sprintf("node-r%d", r))
				if err != nil {
					return out, err
				}
				g.cands[i] = nc
				nc.campaign(g.won)
			}
		}
		if lost != "" {
			out.lose(lost)
			if cur, err = g.reset(ctx); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// fanout: 2 candidates and n observers sharing one client. Each round the
// leader resigns and the other candidate takes over; a sample is, for each
// observer, from just before Resign is called until the observer reads the
// response naming the new leader. A round lost under load (see
// etcdGroup), or whose deliveries did not all come while a session
// expired, is counted and retried.
func (x *etcdSystem) fanout(ctx context.Context, cfg config, n int) (series, error) {
	out := series{scenario: fmt.Sprintf("fanout-%d", n), system: "etcd"}
	prefix := "/" + electionName(fmt.Sprintf("fanout%d", n))
	wait := cfg.within(x.leaseBound())
	g, cur, err := x.newGroup(ctx, prefix, 2, wait)
	if err != nil {
		return out, err
	}
	defer func() { g.close() }()
	col := newCollector()
	stopObs, err := x.observers(ctx, prefix, n, col)
	if err != nil {
		return out, err
	}
	defer stopObs()
	if err := col.waitAll(ctx, n, cur.c.id, 60*time.Second); err != nil {
		return out, err
	}
	for rounds := 0; rounds < cfg.fanoutRounds; {
		if err := out.tooManyLost(cfg.fanoutRounds); err != nil {
			return out, err
		}
		if err := sleep(ctx, cfg.settle); err != nil {
			return out, err
		}
		var (
			lost string
			w    etcdWon
			t0   time.Time
		)
		old, next := g.cands[0], g.cands[1]
		if cur.c == g.cands[1] {
			old, next = g.cands[1], g.cands[0]
		}
		done := col.arm(n, func(l string) bool { return l == next.id })
		if g.expired() {
			lost = "session expired before the resign"
		} else {
			t0 = time.Now()
			err := old.el.Resign(ctx)
			switch {
			case ctx.Err() != nil:
				return out, ctx.Err()
			case err != nil:
				lost = "resign failed: " + err.Error()
			default:
				if w, err = waitWon(ctx, g.won, old, t0, wait); ctx.Err() != nil {
					return out, ctx.Err()
				} else if err != nil {
					lost = g.timedOut(err, "resign")
				} else if !waitDone(ctx, done, wait) && g.expired() {
					lost = "session expired during the round"
				}
			}
		}
		ts := col.collect()
		if lost != "" {
			out.lose(lost)
			if cur, err = g.reset(ctx); err != nil {
				return out, err
			}
			if err := col.waitAll(ctx, n, cur.c.id, wait); err != nil {
				return out, err
			}
			continue
		}
		for _, t := range ts {
			out.samples = append(out.samples, t.Sub(t0))
		}
		out.failed += n - len(ts)
		old.campaign(g.won)
		cur = w
		rounds++
	}
	return out, nil
}

// counter sums the values of the metric family name in the default
// Prometheus registry, where the embedded server registers its metrics.
func counter(name string) (float64, error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
		return sum, nil
	}
	return 0, fmt.Errorf("etcd: metric %s not found", name)
}

// writes: 3 candidates left alone for cfg.intervals of leaderfeed's
// heartbeat interval; the server's own counters give the lease renewals
// (keepalives by every session, leader or not) and the raft
// proposals committed (store writes) in that time.
func (x *etcdSystem) writes(ctx context.Context, cfg config) (writesRow, error) {
	row := writesRow{system: "etcd"}
	prefix := "/" + electionName("writes")
	won := make(chan etcdWon, 256)
	cands, _, err := x.startCands(ctx, prefix, 3, 0, won, cfg.within(x.leaseBound()))
	if err != nil {
		return row, err
	}
	defer closeCands(cands)
	if err := sleep(ctx, time.Duration(x.ttl)*time.Second); err != nil {
		return row, err
	}
	names := []string{"etcd_debugging_lease_renewed_total", "etcd_server_proposals_committed_total", "etcd_mvcc_put_total", "etcd_mvcc_range_total"}
	read := func() ([]float64, error) {
		v := make([]float64, len(names))
		for i, n := range names {
			var err error
			if v[i], err = counter(n); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	before, err := read()
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	if err := sleep(ctx, time.Duration(cfg.intervals)*cfg.timing.HeartbeatInterval); err != nil {
		return row, err
	}
	after, err := read()
	if err != nil {
		return row, err
	}
	iv := float64(time.Since(t0)) / float64(cfg.timing.HeartbeatInterval)
	renew := (after[0] - before[0]) / iv / float64(len(cands))
	proposals := (after[1] - before[1]) / iv
	puts := (after[2] - before[2]) / iv
	row.leader, row.follower = puts, 0
	row.renewals = renew
	row.proposals = proposals
	row.reads = (after[3] - before[3]) / iv
	row.intervals = iv
	row.note = fmt.Sprintf("etcd writes nothing to the store in steady state (mvcc puts %.2f, raft proposals %.2f per interval, all sessions); instead every session, leader and followers alike, renews its lease: the client sends a keepalive every TTL/3 but checks only every 500 ms, so every max(TTL/3, 500 ms): %.2f per session per interval. Renewals are served from the etcd leader's memory, not written through raft", puts, proposals, renew)
	return row, nil
}
