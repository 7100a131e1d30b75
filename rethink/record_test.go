package rethink

import (
	"errors"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
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
	bad := map[string]string{
		"not an object":     `[1]`,
		"other id":          `{"id":"f","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"no mark":           `{"id":"e","leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"mark a string":     `{"id":"e","leaderfeed":"1","leader":"a","term":3,"revision":9,"timestamp":` + ts + `}`,
		"term too big":      `{"id":"e","leaderfeed":1,"leader":"a","term":1e300,"revision":9,"timestamp":` + ts + `}`,
		"revision null":     `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":null,"timestamp":` + ts + `}`,
		"time without type": `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":{"epoch_time":1}}`,
		"bad base64":        `{"id":"e","leaderfeed":1,"leader":"a","term":3,"revision":9,"timestamp":` + ts + `,"value":{"$reql_type$":"BINARY","data":"!!"}}`,
		"leader too long":   `{"id":"e","leaderfeed":1,"leader":"` + longName() + `","term":3,"revision":9,"timestamp":` + ts + `}`,
	}
	for name, doc := range bad {
		if _, err := decodeRecord("e", []byte(doc)); !errors.Is(err, base.ErrMalformedRecord) {
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

func TestOwnWrite(t *testing.T) {
	next := heartbeat.Record{Leader: "a", Term: 2, Value: []byte("v")}
	cur := heartbeat.Record{Election: "e", Leader: "a", Term: 2, Revision: 6, Value: []byte("v")}
	if !ownWrite(cur, 5, next) {
		t.Error("the record a write on revision 5 stores is not recognised as that write")
	}
	for name, c := range map[string]heartbeat.Record{
		"other revision": {Leader: "a", Term: 2, Revision: 7, Value: []byte("v")},
		"other leader":   {Leader: "b", Term: 2, Revision: 6, Value: []byte("v")},
		"other term":     {Leader: "a", Term: 3, Revision: 6, Value: []byte("v")},
		"other value":    {Leader: "a", Term: 2, Revision: 6},
	} {
		if ownWrite(c, 5, next) {
			t.Errorf("%s: taken for our own write", name)
		}
	}
	if ownWrite(heartbeat.Record{Term: 2, Revision: 6}, 5, heartbeat.Record{Term: 2}) {
		t.Error("a vacant record is taken for our own write; any node may write one")
	}
}
