package mongo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// These tests need no server. The tests that need one are in package
// mongo/internal/suite: they run on lungo in module mongo/onlungo, and on
// a real server through this package's driver-v2 adapter
// (server_test.go) when LEADERFEED_MONGO_URL is set.

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func rec(leader string, term uint64, value string) heartbeat.Record {
	r := heartbeat.Record{Leader: leader, Term: term}
	if value != "" {
		r.Value = []byte(value)
	}
	return r
}

// unconnected returns a driver-v2 client of a port where no server
// listens, disconnected when the test ends.
func unconnected(t *testing.T) *mongodrv.Client {
	t.Helper()
	client, err := mongodrv.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=5000&connectTimeoutMS=100"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}

func TestNamesRejected(t *testing.T) {
	db := unconnected(t).Database("app")
	cases := map[string]struct {
		election, coll string
	}{
		"empty election":      {"", "c"},
		"control in election": {"a\x01b", "c"},
		"long election":       {strings.Repeat("e", heartbeat.MaxNameLen+1), "c"},
		"dollar collection":   {"e", "a$b"},
		"NUL collection":      {"e", "a\x00b"},
		"system collection":   {"e", "system.users"},
		"long collection":     {"e", strings.Repeat("c", 255)},
	}
	for name, c := range cases {
		b, err := New(db, c.election, Options{Collection: c.coll})
		if !errors.Is(err, base.ErrInvalidConfig) || b != nil {
			t.Errorf("%s: New = %v, %v; want nil, ErrInvalidConfig", name, b, err)
		}
	}
	if _, err := New(nil, "e", Options{}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v, want ErrInvalidConfig", err)
	}
	if _, err := NewCollection(nil, "e", Options{}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("NewCollection(nil) = %v, want ErrInvalidConfig", err)
	}
	if _, err := NewCollection(db.Collection("a"), "e", Options{Collection: "b"}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("NewCollection with another Options.Collection = %v, want ErrInvalidConfig", err)
	}
	b, err := NewCollection(db.Collection("a"), "e", Options{})
	if err != nil || b.Name() != "e" {
		t.Fatalf("NewCollection = %v, %v", b, err)
	}
	_ = b.Close()
	for name, f := range map[string]func() (*Store, error){
		"NewStore":           func() (*Store, error) { return NewStore(db, Options{Collection: "a"}) },
		"NewCollectionStore": func() (*Store, error) { return NewCollectionStore(db.Collection("a"), Options{}) },
	} {
		st, err := f()
		if err != nil || st.Collection() != "a" {
			t.Fatalf("%s = %v, %v", name, st, err)
		}
		_ = st.Close()
	}
	for name, f := range map[string]func() (*Store, error){
		"NewStore(nil)":            func() (*Store, error) { return NewStore(nil, Options{}) },
		"NewCollectionStore(nil)":  func() (*Store, error) { return NewCollectionStore(nil, Options{}) },
		"NewStore, bad collection": func() (*Store, error) { return NewStore(db, Options{Collection: "a$"}) },
	} {
		if st, err := f(); st != nil || !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("%s = %v, %v; want ErrInvalidConfig", name, st, err)
		}
	}
	st, _ := NewStore(db, Options{})
	defer func() { _ = st.Close() }()
	ctx := context.Background()
	for _, name := range []string{"", "a\x01", strings.Repeat("e", heartbeat.MaxNameLen+1)} {
		if _, err := st.Get(ctx, name); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("Get(%q) = %v, want ErrInvalidConfig", name, err)
		}
		if _, err := st.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: name, Leader: "a", Term: 1}); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("Heartbeat of %q = %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, db := range []string{"", "a.b", "a b", "a$", strings.Repeat("d", 64)} {
		if err := validateNames(db, "c"); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("database name %q accepted: %v", db, err)
		}
	}
	if err := validateNames("app", "leader.feed"); err != nil {
		t.Errorf("valid names refused: %v", err)
	}
}
func TestDecodeLenient(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	doc, _ := bson.Marshal(bson.D{{Key: "_id", Value: "e"}, {Key: "leaderfeed", Value: 1.0},
		{Key: "leader", Value: "n"}, {Key: "term", Value: int32(3)}, {Key: "revision", Value: int64(9)},
		{Key: "ts", Value: now}, {Key: "value", Value: []byte("v")}})
	r, err := decodeRecord(doc, "e")
	if err != nil || r.Term != 3 || r.Revision != 9 || !r.Timestamp.Equal(now) || !bytes.Equal(r.Value, []byte("v")) {
		t.Fatalf("decodeRecord = %+v, %v", r, err)
	}
	if _, err := decodeRecord(doc, "f"); !errors.Is(err, backend.ErrMalformedRecord) {
		t.Fatalf("decodeRecord of another election = %v", err)
	}
}

