package suite

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
)

// One HeartbeatBatch (a bulk write and a find) mixing a creation, a
// renewal, a takeover after a vacancy, a stale write, a creation that loses
// to an existing record (duplicate key), writes over malformed documents
// with and without the mark, and a write that breaks the record rules:
// each result is what a single compare-and-set gives, the store holds what
// the results say, and the change stream carries each applied record.
func testHeartbeatBatch(t *testing.T, newServer NewServer) {
	s := newServer(t)
	ctx := testCtx(t)
	st := s.store(t, mongo.Options{})
	if err := st.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Create(ctx); err != nil {
		t.Fatal(err)
	}
	name := electionName(t)
	el := func(suffix string) string { return name + "-" + suffix }
	single := func(expected heartbeat.Record, election, leader string, term uint64) heartbeat.Record {
		t.Helper()
		r, err := st.Heartbeat(ctx, expected, heartbeat.Record{Election: election, Leader: leader, Term: term})
		if err != nil {
			t.Fatalf("Heartbeat of %s: %v", election, err)
		}
		return r
	}
	renewed := single(heartbeat.Record{}, el("renew"), "a", 1)
	vacant := single(single(heartbeat.Record{}, el("vacant"), "a", 1), el("vacant"), "", 1)
	stale1 := single(heartbeat.Record{}, el("stale"), "a", 1)
	stale2 := single(stale1, el("stale"), "b", 2)
	taken := single(heartbeat.Record{}, el("taken"), "x", 3)
	if err := s.Put(ctx, el("marked"), bson.M{"leaderfeed": 1, "leader": 5}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, el("foreign"), bson.M{"foo": "bar"}); err != nil {
		t.Fatal(err)
	}
	ch := subscribe(t, st)

	writes := []backend.Write{
		{Next: heartbeat.Record{Election: el("create"), Leader: "c", Term: 1, Value: []byte("addr"), Lease: time.Second}},
		{Expected: renewed, Next: heartbeat.Record{Election: el("renew"), Leader: "a", Term: 1, Value: []byte("v"), Lease: 1500 * time.Microsecond}},
		{Expected: vacant, Next: heartbeat.Record{Election: el("vacant"), Leader: "b", Term: 2}},
		{Expected: stale1, Next: heartbeat.Record{Election: el("stale"), Leader: "a", Term: 1}},
		{Next: heartbeat.Record{Election: el("taken"), Leader: "y", Term: 1}},
		{Expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, Next: heartbeat.Record{Election: el("marked"), Leader: "a", Term: 2}},
		{Next: heartbeat.Record{Election: el("foreign"), Leader: "a", Term: 1}},
		{Expected: renewed, Next: heartbeat.Record{Election: el("invalid"), Leader: "", Term: 1, Value: []byte("v")}},
	}
	before := time.Now().Add(-time.Minute)
	res, err := st.HeartbeatBatch(ctx, writes)
	if err != nil {
		t.Fatalf("HeartbeatBatch: %v", err)
	}
	if len(res) != len(writes) {
		t.Fatalf("%d results for %d writes", len(res), len(writes))
	}
	applied := func(i int, rev uint64) {
		t.Helper()
		r, w := res[i], writes[i].Next
		if r.Err != nil || r.Record.Election != w.Election || r.Record.Revision != rev || r.Record.Leader != w.Leader ||
			r.Record.Term != w.Term || string(r.Record.Value) != string(w.Value) || r.Record.Lease != w.Lease ||
			r.Record.Timestamp.Before(before) || r.Record.Timestamp.After(time.Now().Add(time.Minute)) {
			t.Errorf("write %d (%s): %+v, %v; want revision %d of %+v with a store timestamp", i, w.Election, r.Record, r.Err, rev, w)
			return
		}
		if got, err := st.Get(ctx, w.Election); err != nil || !got.Equal(r.Record) {
			t.Errorf("Get(%s) = %+v, %v; the batch returned %+v", w.Election, got, err, r.Record)
		}
	}
	conflict := func(i int, current heartbeat.Record) {
		t.Helper()
		var ce *backend.ConflictError
		if r := res[i]; !errors.As(r.Err, &ce) || !ce.Current.Equal(current) || !strings.HasPrefix(r.Err.Error(), "mongo: ") {
			t.Errorf("write %d (%s): %+v, %v; want a conflict carrying %+v", i, writes[i].Next.Election, r.Record, r.Err, current)
		}
		if got, err := st.Get(ctx, writes[i].Next.Election); err != nil || !got.Equal(current) {
			t.Errorf("Get(%s) = %+v, %v after a refused write; want %+v", writes[i].Next.Election, got, err, current)
		}
	}
	applied(0, 1)
	applied(1, renewed.Revision+1)
	applied(2, vacant.Revision+1)
	conflict(3, stale2)
	conflict(4, taken)
	for _, i := range []int{5, 6} {
		if r := res[i]; !errors.Is(r.Err, backend.ErrMalformedRecord) || errors.Is(r.Err, backend.ErrConflict) {
			t.Errorf("write %d over a malformed document: %+v, %v; want ErrMalformedRecord", i, r.Record, r.Err)
		}
		if _, err := st.Get(ctx, writes[i].Next.Election); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("Get(%s) after the batch: %v, want the malformed document unchanged", writes[i].Next.Election, err)
		}
	}
	if r := res[7]; !errors.Is(r.Err, base.ErrInvalidConfig) {
		t.Errorf("invalid write: %+v, %v; want ErrInvalidConfig", r.Record, r.Err)
	}

	// Each applied record arrives on the change stream.
	want := map[string]heartbeat.Record{}
	for _, i := range []int{0, 1, 2} {
		want[res[i].Record.Election] = res[i].Record
	}
	for len(want) > 0 {
		n := next(t, ch)
		if n.Type != backend.RecordChanged {
			t.Fatalf("after the batch: %v %v of %q, want the applied records", n.Type, n.Err, n.Election)
		}
		if w, ok := want[n.Record.Election]; !ok || !n.Record.Equal(w) {
			t.Fatalf("after the batch: %+v, want one of %v", n.Record, want)
		}
		delete(want, n.Record.Election)
	}

	// An empty batch, and a batch of invalid writes only, send nothing.
	if res, err := st.HeartbeatBatch(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch: %v, %v", res, err)
	}
	if res, err := st.HeartbeatBatch(ctx, writes[7:]); err != nil || len(res) != 1 || !errors.Is(res[0].Err, base.ErrInvalidConfig) {
		t.Fatalf("batch of one invalid write: %v, %v", res, err)
	}
	_ = st.Close()
	if _, err := st.HeartbeatBatch(ctx, writes[:1]); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("HeartbeatBatch after Close: %v, want ErrClosed", err)
	}
}

