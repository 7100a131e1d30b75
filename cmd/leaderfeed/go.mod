module github.com/leaderfeed/leaderfeed/cmd/leaderfeed

go 1.26

replace github.com/leaderfeed/leaderfeed => ../../

replace github.com/leaderfeed/leaderfeed/postgres => ../../postgres

replace github.com/leaderfeed/leaderfeed/mongo => ../../mongo

replace github.com/leaderfeed/leaderfeed/rethink => ../../rethink

replace github.com/leaderfeed/leaderfeed/otelmetrics => ../../otelmetrics

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/leaderfeed/leaderfeed v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/mongo v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/otelmetrics v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/postgres v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/rethink v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_golang v1.24.1
	go.mongodb.org/mongo-driver/v2 v2.10.0
	go.opentelemetry.io/otel/exporters/prometheus v0.67.0
	go.opentelemetry.io/otel/sdk/metric v1.45.0
	go.uber.org/goleak v1.3.0
	gopkg.in/rethinkdb/rethinkdb-go.v6 v6.2.1
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/golang/protobuf v1.5.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hailocab/go-hostpool v0.0.0-20160125115350-e80d13ce29ed // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/opentracing/opentracing-go v1.1.0 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.70.1 // indirect
	github.com/prometheus/otlptranslator v1.0.0 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.45.0 // indirect
	go.opentelemetry.io/otel/metric v1.45.0 // indirect
	go.opentelemetry.io/otel/sdk v1.45.0 // indirect
	go.opentelemetry.io/otel/trace v1.45.0 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/term v0.45.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
	gopkg.in/cenkalti/backoff.v2 v2.2.1 // indirect
)
