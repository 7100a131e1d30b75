package rethink

import (
	"errors"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// These cases need no server: they decode documents as the server sends
// them, pseudo-types unconverted.
func TestDecodeRecord(t *testing.T) {
	const ts = `{"$reql_type$":"TIME","epoch_time":1700000000.123,"timezone":"+00:00"}`
	good := `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts +
		`,"value":{"$reql_type$":"BINARY","data":"aGk="}}`
	got, err := decodeRecord("e", []byte(good))
	want := heartbeat.Record{Election: "e", Leader: "a", Term: 3, Revision: 9,
		Timestamp: time.UnixMilli(1700000000123).UTC(), Value: []byte("hi")}
	if err != nil || !got.Equal(want) {
		t.Fatalf("good document: got %v %v (%v), want %v %v", got, got.Timestamp, err, want, want.Timestamp)
	}
	legacy := `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`
	for doc, lease := range map[string]time.Duration{
		legacy: 0,
		`{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":null}`:       0,
		`{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":1500250}`:    1500250 * time.Microsecond,
		`{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":3600000000}`: heartbeat.MaxLease,
		// An older writer's vacancy merged into a leased document.
		`{"id":"e","leaderfeed":1,"leader":"","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":1000}`: 0,
	} {
		got, err := decodeRecord("e", []byte(doc))
		if err != nil || got.Lease != lease {
			t.Errorf("%s: got lease %v, %v; want %v", doc, got.Lease, err, lease)
		}
	}
	bad := map[string]string{
		"not an object":     `[1]`,
		"other id":          `{"id":"f","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"no mark":           `{"id":"e","leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"mark a string":     `{"id":"e","leaderfeed":"1","leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"term too big":      `{"id":"e","leaderfeed":1,"leader":"a","term":1e300,"revision":9,"timestamp":` + ts + `}`,
		"negative term":     `{"id":"e","leaderfeed":1,"leader":"a","term":-1,"revision":9,"timestamp":` + ts + `}`,
		"revision 0":        `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":0,"timestamp":` + ts + `}`,
		"revision null":     `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":null,"timestamp":` + ts + `}`,
		"time without type": `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":{"epoch_time":1}}`,
		"bad base64":        `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"value":{"$reql_type$":"BINARY","data":"!!"}}`,
		"leader too long":   `{"id":"e","leaderfeed":1,"leader":"` + longName() + `","term":3,"revision":9,"timestamp":` + ts + `}`,
		"lease a string":    `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":"5"}`,
		"negative lease":    `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":-1}`,
		"fractional lease":  `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":0.5}`,
		"lease too long":    `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"lease_us":3600000001}`,
	}
	for name, doc := range bad {
		if _, err := decodeRecord("e", []byte(doc)); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("%s: got %v, want ErrMalformedRecord", name, err)
		}
	}
}

func longName() string {
	b := make([]byte, heartbeat.MaxNameLen+1)
	for i := range b {
		b[i] = 'x'
	}
	return string(b)
}

func TestDecodeSuccessor(t *testing.T) {
	const ts = `{"$reql_type$":"TIME","epoch_time":1700000000.123,"timezone":"+00:00"}`
	doc := func(leader, successor string) []byte {
		d := `{"id":"e","leaderfeed":1,"leader":"` + leader + `","term":3,"revision":9,"timestamp":` + ts
		if successor != "" {
			d += `,"successor":` + successor
		}
		return []byte(d + "}")
	}
	for name, c := range map[string]struct {
		doc  []byte
		want string
	}{
		"missing":  {doc("", ""), ""},
		"null":     {doc("", "null"), ""},
		"reserved": {doc("", `"b"`), "b"},
		// An older writer's claim merged into a reserved vacancy.
		"led, stale successor": {doc("a", `"b"`), ""},
	} {
		got, err := decodeRecord("e", c.doc)
		if err != nil || got.Successor != c.want {
			t.Errorf("%s: successor %q, %v; want %q", name, got.Successor, err, c.want)
		}
	}
	for name, d := range map[string][]byte{"number": doc("", "5"), "control character": doc("", `"a\u0001b"`)} {
		if _, err := decodeRecord("e", d); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("successor %s: %v, want ErrMalformedRecord", name, err)
		}
	}
}

