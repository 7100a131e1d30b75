package base_test

// Tests of how a Feed takes a store's refusals (base.ErrRefused), under
// testing/synctest with the memory backend wrapped in base/faulty.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/memory"
)

// logLines records the messages of a slog.Logger by level.
type logLines struct {
	mu    sync.Mutex
	lines []string // "LEVEL msg"
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	return nil
}

// count returns how many lines are "LEVEL msg".
func (l *logLines) count(line string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if s == line {
			n++
		}
	}
	return n
}

var errRefusedWrite = fmt.Errorf("test: %w: permission denied for table t; fix: GRANT", base.ErrRefused)

// A follower whose claims the store refuses is unhealthy at once, with
// the refusal as the reason; it logs the refusal once, then a summary a
// minute, not once per retry; the trace hooks carry the refusal; it
// retries its claim only every refusalRetry; and once the store takes its
// writes again it leads, healthy.
func TestRefusedClaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logLines
		var tl traceLog
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Err: errRefusedWrite})
		f, err := base.New(fb, "n", base.Options{Timing: timing, Logger: slog.New(&logs), Trace: tl.trace()})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Stop(context.Background()) }()

		retry := base.RefusalRetry(timing)
		span := 150 * time.Second // three summaries' worth
		time.Sleep(span)
		synctest.Wait()

		err = f.Healthy(0)
		if !errors.Is(err, base.ErrUnhealthy) || !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "store refuses") ||
			!strings.Contains(err.Error(), "permission denied for table t") {
			t.Fatalf("Healthy of a node whose writes are refused: %v, want ErrUnhealthy and ErrRefused naming the permission", err)
		}
		if h := f.Health(); !errors.Is(h.Refused, base.ErrRefused) || h.RefusedSince.IsZero() {
			t.Fatalf("Health: %+v, want the refusal and its start", h)
		}
		// One claim at once, then one per refusalRetry (timers may fire a
		// little later, never sooner).
		if n, most := fb.Calls(faulty.MethodHeartbeat), int(span/retry)+1; n < 2 || n > most {
			t.Fatalf("%d claims in %v, want 2..%d (one per refusalRetry %v)", n, span, most, retry)
		}
		if n := logs.count("ERROR leaderfeed: store refuses"); n != 1 {
			t.Fatalf("%d first-refusal lines at Error, want 1: %q", n, logs.lines)
		}
		if n := logs.count("ERROR leaderfeed: store still refuses"); n < 1 || n > int(span/time.Minute) {
			t.Fatalf("%d summaries at Error in %v, want 1..%d", n, span, int(span/time.Minute))
		}
		tl.mu.Lock()
		for _, c := range tl.claims {
			if !errors.Is(c.Err, base.ErrRefused) || c.Won {
				t.Errorf("traced claim %+v, want a refusal (ErrRefused) not won", c)
			}
		}
		tl.mu.Unlock()

		fb.Heal()
		time.Sleep(retry + timing.ElectionTimeoutMax)
		synctest.Wait()
		if !f.IsLeader() {
			t.Fatalf("not leader %v after the store took writes again", retry+timing.ElectionTimeoutMax)
		}
		if err := f.Healthy(0); err != nil {
			t.Fatalf("Healthy after the refusals ended: %v", err)
		}
		if n := logs.count("INFO leaderfeed: store takes the calls it refused"); n != 1 {
			t.Fatalf("%d lines saying the refusals ended, want 1", n)
		}
	})
}

// An observer whose reads and changefeed the store refuses polls and
// reopens only every refusalRetry, and reports the refusal.
func TestRefusedReadsAndFeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		refused := fmt.Errorf("test: %w: permission denied for table t", base.ErrRefused)
		fb.Inject(faulty.Fault{Method: faulty.MethodGet, Err: refused})
		fb.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: refused})
		f, err := base.New(fb, "o", base.Options{Timing: timing, ObserveOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Stop(context.Background()) }()
		retry := base.RefusalRetry(timing)
		span := 10 * retry
		time.Sleep(span)
		synctest.Wait()
		if err := f.Healthy(0); !errors.Is(err, base.ErrRefused) {
			t.Fatalf("Healthy: %v, want ErrRefused", err)
		}
		for _, m := range []faulty.Method{faulty.MethodGet, faulty.MethodSubscribe} {
			// Without the refusal: a read every heartbeat interval (1000
			// here), a reopen every ElectionTimeoutMax at most (50).
			if n, most := fb.Calls(m), int(span/retry)+2; n < 2 || n > most {
				t.Errorf("%d calls of %s in %v, want 2..%d", n, m, span, most)
			}
		}
	})
}

// Run returns the store's refusal, naming it, and stops the Feed: a
// process that cannot lead says so rather than run on silently.
func TestRunReturnsRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Err: errRefusedWrite})
		f, err := base.New(fb, "n", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = f.Run(context.Background(), func(ctx context.Context, term uint64) error {
			t.Errorf("fn ran for term %d though every write is refused", term)
			return nil
		})
		if !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "permission denied for table t") {
			t.Fatalf("Run: %v, want the refusal", err)
		}
		if d := time.Since(start); d > timing.ElectionTimeoutMax {
			t.Fatalf("Run returned after %v, want within ElectionTimeoutMax (%v)", d, timing.ElectionTimeoutMax)
		}
		select {
		case <-f.Done():
		default:
			t.Fatal("the Feed runs on after Run returned")
		}
	})
}

// A leader whose renewal the store refuses is stopped by Run, and the log
// line of its end says why: the refusal, not only that Stop was called.
func TestRunRefusedRenewalSaysWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		var out syncWriter
		f, err := base.New(fb, "n", base.Options{Timing: timing, Logger: slog.New(slog.NewTextHandler(&out, nil))})
		if err != nil {
			t.Fatal(err)
		}
		err = f.Run(context.Background(), func(ctx context.Context, term uint64) error {
			fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Err: errRefusedWrite})
			<-ctx.Done()
			return nil
		})
		if !errors.Is(err, base.ErrRefused) {
			t.Fatalf("Run: %v, want the refusal", err)
		}
		var line string
		for l := range strings.Lines(out.String()) {
			if strings.Contains(l, `msg="leaderfeed: unelected"`) {
				line = l
			}
		}
		if !strings.Contains(line, "reason=stopped") || !strings.Contains(line, "permission denied for table t") {
			t.Fatalf("the unelected line %q does not name the refusal\n%s", line, out.String())
		}
	})
}

// syncWriter is a bytes.Buffer safe for concurrent writes.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
