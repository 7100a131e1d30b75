package logstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/examples/custombackend/logstore"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// TestMain fails the tests if a goroutine outlives them: every feed must
// end when its context is cancelled or its backend is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the whole conformance suite on backends that share
// one Log.
func TestConformance(t *testing.T) {
	log := logstore.NewLog()
	basetest.Run(t, basetest.Harness{
		Open: func(_ *testing.T, election string) (backend.Election, error) {
			return log.Election(election)
		},
		OpenStore: func(*testing.T) (backend.Store, error) { return log.Store(), nil },
		PutOther: func(_ context.Context, _, key string, doc map[string]any) error {
			return log.Put(key, doc)
		},
		DeleteOther: func(_ context.Context, _, key string) error {
			log.Delete(key)
			return nil
		},
		WriteMalformed: func(_ context.Context, election string) error {
			return log.Put(election, map[string]any{"leaderfeed": 1, "leader": 5}) // the mark, a wrong type
		},
		Invalid: map[string]func() (backend.Election, error){
			"election name with a newline": func() (backend.Election, error) {
				return log.Election("a\nb")
			},
			"election name longer than heartbeat.MaxNameLen": func() (backend.Election, error) {
				return log.Election(strings.Repeat("x", 128))
			},
		},
	})
}

// TestOlderRecords reads records as versions before the lease, successor,
// handover and incarnation fields wrote them: without those fields, they
// read as none.
func TestOlderRecords(t *testing.T) {
	log := logstore.NewLog()
	b, err := log.Election("e")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := log.Put("e", map[string]any{"leaderfeed": 1, "leader": "a", "term": 3, "revision": 9, "ts": ts}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx)
	want := heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9, Timestamp: ts}
	if err != nil || !got.Equal(want) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}
	r, err := b.Heartbeat(ctx, got, heartbeat.Record{Election: "e", Leader: "a", Term: 3, Incarnation: 7})
	if err != nil || r.Incarnation != 7 || r.Revision != 10 {
		t.Fatalf("a renewal over it: %+v, %v", r, err)
	}
}
