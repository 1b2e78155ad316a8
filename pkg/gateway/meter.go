package gateway

import (
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/usage"
)

// meter follows what a request consumed. Usage from the backend is cumulative: the latest
// report replaces the one before, so nothing is ever summed twice.
type meter struct {
	usage     openai.Usage
	raw       []byte // the latest usage object as sent, parsed into usage only when needed
	haveUsage bool   // the backend reported usage at least once
	complete  bool   // that report covers the whole answer (final usage chunk, or a complete body)

	exactPerChunk bool  // the backend reports usage on every chunk (continuous usage)
	chunks        int64 // chunks carrying generated content that reached the client
	billable      bool  // the backend worked on the request, so a partial answer costs something
	finish        string

	// promptEstimate guesses the prompt's tokens when the backend never said; set lazily.
	promptEstimate func() int64
}

// observe keeps a usage object a chunk carried. Continuous usage comes on every chunk, so it is
// copied, not parsed: only the last one counts.
func (m *meter) observe(raw []byte) {
	m.raw = append(m.raw[:0], raw...)
	m.haveUsage = true
}

// current returns the latest usage, parsing what observe kept.
func (m *meter) current() (openai.Usage, error) {
	if m.raw != nil {
		u, ok, err := openai.ParseUsage(m.raw)
		if err != nil || !ok {
			m.haveUsage, m.raw = false, nil
			if err == nil {
				err = errors.New("usage is null")
			}
			return openai.Usage{}, err
		}
		m.usage, m.raw = u, nil
	}
	return m.usage, nil
}

// apply writes tokens, cost and finish reason into the event.
func (m *meter) apply(ev *usage.Event, prices money.Prices) error {
	ev.FinishReason = clip(m.finish, usage.MaxFinishReasonLen/2) // the backend's: "stop", "length"…
	// A malformed report is dropped, and the answer is billed as if none had come: estimated.
	_, usageErr := m.current()
	if usageErr != nil {
		usageErr = fmt.Errorf("backend usage: %w", usageErr)
	}
	switch {
	case m.haveUsage && (m.complete || m.exactPerChunk):
		ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens = m.usage.PromptTokens, m.usage.CachedTokens, m.usage.CompletionTokens
		// Continuous usage can lag a chunk behind what was delivered; never bill fewer
		// completion tokens than content chunks the client received.
		if !m.complete && m.chunks > ev.CompletionTokens {
			ev.CompletionTokens = m.chunks
		}
	case m.billable:
		ev.Estimated = true
		ev.PromptTokens, ev.CachedTokens = m.usage.PromptTokens, m.usage.CachedTokens
		if ev.PromptTokens == 0 && m.promptEstimate != nil {
			ev.PromptTokens = m.promptEstimate()
		}
		ev.CompletionTokens = max(m.usage.CompletionTokens, m.chunks)
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