// Term and revision: the BSON types here, the ranges in heartbeat.Decode.
func TestDecodeNumbers(t *testing.T) {
	doc := func(term, rev any) bson.Raw {
		raw, _ := bson.Marshal(bson.D{{Key: "_id", Value: "e"}, {Key: "leaderfeed", Value: 1}, {Key: "leader", Value: "a"},
			{Key: "term", Value: term}, {Key: "revision", Value: rev}, {Key: "ts", Value: time.Now()}, {Key: "value", Value: []byte{}}})
		return raw
	}
	if r, err := decodeRecord(doc(int64(0), int32(1)), "e"); err != nil || r.Term != 0 || r.Revision != 1 {
		t.Errorf("term 0, revision 1: %+v, %v", r, err)
	}
	if r, err := decodeRecord(doc(int64(math.MaxInt64), int64(math.MaxInt64)), "e"); err != nil || r.Term != math.MaxInt64 || r.Revision != math.MaxInt64 {
		t.Errorf("the largest int64: %+v, %v", r, err)
	}
	for name, c := range map[string]struct {
		doc  bson.Raw
		want string
	}{
		"negative term":   {doc(int64(-1), 9), "term -1 is negative"},
		"revision 0":      {doc(3, int32(0)), "revision 0 is not positive"},
		"fractional term": {doc(1.5, 9), `field "term" is double, not an integer`},
		"string revision": {doc(3, "9"), `field "revision" is string, not an integer`},
	} {
		if _, err := decodeRecord(c.doc, "e"); !errors.Is(err, backend.ErrMalformedRecord) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrMalformedRecord saying %q", name, err, c.want)
		}
	}
}

func TestDecodeLease(t *testing.T) {
	doc := func(leader string, lease any) bson.Raw {
		d := bson.D{{Key: "_id", Value: "e"}, {Key: "leaderfeed", Value: 1}, {Key: "leader", Value: leader},
			{Key: "term", Value: 3}, {Key: "revision", Value: 9}, {Key: "ts", Value: time.Now()}, {Key: "value", Value: []byte{}}}
		if lease != "missing" {
			d = append(d, bson.E{Key: "lease_us", Value: lease})
		}
		raw, _ := bson.Marshal(d)
		return raw
	}
	for name, c := range map[string]struct {
		doc  bson.Raw
		want time.Duration
	}{
		"missing":             {doc("a", "missing"), 0},
		"null":                {doc("a", nil), 0},
		"int32":               {doc("a", int32(1500)), 1500 * time.Microsecond},
		"int64":               {doc("a", int64(1500250)), 1500250 * time.Microsecond},
		"whole double":        {doc("a", 2e6), 2 * time.Second},
		"MaxLease":            {doc("a", heartbeat.MaxLease.Microseconds()), heartbeat.MaxLease},
		"vacant, stale lease": {doc("", int64(1000)), 0},
	} {
		r, err := decodeRecord(c.doc, "e")
		if err != nil || r.Lease != c.want {
			t.Errorf("%s: lease %v, %v; want %v", name, r.Lease, err, c.want)
		}
	}
	for name, d := range map[string]bson.Raw{
		"string":   doc("a", "1000"),
		"negative": doc("a", int64(-1)),
		"fraction": doc("a", 1.5),
		"too long": doc("a", heartbeat.MaxLease.Microseconds()+1),
		"binary":   doc("a", []byte{1}),
	} {
		if _, err := decodeRecord(d, "e"); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("lease %s: %v, want ErrMalformedRecord", name, err)
		}
	}
}

