package mongo

import (
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/basetest"
)

// harness returns the conformance harness for the backends of s: all in
// s's collection, user documents written beside the election documents.
func harness(s *server) basetest.Harness {
	return basetest.Harness{
		Open: func(t *testing.T, election string) (base.Backend, error) {
			b, err := s.newBackend(election, Options{})
			if err != nil {
				return nil, err
			}
			return b, nil
		},
		PutOther: func(ctx context.Context, _, key string, doc map[string]any) error {
			return s.putDoc(ctx, key, bson.M(doc))
		},
		DeleteOther: func(ctx context.Context, _, key string) error {
			_, err := s.collection().DeleteOne(ctx, bson.M{"_id": key})
			return err
		},
		WriteMalformed: func(ctx context.Context, election string) error {
			// A foreign document squatting on the election's _id.
			return s.putDoc(ctx, election, bson.M{"leader": 5})
		},
		Invalid: map[string]func() (base.Backend, error){
			"collection name with '$'":     invalid(s, "e", Options{Collection: "a$b"}),
			"collection name with NUL":     invalid(s, "e", Options{Collection: "a\x00b"}),
			"collection name system.*":     invalid(s, "e", Options{Collection: "system.profile"}),
			"collection name too long":     invalid(s, "e", Options{Collection: strings.Repeat("c", 300)}),
			"election name with a control": invalid(s, "e\x7f", Options{}),
			"nil database":                 func() (base.Backend, error) { return wrapNil(New(nil, "e", Options{})) },
		},
	}
}

func invalid(s *server, election string, opts Options) func() (base.Backend, error) {
	return func() (base.Backend, error) { return wrapNil(s.newBackend(election, opts)) }
}

// wrapNil keeps a nil *Backend from becoming a non-nil base.Backend.
func wrapNil(b *Backend, err error) (base.Backend, error) {
	if b == nil {
		return nil, err
	}
	return b, err
}

// TestConformance runs the whole conformance suite: on lungo in every run,
// and on a real server when LEADERFEED_MONGO_URL is set or Docker works.
func TestConformance(t *testing.T) {
	s := newServer(t)
	t.Logf("MongoDB server: %s", s.kind)
	basetest.Run(t, harness(s))
}
