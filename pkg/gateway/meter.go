package gateway

import (
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/usage"
)

// meter follows what a request consumed. Usage from the backend is cumulative: the latest
// report replaces the one before, so nothing is ever summed twice.
type meter struct {
	usage     openai.Usage
	haveUsage bool // the backend reported usage at least once
	complete  bool // that report covers the whole answer (final usage chunk, or a complete body)

	exactPerChunk bool  // the backend reports usage on every chunk (continuous usage)
	chunks        int64 // chunks carrying generated content that reached the client
	billable      bool  // the backend worked on the request, so a partial answer costs something
	finish        string

	// promptEstimate guesses the prompt's tokens when the backend never said; set lazily.
	promptEstimate func() int64
}

// apply writes tokens, cost and finish reason into the event.
func (m *meter) apply(ev *usage.Event, prices money.Prices) error {
	ev.FinishReason = m.finish
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
		return nil // nothing was generated: the event is free
	}
	cost, err := prices.Cost(ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens)
	if err != nil {
		return err
	}
	ev.Cost = cost
	return nil
}
