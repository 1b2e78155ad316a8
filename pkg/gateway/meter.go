package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/usage"
)

// meter follows what a request consumed. Usage from the backend is cumulative: the latest
// report replaces the one before, so nothing is ever summed twice.
//
// A backend reports usage two ways. The request's whole usage comes in a non-streamed answer, in
// the final usage chunk, or (from a backend without continuous usage) on some content chunk:
// observe keeps it. With continuous usage every content chunk carries the running usage of its own
// choice only (vLLM and SGLang count one choice of one prompt at a time, and never report cached
// tokens there): observeChoice keeps the last report of each choice, and a stream cut before its
// final usage chunk is billed from their sum.
type meter struct {
	usage     openai.Usage
	raw       []byte // the latest whole-request usage as sent, parsed into usage only when needed
	haveUsage bool   // the backend reported usage at least once
	complete  bool   // that report covers the whole answer (final usage chunk, or a complete body)

	choiceRaw [][]byte // per choice index, the latest running usage of that choice

	exactPerChunk bool      // the backend reports usage on every chunk (continuous usage)
	cachedTokens  bool      // the backend reports cached tokens, but only in the whole-request usage
	n             int64     // choices per prompt the request asked for (n); 1 when absent
	prompts       int64     // prompts in the request: the length of a completions prompt array, else 1
	chunks        int64     // chunks carrying generated content that reached the client
	firstContent  time.Time // when the first of them did
	billable      bool      // the backend worked on the request, so a partial answer costs something
	finish        string

	// promptEstimate guesses the prompt's tokens when the backend never said; set lazily.
	promptEstimate func() int64
}

// maxMeteredChoices bounds the choices whose running usage a meter keeps; a request asking for
// more is billed from an estimate should its stream be cut.
const maxMeteredChoices = 1024

// delivered counts a chunk of generated content that reached the client, at clock's time.
func (m *meter) delivered(clock Clock) {
	if m.chunks == 0 {
		m.firstContent = clock.Now()
	}
	m.chunks++
}

// observe keeps a whole-request usage object a chunk carried. It is copied, not parsed: only the
// last one counts.
func (m *meter) observe(raw []byte) {
	m.raw = append(m.raw[:0], raw...)
	m.haveUsage = true
}

// observeChoice keeps the running usage of choice i, copied into a buffer the choice reuses.
func (m *meter) observeChoice(i int, raw []byte) {
	if i == 0 && len(m.choiceRaw) == 1 { // one choice: every chunk after the first
		m.choiceRaw[0] = append(m.choiceRaw[0][:0], raw...)
		return
	}
	if i < 0 || i >= maxMeteredChoices {
		return
	}
	for len(m.choiceRaw) <= i {
		m.choiceRaw = append(m.choiceRaw, nil)
	}
	m.choiceRaw[i] = append(m.choiceRaw[i][:0], raw...)
	m.haveUsage = true
}

// current returns the latest whole-request usage, parsing what observe kept; without one, the
// sum of the choices' running usage.
func (m *meter) current() (openai.Usage, error) {
	if m.raw != nil {
		u, ok, err := openai.ParseUsage(m.raw)
		if err != nil || !ok {
			m.raw = nil
			m.haveUsage = m.choiceRaw != nil
			if err == nil {
				err = errors.New("usage is null")
			}
			return openai.Usage{}, err
		}
		m.usage, m.raw = u, nil
		m.choiceRaw = nil // the whole-request report supersedes the running ones
		return m.usage, nil
	}
	if m.choiceRaw != nil {
		u, _, err := m.sumChoices()
		if err != nil {
			m.choiceRaw, m.haveUsage = nil, false
			return openai.Usage{}, err
		}
		m.usage = u
		return u, nil
	}
	return m.usage, nil
}

