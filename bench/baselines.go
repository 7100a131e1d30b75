package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The two electors a team on PostgreSQL usually writes instead of adding a
// coordination service, written the way they usually are: short, with a
// fixed retry period, and nothing a leader checks against its own clock.

// ---- session advisory lock ----
//
// One dedicated connection per node. Every period, a node that does not
// hold an election's lock tries pg_try_advisory_lock; the holder is the
// leader until its session ends. The holder checks its session every
// period with SELECT 1 under a deadline of one period and steps down (and
// reconnects) when that fails. Resign is pg_advisory_unlock. The server
// releases the locks of a session that ends, at once when the client's
// socket is closed (a killed process), and only when its TCP keepalive
// gives up on a client that vanished silently.

type advisoryNode struct {
	url     string
	counter *stmtCounter
	out     *nodeOut
	period  time.Duration
	keys    []int64
	cmds    chan int // resign requests
	cancel  context.CancelFunc
	done    chan struct{}
	tried   chan struct{} // closed after its first round of tries
}

// waitParticipating returns once the node has tried for every lock once.
func (n *advisoryNode) waitParticipating(ctx context.Context) error {
	select {
	case <-n.tried:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func startAdvisoryNode(ctx context.Context, url string, nf nodeFlags, out *nodeOut, counter *stmtCounter) (*advisoryNode, error) {
	n := &advisoryNode{url: url, counter: counter, out: out, period: nf.advRetry, cmds: make(chan int, 16), done: make(chan struct{}), tried: make(chan struct{})}
	for i := range nf.elections {
		n.keys = append(n.keys, lockKey(electionN(nf.election, i, nf.elections)))
	}
	conn, err := n.connect(ctx)
	if err != nil {
		return nil, err
	}
	ctx, n.cancel = context.WithCancel(ctx)
	go n.run(ctx, conn)
	return n, nil
}

func (n *advisoryNode) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(n.url)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = n.counter
	cfg.ConnectTimeout = n.period
	return pgx.ConnectConfig(ctx, cfg)
}

func (n *advisoryNode) run(ctx context.Context, conn *pgx.Conn) {
	defer close(n.done)
	held := make([]bool, len(n.keys))
	sitOut := make([]bool, len(n.keys)) // resigned: skip one round
	drop := func(reason string) {
		now := monotonic()
		for i := range held {
			if held[i] {
				n.out.unelected(i, now, reason)
				held[i] = false
			}
		}
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_ = conn.Close(cctx)
			cancel()
			conn = nil
		}
	}
	defer drop("stopped")
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case i := <-n.cmds:
			if held[i] && conn != nil {
				n.out.resigning(i, monotonic())
				n.out.unelected(i, monotonic(), "resigned")
				held[i], sitOut[i] = false, true
				qctx, cancel := context.WithTimeout(ctx, n.period)
				_, err := conn.Exec(qctx, "SELECT pg_advisory_unlock($1)", n.keys[i])
				cancel()
				if err != nil {
					drop("session-lost")
				}
			}
			continue
		case <-timer.C:
		}
		timer.Reset(n.period)
		if conn == nil {
			c, err := n.connect(ctx)
			if err != nil {
				continue
			}
			conn = c
		}
		leading := false
		for _, h := range held {
			leading = leading || h
		}
		if leading { // is the session, and so the lock, still there?
			qctx, cancel := context.WithTimeout(ctx, n.period)
			_, err := conn.Exec(qctx, "SELECT 1")
			cancel()
			if err != nil {
				drop("session-lost")
				continue
			}
		}
		for i, key := range n.keys {
			if held[i] {
				continue
			}
			if sitOut[i] {
				sitOut[i] = false
				continue
			}
			var ok bool
			qctx, cancel := context.WithTimeout(ctx, n.period)
			err := conn.QueryRow(qctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok)
			cancel()
			if err != nil {
				drop("session-lost")
				break
			}
			if ok {
				held[i] = true
				n.out.elected(i, monotonic())
			}
		}
		if !isClosed(n.tried) {
			close(n.tried)
		}
	}
}

func (n *advisoryNode) resign(i int) { n.cmds <- i }

func (n *advisoryNode) stop() {
	n.cancel()
	<-n.done
}

// ---- polling lease table ----
//
// River's elector (riverqueue/river internal/leadership, before it gained a
// trusted-until deadline), in one statement: every node polls
//
//	INSERT ... ON CONFLICT (name) DO UPDATE SET holder = $me, expires_at = now() + ttl
//	WHERE expires_at < now() OR holder = $me RETURNING holder
//
// A follower polls every ElectInterval plus up to ElectIntervalJitter; the
// leader re-runs it every ElectInterval and is leader until a renewal says
// someone else holds the lease, or until 5 renewals in a row fail (each
// with a deadline, exponential backoff in between). River's defaults:
// interval 5 s, jitter 1 s, TTL = interval + 10 s = 15 s, deadline 5 s,
// backoff 1 s, 2 s, 4 s, 8 s. Here they are scaled by bound / 15 s, so the
// TTL is the dead-leader bound. Resign deletes the row; the others find the
// vacancy at their next poll. (River also NOTIFYs on resign, and on error
// it tells its subscribers it lost leadership only after up to three
// resign attempts; neither is modelled.)

