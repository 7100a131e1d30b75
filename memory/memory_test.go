package memory_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	store := memory.NewDB()
	basetest.Run(t, basetest.Harness{
		Open:      func(_ *testing.T, election string) (backend.Election, error) { return store.Election(election) },
		OpenStore: func(*testing.T) (backend.Store, error) { return store.Conn(), nil },
		PutOther: func(_ context.Context, _, key string, doc map[string]any) error {
			return store.Put(key, doc)
		},
		DeleteOther: func(_ context.Context, _, key string) error {
			store.Delete(key)
			return nil
		},
		WriteMalformed: func(_ context.Context, election string) error {
			store.WriteRaw(heartbeat.Record{Election: election, Leader: "bad\x01id", Term: 1, Revision: 1})
			return nil
		},
		Invalid: map[string]func() (backend.Election, error){
			"election name with a control character": func() (backend.Election, error) { return store.Election("a\nb") },
			"election name longer than MaxNameLen": func() (backend.Election, error) {
				return store.Election(string(make([]byte, heartbeat.MaxNameLen+1)))
			},
		},
	})
}
