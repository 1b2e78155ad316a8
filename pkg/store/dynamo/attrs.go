package dynamo

import (
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/store"
)

// item is one DynamoDB item.
type item = map[string]types.AttributeValue

func sv(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func nv(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func bv(b bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: b} }
func emptyMap() types.AttributeValue { return &types.AttributeValueMemberM{Value: item{}} }

// keyOf is an item of string attributes: name, value, name, value...
func keyOf(kv ...string) item {
	m := make(item, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = sv(kv[i+1])
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

// decoder reads attributes of one item and remembers the first problem, so that a caller checks
// one error after reading every field.
type decoder struct {
	it  item
	err error
}

func (d *decoder) fail(name, want string) {
	if d.err == nil {
		d.err = fmt.Errorf("attribute %s: missing or not %s", name, want)
	}
}

func (d *decoder) has(name string) bool {
	_, ok := d.it[name]
	return ok
}

func (d *decoder) str(name string) string {
	v, ok := d.it[name].(*types.AttributeValueMemberS)
	if !ok {
		d.fail(name, "a string")
		return ""
	}
	return v.Value
}

func (d *decoder) num(name string) int64 {
	v, ok := d.it[name].(*types.AttributeValueMemberN)
	if !ok {
		d.fail(name, "a number")
		return 0
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		d.fail(name, "an int64")
	}
	return n
}

func (d *decoder) boolean(name string) bool {
	v, ok := d.it[name].(*types.AttributeValueMemberBOOL)
	if !ok {
		d.fail(name, "a boolean")
		return false
	}
	return v.Value
}

// optTime reads a time in Unix nanoseconds that may be absent (the zero time).
func (d *decoder) optTime(name string) time.Time {
	if !d.has(name) {
		return time.Time{}
	}
	return store.FromUnixNanos(d.num(name))
}
