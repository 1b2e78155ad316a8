// Package ddbitem reads and writes DynamoDB items as the SDK types them: attribute values, a
// Reader that collects every problem of an item, and DynamoDB JSON, as exports and stream
// records hold items. The store, the usage item's decoding and finance's exports share it, so
// that an item reads the same and its problems read the same wherever it came from.
package ddbitem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Item is one DynamoDB item.
type Item = map[string]types.AttributeValue

// S is a string attribute.
func S(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

// N is a number attribute of an integer.
func N(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// Bool is a boolean attribute.
func Bool(v bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: v} }

// Reader reads the attributes of one item and collects every problem (the attributes missing,
// those of another type), so that a caller checks one error after reading every field. The
// Opt methods read an attribute that may be absent as its zero value.
type Reader struct {
	item    Item
	missing []string
	errs    []string
}

// NewReader returns a Reader of it.
func NewReader(it Item) *Reader { return &Reader{item: it} }

// Has reports whether the item has the attribute.
func (r *Reader) Has(name string) bool {
	_, ok := r.item[name]
	return ok
}

// Fail notes a problem the caller found, to be reported by Err with the others.
func (r *Reader) Fail(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// Err is every problem found so far, or nil.
func (r *Reader) Err() error {
	errs := r.errs
	if len(r.missing) > 0 {
		errs = append([]string{"without " + strings.Join(r.missing, ", ")}, errs...)
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// Str reads a string attribute.
func (r *Reader) Str(name string) string { return r.str(name, false) }

// OptStr reads a string attribute that may be absent.
func (r *Reader) OptStr(name string) string { return r.str(name, true) }

// Num reads an integer exactly: DynamoDB numbers are decimal strings, never floats here.
func (r *Reader) Num(name string) int64 { return r.num(name, false) }

// OptNum reads an integer attribute that may be absent.
func (r *Reader) OptNum(name string) int64 { return r.num(name, true) }

// Bool reads a boolean attribute.
func (r *Reader) Bool(name string) bool { return r.boolean(name, false) }

// OptBool reads a boolean attribute that may be absent.
func (r *Reader) OptBool(name string) bool { return r.boolean(name, true) }

// Map reads a map attribute.
func (r *Reader) Map(name string) Item {
	if v, ok := attr[*types.AttributeValueMemberM](r, name, false, "map (M)"); ok {
		return v.Value
	}
	return nil
}

func (r *Reader) str(name string, opt bool) string {
	if v, ok := attr[*types.AttributeValueMemberS](r, name, opt, "string (S)"); ok {
		return v.Value
	}
	return ""
}

func (r *Reader) num(name string, opt bool) int64 {
	v, ok := attr[*types.AttributeValueMemberN](r, name, opt, "number (N)")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("%s: %q is not an integer", name, v.Value))
	}
	return n
}

func (r *Reader) boolean(name string, opt bool) bool {
	if v, ok := attr[*types.AttributeValueMemberBOOL](r, name, opt, "boolean (BOOL)"); ok {
		return v.Value
	}
	return false
}

// attr is the attribute name as a T, and whether it is one; a problem is noted unless the
// attribute is optional and absent.
func attr[T types.AttributeValue](r *Reader, name string, opt bool, want string) (T, bool) {
	v, ok := r.item[name]
	if !ok {
		if !opt {
			r.missing = append(r.missing, name)
		}
		var none T
		return none, false
	}
	t, ok := v.(T)
	if !ok {
		r.errs = append(r.errs, fmt.Sprintf("%s: want a DynamoDB %s", name, want))
	}
	return t, ok
}