func TestDecodeHandover(t *testing.T) {
	const ts = `{"$reql_type$":"TIME","epoch_time":1700000000.123,"timezone":"+00:00"}`
	doc := func(leader, handover string) []byte {
		d := `{"id":"e","leaderfeed":1,"leader":"` + leader + `","term":3,"revision":9,"timestamp":` + ts
		if handover != "" {
			d += `,"handover":` + handover
		}
		return []byte(d + "}")
	}
	for name, c := range map[string]struct {
		doc  []byte
		want uint64
	}{
		"missing":  {doc("a", ""), 0},
		"null":     {doc("a", "null"), 0},
		"zero":     {doc("a", "0"), 0},
		"MaxToken": {doc("a", "9007199254740991"), heartbeat.MaxToken},
		"exponent": {doc("a", "7e3"), 7000},
		// An older writer's vacancy merged into a handover record.
		"vacant, stale token": {doc("", "7"), 0},
	} {
		got, err := decodeRecord("e", c.doc)
		if err != nil || got.Handover != c.want {
			t.Errorf("%s: handover %d, %v; want %d", name, got.Handover, err, c.want)
		}
	}
	for name, d := range map[string][]byte{
		"string":        doc("a", `"7"`),
		"negative":      doc("a", "-1"),
		"fraction":      doc("a", "1.5"),
		"over MaxToken": doc("a", "9007199254740992"),
		"vacant, negative (refused before the fix-up)": doc("", "-1"),
	} {
		if _, err := decodeRecord("e", d); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("handover %s: %v, want ErrMalformedRecord", name, err)
		}
	}
}

func TestDecodeIncarnation(t *testing.T) {
	const ts = `{"$reql_type$":"TIME","epoch_time":1700000000.123,"timezone":"+00:00"}`
	doc := func(leader, incarnation string) []byte {
		d := `{"id":"e","leaderfeed":1,"leader":"` + leader + `","term":3,"revision":9,"timestamp":` + ts + `,"handover":0`
		if incarnation != "" {
			d += `,"incarnation":` + incarnation
		}
		return []byte(d + "}")
	}
	for name, c := range map[string]struct {
		doc  []byte
		want uint64
	}{
		// A document written before the field existed.
		"missing":  {doc("a", ""), 0},
		"null":     {doc("a", "null"), 0},
		"zero":     {doc("a", "0"), 0},
		"MaxToken": {doc("a", "9007199254740991"), heartbeat.MaxToken},
		"exponent": {doc("a", "7e3"), 7000},
		// An older writer's vacancy merged into a led record.
		"vacant, stale incarnation": {doc("", "7"), 0},
	} {
		got, err := decodeRecord("e", c.doc)
		if err != nil || got.Incarnation != c.want {
			t.Errorf("%s: incarnation %d, %v; want %d", name, got.Incarnation, err, c.want)
		}
	}
	for name, d := range map[string][]byte{
		"string":        doc("a", `"7"`),
		"negative":      doc("a", "-1"),
		"fraction":      doc("a", "1.5"),
		"over MaxToken": doc("a", "9007199254740992"),
		"vacant, negative (refused before the fix-up)": doc("", "-1"),
	} {
		if _, err := decodeRecord("e", d); !errors.Is(err, backend.ErrMalformedRecord) {
			t.Errorf("incarnation %s: %v, want ErrMalformedRecord", name, err)
		}
	}
}

func TestOwnWrite(t *testing.T) {
	next := heartbeat.Record{Leader: "a", Term: 2, Value: []byte("v"), Lease: time.Second + 1}
	cur := heartbeat.Record{Election: "e", Leader: "a", Term: 2, Revision: 6, Value: []byte("v"), Lease: time.Second + time.Microsecond}
	expected := heartbeat.Record{Revision: 5, Leader: "a", Term: 2}
	if !ownWrite(cur, expected, next) {
		t.Error("the record a write on revision 5 stores is not recognised as that write")
	}
	for name, c := range map[string]heartbeat.Record{
		"other revision": {Leader: "a", Term: 2, Revision: 7, Value: []byte("v")},
		"other leader":   {Leader: "b", Term: 2, Revision: 6, Value: []byte("v")},
		"other term":     {Leader: "a", Term: 3, Revision: 6, Value: []byte("v")},
		"other value":    {Leader: "a", Term: 2, Revision: 6, Lease: time.Second + time.Microsecond},
		"other lease":    {Leader: "a", Term: 2, Revision: 6, Value: []byte("v"), Lease: time.Second},
		"other handover": {Leader: "a", Term: 2, Revision: 6, Value: []byte("v"), Lease: time.Second + time.Microsecond, Handover: 7},
		// Another process sharing the node id, at the same revision and term.
		"other incarnation": {Leader: "a", Term: 2, Revision: 6, Value: []byte("v"), Lease: time.Second + time.Microsecond, Incarnation: 7},
	} {
		if ownWrite(c, expected, next) {
			t.Errorf("%s: taken for our own write", name)
		}
	}
	if ownWrite(heartbeat.Record{Term: 2, Revision: 6}, heartbeat.Record{Revision: 5, Term: 2}, heartbeat.Record{Term: 2}) {
		t.Error("a vacant record is taken for our own write; any node may write one")
	}
}
