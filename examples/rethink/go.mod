module github.com/leaderfeed/leaderfeed/examples/rethink

go 1.26

replace github.com/leaderfeed/leaderfeed => ../../

replace github.com/leaderfeed/leaderfeed/rethink => ../../rethink

require (
	github.com/leaderfeed/leaderfeed v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/rethink v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	gopkg.in/rethinkdb/rethinkdb-go.v6 v6.2.1
)

require (
	github.com/golang/protobuf v1.3.4 // indirect
	github.com/hailocab/go-hostpool v0.0.0-20160125115350-e80d13ce29ed // indirect
	github.com/opentracing/opentracing-go v1.1.0 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	golang.org/x/crypto v0.0.0-20200302210943-78000ba7a073 // indirect
	golang.org/x/net v0.0.0-20190404232315-eb5bcb51f2a3 // indirect
	golang.org/x/sys v0.0.0-20191120155948-bd437916bb0e // indirect
	gopkg.in/cenkalti/backoff.v2 v2.2.1 // indirect
)