func TestDecodeSuccessor(t *testing.T) {
	doc := func(leader string, successor any) bson.Raw {
		d := bson.D{{Key: "_id", Value: "e"}, {Key: "leaderfeed", Value: 1}, {Key: "leader", Value: leader},
			{Key: "term", Value: 3}, {Key: "revision", Value: 9}, {Key: "ts", Value: time.Now()}, {Key: "value", Value: []byte{}}}
		if successor != "missing" {
			d = append(d, bson.E{Key: "successor", Value: successor})
		}
		raw, _ := bson.Marshal(d)
		return raw
	}
	for name, c := range map[string]struct {
		doc  bson.Raw
		want string
	}{
		"missing":  {doc("", "missing"), ""},
		"null":     {doc("", nil), ""},
		"reserved": {doc("", "b"), "b"},
		// An older version's claim leaves the successor of the reserved
		// vacancy it claimed in place: ignored on a led record.
		"led, stale successor": {doc("a", "b"), ""},
	} {
		r, err := decodeRecord(c.doc, "e")
		if err != nil || r.Successor != c.want {
			t.Errorf("%s: successor %q, %v; want %q", name, r.Successor, err, c.want)
		}
	}
	for name, d := range map[string]bson.Raw{
		"number":            doc("", 5),
		"control character": doc("", "a\nb"),
	} {
		if _, err := decodeRecord(d, "e"); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("successor %s: %v, want ErrMalformedRecord", name, err)
		}
	}
}

// TestDecodeTokens: the handover token and the incarnation, numbers of at
// most MaxToken on a led record, decode alike: missing or null reads 0 (a
// document of an older version), integers and whole doubles are taken,
// anything else is malformed, and a vacant record drops either (an older
// version's vacancy leaves it in place).
func TestDecodeTokens(t *testing.T) {
	for _, field := range []string{fieldHandover, fieldIncarnation} {
		doc := func(leader string, v any) bson.Raw {
			d := bson.D{{Key: "_id", Value: "e"}, {Key: "leaderfeed", Value: 1}, {Key: "leader", Value: leader},
				{Key: "term", Value: 3}, {Key: "revision", Value: 9}, {Key: "ts", Value: time.Now()}, {Key: "value", Value: []byte{}}}
			if v != "missing" {
				d = append(d, bson.E{Key: field, Value: v})
			}
			raw, _ := bson.Marshal(d)
			return raw
		}
		got := func(r heartbeat.Record) uint64 {
			if field == fieldHandover {
				return r.Handover
			}
			return r.Incarnation
		}
		for name, c := range map[string]struct {
			doc  bson.Raw
			want uint64
		}{
			"missing":      {doc("a", "missing"), 0},
			"null":         {doc("a", nil), 0},
			"int32":        {doc("a", int32(7)), 7},
			"int64":        {doc("a", int64(heartbeat.MaxToken)), heartbeat.MaxToken},
			"whole double": {doc("a", float64(heartbeat.MaxToken)), heartbeat.MaxToken},
			"vacant, left": {doc("", int64(7)), 0},
		} {
			r, err := decodeRecord(c.doc, "e")
			if err != nil || got(r) != c.want {
				t.Errorf("%s %s: %d, %v; want %d", field, name, got(r), err, c.want)
			}
		}
		for name, d := range map[string]bson.Raw{
			"string":        doc("a", "7"),
			"negative":      doc("a", int64(-1)),
			"fraction":      doc("a", 1.5),
			"over MaxToken": doc("a", int64(heartbeat.MaxToken+1)),
		} {
			if _, err := decodeRecord(d, "e"); !errors.Is(err, backend.ErrMalformedRecord) {
				t.Errorf("%s %s: %v, want ErrMalformedRecord", field, name, err)
			}
		}
	}
}

// TestBatchRecognisesItsWrite: a batched write whose document comes back
// is taken as done only when the document holds every field it wrote, its
// incarnation included; another process's write of the same revision,
// leader and term is not this write.
func TestBatchRecognisesItsWrite(t *testing.T) {
	expected := heartbeat.Record{Election: "e", Leader: "a", Term: 2, Revision: 5}
	next := heartbeat.Record{Election: "e", Leader: "a", Term: 2, Value: []byte("v"), Lease: time.Second, Incarnation: 42}
	w := write{expected: expected, next: next}
	stored := next
	stored.Revision = 6
	if !w.wrote(stored) {
		t.Fatalf("wrote(%+v) = false for the record the write stores", stored)
	}
	for name, change := range map[string]func(*heartbeat.Record){
		"other revision":    func(r *heartbeat.Record) { r.Revision = 7 },
		"other value":       func(r *heartbeat.Record) { r.Value = []byte("w") },
		"other lease":       func(r *heartbeat.Record) { r.Lease = 2 * time.Second },
		"other handover":    func(r *heartbeat.Record) { r.Handover = 1 },
		"other incarnation": func(r *heartbeat.Record) { r.Incarnation = 43 },
		"no incarnation":    func(r *heartbeat.Record) { r.Incarnation = 0 },
	} {
		r := stored
		change(&r)
		if w.wrote(r) {
			t.Errorf("%s: wrote(%+v) = true, want false", name, r)
		}
	}
}

