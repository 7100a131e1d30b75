package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
)

// Timings of the shared listener. Variables so that tests can shrink them.
var (
	// pingInterval: after this long without a notification the listener
	// pings the server, so that a connection that died silently is noticed.
	pingInterval = 10 * time.Second
	// ioTimeout bounds connecting, LISTEN and ping.
	ioTimeout = 10 * time.Second
	// Backoff between failed connection attempts.
	minBackoff = 25 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// registry holds the one listener of each pool of the process.
var registry = struct {
	sync.Mutex
	m map[*pgxpool.Pool]*listener
}{m: map[*pgxpool.Pool]*listener{}}

// tableKey identifies the notifications of one table on one channel.
type tableKey struct{ channel, schema, table string }

// listener owns the dedicated LISTEN connection of one pool, shared by every
// Backend of that pool. One goroutine (run) owns the connection: it
// connects, issues LISTEN, waits for notifications and hands them to the
// subscriptions, which never block it.
type listener struct {
	pool   *pgxpool.Pool
	config *pgx.ConnConfig
	logger *slog.Logger
	refs   int // guarded by registry

	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
	wake chan struct{}

	mu         sync.Mutex
	stopped    bool
	pending    []*subscription
	byTable    map[tableKey]map[*subscription]struct{}
	active     map[*subscription]struct{}
	cancelWait context.CancelFunc
	pid        uint32
}

func acquireListener(pool *pgxpool.Pool, logger *slog.Logger) *listener {
	registry.Lock()
	defer registry.Unlock()
	if l := registry.m[pool]; l != nil {
		l.refs++
		return l
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{
		pool:    pool,
		config:  pool.Config().ConnConfig,
		logger:  logger,
		refs:    1,
		ctx:     ctx,
		stop:    stop,
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		byTable: map[tableKey]map[*subscription]struct{}{},
		active:  map[*subscription]struct{}{},
	}
	registry.m[pool] = l
	go l.run()
	return l
}

// release drops one reference; the last one stops the listener and waits
// for its goroutine.
func (l *listener) release() {
	registry.Lock()
	l.refs--
	last := l.refs == 0
	if last {
		delete(registry.m, l.pool)
	}
	registry.Unlock()
	if last {
		l.stop()
		<-l.done
	}
}

// connPID returns the server process id of the LISTEN connection, 0 when
// it is down.
func (l *listener) connPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// add hands s to the listener and waits until the connection listens on
// its channel, or fails.
func (l *listener) add(s *subscription) error {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return base.ErrClosed
	}
	l.pending = append(l.pending, s)
	if l.cancelWait != nil {
		l.cancelWait()
	}
	l.mu.Unlock()
	l.poke()
	select {
	case err := <-s.ready:
		return err
	case <-s.ctx.Done():
		l.remove(s)
		return s.ctx.Err()
	}
}

func (l *listener) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// remove forgets s, wherever it is.
func (l *listener) remove(s *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.pending {
		if p == s {
			l.pending = append(l.pending[:i], l.pending[i+1:]...)
			break
		}
	}
	l.deactivate(s)
	s.removed = true
}

// deactivate removes s from the active sets; l.mu held.
func (l *listener) deactivate(s *subscription) {
	delete(l.active, s)
	for _, k := range s.keys() {
		if m := l.byTable[k]; m != nil {
			delete(m, s)
			if len(m) == 0 {
				delete(l.byTable, k)
			}
		}
	}
}

// activate makes s receive notifications and releases its Subscribe.
func (l *listener) activate(s *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.removed {
		return
	}
	l.active[s] = struct{}{}
	for _, k := range s.keys() {
		m := l.byTable[k]
		if m == nil {
			m = map[*subscription]struct{}{}
			l.byTable[k] = m
		}
		m[s] = struct{}{}
	}
	s.ready <- nil
}

func (l *listener) run() {
	defer close(l.done)
	var (
		conn        *pgx.Conn
		listening   = map[string]bool{}
		backoff     = minBackoff
		nextAttempt time.Time
	)
	// drop closes the connection and fails every active subscription.
	drop := func(err error) {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
		}
		listening = map[string]bool{}
		l.mu.Lock()
		l.pid = 0
		subs := l.active
		l.active = map[*subscription]struct{}{}
		l.byTable = map[tableKey]map[*subscription]struct{}{}
		l.mu.Unlock()
		if len(subs) > 0 {
			l.logger.Warn("postgres: LISTEN connection lost", "subscriptions", len(subs), "err", err)
		}
		for s := range subs {
			s.fail(err)
		}
	}
	failPending := func(subs []*subscription, err error) {
		for _, s := range subs {
			s.ready <- err
		}
	}
	for {
		if l.ctx.Err() != nil {
			l.mu.Lock()
			l.stopped = true
			pending := l.pending
			l.pending = nil
			l.mu.Unlock()
			failPending(pending, base.ErrClosed)
			drop(fmt.Errorf("postgres: listener stopped: %w", base.ErrClosed))
			return
		}
		l.mu.Lock()
		havePending := len(l.pending) > 0
		l.mu.Unlock()

		if havePending && conn == nil {
			if wait := time.Until(nextAttempt); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-l.ctx.Done():
				}
				t.Stop()
				continue
			}
			c, err := l.connect()
			if err != nil {
				nextAttempt = time.Now().Add(backoff)
				backoff = min(2*backoff, maxBackoff)
				l.mu.Lock()
				pending := l.pending
				l.pending = nil
				l.mu.Unlock()
				failPending(pending, fmt.Errorf("cannot open the LISTEN connection: %w", err))
				continue
			}
			conn = c
			backoff = minBackoff
			l.mu.Lock()
			l.pid = conn.PgConn().PID()
			l.mu.Unlock()
			l.logger.Info("postgres: LISTEN connection open", "pid", conn.PgConn().PID())
		}
		if havePending {
			l.mu.Lock()
			pending := l.pending
			l.pending = nil
			l.mu.Unlock()
			for i, s := range pending {
				if !listening[s.channel] {
					ctx, cancel := context.WithTimeout(l.ctx, ioTimeout)
					_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
					cancel()
					if err != nil {
						err = fmt.Errorf("postgres: LISTEN on the shared connection: %w", err)
						failPending(pending[i:], err)
						drop(err)
						break
					}
					listening[s.channel] = true
				}
				l.activate(s)
			}
			continue
		}
		if conn == nil {
			select {
			case <-l.wake:
			case <-l.ctx.Done():
			}
			continue
		}

		l.mu.Lock()
		if len(l.pending) > 0 {
			l.mu.Unlock()
			continue
		}
		wctx, cancel := context.WithTimeout(l.ctx, pingInterval)
		l.cancelWait = cancel
		l.mu.Unlock()
		err := conn.PgConn().WaitForNotification(wctx)
		l.mu.Lock()
		l.cancelWait = nil
		l.mu.Unlock()
		idle := errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err == nil && !conn.IsClosed():
		case l.ctx.Err() != nil:
		case conn.IsClosed():
			if err == nil {
				err = errors.New("connection closed")
			}
			drop(fmt.Errorf("postgres: LISTEN connection lost: %w", err))
		case idle:
			ctx, cancel := context.WithTimeout(l.ctx, ioTimeout)
			err := conn.Ping(ctx)
			cancel()
			if err != nil && l.ctx.Err() == nil {
				drop(fmt.Errorf("postgres: LISTEN connection does not answer: %w", err))
			}
		case errors.Is(err, context.Canceled):
			// Woken by add.
		default:
			drop(fmt.Errorf("postgres: LISTEN connection lost: %w", err))
		}
	}
}

