package mongo

import (
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// V2Collection returns the driver-v2 adapter of coll, for the suite's
// run against a real server (package mongo_test).
func V2Collection(coll *mongodrv.Collection) driver.Collection { return newV2Collection(coll) }
