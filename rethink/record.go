package rethink

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// Field names of an election document.
const (
	fieldID        = "id"
	fieldMark      = "leaderfeed"
	fieldLeader    = "leader"
	fieldTerm      = "term"
	fieldRevision  = "revision"
	fieldTimestamp = "timestamp"
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

	// formatVersion is the value of the mark field.
	formatVersion = 1

	// maxExact is the largest integer a JSON number (a double in RethinkDB)
	// holds exactly.
	maxExact = 1 << 53
)

// errMalformed builds an error matching backend.ErrMalformedRecord.
func errMalformed(election, format string, args ...any) error {
	return fmt.Errorf("rethink: %w: document %q: %s", backend.ErrMalformedRecord, election, fmt.Sprintf(format, args...))
}

// encodeRecord returns the document for next at revision rev; the timestamp
// is the server's r.Now().
func encodeRecord(election string, rev uint64, next heartbeat.Record) map[string]any {
	var value any
	if len(next.Value) > 0 {
		value = r.Binary(next.Value)
	}
	return map[string]any{
		fieldID:          election,
		fieldMark:        formatVersion,
		fieldLeader:      next.Leader,
		fieldTerm:        next.Term,
		fieldRevision:    rev,
		fieldTimestamp:   r.Now(),
		fieldValue:       value,
		fieldLease:       heartbeat.LeaseMicros(next.Lease),
		fieldSuccessor:   next.Successor,
		fieldHandover:    next.Handover,
		fieldIncarnation: next.Incarnation,
	}
}

// rawDoc is a document as the server sent it, pseudo-types unconverted.
type rawDoc map[string]json.RawMessage

// decodeRecord decodes an election document from raw JSON as the server
// sends it (TIME and BINARY as pseudo-type objects): the JSON types here,
// the record rules and the fix-ups of older versions' documents in
// heartbeat.Decode. Errors match backend.ErrMalformedRecord.
func decodeRecord(election string, raw json.RawMessage) (heartbeat.Record, error) {
	var doc rawDoc
	if err := json.Unmarshal(raw, &doc); err != nil || doc == nil {
		return heartbeat.Record{}, errMalformed(election, "not a JSON object")
	}
	var id string
	if err := json.Unmarshal(doc[fieldID], &id); err != nil || id != election {
		return heartbeat.Record{}, errMalformed(election, "id is not the election's name")
	}
	var mark json.Number
	if err := unmarshalNumber(doc[fieldMark], &mark); err != nil || mark.String() != "1" {
		return heartbeat.Record{}, errMalformed(election, "no field %q with value 1: not a leaderfeed election document", fieldMark)
	}
	st := heartbeat.Stored{Election: election}
	if err := unmarshalString(doc[fieldLeader], &st.Leader); err != nil {
		return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldLeader, err)
	}
	var err error
	if st.Term, err = decodeInt(doc[fieldTerm]); err != nil {
		return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldTerm, err)
	}
	if st.Revision, err = decodeInt(doc[fieldRevision]); err != nil {
		return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldRevision, err)
	}
	if st.Timestamp, err = decodeTime(doc[fieldTimestamp]); err != nil {
		return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldTimestamp, err)
	}
	if st.Value, err = decodeBinary(doc[fieldValue]); err != nil {
		return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldValue, err)
	}
	// Missing or null: a document written before the field existed.
	if raw := doc[fieldLease]; !isNull(raw) {
		us, err := decodeInt(raw)
		if err != nil {
			return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldLease, err)
		}
		st.LeaseMicros = &us
	}
	if raw := doc[fieldSuccessor]; !isNull(raw) {
		var s string
		if err := unmarshalString(raw, &s); err != nil {
			return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldSuccessor, err)
		}
		st.Successor = &s
	}
	if raw := doc[fieldHandover]; !isNull(raw) {
		token, err := decodeInt(raw)
		if err != nil {
			return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldHandover, err)
		}
		st.Handover = &token
	}
	if raw := doc[fieldIncarnation]; !isNull(raw) {
		n, err := decodeInt(raw)
		if err != nil {
			return heartbeat.Record{}, errMalformed(election, "field %q: %v", fieldIncarnation, err)
		}
		st.Incarnation = &n
	}
	rec, err := heartbeat.Decode(st)
	if err != nil {
		return heartbeat.Record{}, fmt.Errorf("rethink: %w: document %q: %w", backend.ErrMalformedRecord, election, err)
	}
	return rec, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func unmarshalString(raw json.RawMessage, s *string) error {
	if isNull(raw) {
		return errors.New("missing")
	}
	if err := json.Unmarshal(raw, s); err != nil {
		return errors.New("not a string")
	}
	return nil
}

func unmarshalNumber(raw json.RawMessage, n *json.Number) error {
	if isNull(raw) {
		return errors.New("missing")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return err
	}
	num, ok := v.(json.Number)
	if !ok {
		return errors.New("not a number")
	}
	*n = num
	return nil
}

// decodeInt accepts a JSON number that is a whole number in [-2^53,
// 2^53], exact in a double; heartbeat.Decode judges its range.
func decodeInt(raw json.RawMessage) (int64, error) {
	var n json.Number
	if err := unmarshalNumber(raw, &n); err != nil {
		return 0, err
	}
	f, err := n.Float64()
	if err != nil || math.Abs(f) > maxExact || f != math.Trunc(f) {
		return 0, fmt.Errorf("%s is not a whole number in [-2^53, 2^53]", n)
	}
	return int64(f), nil
}

type pseudo struct {
	Type      string   `json:"$reql_type$"`
	EpochTime *float64 `json:"epoch_time"`
	Data      *string  `json:"data"`
}

func decodeTime(raw json.RawMessage) (time.Time, error) {
	var p pseudo
	if isNull(raw) {
		return time.Time{}, errors.New("missing")
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Type != "TIME" || p.EpochTime == nil {
		return time.Time{}, errors.New("not a TIME")
	}
	e := *p.EpochTime
	if math.IsNaN(e) || math.IsInf(e, 0) || math.Abs(e) > 1e13 {
		return time.Time{}, errors.New("TIME out of range")
	}
	// RethinkDB keeps milliseconds; round to microseconds to undo the
	// binary floating point.
	return time.UnixMicro(int64(math.Round(e * 1e6))).UTC(), nil
}

func decodeBinary(raw json.RawMessage) ([]byte, error) {
	if isNull(raw) {
		return nil, nil
	}
	var p pseudo
	if err := json.Unmarshal(raw, &p); err != nil || p.Type != "BINARY" || p.Data == nil {
		return nil, errors.New("neither null nor BINARY")
	}
	b, err := base64.StdEncoding.DecodeString(*p.Data)
	if err != nil {
		return nil, errors.New("BINARY data is not base64")
	}
	if len(b) == 0 {
		return nil, nil
	}
	return b, nil
}

// ownWrite reports whether cur is exactly what a compare-and-set of next on
// the write expected stores (revision expected.Revision+1, next's leader,
// term, value, lease as stored, handover token and incarnation), which
// only that write produces when node ids are unique, or when the writers
// that share one write their incarnations. Vacant records are left out:
// any node may write one.
func ownWrite(cur, expected, next heartbeat.Record) bool {
	return next.Leader != "" && cur.Revision == expected.Revision+1 && cur.Leader == next.Leader && cur.Term == next.Term &&
		bytes.Equal(cur.Value, next.Value) && heartbeat.LeaseMicros(cur.Lease) == heartbeat.LeaseMicros(next.Lease) &&
		cur.Handover == next.Handover && cur.Incarnation == next.Incarnation
}