// A batch names each election once (backend.BatchStore): the first write or
// read of an election goes, every later one of it fails alone with
// base.ErrInvalidConfig and heartbeat.ErrInvalidRecord, before anything
// is sent, as on PostgreSQL and RethinkDB.
func testBatchDuplicateElection(t *testing.T, newServer NewServer) {
	s := newServer(t)
	ctx := testCtx(t)
	st := s.store(t, mongo.Options{})
	if err := st.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Create(ctx); err != nil {
		t.Fatal(err)
	}
	e, other := electionName(t)+"-e", electionName(t)+"-other"
	writes := []backend.Write{
		{Next: heartbeat.Record{Election: e, Leader: "a", Term: 1}},
		{Next: heartbeat.Record{Election: e, Leader: "b", Term: 1}},
		{Next: heartbeat.Record{Election: other, Leader: "c", Term: 1}},
		{Expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, Next: heartbeat.Record{Election: e, Leader: "a", Term: 1}},
	}
	res, err := st.HeartbeatBatch(ctx, writes)
	if err != nil || len(res) != len(writes) {
		t.Fatalf("HeartbeatBatch: %v, %v", res, err)
	}
	for _, i := range []int{0, 2} {
		if r := res[i]; r.Err != nil || r.Record.Revision != 1 || r.Record.Leader != writes[i].Next.Leader {
			t.Errorf("write %d, the first of its election: %+v, %v; want revision 1 led by %s", i, r.Record, r.Err, writes[i].Next.Leader)
		}
	}
	for _, i := range []int{1, 3} {
		r := res[i]
		if !errors.Is(r.Err, base.ErrInvalidConfig) || !errors.Is(r.Err, heartbeat.ErrInvalidRecord) || errors.Is(r.Err, backend.ErrConflict) ||
			!strings.Contains(r.Err.Error(), "is named by entries 0 and") {
			t.Errorf("write %d, a repeat of election %s: %+v, %v; want ErrInvalidConfig naming both entries", i, e, r.Record, r.Err)
		}
	}
	if got, err := st.Get(ctx, e); err != nil || got.Revision != 1 || got.Leader != "a" {
		t.Errorf("Get(%s) = %+v, %v; want the first write's record, revision 1 led by a", e, got, err)
	}
	reads, err := st.GetBatch(ctx, []string{e, other, e})
	if err != nil || len(reads) != 3 {
		t.Fatalf("GetBatch: %v, %v", reads, err)
	}
	if reads[0].Err != nil || !reads[0].Record.Equal(res[0].Record) || reads[1].Err != nil || !reads[1].Record.Equal(res[2].Record) {
		t.Errorf("GetBatch: %+v; want the records the batch wrote", reads[:2])
	}
	if r := reads[2]; !errors.Is(r.Err, base.ErrInvalidConfig) || !errors.Is(r.Err, heartbeat.ErrInvalidRecord) {
		t.Errorf("GetBatch of %s a second time: %+v, %v; want ErrInvalidConfig", e, r.Record, r.Err)
	}
}
