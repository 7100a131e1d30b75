package storewait

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
)

var errDown = errors.New("connection refused")

// fixed is a Rand that always draws n-1 (the longest wait, d) or 0 (the
// shortest, d/2).
type fixed bool

func (longest fixed) Int64N(n int64) int64 {
	if longest {
		return n - 1
	}
	return 0
}

// The waits between attempts: First/2..First, then doubling, at most Max.
func TestRetryPace(t *testing.T) {
	for _, tc := range []struct {
		r    fixed
		want []time.Duration
	}{
		{false, []time.Duration{100, 200, 250, 250, 250}},
		{true, []time.Duration{200, 400, 500, 500, 500}},
	} {
		t.Run(fmt.Sprintf("longest=%v", tc.r), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var at []time.Time
				err := Retry(context.Background(), slog.New(slog.DiscardHandler), tc.r, func(context.Context) error {
					at = append(at, time.Now())
					if len(at) <= len(tc.want) {
						return errDown
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				for i, w := range tc.want {
					if got := at[i+1].Sub(at[i]).Round(time.Millisecond); got != w*time.Millisecond {
						t.Errorf("wait %d: %v, want %v", i+1, got, w*time.Millisecond)
					}
				}
			})
		})
	}
}

// Permanent errors end the wait at once; the others are retried.
func TestPermanent(t *testing.T) {
	for _, err := range []error{backend.ErrRefused, backend.ErrUnsupported, backend.ErrInvalidConfig, backend.ErrClosed} {
		if !Permanent(fmt.Errorf("x: %w", err)) {
			t.Errorf("%v: not permanent", err)
		}
	}
	for _, err := range []error{errDown, context.DeadlineExceeded, backend.ErrNotFound} {
		if Permanent(err) {
			t.Errorf("%v: permanent", err)
		}
	}
}

// When ctx ends, the error matches ctx's and the last failure, and says
// both.
func TestRetryEndsWithCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := Retry(ctx, slog.New(slog.DiscardHandler), nil, func(context.Context) error { return errDown })
		var nr *NotReached
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errDown) || !errors.As(err, &nr) {
			t.Fatalf("Retry: %v, want a *NotReached matching ctx's error and the last failure", err)
		}
		if want := "leaderfeed: store not reached: context deadline exceeded; last error: connection refused"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
		// A ctx that ended before any failure: its error, as the call gave it.
		err = Retry(ctx, slog.New(slog.DiscardHandler), nil, func(ctx context.Context) error { return fmt.Errorf("call: %w", ctx.Err()) })
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nr) {
			t.Fatalf("Retry on an ended ctx: %v, want the call's error", err)
		}
	})
}
