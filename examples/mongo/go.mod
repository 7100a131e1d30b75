module github.com/leaderfeed/leaderfeed/examples/mongo

go 1.26

replace github.com/leaderfeed/leaderfeed => ../../

replace github.com/leaderfeed/leaderfeed/mongo => ../../mongo

replace github.com/leaderfeed/leaderfeed/mongo/onlungo => ../../mongo/onlungo

require (
	github.com/256dpi/lungo v0.4.0
	github.com/leaderfeed/leaderfeed v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/mongo v0.0.0-00010101000000-000000000000
	github.com/leaderfeed/leaderfeed/mongo/onlungo v0.0.0-00010101000000-000000000000
	go.mongodb.org/mongo-driver/v2 v2.10.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/golang/snappy v0.0.4 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/montanaflynn/stats v0.7.1 // indirect
	github.com/shopspring/decimal v1.4.0 // indirect
	github.com/tidwall/btree v1.8.1 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.mongodb.org/mongo-driver v1.17.10 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	gopkg.in/tomb.v2 v2.0.0-20161208151619-d5d1b5820637 // indirect
)