// sumChoices adds up the choices' running usage: every choice's completion tokens, and each
// prompt's tokens once (choice i answers prompt i / n). all reports whether every choice the
// request asked for has reported; when some have not, the prompts none of whose choices reported
// are counted at the mean of those that did.
func (m *meter) sumChoices() (u openai.Usage, all bool, err error) {
	n := max(m.n, 1)
	expected := n * max(m.prompts, 1)
	prompt := map[int64]int64{}
	var reported int64
	for i, raw := range m.choiceRaw {
		if raw == nil {
			continue
		}
		cu, ok, err := openai.ParseUsage(raw)
		if err != nil || !ok {
			if err == nil {
				err = errors.New("usage is null")
			}
			return openai.Usage{}, false, fmt.Errorf("choice %d: %w", i, err)
		}
		reported++
		u.CompletionTokens += cu.CompletionTokens
		prompt[int64(i)/n] = cu.PromptTokens
	}
	for _, p := range prompt {
		u.PromptTokens += p
	}
	if groups := max(m.prompts, 1); int64(len(prompt)) < groups && len(prompt) > 0 {
		u.PromptTokens += (groups - int64(len(prompt))) * u.PromptTokens / int64(len(prompt))
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u, reported >= expected, nil
}

// produced reports whether the backend generated anything: content reached the client, or its
// usage counts completion tokens.
func (m *meter) produced() bool {
	if m.chunks > 0 {
		return true
	}
	u, err := m.current()
	return err == nil && m.haveUsage && u.CompletionTokens > 0
}

// apply writes tokens, cost, finish reason and, for a stream, the time to its first content into
// the event.
//
// Billed exactly: a whole-request report that covers the answer; or, for a stream cut short on a
// backend with continuous usage, the running usage of every choice, provided the backend does not
// report cached tokens (it reports them only at the end, so the split of the prompt is unknown).
// Otherwise a backend that worked is billed from what is known and the event marked estimated:
// reported counts where there are some, the prompt estimated from the request's words where
// there are none, completion tokens never fewer than the content chunks the client received, and
// every prompt token at the input price.
func (m *meter) apply(ev *usage.Event, prices money.Prices) error {
	ev.FinishReason = clip(m.finish, usage.MaxFinishReasonLen/2) // the backend's: "stop", "length"…
	if !m.firstContent.IsZero() {
		ev.TTFTMillis = max(1, m.firstContent.Sub(ev.StartedAt).Milliseconds())
	}
	// A malformed report is dropped, and the answer is billed as if none had come: estimated.
	_, usageErr := m.current()
	if usageErr != nil {
		usageErr = fmt.Errorf("backend usage: %w", usageErr)
	}
	exact := m.haveUsage && m.complete
	if m.haveUsage && !m.complete && m.exactPerChunk && m.choiceRaw != nil && !m.cachedTokens {
		_, all, err := m.sumChoices()
		exact = err == nil && all
	}
	switch {
	case exact:
		ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens = m.usage.PromptTokens, m.usage.PromptTokensDetails.CachedTokens, m.usage.CompletionTokens
		// Continuous usage can lag a chunk behind what was delivered; never bill fewer
		// completion tokens than content chunks the client received.
		if !m.complete && m.chunks > ev.CompletionTokens {
			ev.CompletionTokens = m.chunks
		}
	case m.billable:
		ev.Estimated = true
		ev.PromptTokens = m.usage.PromptTokens
		if !m.haveUsage {
			ev.PromptTokens = 0
		}
		if m.complete {
			ev.CachedTokens = m.usage.PromptTokensDetails.CachedTokens
		}
		if ev.PromptTokens == 0 && m.promptEstimate != nil {
			ev.PromptTokens = m.promptEstimate()
		}
		ev.CompletionTokens = m.chunks
		if m.haveUsage {
			ev.CompletionTokens = max(m.usage.CompletionTokens, m.chunks)
		}
	default:
		return usageErr // nothing was generated: the event is free
	}
	cost, err := prices.Cost(ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens)
	if err != nil {
		return errors.Join(usageErr, err)
	}
	ev.Cost = cost
	return usageErr
}

// estimatePromptTokens guesses a prompt's tokens when a request ends before the backend reported
// usage (a client that left, a backend that broke, on a backend without continuous usage). The
// rule: one token per whitespace-separated word of the text (every message's string content and
// text parts for chat; every prompt of a completions request), one per token id, and nothing for
// the chat template. That is the simulator's count exactly, and a lower bound for real
// tokenizers, whose pre-tokenizers split at whitespace before merging, so that every word is at
// least one token: for English a real count runs about a quarter higher (a word is 1.3 tokens on
// average, and a chat template adds a few tokens per message), for text without spaces (Chinese,
// Japanese) far higher. An estimate never bills the customer for tokens the gateway cannot show;
// such events are marked estimated.
func estimatePromptTokens(chat bool, body []byte) int64 {
	var r struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if json.Unmarshal(body, &r) != nil {
		return 0
	}
	words := func(s string) int64 { return int64(len(strings.Fields(s))) }
	textTokens := func(raw json.RawMessage) int64 {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return words(s)
		}
		var parts []json.RawMessage
		if json.Unmarshal(raw, &parts) != nil {
			return 0
		}
		var n int64
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			var num json.Number
			switch {
			case json.Unmarshal(p, &num) == nil:
				n++ // a token id
			case json.Unmarshal(p, &s) == nil:
				n += words(s)
			case json.Unmarshal(p, &part) == nil && part.Text != nil:
				n += words(*part.Text)
			default:
				var ids []json.Number
				if json.Unmarshal(p, &ids) == nil {
					n += int64(len(ids))
				}
			}
		}
		return n
	}
	if !chat {
		return textTokens(r.Prompt)
	}
	var n int64
	for _, m := range r.Messages {
		n += textTokens(m.Content)
	}
	return n
}
