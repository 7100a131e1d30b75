package base_test

// Tests of Start and Run waiting for a store that cannot be reached yet,
// under testing/synctest with the memory backend wrapped in base/faulty.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/internal/storewait"
	"github.com/leaderfeed/leaderfeed/memory"
)

// errDown is a transient failure: a server that is not up yet.
var errDown = errors.New("test: dial tcp 127.0.0.1:5432: connect: connection refused")

// The log lines of the wait.
const (
	logWaiting = "WARN leaderfeed: store not reached, waiting"
	logStill   = "WARN leaderfeed: store still not reached, waiting"
	logReached = "INFO leaderfeed: store reached"
)

// failFirst makes the next n calls of m fail with err.
func failFirst(fb interface{ Inject(faulty.Fault) }, m faulty.Method, n int, err error) {
	for i := 1; i <= n; i++ {
		fb.Inject(faulty.Fault{Method: m, Nth: i, Err: err})
	}
}

// Transient failures of Start and Create are retried, with backoff, until
// the store takes the calls; Start then returns nil and the node leads.
// The wait is logged once at Warn, and once at Info when it ends.
func TestStartWaitsForTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logLines
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		failFirst(fb, faulty.MethodStart, 3, errDown)
		failFirst(fb, faulty.MethodCreate, 2, errDown)
		f, err := base.New(fb, "n", base.Options{Timing: timing, Logger: slog.New(&logs)})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := f.Start(context.Background()); err != nil {
			t.Fatalf("Start: %v, want nil once the store takes the calls", err)
		}
		// Five failures, waits of [d/2, d] for d = 200, 400, 500, 500, 500 ms.
		if took := time.Since(t0); took < 1050*time.Millisecond || took > 2100*time.Millisecond {
			t.Errorf("Start took %v through five failures, want 1.05s..2.1s (backoff from 200 ms, at most 500 ms)", took)
		}
		if s, c := fb.Calls(faulty.MethodStart), fb.Calls(faulty.MethodCreate); s != 4 || c != 3 {
			t.Errorf("Start called %d times and Create %d times, want 4 and 3: each step retried until it succeeds, none repeated", s, c)
		}
		if w, s, r := logs.count(logWaiting), logs.count(logStill), logs.count(logReached); w != 1 || s != 0 || r != 1 {
			t.Errorf("log lines: %d waiting, %d still waiting, %d reached; want 1, 0, 1:\n%v", w, s, r, logs.lines)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A store that comes up after a long wait is in use within storewait.Max
// (well under a second), and the wait logs a line now and then, not one
// per attempt: at 0, 5 s, 15 s and 35 s of a 40 s wait.
func TestStartUsesTheStoreSoonAfterItComesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logLines
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodStart, Err: errDown}) // every call, until Heal
		f, _ := base.New(fb, "n", base.Options{Timing: timing, Logger: slog.New(&logs)})
		started := make(chan error, 1)
		go func() { started <- f.Start(context.Background()) }()
		time.Sleep(40 * time.Second)
		fb.Heal()
		up := time.Now()
		if err := <-started; err != nil {
			t.Fatalf("Start: %v", err)
		}
		if took := time.Since(up); took > storewait.Max {
			t.Errorf("Start returned %v after the store came up, want within %v", took, storewait.Max)
		}
		if n := fb.Calls(faulty.MethodStart); n < int(40*time.Second/storewait.Max) {
			t.Errorf("%d calls in 40 s, want one at least every %v", n, storewait.Max)
		}
		if w, s, r := logs.count(logWaiting), logs.count(logStill), logs.count(logReached); w != 1 || s != 3 || r != 1 {
			t.Errorf("log lines: %d waiting, %d still waiting, %d reached; want 1, 3, 1", w, s, r)
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// What retrying cannot fix ends Start at once, with the error: a refusal,
// an invalid configuration, a missing capability, a closed store. The
// Feed stays unstarted and can be started again.
func TestStartReturnsRefusalsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method faulty.Method
		err    error
	}{
		{"refused", faulty.MethodStart, errRefusedWrite},
		{"refused at Create", faulty.MethodCreate, fmt.Errorf("test: %w: password authentication failed; fix: the password", base.ErrRefused)},
		{"invalid config", faulty.MethodCreate, fmt.Errorf("test: %w: table of another shape", base.ErrInvalidConfig)},
		{"unsupported", faulty.MethodStart, fmt.Errorf("test: server version 11: %w", backend.ErrUnsupported)},
		{"closed", faulty.MethodStart, fmt.Errorf("test: %w", base.ErrClosed)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs logLines
				b, _ := memory.NewDB().Election("e")
				fb := faulty.Wrap(b)
				fb.Inject(faulty.Fault{Method: tc.method, Nth: 1, Err: tc.err})
				f, _ := base.New(fb, "n", base.Options{Timing: timing, Logger: slog.New(&logs)})
				t0 := time.Now()
				if err := f.Start(context.Background()); !errors.Is(err, tc.err) {
					t.Fatalf("Start: %v, want %v", err, tc.err)
				}
				if took := time.Since(t0); took != 0 {
					t.Errorf("Start returned after %v, want at once", took)
				}
				if n := fb.Calls(tc.method); n != 1 {
					t.Errorf("%s called %d times, want once", tc.method, n)
				}
				if n := logs.count(logWaiting); n != 0 {
					t.Errorf("%d lines %q for an error that is not waited for", n, logWaiting)
				}
				if err := f.Start(context.Background()); err != nil {
					t.Fatalf("Start again: %v", err)
				}
				if err := f.Stop(context.Background()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// When ctx ends, the wait ends with an error matching ctx's error and
// carrying the last failure; the Feed stays unstarted.
func TestStartWaitEndsWithCtx(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 3*time.Second)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(3*time.Second, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, _ := memory.NewDB().Election("e")
				fb := faulty.Wrap(b)
				fb.Inject(faulty.Fault{Method: faulty.MethodStart, Err: errDown})
				f, _ := base.New(fb, "n", base.Options{Timing: timing})
				ctx, cancel := tc.ctx()
				defer cancel()
				t0 := time.Now()
				err := f.Start(ctx)
				if !errors.Is(err, tc.want) || !errors.Is(err, errDown) {
					t.Fatalf("Start: %v, want an error matching %v and the last failure (%v)", err, tc.want, errDown)
				}
				if took := time.Since(t0); took != 3*time.Second {
					t.Errorf("Start returned after %v, want when ctx ended (3s)", took)
				}
				fb.Heal()
				if err := f.Start(context.Background()); err != nil {
					t.Fatalf("Start after the wait ended: %v", err)
				}
				if err := f.Stop(context.Background()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// Stop ends a Start that waits for the store: Start returns ErrClosed, and
// Stop returns at once, leaving no goroutine behind.
func TestStopEndsStartsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodCreate, Err: errDown})
		f, _ := base.New(fb, "n", base.Options{Timing: timing})
		started := make(chan error, 1)
		go func() { started <- f.Start(context.Background()) }()
		time.Sleep(10 * time.Second)
		t0 := time.Now()
		if err := f.Stop(ctx(t)); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(t0); took != 0 {
			t.Errorf("Stop took %v, want at once", took)
		}
		if err := <-started; !errors.Is(err, base.ErrClosed) {
			t.Fatalf("Start: %v, want ErrClosed", err)
		}
		<-f.Done()
	})
}

