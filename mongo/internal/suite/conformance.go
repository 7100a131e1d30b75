package suite

import (
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/mongo"
)

// harness returns the conformance harness for the backends of s: all in
// s's collection, user documents written beside the election documents.
func harness(s *Server) basetest.Harness {
	return basetest.Harness{
		Open: func(t *testing.T, election string) (backend.Election, error) {
			return s.newBackend(election, mongo.Options{})
		},
		OpenStore: func(t *testing.T) (backend.Store, error) {
			st, err := s.newStore(mongo.Options{})
			if err != nil {
				return nil, err
			}
			return st, nil
		},
		PutOther: func(ctx context.Context, _, key string, doc map[string]any) error {
			return s.Put(ctx, key, bson.M(doc))
		},
		DeleteOther: func(ctx context.Context, _, key string) error {
			err := s.Delete(ctx, key)
			return err
		},
		WriteMalformed: func(ctx context.Context, election string) error {
			// A document with the election mark that breaks the record
			// rules (a document without the mark is the caller's unless
			// the store knows the _id as an election's).
			return s.Put(ctx, election, bson.M{"leaderfeed": 1, "leader": 5})
		},
		Invalid: map[string]func() (backend.Election, error){
			"collection name with '$'":     invalid(s, "e", mongo.Options{Collection: "a$b"}),
			"collection name with NUL":     invalid(s, "e", mongo.Options{Collection: "a\x00b"}),
			"collection name system.*":     invalid(s, "e", mongo.Options{Collection: "system.profile"}),
			"collection name too long":     invalid(s, "e", mongo.Options{Collection: strings.Repeat("c", 300)}),
			"election name with a control": invalid(s, "e\x7f", mongo.Options{}),
			"nil database":                 func() (backend.Election, error) { return mongo.New(nil, "e", mongo.Options{}) },
			"nil collection":               func() (backend.Election, error) { return mongo.NewCollection(nil, "e", mongo.Options{}) },
		},
	}
}

func invalid(s *Server, election string, opts mongo.Options) func() (backend.Election, error) {
	return func() (backend.Election, error) { return s.newBackend(election, opts) }
}

// testConformance runs the whole conformance suite: on lungo in every run,
// and on a real server when LEADERFEED_MONGO_URL is set or Docker works.
func testConformance(t *testing.T, newServer NewServer) {
	s := newServer(t)
	t.Logf("MongoDB server: %s", s.Kind)
	basetest.Run(t, harness(s))
}
