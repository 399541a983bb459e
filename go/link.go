package redislock

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
)

// A link is a connection of its own to one server, used where the shared
// pool must not be: a parked WAIT (it would block everything pipelined
// behind it), an ephemeral hold (bound to its connection for the hold's
// life), and every acquisition, so that a grant whose reply may have
// crossed a cancel is released on the very connection that asked for it.
//
// A reader goroutine takes replies off the socket as they come and hands
// them to the requests in order; when the socket closes it fires closed at
// once, which is how an ephemeral hold learns of its loss within
// milliseconds instead of at its next renewal.

// Endpoint says how to open a link to the server that serves a key.
type Endpoint struct {
	// Addr is the server's address ("host:port"); a redirection replaces it.
	Addr string
	// Dial opens the raw connection (TLS included) to addr.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Username and Password, when set, are sent with AUTH; DB with SELECT.
	Username, Password string
	DB                 int
}

type reply struct {
	v   any
	err error
}

var errLinkClosed = errors.New("redislock: connection closed")

type link struct {
	nc   net.Conn
	ep   Endpoint
	id   string // CLIENT ID, for CLIENT UNBLOCK from another connection
	wmu  sync.Mutex
	w    *bufio.Writer
	qmu  sync.Mutex
	q    []chan reply
	dead bool
	err  error
	// closed is closed once the connection is gone (either side closed it).
	closed chan struct{}
}

// openLink dials ep, authenticates, selects the database and learns the
// connection's id, all in one round trip.
func openLink(ctx context.Context, ep Endpoint) (*link, error) {
	nc, err := ep.Dial(ctx, ep.Addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, cancelled(ctx.Err())
		}
		return nil, transportError(err)
	}
	l := &link{nc: nc, ep: ep, w: bufio.NewWriter(nc), closed: make(chan struct{})}
	go l.readLoop(bufio.NewReaderSize(nc, 4096))
	var setup [][]string
	if ep.Password != "" {
		if ep.Username != "" {
			setup = append(setup, []string{"AUTH", ep.Username, ep.Password})
		} else {
			setup = append(setup, []string{"AUTH", ep.Password})
		}
	}
	if ep.DB != 0 {
		setup = append(setup, []string{"SELECT", strconv.Itoa(ep.DB)})
	}
	setup = append(setup, []string{"CLIENT", "ID"})
	chans := make([]chan reply, len(setup))
	for i, args := range setup {
		chans[i] = l.send(args...)
	}
	for _, ch := range chans {
		select {
		case r := <-ch:
			if r.err == nil {
				if e, ok := r.v.(ServerError); ok {
					r.err = e
				}
			}
			if r.err != nil {
				l.close()
				return nil, transportError(r.err)
			}
			if n, ok := r.v.(int64); ok {
				l.id = strconv.FormatInt(n, 10)
			}
		case <-ctx.Done():
			l.close()
			return nil, cancelled(ctx.Err())
		}
	}
	return l, nil
}

// send writes one command; its reply (or the connection's failure) comes
// on the returned channel, which is buffered so nobody need read it.
func (l *link) send(args ...string) chan reply {
	ch := make(chan reply, 1)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.qmu.Lock()
	if l.dead {
		l.qmu.Unlock()
		ch <- reply{err: transportError(errLinkClosed)}
		return ch
	}
	l.q = append(l.q, ch)
	l.qmu.Unlock()
	if err := writeCommand(l.w, args); err != nil {
		l.fail(err)
	}
	return ch
}

// do sends a command and waits for its reply or the context's end. An
// error reply comes back as a ServerError error.
func (l *link) do(ctx context.Context, args ...string) (any, error) {
	select {
	case r := <-l.send(args...):
		return r.result()
	case <-ctx.Done():
		return nil, cancelled(ctx.Err())
	}
}

func (r reply) result() (any, error) {
	if r.err != nil {
		return nil, r.err
	}
	if e, ok := r.v.(ServerError); ok {
		return nil, e
	}
	return r.v, nil
}

func (l *link) readLoop(r *bufio.Reader) {
	for {
		v, err := readReply(r)
		if err != nil {
			l.fail(err)
			return
		}
		l.qmu.Lock()
		if len(l.q) == 0 {
			// A reply nobody asked for: the stream is out of step.
			l.qmu.Unlock()
			l.fail(errProtocol)
			return
		}
		ch := l.q[0]
		l.q[0] = nil
		l.q = l.q[1:]
		l.qmu.Unlock()
		ch <- reply{v: v}
	}
}

// fail marks the link dead, closes the socket and answers every request
// still waiting with the failure.
func (l *link) fail(err error) {
	l.qmu.Lock()
	if l.dead {
		l.qmu.Unlock()
		return
	}
	l.dead = true
	l.err = err
	q := l.q
	l.q = nil
	l.qmu.Unlock()
	_ = l.nc.Close()
	close(l.closed)
	for _, ch := range q {
		ch <- reply{err: transportError(err)}
	}
}

func (l *link) close() { l.fail(errLinkClosed) }

func (l *link) isDead() bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.dead
}

// busy says whether replies are still awaited (the link is not reusable).
func (l *link) busy() bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return len(l.q) > 0
}
