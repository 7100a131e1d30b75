package logstore_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/examples/custombackend/logstore"
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
