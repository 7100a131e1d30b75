package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Timings of a subscription's LISTEN connection. Variables so that tests
// can shrink them.
var (
	// pingInterval: after this long without a notification the
	// subscription pings the server, so that a connection that died
	// silently is noticed.
	pingInterval = 10 * time.Second
	// ioTimeout bounds connecting, LISTEN and ping.
	ioTimeout = 10 * time.Second
)

// feed is one Subscribe or SubscribeFunc: a LISTEN connection of its own,
// owned by one goroutine (run) that waits for notifications, decodes them
// and sends them on out, blocking while nobody reads, or hands them to
// deliver.
type feed struct {
	s       *Store
	ctx     context.Context // the caller's (Subscribe); ended by cancel (SubscribeFunc)
	fctx    context.Context // ends with ctx or when the Store closes
	cancel  context.CancelFunc
	stop    func() bool // undoes the AfterFunc on the Store's context
	conn    *pgx.Conn
	out     chan backend.Notification  // Subscribe
	deliver func(backend.Notification) // SubscribeFunc, instead of out
	done    chan struct{}              // closed when run returns
}

// Subscribe opens the changefeed of the table on a LISTEN connection of its
// own (made from the pool's ConnConfig, not a slot of the pool) and returns
// once the connection listens, so that every change committed after
// Subscribe returns is delivered. It delivers every election's record
// changes and the watched table's changes, decoded, in commit order; a
// record too large for its notification is read (Get) and sent whole. The
// channel closes when ctx ends, after a Failed notification when the
// connection is lost, and after one matching base.ErrClosed when the Store
// closes. The connection is closed with it.
func (s *Store) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	f := &feed{s: s, ctx: ctx, out: make(chan backend.Notification)}
	if err := s.open(ctx, f); err != nil {
		return nil, err
	}
	return f.out, nil
}

// SubscribeFunc is Subscribe handing each notification to deliver on the
// connection's goroutine instead of sending it on a channel
// (backend.FuncSubscriber): the Elections of package base read the
// Store's changefeed so, one goroutine hop fewer between a notification
// and the engine. ctx bounds the call only; the subscription ends when
// cancel is called (it waits until deliver is no longer running, so it
// must not be called from deliver), or after a Failed delivery.
func (s *Store) SubscribeFunc(ctx context.Context, deliver func(backend.Notification)) (cancel func(), err error) {
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &feed{s: s, ctx: lctx, deliver: deliver}
	stop := context.AfterFunc(ctx, lcancel) // until the connection listens
	err = s.open(ctx, f)
	if !stop() || err != nil {
		lcancel()
		if err == nil {
			<-f.done
			err = fmt.Errorf("postgres: Subscribe: %w", ctx.Err())
		}
		return nil, err
	}
	return func() { lcancel(); <-f.done }, nil
}

// open connects f and starts its goroutine.
func (s *Store) open(ctx context.Context, f *feed) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("postgres: Subscribe: %w", err)
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return fmt.Errorf("postgres: Subscribe: %w", base.ErrClosed)
	}
	s.wg.Add(1)
	s.mu.Unlock()
	f.done = make(chan struct{})
	f.fctx, f.cancel = context.WithCancel(f.ctx)
	f.stop = context.AfterFunc(s.ctx, f.cancel)
	conn, err := s.listen(f.fctx)
	if err != nil {
		f.stop()
		f.cancel()
		s.wg.Done()
		if s.closed.Load() {
			return fmt.Errorf("postgres: Subscribe: %w", base.ErrClosed)
		}
		return s.wrapErr(ctx, "postgres: Subscribe", err)
	}
	f.conn = conn
	s.mu.Lock()
	s.feeds[f] = conn.PgConn().PID()
	s.mu.Unlock()
	s.opts.Logger.Info("postgres: LISTEN connection open", "pid", conn.PgConn().PID())
	go f.run()
	return nil
}