func TestDecodePresenceToken(t *testing.T) {
	doc := func(token any) bson.Raw {
		d := bson.D{{Key: "_id", Value: backend.PresenceKey("e", "n")}, {Key: "leaderfeed", Value: 2}, {Key: "election", Value: "e"},
			{Key: "node", Value: "n"}, {Key: "priority", Value: 0}, {Key: "can_lead", Value: true}, {Key: "ts", Value: time.Now()},
			{Key: "value", Value: []byte{}}}
		if token != "missing" {
			d = append(d, bson.E{Key: "token", Value: token})
		}
		raw, _ := bson.Marshal(d)
		return raw
	}
	for name, c := range map[string]struct {
		doc  bson.Raw
		want uint64
		ok   bool
	}{
		"missing (an older version)": {doc("missing"), 0, true},
		"null":                       {doc(nil), 0, true},
		"int64":                      {doc(int64(heartbeat.MaxToken)), heartbeat.MaxToken, true},
		"whole double":               {doc(float64(42)), 42, true},
		"negative":                   {doc(int64(-1)), 0, false},
		"over MaxToken":              {doc(int64(heartbeat.MaxToken + 1)), 0, false},
		"string":                     {doc("7"), 0, false},
	} {
		p, ok := decodePresence(c.doc, "e")
		if ok != c.ok || (ok && p.Token != c.want) {
			t.Errorf("%s: token %d, %v; want %d, %v", name, p.Token, ok, c.want, c.ok)
		}
	}
}

func TestDecodePresenceIncarnationAndJoined(t *testing.T) {
	ts, joined := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	doc := func(fields ...bson.E) bson.Raw {
		d := bson.D{{Key: "_id", Value: backend.PresenceKey("e", "n")}, {Key: "leaderfeed", Value: 2}, {Key: "election", Value: "e"},
			{Key: "node", Value: "n"}, {Key: "priority", Value: 0}, {Key: "can_lead", Value: true}, {Key: "value", Value: []byte{}}}
		raw, _ := bson.Marshal(append(d, fields...))
		return raw
	}
	for name, c := range map[string]struct {
		doc               bson.Raw
		incarnation       uint64
		timestamp, joined time.Time
		ok                bool
	}{
		"an older version's (ts alone)": {doc(bson.E{Key: "ts", Value: ts}), 0, ts, time.Time{}, true},
		"first write of an incarnation": {doc(bson.E{Key: "joined", Value: joined}, bson.E{Key: "incarnation", Value: int64(heartbeat.MaxToken)}),
			heartbeat.MaxToken, joined, joined, true},
		"refreshed": {doc(bson.E{Key: "joined", Value: joined}, bson.E{Key: "ts", Value: ts}, bson.E{Key: "incarnation", Value: int64(3)}),
			3, ts, joined, true},
		"null incarnation":          {doc(bson.E{Key: "ts", Value: ts}, bson.E{Key: "incarnation", Value: nil}), 0, ts, time.Time{}, true},
		"neither ts nor joined":     {doc(bson.E{Key: "incarnation", Value: int64(3)}), 0, time.Time{}, time.Time{}, false},
		"joined not a date":         {doc(bson.E{Key: "ts", Value: ts}, bson.E{Key: "joined", Value: "yesterday"}), 0, ts, time.Time{}, true},
		"joined alone, not a date":  {doc(bson.E{Key: "joined", Value: "yesterday"}), 0, time.Time{}, time.Time{}, false},
		"ts not a date":             {doc(bson.E{Key: "ts", Value: 5}, bson.E{Key: "joined", Value: joined}), 0, time.Time{}, time.Time{}, false},
		"negative incarnation":      {doc(bson.E{Key: "ts", Value: ts}, bson.E{Key: "incarnation", Value: int64(-1)}), 0, time.Time{}, time.Time{}, false},
		"incarnation over MaxToken": {doc(bson.E{Key: "ts", Value: ts}, bson.E{Key: "incarnation", Value: int64(heartbeat.MaxToken + 1)}), 0, time.Time{}, time.Time{}, false},
		"incarnation a string":      {doc(bson.E{Key: "ts", Value: ts}, bson.E{Key: "incarnation", Value: "3"}), 0, time.Time{}, time.Time{}, false},
	} {
		p, ok := decodePresence(c.doc, "e")
		if ok != c.ok || (ok && (p.Incarnation != c.incarnation || !p.Timestamp.Equal(c.timestamp) || !p.Joined.Equal(c.joined))) {
			t.Errorf("%s: %+v, %v; want incarnation %d, timestamp %v, joined %v, %v", name, p, ok, c.incarnation, c.timestamp, c.joined, c.ok)
		}
	}
}

