package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
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
	user, password string
	tls            *tls.Config // nil: no TLS
	// postgres
	pgConfig *pgxpool.Config
}

// storeOptions are the flags that name where the records live.
type storeOptions struct {
	table    string // postgres table, mongo collection, rethink table; "" default
	schema   string // postgres schema; "" default
	noCreate bool
}

// redact returns raw without its password, for error messages: a URL
// that does not parse, or has no scheme, is not shown at all (its
// password could not be found in it).
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || !strings.Contains(raw, "://") {
		return "the URL given"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// hasPassword reports whether the store URL raw holds a password (in its
// user information, or as the parameter password that pgx takes).
func hasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return strings.Contains(raw, "@") // cannot tell: say so rather than not
	}
	_, set := u.User.Password()
	return set || u.Query().Has("password")
}

// parseStore checks a store URL without connecting. Its errors are usage
// errors.
func parseStore(raw string) (*storeURL, error) {
	if raw == "" {
		return nil, errors.New("no store: give --store URL, --store-file FILE or " + storeEnv + " in the environment (postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://host:port/database)")
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("the store URL has no scheme: want postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://")
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
		su := &storeURL{kind: kindRethink, addr: addr, database: db, raw: raw}
		su.user = u.User.Username()
		su.password, _ = u.User.Password()
		if su.tls, err = rethinkTLS(u); err != nil {
			return nil, fmt.Errorf("rethinkdb store URL %q: %w", redact(raw), err)
		}
		return su, nil
	}
	return nil, fmt.Errorf("unsupported store URL scheme %q: want postgres://, postgresql://, mongodb://, mongodb+srv:// or rethinkdb://", scheme)
}

// rethinkTLS returns the TLS configuration of a rethinkdb:// URL's
// parameters, named as MongoDB's are: tls=true connects over TLS, checking
// the server's certificate against the system's roots, or against the
// PEM certificates of tlsCAFile (which implies tls=true). nil: no TLS.
func rethinkTLS(u *url.URL) (*tls.Config, error) {
	q := u.Query()
	for k := range q {
		if k != "tls" && k != "tlsCAFile" {
			return nil, fmt.Errorf("unknown parameter %q (want tls=true, tlsCAFile=PATH)", k)
		}
	}
	on := q.Get("tls")
	if on != "" && on != "true" && on != "false" {
		return nil, fmt.Errorf("tls=%q: want true or false", on)
	}
	ca := q.Get("tlsCAFile")
	if on != "true" && ca == "" {
		return nil, nil
	}
	if on == "false" {
		return nil, errors.New("tlsCAFile with tls=false")
	}
	cfg := &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("tlsCAFile: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsCAFile %s: no PEM certificate in it", ca)
		}
	}
	return cfg, nil
}

// store is an open connection to a store: it makes a backend per election.
// Every store run uses keeps presence records, so run participates
// unless --no-participate is given.
var (
	_ backend.PresenceStore = (*postgres.Store)(nil)
	_ backend.PresenceStore = (*lfmongo.Store)(nil)
	_ backend.PresenceStore = (*rethink.Store)(nil)
)

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
		// rethinkdb-go v6.2.1 leaks a goroutine (the host pool's of the
		// cluster it makes) and, after a failed handshake, a connection,
		// per failed Connect: open is retried every 500 ms while the
		// store cannot be reached. A server that is not up yet refuses
		// the TCP connection, so try that first, without the driver.
		conn, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", u.addr)
		if err != nil {
			return nil, fmt.Errorf("rethinkdb: cannot connect to %s: %s", u.addr, oneLine(err))
		}
		_ = conn.Close()
		sess, err := r.Connect(r.ConnectOpts{Address: u.addr, Timeout: timeout, Username: u.user, Password: u.password, TLSConfig: u.tls})
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
