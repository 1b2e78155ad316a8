package gateway

import (
	"math"
	"strconv"
	"strings"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/openai"
)

// maxReservation is what a request is taken to reserve when its worst case does not fit an
// amount: more than any balance, so that it is refused with 402.
const maxReservation = money.Amount(math.MaxInt64)

// worstCase is the most a checked request can cost, the amount admission reserves (contract §7).
// The bound, per prompt (one for chat; each element of a completions prompt array), is the most
// of price(p prompt tokens, k × m completion tokens) over what the backend can run:
//
//   - the model's context length C bounds prompt plus completion tokens of every sequence;
//   - m = min(max_tokens, C) (chat: max_completion_tokens, else max_tokens), and C when the
//     request gives neither — vLLM then generates up to what the context leaves;
//   - k = n (completions: max(n, best_of)) sequences share one prompt, counted once.
//
// cost(p) = p × input + k × min(m, C − p) × output is piecewise linear in p, so its maximum over
// 0 ≤ p ≤ C is at p = 0, p = C or p = C − m; cached prompt tokens are priced at the higher of
// input and cached_input. A request that cannot cost anything reserves zero.
func worstCase(ep *endpoint, req *request) money.Amount {
	m := req.model
	ctx := int64(m.ContextLength)
	maxTokens := positiveInt(req, "max_tokens")
	if mc := positiveInt(req, "max_completion_tokens"); ep.chat && mc > 0 {
		maxTokens = mc
	}
	if maxTokens == 0 || maxTokens > ctx {
		maxTokens = ctx
	}
	k, prompts := max(1, positiveInt(req, "n")), int64(1)
	if !ep.chat {
		k, prompts = max(k, positiveInt(req, "best_of")), promptCount(req)
	}
	p := m.Pricing
	p.Input = max(p.Input, p.CachedInput)
	worst := money.Amount(0)
	for _, at := range [...]struct{ prompt, completion int64 }{
		{0, maxTokens},
		{ctx, 0},
		{ctx - maxTokens, maxTokens},
	} {
		completion, overflow := mul(k, at.completion)
		if overflow {
			return maxReservation
		}
		c, err := p.Cost(at.prompt, 0, completion)
		if err != nil {
			return maxReservation
		}
		worst = max(worst, c)
	}
	total, overflow := mul(prompts, int64(worst))
	if overflow {
		return maxReservation
	}
	return money.Amount(total)
}

// mul multiplies two non-negative counts, reporting overflow.
func mul(a, b int64) (int64, bool) {
	if a != 0 && b > math.MaxInt64/a {
		return 0, true
	}
	return a * b, false
}

// positiveInt reads a count of the request (n, best_of, max_tokens, max_completion_tokens) as
// pydantic's lax mode, with which vLLM and SGLang validate, reads an int: an integer, a number
// without a fraction (4.0, 4e0), or a string of an integer or of a decimal without a fraction
// ("4", " 4.0"); 0 when absent or not a positive count. It never reads a count lower than the
// backend does: a fraction (which the backend refuses) rounds up, and a count from 2^53 on, where
// a float64 loses units, is math.MaxInt64 (beyond any amount).
func positiveInt(req *request, key string) int64 {
	f, ok := openai.Lookup(req.body, req.fields, key)
	if !ok {
		return 0
	}
	text := string(f.Value(req.body))
	if s, ok := openai.String(f.Value(req.body)); ok {
		text = strings.TrimSpace(s)
	}
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return max(n, 0)
	}
	x, err := strconv.ParseFloat(text, 64)
	switch {
	case err != nil || math.IsInf(x, 0) || !(x > 0):
		return 0
	case x >= 1<<53:
		return math.MaxInt64
	}
	return int64(math.Ceil(x))
}

// promptCount is how many prompts a completions request sends: the elements of a prompt array of
// strings or of token arrays, one otherwise (a string, or one array of token ids).
func promptCount(req *request) int64 {
	f, ok := openai.Lookup(req.body, req.fields, "prompt")
	if !ok {
		return 1
	}
	count, first := openai.Elements(f.Value(req.body))
	if first != '"' && first != '[' {
		return 1 // not an array, an empty one, or token ids: one prompt
	}
	return int64(count)
}
