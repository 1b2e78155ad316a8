package usage

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/money"
)

// Item is one DynamoDB item, as the SDK types it. The usage item is the one place the event's
// DynamoDB shape is written down: the store writes it (EventItem), and the store, the stream's
// decoding and finance's exports read it (DecodeItem, DecodePartialItem); docs/dynamodb.md lists
// its attributes.
type Item = map[string]types.AttributeValue

// EventItem is the usage item of an event: the wire names of the event's fields, the cost in
// picodollars and as a decimal USD string, started_at in Unix nanoseconds (and also as RFC 3339,
// and as its UTC day, for people reading exports). The caller checks that StartedAt is storable
// in nanoseconds and adds the attributes it keeps for itself.
func EventItem(e Event) Item {
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	n := func(v int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
	b := func(v bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: v} }
	return Item{
		"org_id":            s(e.OrgID),
		"generation_id":     s(e.GenerationID),
		"version":           n(int64(e.Version)),
		"key_id":            s(e.KeyID),
		"model":             s(e.Model),
		"endpoint":          s(e.Endpoint),
		"stream":            b(e.Stream),
		"status":            s(string(e.Status)),
		"http_status":       n(int64(e.HTTPStatus)),
		"finish_reason":     s(e.FinishReason),
		"prompt_tokens":     n(e.PromptTokens),
		"cached_tokens":     n(e.CachedTokens),
		"completion_tokens": n(e.CompletionTokens),
		"cost":              n(int64(e.Cost)),
		"cost_usd":          s(e.Cost.String()),
		"estimated":         b(e.Estimated),
		"started_at":        n(e.StartedAt.UnixNano()),
		"started_at_utc":    s(e.StartedAt.UTC().Format(time.RFC3339Nano)),
		"day":               s(e.Day()),
		"ttft_ms":           n(e.TTFTMillis),
		"duration_ms":       n(e.DurationMillis),
		"backend":           s(e.Backend),
	}
}

// DecodeItem reads a usage item as EventItem writes it: every attribute of the event is
// required, with its type; attributes kept for people or for the store (cost_usd, day,
// settled_at, ...) are ignored. The error names every problem.
func DecodeItem(it Item) (Event, error) { return decodeItem(it, false) }

// DecodePartialItem is DecodeItem for readers of exports, which may hold items written before an
// attribute existed: only the keys, the status and started_at are required, and an absent
// attribute reads as its zero value.
func DecodePartialItem(it Item) (Event, error) { return decodeItem(it, true) }

func decodeItem(it Item, partial bool) (Event, error) {
	r := itemReader{it: it, partial: partial}
	e := Event{
		GenerationID:     r.str("generation_id", true),
		OrgID:            r.str("org_id", true),
		Status:           Status(r.str("status", true)),
		StartedAt:        time.Unix(0, r.num("started_at", true)).UTC(),
		Version:          int(r.num("version", false)),
		KeyID:            r.str("key_id", false),
		Model:            r.str("model", false),
		Endpoint:         r.str("endpoint", false),
		Stream:           r.boolean("stream"),
		HTTPStatus:       int(r.num("http_status", false)),
		FinishReason:     r.str("finish_reason", false),
		PromptTokens:     r.num("prompt_tokens", false),
		CachedTokens:     r.num("cached_tokens", false),
		CompletionTokens: r.num("completion_tokens", false),
		Cost:             money.Amount(r.num("cost", false)),
		Estimated:        r.boolean("estimated"),
		TTFTMillis:       r.num("ttft_ms", false),
		DurationMillis:   r.num("duration_ms", false),
		Backend:          r.str("backend", false),
	}
	errs := r.errs
	if len(r.missing) > 0 {
		errs = append([]string{"without " + strings.Join(r.missing, ", ")}, errs...)
	}
	if len(errs) > 0 {
		return Event{}, errors.New(strings.Join(errs, "; "))
	}
	return e, nil
}

// itemReader reads the attributes of one usage item and collects every problem: the names of
// the attributes missing, and those of the wrong type.
type itemReader struct {
	it      Item
	partial bool // only the attributes read as always there are required
	missing []string
	errs    []string
}

// attr is the attribute name, or nil when it is absent; always is whether even a partial item
// has it.
func (r *itemReader) attr(name string, always bool) types.AttributeValue {
	v, ok := r.it[name]
	if !ok && (always || !r.partial) {
		r.missing = append(r.missing, name)
	}
	return v
}

func (r *itemReader) wrong(name, want string) {
	r.errs = append(r.errs, fmt.Sprintf("%s: want a DynamoDB %s", name, want))
}

func (r *itemReader) str(name string, always bool) string {
	switch v := r.attr(name, always).(type) {
	case nil:
	case *types.AttributeValueMemberS:
		return v.Value
	default:
		r.wrong(name, "string (S)")
	}
	return ""
}

// num reads an integer exactly: DynamoDB numbers are decimal strings, never floats here.
func (r *itemReader) num(name string, always bool) int64 {
	switch v := r.attr(name, always).(type) {
	case nil:
	case *types.AttributeValueMemberN:
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			r.errs = append(r.errs, fmt.Sprintf("%s: %q is not an integer", name, v.Value))
		}
		return n
	default:
		r.wrong(name, "number (N)")
	}
	return 0
}

func (r *itemReader) boolean(name string) bool {
	switch v := r.attr(name, false).(type) {
	case nil:
	case *types.AttributeValueMemberBOOL:
		return v.Value
	default:
		r.wrong(name, "boolean (BOOL)")
	}
	return false
}
