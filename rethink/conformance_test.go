package rethink_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/rethink"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// harness returns the conformance harness: every backend and store of one
// Run shares one database and table made for the test, each with a Store
// and a session of its own (as separate nodes would). On reqlite, which
// does not run update functions atomically across connections, the
// stores' writes are serialized through writeMu and SerializedWrites says
// so.
func harness(t *testing.T) basetest.Harness {
	db := newDatabase(t)
	admin := connect(t)
	tb := r.DB(db).Table(table)
	return basetest.Harness{
		Open: func(t *testing.T, election string) (backend.Election, error) {
			s, err := rethink.NewStore(connect(t), rethink.Options{Database: db, Table: table})
			if err != nil {
				return nil, err
			}
			b, err := base.Open(wrapWrites(s), election)
			if err != nil {
				_ = s.Close()
				return nil, err
			}
			return b, nil
		},
		OpenStore: func(t *testing.T) (backend.Store, error) {
			s, err := rethink.NewStore(connect(t), rethink.Options{Database: db, Table: table})
			if err != nil {
				return nil, err
			}
			return wrapWrites(s), nil
		},
		PutOther: func(ctx context.Context, _, key string, doc map[string]any) error {
			d := maps.Clone(doc)
			d["id"] = key
			_, err := tb.Insert(d, r.InsertOpts{Conflict: "replace"}).RunWrite(admin, r.RunOpts{Context: ctx})
			return err
		},
		DeleteOther: func(ctx context.Context, _, key string) error {
			_, err := tb.Get(key).Delete().RunWrite(admin, r.RunOpts{Context: ctx})
			return err
		},
		WriteMalformed: func(ctx context.Context, election string) error {
			// Marked as ours, but the leader is a number.
			doc := map[string]any{"id": election, "leaderfeed": 1, "leader": 42, "term": 1, "revision": 1, "timestamp": r.Now(), "value": nil}
			_, err := tb.Insert(doc, r.InsertOpts{Conflict: "replace"}).RunWrite(admin, r.RunOpts{Context: ctx})
			return err
		},
		Invalid:          invalid(admin),
		SerializedWrites: server.reqlite,
		Timing:           timing,
	}
}

// timing is basetest.FastTiming with more room between a renewal and the
// end of the lease (125 ms instead of 40 ms): a round trip to reqlite under
// the race detector, or a RethinkDB that syncs every write to disk, now and
// then takes longer than 40 ms, and a leader then rightly steps down.
var timing = heartbeat.Timing{
	HeartbeatInterval:  25 * time.Millisecond,
	LeaseDuration:      150 * time.Millisecond,
	ElectionTimeoutMin: 300 * time.Millisecond,
	ElectionTimeoutMax: 500 * time.Millisecond,
}

func TestConformance(t *testing.T) {
	needServer(t)
	basetest.Run(t, harness(t))
}