type leaseTiming struct {
	interval, jitter, ttl, deadline, backoff time.Duration
}

func riverTiming(bound time.Duration) leaseTiming {
	// In floating point: d * bound overflows a Duration from a bound of
	// about 2 s on.
	s := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * float64(bound) / float64(15*time.Second))
	}
	return leaseTiming{interval: s(5 * time.Second), jitter: s(time.Second), ttl: bound, deadline: s(5 * time.Second), backoff: s(time.Second)}
}

const leaseSQL = `INSERT INTO bench_lease AS l (name, holder, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.expires_at < now() OR l.holder = excluded.holder
RETURNING l.holder`

type leaseNode struct {
	pool   *pgxpool.Pool
	out    *nodeOut
	id     string
	tm     leaseTiming
	names  []string
	cmds   []chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
	tried  chan struct{} // closed after the first attempt in election 0
}

// waitParticipating returns once the node has polled the lease once.
func (n *leaseNode) waitParticipating(ctx context.Context) error {
	select {
	case <-n.tried:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func startLeaseNode(ctx context.Context, url string, nf nodeFlags, out *nodeOut, counter *stmtCounter) (*leaseNode, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	n := &leaseNode{pool: pool, out: out, id: nf.id, tm: riverTiming(nf.bound), tried: make(chan struct{})}
	ctx, n.cancel = context.WithCancel(ctx)
	for i := range nf.elections {
		n.names = append(n.names, electionN(nf.election, i, nf.elections))
		n.cmds = append(n.cmds, make(chan struct{}, 1))
		n.wg.Go(func() { n.run(ctx, i) })
	}
	return n, nil
}

// attempt runs the statement once: true if this node holds the lease.
func (n *leaseNode) attempt(ctx context.Context, i int) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, n.tm.deadline)
	defer cancel()
	var holder string
	err := n.pool.QueryRow(ctx, leaseSQL, n.names[i], n.id, n.tm.ttl.Milliseconds()).Scan(&holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil && holder == n.id, err
}

// backoff is River's exponential backoff (2^(k-1) units, ±10%).
func (n *leaseNode) backoff(k int) time.Duration {
	d := n.tm.backoff << min(k-1, 10)
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}

func (n *leaseNode) run(ctx context.Context, i int) {
	wait := func(d time.Duration) (resign bool) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-n.cmds[i]:
			return true
		}
		return false
	}
	for ctx.Err() == nil {
		// Follower: poll until the statement makes us the holder.
		errs := 0
		for ctx.Err() == nil {
			ok, err := n.attempt(ctx, i)
			if i == 0 && !isClosed(n.tried) {
				close(n.tried)
			}
			if err != nil {
				errs++
				wait(n.backoff(errs))
				continue
			}
			if ok {
				break
			}
			errs = 0
			wait(n.tm.interval + rand.N(n.tm.jitter+1))
		}
		if ctx.Err() != nil {
			return
		}
		n.out.elected(i, monotonic())
		// Leader: renew every interval.
		errs = 0
		for {
			if wait(n.tm.interval) {
				n.out.resigning(i, monotonic())
				n.out.unelected(i, monotonic(), "resigned")
				n.release(i)
				wait(n.tm.interval) // sit out one round
				break
			}
			if ctx.Err() != nil {
				n.out.unelected(i, monotonic(), "stopped")
				n.release(i)
				return
			}
			ok, err := n.attempt(ctx, i)
			if err != nil {
				if errs++; errs >= 5 {
					n.out.unelected(i, monotonic(), "renewal-errors")
					break
				}
				wait(n.backoff(errs))
				continue
			}
			if !ok {
				n.out.unelected(i, monotonic(), "lost")
				break
			}
			errs = 0
		}
	}
}

func (n *leaseNode) release(i int) {
	ctx, cancel := context.WithTimeout(context.Background(), n.tm.deadline)
	defer cancel()
	_, _ = n.pool.Exec(ctx, "DELETE FROM bench_lease WHERE name = $1 AND holder = $2", n.names[i], n.id)
}

func (n *leaseNode) resign(i int) {
	select {
	case n.cmds[i] <- struct{}{}:
	default:
	}
}

func (n *leaseNode) stop() {
	n.cancel()
	n.wg.Wait()
	n.pool.Close()
}
