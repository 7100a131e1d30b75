package mongo

import (
	"bytes"
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Fields of the election document.
const (
	fieldMark      = "leaderfeed" // 1: the document is an election record
	fieldLeader    = "leader"
	fieldTerm      = "term"
	fieldRevision  = "revision"
	fieldTimestamp = "ts"
	fieldValue     = "value"
	// fieldLease is the writer's lease (heartbeat.Record.Lease) in whole
	// microseconds, rounded up (heartbeat.LeaseMicros). Documents written
	// before it existed lack it: they decode with Lease 0.
	fieldLease = "lease_us"
	// fieldSuccessor is the node a vacancy is reserved for (a transfer),
	// "" otherwise. Documents written before it existed lack it: they
	// decode with no successor.
	fieldSuccessor = "successor"
	// fieldHandover is the handover token of a led record written as a
	// handover (heartbeat.Record.Handover), 0 otherwise. Documents written
	// before it existed lack it: they decode with no token.
	fieldHandover = "handover"
	// fieldIncarnation is the incarnation of the process that wrote a led
	// record by a claim or renewal (heartbeat.Record.Incarnation), 0
	// otherwise. Documents written before it existed lack it: they decode
	// with none.
	fieldIncarnation = "incarnation"
)

// decodeRecord decodes the election document doc strictly: the BSON types
// here, the record rules and the fix-ups of older versions' documents in
// heartbeat.Decode. Every failure matches backend.ErrMalformedRecord.
func decodeRecord(doc bson.Raw, election string) (heartbeat.Record, error) {
	bad := func(format string, args ...any) (heartbeat.Record, error) {
		return heartbeat.Record{}, fmt.Errorf("%w: document %q: %s", backend.ErrMalformedRecord, election, fmt.Sprintf(format, args...))
	}
	if err := doc.Validate(); err != nil {
		return bad("invalid BSON: %v", err)
	}
	id, ok := doc.Lookup("_id").StringValueOK()
	if !ok || id != election {
		return bad("_id is not the election name")
	}
	if mark, ok := integer(doc.Lookup(fieldMark)); !ok || mark != 1 {
		return bad("field %q is not 1: not a leaderfeed election record", fieldMark)
	}
	st := heartbeat.Stored{Election: election}
	leader := doc.Lookup(fieldLeader)
	if st.Leader, ok = leader.StringValueOK(); !ok {
		return bad("field %q is %s, not a string", fieldLeader, typeName(leader))
	}
	term := doc.Lookup(fieldTerm)
	if st.Term, ok = integer(term); !ok {
		return bad("field %q is %s, not an integer", fieldTerm, typeName(term))
	}
	rev := doc.Lookup(fieldRevision)
	if st.Revision, ok = integer(rev); !ok {
		return bad("field %q is %s, not an integer", fieldRevision, typeName(rev))
	}
	ts := doc.Lookup(fieldTimestamp)
	dt, ok := ts.DateTimeOK()
	if !ok {
		return bad("field %q is %s, not a date", fieldTimestamp, typeName(ts))
	}
	st.Timestamp = bson.DateTime(dt).Time().UTC()
	value := doc.Lookup(fieldValue)
	_, data, ok := value.BinaryOK()
	if !ok {
		return bad("field %q is %s, not binary", fieldValue, typeName(value))
	}
	st.Value = bytes.Clone(data) // data is doc's memory
	// Missing or null: a document written before the field existed.
	if lease := doc.Lookup(fieldLease); lease.Type != 0 && lease.Type != bson.TypeNull {
		us, ok := integer(lease)
		if !ok {
			return bad("field %q is %s, not a whole number of microseconds", fieldLease, typeName(lease))
		}
		st.LeaseMicros = &us
	}
	if succ := doc.Lookup(fieldSuccessor); succ.Type != 0 && succ.Type != bson.TypeNull {
		s, ok := succ.StringValueOK()
		if !ok {
			return bad("field %q is %s, not a string", fieldSuccessor, typeName(succ))
		}
		st.Successor = &s
	}
	if h := doc.Lookup(fieldHandover); h.Type != 0 && h.Type != bson.TypeNull {
		token, ok := integer(h)
		if !ok {
			return bad("field %q is %s, not an integer", fieldHandover, typeName(h))
		}
		st.Handover = &token
	}
	if inc := doc.Lookup(fieldIncarnation); inc.Type != 0 && inc.Type != bson.TypeNull {
		n, ok := integer(inc)
		if !ok {
			return bad("field %q is %s, not an integer", fieldIncarnation, typeName(inc))
		}
		st.Incarnation = &n
	}
	rec, err := heartbeat.Decode(st)
	if err != nil {
		return heartbeat.Record{}, fmt.Errorf("%w: document %q: %w", backend.ErrMalformedRecord, election, err)
	}
	return rec, nil
}

// integer returns v as an int64 if it is an int32, an int64, or a double
// holding an integer.
func integer(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32()), true
	case bson.TypeInt64:
		return v.Int64(), true
	case bson.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return int64(f), true
		}
	}
	return 0, false
}

func typeName(v bson.RawValue) string {
	if v.Type == 0 {
		return "missing"
	}
	return v.Type.String()
}
