package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

var _ backend.PresenceStore = (*Store)(nil)

// Fields of a presence document. A presence document lives in the
// collection of the election documents under _id backend.PresenceKey
// (election, "\x1f", node): no election name holds a control character,
// so it never is an election's, and the change stream's reader skips it
// (a refresh wakes nobody). Its mark is 2. Its incarnation is
// fieldIncarnation, as in an election document (missing in documents of
// older versions: 0).
const (
	presenceMark     = 2
	fieldElection    = "election"
	fieldNode        = "node"
	fieldPriority    = "priority"
	fieldCanLead     = "can_lead"
	fieldToken       = "token"     // missing in documents of older versions: 0
	fieldHelloTime   = "localTime" // of the hello answer: the server's clock
	presenceWhatFmt  = "election %q: presence of %q"
	participantsWhat = "election %q: participants"
	// fieldJoined is when the document's incarnation first wrote it
	// (backend.Presence.Joined), missing in documents of older versions.
	// The write that sets it leaves ts out: the document's Timestamp is
	// then its joined time, until a refresh stamps ts (see Present).
	fieldJoined = "joined"
)

// presentAttempts bounds the rounds of Present's two conditional writes;
// another round is needed only when a write of the same node came between
// them.
const presentAttempts = 3

// Present upserts the presence document of p.Node in election, stamped
// with the server's clock ($currentDate), keeping or setting its joined
// time (backend.Presence.Joined) with conditional writes, each atomic on
// the server, with no read before them:
//
//   - a refresh: the update of the document of p.Incarnation, which stamps
//     ts and keeps joined;
//   - when none matched (no document, or another incarnation's): the
//     upsert of a document not of p.Incarnation, which stamps joined and
//     removes ts, so that the one clock reading is both the Timestamp and
//     the Joined time. (Two $currentDate fields of one update may read
//     the clock twice, and lungo, the stand-in of the tests, has no
//     pipeline updates and no $$NOW.)
//
// When the upsert's insert loses to a document of p.Incarnation written
// meanwhile, the refresh runs again. A version before joined takes a
// document without ts for malformed: during a rolling upgrade, its
// leaders leave a participant out until the participant's first refresh,
// one presence interval after it joined.
func (s *Store) Present(ctx context.Context, election string, p backend.Presence) error {
	if err := validElection(election); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("mongo: "+presenceWhatFmt+": %w: %w", election, p.Node, base.ErrInvalidConfig, err)
	}
	what := fmt.Sprintf(presenceWhatFmt, election, p.Node)
	if err := s.check(ctx, what); err != nil {
		return err
	}
	value := p.Value
	if value == nil {
		value = []byte{}
	}
	id := backend.PresenceKey(election, p.Node)
	set := bson.D{
		{Key: fieldMark, Value: int32(presenceMark)},
		{Key: fieldElection, Value: election},
		{Key: fieldNode, Value: p.Node},
		{Key: fieldPriority, Value: int32(p.Priority)},
		{Key: fieldCanLead, Value: p.CanLead},
		{Key: fieldValue, Value: bson.Binary{Data: value}},
		{Key: fieldToken, Value: int64(p.Token)},
		{Key: fieldIncarnation, Value: int64(p.Incarnation)},
	}
	// A document without the field (an older version's) is of
	// incarnation 0.
	same, other := bson.D{{Key: "$eq", Value: int64(p.Incarnation)}}, bson.D{{Key: "$ne", Value: int64(p.Incarnation)}}
	if p.Incarnation == 0 {
		same, other = bson.D{{Key: "$in", Value: bson.A{int64(0), nil}}}, bson.D{{Key: "$nin", Value: bson.A{int64(0), nil}}}
	}
	for range presentAttempts {
		_, err := s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}, {Key: fieldIncarnation, Value: same}}, bson.D{
			{Key: "$set", Value: set},
			{Key: "$currentDate", Value: bson.D{{Key: fieldTimestamp, Value: true}}},
		}, false)
		if !errors.Is(err, driver.ErrNoDocument) {
			if err != nil {
				return s.opError(ctx, what, err)
			}
			return nil
		}
		_, err = s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}, {Key: fieldIncarnation, Value: other}}, bson.D{
			{Key: "$set", Value: set},
			{Key: "$currentDate", Value: bson.D{{Key: fieldJoined, Value: true}}},
			{Key: "$unset", Value: bson.D{{Key: fieldTimestamp, Value: ""}}},
		}, true)
		if !errors.Is(err, driver.ErrDuplicateKey) {
			if err != nil {
				return s.opError(ctx, what, err)
			}
			return nil
		}
	}
	return fmt.Errorf("mongo: %s: other writes of the document came between its conditional writes %d times", what, presentAttempts)
}

