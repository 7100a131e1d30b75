// Command mongo runs the quickstart on MongoDB, with a client of the
// official driver v2 (go.mongodb.org/mongo-driver/v2): two nodes of one
// election, each with its own backend on one client, an election, and a
// handover on Resign. The server must be a replica set (a single-node one will do),
// since change streams need one. The election documents go into the
// collection "leaderfeed" of the database given by -db, created if missing.
//
//	go run ./examples/mongo -url 'mongodb://localhost:27017/?replicaSet=rs0'
//
// Without -url it uses $LEADERFEED_MONGO_URL.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/examples/internal/demo"
	"github.com/leaderfeed/leaderfeed/mongo"
)

func main() {
	url := flag.String("url", os.Getenv("LEADERFEED_MONGO_URL"), "MongoDB URL of a replica set (default $LEADERFEED_MONGO_URL)")
	db := flag.String("db", "leaderfeed_example", "database")
	election := flag.String("election", "quickstart", "election name")
	flag.Parse()
	if *url == "" {
		log.Fatal("mongo: give -url or set LEADERFEED_MONGO_URL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *url, *db, *election); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer, url, db, election string) error {
	client, err := mongodrv.Connect(options.Client().ApplyURI(url)) // the application's client: never disconnected by the backend
	if err != nil {
		return fmt.Errorf("mongo: %w", err)
	}
	defer client.Disconnect(context.Background()) //nolint:errcheck // nothing to do about it
	database := client.Database(db)
	return demo.Run(ctx, w, func() (backend.Election, error) {
		return mongo.New(database, election, mongo.Options{})
	})
}
