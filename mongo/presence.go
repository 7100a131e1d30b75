package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

var _ backend.PresenceStore = (*Store)(nil)

// Fields of a presence document. A presence document lives in the
// collection of the election documents under _id backend.PresenceKey
// (election, "\x1f", node): no election name holds a control character,
// so it never is an election's, and the change stream's reader skips it
// (a refresh wakes nobody). Its mark is 2.
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
)

// Present upserts the presence document of p.Node in election, stamped
// with the server's clock ($currentDate).
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
	_, err := s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: backend.PresenceKey(election, p.Node)}}, bson.D{
		{Key: "$set", Value: bson.D{
			{Key: fieldMark, Value: int32(presenceMark)},
			{Key: fieldElection, Value: election},
			{Key: fieldNode, Value: p.Node},
			{Key: fieldPriority, Value: int32(p.Priority)},
			{Key: fieldCanLead, Value: p.CanLead},
			{Key: fieldValue, Value: bson.Binary{Data: value}},
			{Key: fieldToken, Value: int64(p.Token)},
		}},
		{Key: "$currentDate", Value: bson.D{{Key: fieldTimestamp, Value: true}}},
	}, true)
	if err != nil {
		return s.opError(ctx, what, err)
	}
	return nil
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
	ts, ok4 := doc.Lookup(fieldTimestamp).DateTimeOK()
	_, value, ok5 := doc.Lookup(fieldValue).BinaryOK()
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || id != backend.PresenceKey(election, node) {
		return backend.Presence{}, false
	}
	var token int64
	if tok := doc.Lookup(fieldToken); tok.Type != 0 && tok.Type != bson.TypeNull {
		var ok bool
		if token, ok = integer(tok); !ok || token < 0 {
			return backend.Presence{}, false
		}
	}
	p := backend.Presence{Node: node, Priority: int(prio), CanLead: canLead, Token: uint64(token), Timestamp: bson.DateTime(ts).Time().UTC()}
	if len(value) > 0 {
		p.Value = append([]byte(nil), value...)
	}
	return p, p.Validate() == nil
}
