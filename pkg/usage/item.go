package usage

import (
	"time"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
)

// EventItem is the usage item of an event, the one place its DynamoDB shape is written down
// (docs/dynamodb.md lists it): the wire names of the event's fields, the cost in picodollars and
// as a decimal USD string, started_at in Unix nanoseconds (and also as RFC 3339, and as its UTC
// day, for people reading exports). The caller checks that StartedAt is storable in nanoseconds
// and adds the attributes it keeps for itself.
func EventItem(e Event) ddbitem.Item {
	s, n, b := ddbitem.S, ddbitem.N, ddbitem.Bool
	return ddbitem.Item{
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
func DecodeItem(it ddbitem.Item) (Event, error) { return decodeItem(it, false) }

// DecodePartialItem is DecodeItem for readers of exports, which may hold items written before an
// attribute existed: only the keys, the status and started_at are required, and an absent
// attribute reads as its zero value.
func DecodePartialItem(it ddbitem.Item) (Event, error) { return decodeItem(it, true) }

func decodeItem(it ddbitem.Item, partial bool) (Event, error) {
	r := ddbitem.NewReader(it)
	str, num, boolean := r.Str, r.Num, r.Bool
	if partial {
		str, num, boolean = r.OptStr, r.OptNum, r.OptBool
	}
	e := Event{
		GenerationID:     r.Str("generation_id"),
		OrgID:            r.Str("org_id"),
		Status:           Status(r.Str("status")),
		StartedAt:        time.Unix(0, r.Num("started_at")).UTC(),
		Version:          int(num("version")),
		KeyID:            str("key_id"),
		Model:            str("model"),
		Endpoint:         str("endpoint"),
		Stream:           boolean("stream"),
		HTTPStatus:       int(num("http_status")),
		FinishReason:     str("finish_reason"),
		PromptTokens:     num("prompt_tokens"),
		CachedTokens:     num("cached_tokens"),
		CompletionTokens: num("completion_tokens"),
		Cost:             money.Amount(num("cost")),
		Estimated:        boolean("estimated"),
		TTFTMillis:       num("ttft_ms"),
		DurationMillis:   num("duration_ms"),
		Backend:          str("backend"),
	}
	if err := r.Err(); err != nil {
		return Event{}, err
	}
	return e, nil
}