// A participant's first presence write is waited for like Start and
// Create.
func TestStartWaitsForThePresenceWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		fb := faulty.Wrap(b)
		failFirst(fb, faulty.MethodPresent, 2, errDown)
		f, _ := base.New(fb, "n", base.Options{Timing: timing, Participate: true})
		if err := f.Start(context.Background()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if n := fb.Calls(faulty.MethodPresent); n != 3 {
			t.Errorf("Present called %d times, want 3", n)
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Feeds of an Elections wait for the shared store together: each Start
// retries the store's Start until it succeeds once.
func TestElectionsFeedsWaitForTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := faulty.WrapStore(memory.NewDB().Conn())
		failFirst(fs, faulty.MethodStart, 4, errDown)
		els, err := base.NewElections(fs, base.ElectionsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer els.Close()
		errs := make(chan error, 2)
		var feeds []*base.Feed
		for _, name := range []string{"a", "b"} {
			f, err := els.Feed(name, "n", base.Options{Timing: timing})
			if err != nil {
				t.Fatal(err)
			}
			feeds = append(feeds, f)
			go func() { errs <- f.Start(context.Background()) }()
		}
		for range feeds {
			if err := <-errs; err != nil {
				t.Fatalf("Start: %v", err)
			}
		}
		if n := fs.Calls(faulty.MethodStart); n != 5 {
			t.Errorf("the store's Start called %d times, want 5 (4 failures, then once for both)", n)
		}
		for _, f := range feeds {
			if err := f.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Run waits for the store as Start does, then runs fn when elected; when
// its ctx ends during the wait, it returns ctx's error and can be called
// again.
func TestRunWaitsForTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newRunNode(t, memory.NewDB(), "n")
		n.link.Inject(faulty.Fault{Method: faulty.MethodStart, Err: errDown})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		noop := func(ctx context.Context, term uint64) error { <-ctx.Done(); return nil }
		if err := n.feed.Run(ctx, noop); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errDown) {
			t.Fatalf("Run while the store is down: %v, want ctx's error with the last failure", err)
		}

		n.link.Heal()
		failFirst(n.link, faulty.MethodStart, 3, errDown)
		started := make(chan uint64, 1)
		n.run(t, func(ctx context.Context, term uint64) error {
			started <- term
			<-ctx.Done()
			return nil
		})
		if term := <-started; term != 1 {
			t.Fatalf("fn of term %d, want 1", term)
		}
		n.cancel(nil)
		if err := n.wait(t, wait); err != nil {
			t.Fatal(err)
		}
	})
}
