package otelmetrics

import (
	"errors"
	"fmt"
	"testing"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "success"},
		{&backend.ConflictError{}, "conflict"},
		{fmt.Errorf("renew: %w", backend.ErrConflict), "conflict"},
		{errors.New("connection reset"), "error"},
		{base.ErrClosed, "error"},
		{fmt.Errorf("postgres: Heartbeat: %w: permission denied", base.ErrRefused), "refused"},
	} {
		if got := outcome(tc.err); got != tc.want {
			t.Errorf("outcome(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
