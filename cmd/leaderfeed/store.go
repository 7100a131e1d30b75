package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	lfmongo "github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/postgres"
	"github.com/leaderfeed/leaderfeed/rethink"
)

// storeKind is the database a store URL names.
type storeKind string

const (
	kindPostgres storeKind = "postgres"
	kindMongo    storeKind = "mongodb"
	kindRethink  storeKind = "rethinkdb"
)

// storeURL is a parsed and checked --store.
type storeURL struct {
	kind storeKind
	raw  string // as given (postgres, mongodb)
	// rethinkdb
	addr, database string
	// postgres
	pgConfig *pgxpool.Config
}

// storeOptions are the flags that name where the records live.
type storeOptions struct {
	table    string // postgres table, mongo collection, rethink table; "" default
	schema   string // postgres schema; "" default
	noCreate bool
}

// redact returns raw without its password, for error messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the URL given"
	}
	return u.Redacted()
}

// parseStore checks a store URL without connecting. Its errors are usage
// errors.
func parseStore(raw string) (*storeURL, error) {
	if raw == "" {
		return nil, errors.New("--store is required (postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://host:port/database)")
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("store URL %q has no scheme: want postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://", redact(raw))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		cfg, err := pgxpool.ParseConfig(raw)
		if err != nil {
			return nil, fmt.Errorf("malformed postgres store URL: %s", oneLine(err))
		}
		return &storeURL{kind: kindPostgres, raw: raw, pgConfig: cfg}, nil
	case "mongodb", "mongodb+srv":
		if strings.EqualFold(scheme, "mongodb+srv") {
			// Parsing an SRV URL looks its hosts up in DNS; check the
			// syntax only and leave the lookup to the connection.
			if _, err := url.Parse(raw); err != nil {
				return nil, fmt.Errorf("malformed mongodb store URL: %s", oneLine(err))
			}
			return &storeURL{kind: kindMongo, raw: raw}, nil
		}
		if _, err := connstring.ParseAndValidate(raw); err != nil {
			return nil, fmt.Errorf("malformed mongodb store URL: %s", oneLine(err))
		}
		return &storeURL{kind: kindMongo, raw: raw}, nil
	case "rethinkdb":
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("malformed rethinkdb store URL: %s", oneLine(err))
		}
		if u.Host == "" {
			return nil, fmt.Errorf("rethinkdb store URL %q has no host: want rethinkdb://host:port/database", redact(raw))
		}
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "28015")
		}
		db := strings.Trim(u.Path, "/")
		if strings.Contains(db, "/") {
			return nil, fmt.Errorf("rethinkdb store URL %q: the path must be one database name", redact(raw))
		}
		if db == "" {
			db = rethink.DefaultDatabase
		}
		return &storeURL{kind: kindRethink, addr: addr, database: db, raw: raw}, nil
	}
	return nil, fmt.Errorf("unsupported store URL scheme %q: want postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://", scheme)
}

// store is an open connection to a store: it makes a backend per election.
type store struct {
	kind    storeKind
	backend func(election string) (backend.Election, error)
	now     func(ctx context.Context) (time.Time, error) // the store's own clock
	close   func()
}

// open connects (lazily where the driver allows: the backend's Start
// checks the server).
func (u *storeURL) open(ctx context.Context, so storeOptions) (*store, error) {
	switch u.kind {
	case kindPostgres:
		pool, err := pgxpool.NewWithConfig(ctx, u.pgConfig)
		if err != nil {
			return nil, fmt.Errorf("postgres: %s", oneLine(err))
		}
		return &store{
			kind: u.kind,
			backend: func(election string) (backend.Election, error) {
				return postgres.New(pool, election, postgres.Options{Schema: so.schema, Table: so.table, NoCreate: so.noCreate})
			},
			now: func(ctx context.Context) (t time.Time, err error) {
				err = pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
				return t, err
			},
			close: pool.Close,
		}, nil
	case kindMongo:
		opts := options.Client().ApplyURI(u.raw)
		client, err := mongodrv.Connect(opts)
		if err != nil {
			return nil, fmt.Errorf("mongodb: %s", oneLine(err))
		}
		dbName := "leaderfeed"
		if cs, err := connstring.Parse(u.raw); err == nil && cs.Database != "" {
			dbName = cs.Database
		}
		db := client.Database(dbName)
		return &store{
			kind: u.kind,
			backend: func(election string) (backend.Election, error) {
				return lfmongo.New(db, election, lfmongo.Options{Collection: so.table, NoCreate: so.noCreate})
			},
			now: func(ctx context.Context) (time.Time, error) {
				var res struct {
					LocalTime time.Time `bson:"localTime"`
				}
				err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&res)
				return res.LocalTime, err
			},
			close: func() { _ = client.Disconnect(context.Background()) },
		}, nil
	case kindRethink:
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		timeout := 10 * time.Second
		if d, ok := ctx.Deadline(); ok {
			timeout = time.Until(d)
		}
		sess, err := r.Connect(r.ConnectOpts{Address: u.addr, Timeout: timeout})
		if errors.As(err, new(r.RQLAuthError)) {
			return nil, fmt.Errorf("rethinkdb: cannot connect to %s: %w: %s; fix: the user and password of the connection", u.addr, base.ErrRefused, oneLine(err))
		}
		if err != nil {
			return nil, fmt.Errorf("rethinkdb: cannot connect to %s: %s", u.addr, oneLine(err))
		}
		return &store{
			kind: u.kind,
			backend: func(election string) (backend.Election, error) {
				return rethink.New(sess, election, rethink.Options{Database: u.database, Table: so.table, NoCreate: so.noCreate})
			},
			now: func(ctx context.Context) (t time.Time, err error) {
				err = r.Now().ReadOne(&t, sess)
				return t, err
			},
			close: func() { _ = sess.Close() },
		}, nil
	}
	return nil, fmt.Errorf("unsupported store %q", u.kind)
}

// oneLine returns err's message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