func (l *listener) connect() (*pgx.Conn, error) {
	cfg := l.config.Copy()
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { l.dispatch(n) }
	// Interrupting WaitForNotification must not close the connection nor
	// send a cancel request that could hit the next LISTEN.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "leaderfeed listener"
	}
	ctx, cancel := context.WithTimeout(l.ctx, ioTimeout)
	defer cancel()
	return pgx.ConnectConfig(ctx, cfg)
}

// payload is a notification sent by the triggers.
type payload struct {
	Kind   string          `json:"k"` // "r": election table, "c": watched table
	Schema string          `json:"s"`
	Table  string          `json:"t"`
	Op     string          `json:"op"` // "I", "U", "D"
	Big    bool            `json:"big"`
	E      *string         `json:"e"`
	L      *string         `json:"l"`
	N      *json.Number    `json:"n"`
	R      *json.Number    `json:"r"`
	TS     *json.Number    `json:"ts"`
	V      *string         `json:"v"`
	LS     *json.Number    `json:"ls"`
	Key    json.RawMessage `json:"key"`
	Old    json.RawMessage `json:"old"`
	New    json.RawMessage `json:"new"`
	P      bool            `json:"p"`
}

// dispatch runs on the listener's goroutine, inside pgx, for every
// notification. It decodes it once and queues it on the subscriptions it
// concerns; it never blocks.
func (l *listener) dispatch(n *pgconn.Notification) {
	var p payload
	if err := json.Unmarshal([]byte(n.Payload), &p); err != nil || p.Table == "" || (p.Kind != "r" && p.Kind != "c") {
		l.logger.Debug("postgres: dropped a notification that is not ours", "channel", n.Channel, "pid", n.PID)
		return
	}
	key := tableKey{n.Channel, p.Schema, p.Table}
	l.mu.Lock()
	var subs []*subscription
	for s := range l.byTable[key] {
		if p.Kind == "r" && s.recordKey == key && p.E != nil && *p.E == s.b.election {
			subs = append(subs, s)
		} else if p.Kind == "c" && s.watchKey == key {
			subs = append(subs, s)
		}
	}
	l.mu.Unlock()
	if len(subs) == 0 {
		return
	}
	var it item
	if p.Kind == "r" {
		it = recordItem(*p.E, &p)
	} else {
		it = changeItem(&p)
	}
	for _, s := range subs {
		s.enqueue(it)
	}
}

func recordItem(election string, p *payload) item {
	switch {
	case p.Op == "D":
		return item{n: base.Notification{Type: base.RecordDeleted, Record: recordOnly(election)}, record: true}
	case p.Big:
		return item{fetch: true, record: true}
	}
	num := func(n *json.Number) *int64 {
		if n == nil {
			return nil
		}
		v, err := strconv.ParseInt(string(*n), 10, 64)
		if err != nil {
			return nil
		}
		return &v
	}
	value, err := decodeBase64(election, p.V)
	var r = recordOnly(election)
	if err == nil {
		r, err = decodeRecord(election, p.L, num(p.N), num(p.R), num(p.TS), value, num(p.LS))
	}
	if err != nil {
		return item{n: base.Notification{Type: base.Ignored, Err: err}, record: true}
	}
	return item{n: base.Notification{Type: base.RecordChanged, Record: r}, record: true}
}

func changeItem(p *payload) item {
	raw := func(m json.RawMessage) json.RawMessage {
		if len(m) == 0 || string(m) == "null" {
			return nil
		}
		return m
	}
	c := base.Change{Table: p.Table, Key: raw(p.Key), Old: raw(p.Old), New: raw(p.New), Partial: p.P}
	switch p.Op {
	case "I":
		c.Op = base.Insert
	case "U":
		c.Op = base.Update
	default:
		c.Op = base.Delete
	}
	return item{n: base.Notification{Type: base.OtherChanged, Change: c}}
}
