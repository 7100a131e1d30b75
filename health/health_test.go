package health_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/health"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var timing = heartbeat.Timing{
	HeartbeatInterval:  10 * time.Millisecond,
	ElectionTimeoutMin: 50 * time.Millisecond,
	ElectionTimeoutMax: 80 * time.Millisecond,
	LeaseDuration:      30 * time.Millisecond,
}

// The handler answers 200 "ok" for a healthy leader, and 503 with the
// reason on one line once the node is cut off from the store for longer
// than the bound.
func TestHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := memory.NewDB().Election("e")
		if err != nil {
			t.Fatal(err)
		}
		fb := faulty.Wrap(b)
		f, err := base.New(fb, "a", base.Options{Timing: timing})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Stop(context.Background()) }()
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		get := func() (int, string, http.Header) {
			w := httptest.NewRecorder()
			health.Handler(f, 0).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			return w.Code, w.Body.String(), w.Header()
		}
		code, body, h := get()
		if code != http.StatusOK || body != "ok\n" {
			t.Fatalf("healthy: %d %q, want 200 \"ok\\n\"", code, body)
		}
		if h.Get("Cache-Control") != "no-store" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
			t.Fatalf("headers %v, want plain text that is not cached", h)
		}
		fb.Partition()
		time.Sleep(4 * timing.WithDefaults().ElectionTimeoutMax) // twice the default bound
		synctest.Wait()
		code, body, _ = get()
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "unhealthy: ") || strings.Count(body, "\n") != 1 {
			t.Fatalf("partitioned: %d %q, want 503 and one line", code, body)
		}
	})
}