func TestCheckHello(t *testing.T) {
	for name, c := range map[string]struct {
		hello bson.D
		ok    bool
	}{
		"standalone":  {bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "maxWireVersion", Value: 21}}, false},
		"replica set": {bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs0"}}, true},
		"secondary":   {bson.D{{Key: "secondary", Value: true}, {Key: "setName", Value: "rs0"}}, true},
		"mongos":      {bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "msg", Value: "isdbgrid"}}, true},
	} {
		raw, _ := bson.Marshal(c.hello)
		err := checkHello(raw)
		if c.ok && err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if !c.ok && (!errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "replica set")) {
			t.Errorf("%s: %v, want ErrUnsupported naming the replica set", name, err)
		}
	}
}
func TestDriverUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := New(unconnected(t).Database("app"), "e", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := b.Start(short); !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "mongo: ") {
		t.Fatalf("Start against no server = %v, want a mongo: error matching context.DeadlineExceeded", err)
	}
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := b.Heartbeat(short, heartbeat.Record{}, rec("a", 1, "")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Heartbeat against no server = %v, want context.DeadlineExceeded", err)
	}
	st, err := NewStore(unconnected(t).Database("app"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	w := backend.Write{Next: heartbeat.Record{Election: "e", Leader: "a", Term: 1}}
	if res, err := st.HeartbeatBatch(short, []backend.Write{w}); res != nil || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "mongo: ") {
		t.Fatalf("HeartbeatBatch against no server = %v, %v; want a mongo: error matching context.DeadlineExceeded", res, err)
	}
}

// The driver-v2 adapter wraps the server errors the logic must tell apart
// with the driver sentinels (codes from the server's error_codes.yml).
func TestClassifyServerErrors(t *testing.T) {
	for code, want := range map[int32]error{
		11000: driver.ErrDuplicateKey,
		136:   driver.ErrHistoryLost, // CappedPositionLost
		260:   driver.ErrHistoryLost, // InvalidResumeToken
		280:   driver.ErrHistoryLost, // ChangeStreamFatalError
		286:   driver.ErrHistoryLost, // ChangeStreamHistoryLost
		10334: driver.ErrEventTooLarge,
	} {
		err := classify(mongodrv.CommandError{Code: code, Message: "from the test"})
		if !errors.Is(err, want) {
			t.Errorf("code %d: %v, want %v", code, err, want)
		}
	}
	if err := classify(fmt.Errorf("find: %w", mongodrv.ErrNoDocuments)); !errors.Is(err, driver.ErrNoDocument) || !errors.Is(err, mongodrv.ErrNoDocuments) {
		t.Errorf("no documents: %v", err)
	}
	other := mongodrv.CommandError{Code: 2, Message: "BadValue"}
	if err := classify(other); !hasCode(err, 2) || errors.Is(err, driver.ErrHistoryLost) || errors.Is(err, driver.ErrDuplicateKey) ||
		errors.Is(err, driver.ErrUnauthorized) || errors.Is(err, driver.ErrAuthFailed) {
		t.Errorf("another error: %v", err)
	}
}

// The store sorts the server's refusals (a missing privilege, wrong
// credentials) from transient failures: the refusals match
// base.ErrRefused and say how to fix them. The errors are the driver's
// own values, built as the driver builds them from a server reply (a
// CommandError for a command's reply; an authentication failure reaches
// the operation as a CommandError too, see mongo.wrapErrors).
func TestRefusals(t *testing.T) {
	s, err := NewStore(unconnected(t).Database("app"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
		words   []string
	}{
		{"Unauthorized", mongodrv.CommandError{Code: 13, Name: "Unauthorized",
			Message: "not authorized on app to execute command { update: \"leaderfeed\" }"}, true, []string{"not authorized on app", `readWrite`, `db: "app"`}},
		{"AuthenticationFailed", mongodrv.CommandError{Code: 18, Name: "AuthenticationFailed", Message: "Authentication failed."},
			true, []string{"Authentication failed", "password"}},
		{"UserNotFound", fmt.Errorf("connection(127.0.0.1:27017): %w", mongodrv.CommandError{Code: 11, Name: "UserNotFound"}), true, []string{"authSource"}},
		{"NotWritablePrimary", mongodrv.CommandError{Code: 10107, Name: "NotWritablePrimary", Labels: []string{"RetryableWriteError"}}, false, nil},
		{"network", mongodrv.CommandError{Code: 6, Name: "HostUnreachable", Labels: []string{"NetworkError"}}, false, nil},
		{"timeout", context.DeadlineExceeded, false, nil},
	} {
		err := s.opError(ctx, "heartbeat", classify(tc.err))
		if errors.Is(err, base.ErrRefused) != tc.refused {
			t.Errorf("%s: %v: refused %v, want %v", tc.name, err, !tc.refused, tc.refused)
			continue
		}
		for _, w := range tc.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tc.name, err, w)
			}
		}
	}
}