// listen connects and issues LISTEN on the channel.
func (s *Store) listen(ctx context.Context) (*pgx.Conn, error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	// pgx buffers the notifications it reads (WaitForNotification hands
	// them out one at a time) only without a handler of the caller's.
	cfg.OnNotification = nil
	// Interrupting WaitForNotification must not close the connection nor
	// send a cancel request.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "leaderfeed listener"
	}
	ctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot open the LISTEN connection: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.opts.ChannelPrefix}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("LISTEN: %w", err)
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// listenerPIDs returns the server process ids of the Store's open LISTEN
// connections, for tests.
func (s *Store) listenerPIDs() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	pids := make([]uint32, 0, len(s.feeds))
	for _, pid := range s.feeds {
		pids = append(pids, pid)
	}
	return pids
}

// run receives until the connection fails or the feed's context ends,
// closes the connection, then sends the failure if any and closes out.
func (f *feed) run() {
	defer close(f.done)
	err := f.receive()
	closeConn(f.conn)
	f.stop()
	f.cancel()
	s := f.s
	s.mu.Lock()
	delete(s.feeds, f)
	s.mu.Unlock()
	s.wg.Done()
	if f.out != nil {
		defer close(f.out)
	}
	if err == nil && f.ctx.Err() == nil && s.closed.Load() {
		err = fmt.Errorf("postgres: store closed: %w", base.ErrClosed)
	}
	if err == nil || errors.Is(err, errSent) {
		return
	}
	if !errors.Is(err, base.ErrClosed) {
		s.opts.Logger.Warn("postgres: LISTEN connection lost", "err", err)
	}
	f.send(f.ctx, backend.Notification{Type: backend.Failed, Err: err})
}

// send hands n to the reader; it reports false when ctx ended first.
func (f *feed) send(ctx context.Context, n backend.Notification) bool {
	if f.deliver != nil {
		if ctx.Err() != nil {
			return false
		}
		f.deliver(n)
		return true
	}
	select {
	case f.out <- n:
		return true
	case <-ctx.Done():
		return false
	}
}

// errSent: receive sent a Failed notification already.
var errSent = errors.New("failed notification sent")

// receive hands the notifications to the reader. It returns nil when the
// feed's context ended, else why the feed failed.
func (f *feed) receive() error {
	for {
		wctx, cancel := context.WithTimeout(f.fctx, pingInterval)
		msg, err := f.conn.WaitForNotification(wctx)
		idle := errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case f.fctx.Err() != nil:
			return nil
		case err == nil && msg != nil:
		case !f.conn.IsClosed() && idle:
			ctx, cancel := context.WithTimeout(f.fctx, ioTimeout)
			err := f.conn.Ping(ctx)
			cancel()
			if err != nil && f.fctx.Err() == nil {
				return fmt.Errorf("postgres: LISTEN connection does not answer: %w", err)
			}
			continue
		default:
			if err == nil {
				err = errors.New("connection closed")
			}
			return fmt.Errorf("postgres: LISTEN connection lost: %w", err)
		}
		for _, n := range f.decode(msg) {
			if f.fctx.Err() != nil || !f.send(f.fctx, n) {
				return nil
			}
			if n.Type == backend.Failed {
				return errSent
			}
		}
	}
}

// payload is a notification sent by the triggers.
type payload struct {
	Kind   string          `json:"k"`  // "b": records of the election table, "r": one record (row-level trigger of older versions), "c": watched table
	Rs     []payload       `json:"rs"` // "b": the records, each a payload without k, s and t
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
	SC     *string         `json:"sc"`
	H      *json.Number    `json:"h"`
	I      *json.Number    `json:"i"`
	Key    json.RawMessage `json:"key"`
	Old    json.RawMessage `json:"old"`
	New    json.RawMessage `json:"new"`
	P      bool            `json:"p"`
}

