package gateway

import (
	"context"
	"errors"

	"github.com/neocloud/kiln/pkg/usage"
)

// deadlinePassed answers, and reports true for, a backend call that the request's own deadline
// (ctx is the backend context: the deadline less the settle reserve, see backendContext) ended
// before anything reached the client: 503 deadline_exceeded, and the usage event says so. A
// deadline that had passed before the request started (shorter than the reserve) means the
// backend was never called, and the message says that. A client that left is not a deadline.
func (x *exchange) deadlinePassed(ctx context.Context) bool {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || x.requestCtxDone() {
		return false
	}
	dl, _ := ctx.Deadline()
	x.event.Status = usage.StatusDeadlineExceeded
	x.fail(errDeadline(!dl.After(x.event.StartedAt)))
	return true
}
