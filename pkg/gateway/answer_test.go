package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/neocloud/kiln/pkg/store"
)

// TestAnswerDecidesWhatAClientSees: the one door maps the store's refusals, however wrapped, to
// the contract's errors, keeps a gateway error as it is, and shows anything else as the generic
// 503, never with its own text.
func TestAnswerDecidesWhatAClientSees(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		known  bool
	}{
		{"gateway error", errModelNotFound("m"), http.StatusNotFound, "model_not_found", true},
		{"wrapped gateway error", fmt.Errorf("check: %w", errEmptyMessages), http.StatusBadRequest, "empty_array", true},
		{"plain 502", errBackendFailed, http.StatusBadGateway, "", true},
		{"unknown key", fmt.Errorf("key: %w", store.ErrNotFound), http.StatusUnauthorized, "invalid_api_key", true},
		{"revoked key", store.ErrKeyRevoked, http.StatusUnauthorized, "invalid_api_key", true},
		{"suspended", &admissionError{err: store.ErrSuspended}, http.StatusForbidden, "organization_suspended", true},
		{"no credits", &admissionError{err: fmt.Errorf("admit org: %w", store.ErrInsufficientCredits), reserve: 5}, http.StatusPaymentRequired, "insufficient_credits", true},
		{"slots full", &admissionError{err: store.ErrSlotsFull, limit: 3}, http.StatusTooManyRequests, "rate_limit_exceeded", true},
		// A limit's refusal means nothing without the figures its message quotes.
		{"slots full outside admission", store.ErrSlotsFull, http.StatusServiceUnavailable, "store_unavailable", false},
		{"admission backlog", &admissionError{err: errBacklog}, http.StatusServiceUnavailable, "store_unavailable", false},
		{"store failure", context.DeadlineExceeded, http.StatusServiceUnavailable, "store_unavailable", false},
		{"the generic 503 itself", errStoreDown, http.StatusServiceUnavailable, "store_unavailable", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := answer(tc.err)
			if e.status != tc.status || e.body.Code != tc.code {
				t.Errorf("answer(%v) = %d %q, want %d %q", tc.err, e.status, e.body.Code, tc.status, tc.code)
			}
			if got := known(tc.err); got != tc.known {
				t.Errorf("known(%v) = %v, want %v", tc.err, got, tc.known)
			}
			var ae *apiError
			if !errors.As(tc.err, &ae) && e.body.Message == tc.err.Error() {
				t.Errorf("the client sees the error's own text %q", e.body.Message)
			}
		})
	}
	if e := answer(&admissionError{err: store.ErrSlotsFull, limit: 3}); e.body.Message != errRateLimited(3).body.Message {
		t.Errorf("429 message %q does not quote the limit", e.body.Message)
	}
}
