// Package storewait waits for a store that cannot be reached yet: a
// database still starting beside the service (compose, Kubernetes), a
// name that does not resolve yet, a refused connection. Feed.Start of
// package base and the command leaderfeed call the store through Retry,
// so both wait the same way.
package storewait

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
)

// The pace of the retries. The first comes First/2..First after the
// first failure; each wait doubles up to Max, drawn from [d/2, d] so that
// processes started together spread their attempts. Max is well under a
// second, so that a store that comes up is in use within a second.
const (
	First = 200 * time.Millisecond
	Max   = 500 * time.Millisecond
)

// The log lines while waiting: the first failure, then a line LogFirst
// after it, each later one twice as long after the one before, at most
// LogMax apart.
const (
	LogFirst = 5 * time.Second
	LogMax   = time.Minute
)

// Rand is the source of the jitter (heartbeat.Rand); nil means
// math/rand/v2's global source.
type Rand interface {
	Int64N(n int64) int64
}

// Permanent reports whether retrying cannot fix err: the store refuses
// (backend.ErrRefused: a missing privilege, failed authentication, a
// missing or foreign table), lacks a capability (backend.ErrUnsupported),
// the configuration is wrong (backend.ErrInvalidConfig) or the store was
// closed (backend.ErrClosed). Every other error of a store call is
// transient, as the backend contract says.
func Permanent(err error) bool {
	return errors.Is(err, backend.ErrRefused) || errors.Is(err, backend.ErrUnsupported) ||
		errors.Is(err, backend.ErrInvalidConfig) || errors.Is(err, backend.ErrClosed)
}

// Retry calls call until it returns nil or a Permanent error, which it
// returns, or until ctx ends. A transient failure is retried after a wait
// (First, doubling up to Max, jittered with r). It logs the first
// transient failure at Warn on log ("leaderfeed: store not reached,
// waiting"), then a summary now and then while the failures go on (see
// LogFirst), and one line at Info when a call succeeds after failures.
// When ctx ends it returns an error matching ctx.Err(): a *NotReached
// carrying the last failure that said more than that ctx ended, if any.
func Retry(ctx context.Context, log *slog.Logger, r Rand, call func(context.Context) error) error {
	var (
		attempts int
		first    time.Time // of the first failure
		logged   time.Time // of the last log line
		logEvery = LogFirst
		wait     = First
		last     error // the last failure that was not ctx's end
	)
	for {
		err := call(ctx)
		if err == nil {
			if attempts > 0 {
				log.Info("leaderfeed: store reached", "attempts", attempts+1, "waited", time.Since(first).Round(time.Millisecond))
			}
			return nil
		}
		if Permanent(err) {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return ended(cerr, err, last)
		}
		attempts++
		last = err
		now := time.Now()
		switch {
		case attempts == 1:
			first, logged = now, now
			log.Warn("leaderfeed: store not reached, waiting", "err", err)
		case now.Sub(logged) >= logEvery:
			logged, logEvery = now, min(2*logEvery, LogMax)
			log.Warn("leaderfeed: store still not reached, waiting", "attempts", attempts,
				"for", now.Sub(first).Round(time.Millisecond), "err", err)
		}
		t := time.NewTimer(jitter(r, wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return ended(ctx.Err(), err, last)
		case <-t.C:
		}
		wait = min(2*wait, Max)
	}
}

// jitter draws a wait from [d/2, d].
func jitter(r Rand, d time.Duration) time.Duration {
	half := int64(d / 2)
	if r == nil {
		return time.Duration(half + rand.Int64N(half+1))
	}
	return time.Duration(half + r.Int64N(half+1))
}

// ended is Retry's error when ctx ended (cerr), err being the last call's
// error and last the failure before it: cerr, with the last failure that
// said more than that ctx ended.
func ended(cerr, err, last error) error {
	if !errors.Is(err, cerr) {
		last = err
	}
	if last == nil {
		return err // it matches cerr: the backend contract
	}
	return &NotReached{Ctx: cerr, Last: last}
}

// NotReached is Retry's error when ctx ended after a failure that said
// more than that: it matches both.
type NotReached struct {
	Ctx  error // ctx.Err()
	Last error // the last failure that was not ctx's end
}

func (e *NotReached) Error() string {
	return fmt.Sprintf("leaderfeed: store not reached: %v; last error: %v", e.Ctx, e.Last)
}

func (e *NotReached) Unwrap() []error { return []error{e.Ctx, e.Last} }
