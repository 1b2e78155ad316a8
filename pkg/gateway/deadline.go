package gateway

import (
	"context"
	"errors"

	"github.com/neocloud/kiln/pkg/usage"
)

// deadlineError is the error of a backend call that the request's own deadline (ctx is the
// backend context: the deadline less the settle reserve, see forward) ended before
// anything reached the client: 503 deadline_exceeded, and the usage event says so; nil when the
// deadline did not end it. A deadline that had passed before the request started (shorter than
// the reserve) means the backend was never called, and the message says that. A client that
// left is not a deadline.
func (x *exchange) deadlineError(ctx context.Context) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || x.requestCtxDone() {
		return nil
	}
	dl, _ := ctx.Deadline()
	x.event.Status = usage.StatusDeadlineExceeded
	return errDeadline(!dl.After(x.admitted.StartedAt))
}