// decode turns a notification into the feed's notifications, one per
// record of a chunk. A notification of another table (the channel may be
// shared) gives none. A record too large for its notification is read from
// the table; the reading stops at the first that fails (Failed).
func (f *feed) decode(msg *pgconn.Notification) []backend.Notification {
	o := f.s.opts
	var p payload
	err := json.Unmarshal([]byte(msg.Payload), &p)
	var raws []json.RawMessage
	if err != nil {
		// One pass decodes a chunk (a successor reads its handover here);
		// a record that is not ours fails it whole: read the chunk again
		// with its records raw, and drop only those that fail.
		var each struct {
			payload
			Rs []json.RawMessage `json:"rs"`
		}
		err = json.Unmarshal([]byte(msg.Payload), &each)
		p, raws = each.payload, each.Rs
		p.Rs = make([]payload, len(raws))
	}
	ours := err == nil && p.Schema == o.Schema && p.Table == o.Table
	switch {
	case ours && p.Kind == "b":
		out := make([]backend.Notification, 0, len(p.Rs))
		for i := range p.Rs {
			r := &p.Rs[i]
			if raws != nil && json.Unmarshal(raws[i], r) != nil || r.E == nil {
				o.Logger.Debug("postgres: dropped a record of a notification that is not ours", "channel", msg.Channel, "pid", msg.PID)
				continue
			}
			n := f.record(*r.E, r)
			out = append(out, n)
			if n.Type == backend.Failed || f.fctx.Err() != nil {
				break
			}
		}
		return out
	case ours && p.Kind == "r" && p.E != nil:
		return []backend.Notification{f.record(*p.E, &p)}
	case err == nil && p.Kind == "c" && o.WatchTable != "" && p.Schema == o.WatchSchema && p.Table == o.WatchTable:
		return []backend.Notification{change(&p)}
	}
	o.Logger.Debug("postgres: dropped a notification of another table", "channel", msg.Channel, "pid", msg.PID)
	return nil
}

func (f *feed) record(election string, p *payload) backend.Notification {
	switch {
	case p.Op == "D":
		return backend.Notification{Type: backend.RecordDeleted, Record: heartbeat.Record{Election: election}, Election: election}
	case p.Big:
		return f.fetch(election)
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
	var r heartbeat.Record
	if err == nil {
		r, err = decodeRecord(election, p.L, num(p.N), num(p.R), num(p.TS), value, num(p.LS), p.SC, num(p.H), num(p.I))
	}
	if err != nil {
		return backend.Notification{Type: backend.Ignored, Err: err, Election: election}
	}
	return backend.Notification{Type: backend.RecordChanged, Record: r}
}

// fetch reads a record that did not fit in its notification.
func (f *feed) fetch(election string) backend.Notification {
	r, err := f.s.get(f.fctx, election)
	switch {
	case err == nil:
		return backend.Notification{Type: backend.RecordChanged, Record: r}
	case errors.Is(err, backend.ErrNotFound):
		return backend.Notification{Type: backend.RecordDeleted, Record: heartbeat.Record{Election: election}, Election: election}
	case errors.Is(err, backend.ErrMalformedRecord):
		return backend.Notification{Type: backend.Ignored, Err: err, Election: election}
	}
	return backend.Notification{Type: backend.Failed, Err: fmt.Errorf("postgres: reading a record too large for its notification: %w", err)}
}

func change(p *payload) backend.Notification {
	raw := func(m json.RawMessage) json.RawMessage {
		if len(m) == 0 || string(m) == "null" {
			return nil
		}
		return m
	}
	c := backend.Change{Table: p.Table, Key: raw(p.Key), Old: raw(p.Old), New: raw(p.New), Partial: p.P}
	switch p.Op {
	case "I":
		c.Op = backend.Insert
	case "U":
		c.Op = backend.Update
	default:
		c.Op = backend.Delete
	}
	return backend.Notification{Type: backend.OtherChanged, Change: c}
}
