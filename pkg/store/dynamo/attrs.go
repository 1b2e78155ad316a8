package dynamo

import (
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/store"
)

// item is one DynamoDB item.
type item = ddbitem.Item

func emptyMap() types.AttributeValue { return &types.AttributeValueMemberM{Value: item{}} }

// keyOf is an item of string attributes: name, value, name, value...
func keyOf(kv ...string) item {
	m := make(item, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = ddbitem.S(kv[i+1])
	}
	return m
}

// names is an expression's attribute names: placeholder, name, placeholder, name...
func names(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// optTime reads a time in Unix nanoseconds that may be absent (the zero time).
func optTime(d *ddbitem.Reader, name string) time.Time {
	if !d.Has(name) {
		return time.Time{}
	}
	return store.FromUnixNanos(d.Num(name))
}
