package gateway

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// settlerIdle is how long a settler waits for more work before it exits.
const settlerIdle = 10 * time.Second

// maxIdleSettlers is how many settlers wait for work at most: those a burst started beyond it (a
// thousand streams cut at once, or a store that stalled under load) exit as soon as they are done,
// rather than hold their stacks for settlerIdle.
const maxIdleSettlers = 64

// settlers run background settlements on goroutines that outlive one request, so that
// settlements run on a stack already grown to what they need: a new goroutine starts on a
// smaller one, and growing it (a copy of the stack) was 2 % of the gateway's CPU under load.
//
// Work goes to the settler that became idle last. Under steady load the same few settlers then
// do it all, and those a burst started wait in vain and exit after idleFor; handed out in turn,
// each would get work often enough never to exit.
type settlers struct {
	idleFor time.Duration
	maxIdle int
	mu      sync.Mutex
	idle    []*settler // waiting for work, the one that became idle last at the end
	started atomic.Int64
	live    atomic.Int64
}

type settler struct {
	work chan *exchange // capacity 1: whoever takes the settler off idle sends it one exchange
}

// run settles x in the background.
func (p *settlers) run(x *exchange) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		s.work <- x
		return
	}
	p.mu.Unlock()
	p.started.Add(1)
	p.live.Add(1)
	go p.loop(x)
}

// loop is a settler: it settles x, then what run hands it, until it has been idle for idleFor.
func (p *settlers) loop(x *exchange) {
	defer p.live.Add(-1)
	s := &settler{work: make(chan *exchange, 1)}
	idle := time.NewTimer(p.idleFor)
	defer idle.Stop()
	for {
		g := x.g
		x.settle(x.reqCtx)
		x = nil // not kept while idle
		g.settling.Add(-1)
		p.mu.Lock()
		if len(p.idle) >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, s)
		p.mu.Unlock()
		idle.Reset(p.idleFor)
		select {
		case x = <-s.work:
		case <-idle.C:
			if p.leave(s) {
				return
			}
			x = <-s.work // run took it as it timed out: its work is on the way
		}
	}
}

// leave takes s off the idle list; false when run took it first.
func (p *settlers) leave(s *settler) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Those that time out have been idle longest: they are at the front.
	if i := slices.Index(p.idle, s); i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
		return true
	}
	return false
}