// An update event whose document was deleted before the stream looked it
// up carries fullDocument: null (updateLookup). lungo always carries the
// document, so this is tested on the event alone: the election record's
// update is skipped (its delete event follows), another document's is
// reported as Partial without New.
func TestUpdateLookupNull(t *testing.T) {
	b, err := NewStore(unconnected(t).Database("app"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	b.know("e")
	event := func(id string) *changeEvent {
		raw, _ := bson.Marshal(bson.D{{Key: "operationType", Value: "update"},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: id}}}, {Key: "fullDocument", Value: nil}})
		var ev changeEvent
		if err := bson.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		return &ev
	}
	st := newStreamState()
	if ns := b.translate(event("e"), st); len(ns) != 0 {
		t.Fatalf("election record updated then deleted: %+v, want nothing", ns)
	}
	ns := b.translate(event("user"), st)
	if len(ns) != 1 {
		t.Fatalf("user document updated then deleted: %+v", ns)
	}
	n, ok := ns[0], true
	if !ok || n.Type != backend.OtherChanged || n.Change.Op != backend.Update || !n.Change.Partial || n.Change.New != nil || string(n.Change.Key) != `"user"` {
		t.Fatalf("user document updated then deleted: %+v, %v", n, ok)
	}
}

// fakeColl is a driver.Collection whose streams return scripted results;
// only what Subscribe uses works.
type fakeColl struct {
	driver.Collection
	watched chan bson.Raw // the resumeAfter of each Watch
	script  []fakeStep
}

type fakeStep struct {
	token bson.Raw // the stream's ResumeToken after this step
	err   error
}

func (f *fakeColl) DatabaseName() string { return "app" }
func (f *fakeColl) Name() string         { return "elections" }

func (f *fakeColl) Find(context.Context, bson.D) ([]bson.Raw, error) { return nil, nil }

func (f *fakeColl) Watch(_ context.Context, resumeAfter bson.Raw) (driver.Stream, error) {
	f.watched <- resumeAfter
	return &fakeStream{script: f.script}, nil
}

type fakeStream struct {
	script []fakeStep
	token  bson.Raw
}

func (s *fakeStream) Next(ctx context.Context) (bson.Raw, error) {
	if len(s.script) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	step := s.script[0]
	s.script = s.script[1:]
	if step.token != nil {
		s.token = step.token
	}
	return nil, step.err
}

func (s *fakeStream) ResumeToken() bson.Raw       { return s.token }
func (s *fakeStream) Close(context.Context) error { return nil }

// An idle stream keeps the postBatchResumeToken of each empty batch (the
// driver v2 returns them from TryNext; lungo has no batches), so the next
// stream resumes from the latest one rather than from the last event.
func TestIdleStreamKeepsPostBatchResumeToken(t *testing.T) {
	tok := func(n int32) bson.Raw {
		raw, _ := bson.Marshal(bson.D{{Key: "_data", Value: fmt.Sprintf("%08d", n)}})
		return raw
	}
	f := &fakeColl{watched: make(chan bson.Raw, 2), script: []fakeStep{
		{token: tok(1)}, {token: tok(2)}, {err: errors.New("connection reset")},
	}}
	b := newStore(f, Options{})
	defer func() { _ = b.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b.saveToken(tok(0)) // as after an event
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-f.watched; !bytes.Equal(got, tok(0)) {
		t.Fatalf("first stream resumed after %v", got)
	}
	n := <-ch
	if n.Type != backend.Failed || !strings.HasPrefix(n.Err.Error(), "mongo: ") {
		t.Fatalf("got %v %v, want Failed", n.Type, n.Err)
	}
	if _, err := b.Subscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-f.watched; !bytes.Equal(got, tok(2)) {
		t.Fatalf("reopened stream resumed after %v, want the last empty batch's token %v", got, tok(2))
	}
}
