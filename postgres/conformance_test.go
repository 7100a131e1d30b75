package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
)

// harness runs the conformance suite on one election table of its own.
// Every election gets a watched table of its own ("w_" and a hash of the
// election name, columns id text primary key and doc jsonb), so that the
// OtherChanged cases of concurrent elections do not meet.
type harness struct {
	pool  *pgxpool.Pool
	table string

	mu      sync.Mutex
	watched map[string]bool
}

func newHarness(t *testing.T) *harness {
	pool := newPool(t)
	h := &harness{pool: pool, table: uniqueName(t), watched: map[string]bool{}}
	// Create the election table now, so that WriteMalformed can write to
	// it before any backend ran Create.
	s, err := NewStore(pool, Options{Table: h.table})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Create(ctxT(t)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return h
}

func watchTableOf(election string) string {
	sum := sha256.Sum256([]byte(election))
	return "w_" + hex.EncodeToString(sum[:12])
}

// watch creates the watched table of election, once.
func (h *harness) watch(ctx context.Context, election string) (string, error) {
	name := watchTableOf(election)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.watched[name] {
		_, err := h.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{"public", name}.Sanitize()+
			" (id text PRIMARY KEY, doc jsonb NOT NULL)")
		if err != nil {
			return "", err
		}
		h.watched[name] = true
	}
	return name, nil
}

func (h *harness) options(watch string) Options {
	return Options{Table: h.table, WatchTable: watch}
}

func (h *harness) Harness() basetest.Harness {
	return basetest.Harness{
		// Lenient timings: a real server, beside other tests, under -race.
		Timing: feedTiming,
		Open: func(t *testing.T, election string) (backend.Election, error) {
			if _, err := New(h.pool, election, Options{Table: h.table}); err != nil {
				return nil, err
			}
			watch, err := h.watch(ctxT(t), election)
			if err != nil {
				return nil, err
			}
			// Each node a Store of its own, as each process has.
			s, err := NewStore(h.pool, h.options(watch))
			if err != nil {
				return nil, err
			}
			return base.Open(s, election)
		},
		// A Store on the table, watching no table of its own: the Store
		// rules use election records only.
		OpenStore: func(t *testing.T) (backend.Store, error) {
			s, err := NewStore(h.pool, Options{Table: h.table})
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		PutOther: func(ctx context.Context, election, key string, doc map[string]any) error {
			watch, err := h.watch(ctx, election)
			if err != nil {
				return err
			}
			_, err = h.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{"public", watch}.Sanitize()+
				" AS w (id, doc) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc", key, doc)
			return err
		},
		DeleteOther: func(ctx context.Context, election, key string) error {
			watch, err := h.watch(ctx, election)
			if err != nil {
				return err
			}
			_, err = h.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{"public", watch}.Sanitize()+" WHERE id = $1", key)
			return err
		},
		// A leader id with a control character and a negative term, as a
		// foreign client could write.
		WriteMalformed: func(ctx context.Context, election string) error {
			_, err := h.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{"public", h.table}.Sanitize()+
				" AS t (election, leader, term, revision) VALUES ($1, $2, -1, 1)"+
				" ON CONFLICT (election) DO UPDATE SET leader = excluded.leader, term = -1, revision = t.revision + 1",
				election, "evil\x01node")
			return err
		},
		Invalid: map[string]func() (backend.Election, error){
			"nil pool":                     func() (backend.Election, error) { return backendOrNil(New(nil, "e", Options{})) },
			"election with a control char": func() (backend.Election, error) { return backendOrNil(New(h.pool, "e\x00", Options{})) },
			"schema with a quote":          func() (backend.Election, error) { return backendOrNil(New(h.pool, "e", Options{Schema: `x"y`})) },
			"table with SQL in it": func() (backend.Election, error) {
				return backendOrNil(New(h.pool, "e", Options{Table: "t; DROP TABLE x"}))
			},
			"table name of 64 bytes": func() (backend.Election, error) {
				return backendOrNil(New(h.pool, "e", Options{Table: strings.Repeat("t", 64)}))
			},
			"watch table with a dash":     func() (backend.Election, error) { return backendOrNil(New(h.pool, "e", Options{WatchTable: "a-b"})) },
			"channel prefix with a space": func() (backend.Election, error) { return backendOrNil(New(h.pool, "e", Options{ChannelPrefix: "a b"})) },
			"watch table = election table": func() (backend.Election, error) {
				return backendOrNil(New(h.pool, "e", Options{Table: "x", WatchTable: "x"}))
			},
			"channel prefix over 49 bytes": func() (backend.Election, error) {
				return backendOrNil(New(h.pool, "e", Options{ChannelPrefix: strings.Repeat("c", 50)}))
			},
			"election name over 127 bytes": func() (backend.Election, error) {
				return backendOrNil(New(h.pool, strings.Repeat("e", 128), Options{}))
			},
		},
	}
}

// backendOrNil keeps a failed New from returning a backend.
func backendOrNil(b backend.Election, err error) (backend.Election, error) {
	if err != nil {
		return nil, err
	}
	return b, nil
}

func TestConformance(t *testing.T) {
	h := newHarness(t)
	basetest.Run(t, h.Harness())
}
