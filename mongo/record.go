package mongo

import (
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
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
	// microseconds, rounded up. Documents written before it existed lack
	// it: they decode with Lease 0.
	fieldLease = "lease_us"
	// fieldSuccessor is the node a vacancy is reserved for (a transfer),
	// "" otherwise. Documents written before it existed lack it: they
	// decode with no successor.
	fieldSuccessor = "successor"

	// maxLeaseMicros is heartbeat.MaxLease in microseconds, the largest
	// lease a document may hold.
	maxLeaseMicros = int64(heartbeat.MaxLease / time.Microsecond)
)

// leaseMicros returns lease in whole microseconds, rounded up: a stored
// lease is never shorter than the writer's. A valid lease (at most
// heartbeat.MaxLease) stays within maxLeaseMicros.
func leaseMicros(lease time.Duration) int64 {
	if lease <= 0 {
		return 0
	}
	return int64((lease + time.Microsecond - 1) / time.Microsecond)
}

// decodeRecord decodes the election document doc strictly. Every failure
// matches base.ErrMalformedRecord.
func decodeRecord(doc bson.Raw, election string) (heartbeat.Record, error) {
	bad := func(format string, args ...any) (heartbeat.Record, error) {
		return heartbeat.Record{}, fmt.Errorf("%w: document %q: %s", base.ErrMalformedRecord, election, fmt.Sprintf(format, args...))
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
	rec := heartbeat.Record{Election: election}
	leader := doc.Lookup(fieldLeader)
	if rec.Leader, ok = leader.StringValueOK(); !ok {
		return bad("field %q is %s, not a string", fieldLeader, typeName(leader))
	}
	term, ok := integer(doc.Lookup(fieldTerm))
	if !ok || term < 0 {
		return bad("field %q is not a non-negative integer", fieldTerm)
	}
	rev, ok := integer(doc.Lookup(fieldRevision))
	if !ok || rev < 1 {
		return bad("field %q is not a positive integer", fieldRevision)
	}
	rec.Term, rec.Revision = uint64(term), uint64(rev)
	ts := doc.Lookup(fieldTimestamp)
	dt, ok := ts.DateTimeOK()
	if !ok {
		return bad("field %q is %s, not a date", fieldTimestamp, typeName(ts))
	}
	rec.Timestamp = bson.DateTime(dt).Time().UTC()
	value := doc.Lookup(fieldValue)
	_, data, ok := value.BinaryOK()
	if !ok {
		return bad("field %q is %s, not binary", fieldValue, typeName(value))
	}
	if len(data) > 0 {
		rec.Value = append([]byte(nil), data...)
	}
	// A missing lease (or null) is a document written before the field
	// existed: Lease 0.
	if lease := doc.Lookup(fieldLease); lease.Type != 0 && lease.Type != bson.TypeNull {
		us, ok := integer(lease)
		if !ok || us < 0 || us > maxLeaseMicros {
			return bad("field %q is not a whole number of microseconds in [0, %d]", fieldLease, maxLeaseMicros)
		}
		rec.Lease = time.Duration(us) * time.Microsecond
	}
	if succ := doc.Lookup(fieldSuccessor); succ.Type != 0 && succ.Type != bson.TypeNull {
		if rec.Successor, ok = succ.StringValueOK(); !ok {
			return bad("field %q is %s, not a string", fieldSuccessor, typeName(succ))
		}
	}
	if rec.Leader != "" {
		// Only a vacancy is reserved. A successor on a led record comes
		// from a writer that predates the field: its claim's $set left
		// the reserved vacancy's successor in place.
		rec.Successor = ""
	}
	if rec.Leader == "" {
		// A vacant record grants nobody a lease. A lease on one comes from
		// a writer that predates the field: its $set of leader "" left the
		// previous writer's lease in place. Refusing it would leave the
		// election stuck on a record no compare-and-set overwrites.
		rec.Lease = 0
	}
	if err := rec.Validate(); err != nil {
		return bad("%v", err)
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