// Absent deletes the presence document of node in election.
func (s *Store) Absent(ctx context.Context, election, node string) error {
	what := fmt.Sprintf(presenceWhatFmt, election, node)
	if err := s.check(ctx, what); err != nil {
		return err
	}
	if err := s.coll.DeleteOne(ctx, backend.PresenceKey(election, node)); err != nil {
		return s.opError(ctx, what+": delete", err)
	}
	return nil
}

// Participants returns the presence documents of election (one find), and
// the server's clock read after them (hello's localTime): a presence looks
// older by a round trip at most, never younger. Documents that do not
// decode are left out.
func (s *Store) Participants(ctx context.Context, election string) ([]backend.Presence, time.Time, error) {
	if err := validElection(election); err != nil {
		return nil, time.Time{}, err
	}
	what := fmt.Sprintf(participantsWhat, election)
	if err := s.check(ctx, what); err != nil {
		return nil, time.Time{}, err
	}
	docs, err := s.coll.Find(ctx, bson.D{{Key: fieldMark, Value: int32(presenceMark)}, {Key: fieldElection, Value: election}})
	if err != nil {
		return nil, time.Time{}, s.opError(ctx, what, err)
	}
	hello, err := s.coll.Hello(ctx)
	if err != nil {
		return nil, time.Time{}, s.opError(ctx, what+": hello", err)
	}
	now, ok := hello.Lookup(fieldHelloTime).DateTimeOK()
	if !ok {
		return nil, time.Time{}, fmt.Errorf("mongo: %s: the server's hello has no %s: %w", what, fieldHelloTime, backend.ErrUnsupported)
	}
	var out []backend.Presence
	for _, doc := range docs {
		if p, ok := decodePresence(doc, election); ok {
			out = append(out, p)
		}
	}
	return out, bson.DateTime(now).Time().UTC(), nil
}

// decodePresence decodes a presence document of election; false if it is
// not a valid one.
func decodePresence(doc bson.Raw, election string) (backend.Presence, bool) {
	id, _ := doc.Lookup("_id").StringValueOK()
	node, ok1 := doc.Lookup(fieldNode).StringValueOK()
	prio, ok2 := integer(doc.Lookup(fieldPriority))
	canLead, ok3 := doc.Lookup(fieldCanLead).BooleanOK()
	_, value, ok4 := doc.Lookup(fieldValue).BinaryOK()
	if !ok1 || !ok2 || !ok3 || !ok4 || id != backend.PresenceKey(election, node) {
		return backend.Presence{}, false
	}
	// ts is missing until the first refresh of an incarnation: the
	// Timestamp is then the joined time (see Present). joined is missing
	// in documents of older versions; one that is not a date (a foreign
	// write, which the refreshes of the incarnation would keep) reads as
	// none too.
	joined, hasJoined := doc.Lookup(fieldJoined).DateTimeOK()
	ts, hasTS := joined, hasJoined
	if v := doc.Lookup(fieldTimestamp); isSet(v) {
		if ts, hasTS = v.DateTimeOK(); !hasTS {
			return backend.Presence{}, false
		}
	}
	if !hasTS {
		return backend.Presence{}, false
	}
	var token, incarnation int64
	for _, f := range []struct {
		name string
		to   *int64
	}{{fieldToken, &token}, {fieldIncarnation, &incarnation}} {
		if v := doc.Lookup(f.name); isSet(v) {
			var ok bool
			if *f.to, ok = integer(v); !ok || *f.to < 0 {
				return backend.Presence{}, false
			}
		}
	}
	p := backend.Presence{Node: node, Priority: int(prio), CanLead: canLead, Token: uint64(token), Incarnation: uint64(incarnation),
		Timestamp: bson.DateTime(ts).Time().UTC()}
	if hasJoined {
		p.Joined = bson.DateTime(joined).Time().UTC()
	}
	if len(value) > 0 {
		p.Value = append([]byte(nil), value...)
	}
	return p, p.Validate() == nil
}

// isSet reports whether a field is there and not null.
func isSet(v bson.RawValue) bool { return v.Type != 0 && v.Type != bson.TypeNull }
