package redislock

import (
	"errors"
	"fmt"
	"strings"
)

// The errors every call returns, for errors.Is. Their names are the ones
// every client of the project uses.
var (
	// ErrNotObtained: a try found the lock held (or others waiting for it).
	ErrNotObtained = errors.New("redislock: not obtained: the lock is held by another owner")
	// ErrTimedOut: a wait bounded by WithWait ran out before the grant.
	ErrTimedOut = errors.New("redislock: timed out waiting for the lock")
	// ErrNotOwner: the server says this owner does not hold the lock.
	ErrNotOwner = errors.New("redislock: not the owner of the lock")
	// ErrLost: the hold was lost; the *LostError carrying it says why.
	ErrLost = errors.New("redislock: the lock was lost")
	// ErrUpgrade: a reader asked for the write side of its own lock. An
	// upgrade deadlocks against another reader upgrading, so it is refused
	// at once: release the read side first.
	ErrUpgrade = errors.New("redislock: upgrade refused: the owner holds the lock shared")
	// ErrLimitMismatch: a semaphore asked with another limit than the one
	// the lock is shared with (or a request waiting on it asked with).
	ErrLimitMismatch = errors.New("redislock: the lock is shared with another limit")
	// ErrQuarantine: the server begins no hold during its quarantine (after
	// a start or a promotion); try again later.
	ErrQuarantine = errors.New("redislock: the server is in quarantine: try again")
	// ErrCancelled: the context ended before the call completed. Nothing
	// is held; the error also wraps the context's own error.
	ErrCancelled = errors.New("redislock: cancelled")
	// ErrRefused: the client refuses the combination of options before
	// sending anything (an ephemeral Redlock, a zero lease, ...).
	ErrRefused = errors.New("redislock: refused")
	// ErrTransport: a connection or I/O failure, or a reply the client did
	// not expect; it wraps the underlying error.
	ErrTransport = errors.New("redislock: transport")
	// ErrModuleMissing: the server does not know the LOCK.* commands.
	ErrModuleMissing = errors.New("redislock: the server does not know LOCK.* commands: load the module")
)

// LossReason says how a hold was lost.
type LossReason string

const (
	// ReasonExpired: the local lease deadline passed without a renew
	// confirming the hold (server paused or unreachable, watchdog off).
	ReasonExpired LossReason = "expired"
	// ReasonNotOwner: the server answered that this owner no longer holds
	// the lock (or the key now holds another type).
	ReasonNotOwner LossReason = "not-owner"
	// ReasonDisconnected: an ephemeral hold's own connection closed, and
	// the server ended the hold with it.
	ReasonDisconnected LossReason = "disconnected"
	// ReasonReleaseUnconfirmed: a release did not complete; it is retried
	// in the background until it lands or the lease ends.
	ReasonReleaseUnconfirmed LossReason = "release-unconfirmed"
)

// LostError is the error of a lost hold. errors.Is(err, ErrLost) is true
// for it, and a reason's sentinel (ErrNotOwner for ReasonNotOwner) too.
type LostError struct {
	Reason LossReason
}

func (e *LostError) Error() string {
	return "redislock: the lock was lost: " + string(e.Reason)
}

// Is makes errors.Is(err, ErrLost) hold for every loss.
func (e *LostError) Is(target error) bool {
	return target == ErrLost || (target == ErrNotOwner && e.Reason == ReasonNotOwner)
}

// transportError wraps a connection failure so that errors.Is(err,
// ErrTransport) holds and the cause stays reachable.
func transportError(err error) error {
	if err == nil || errors.Is(err, ErrTransport) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrTransport, err)
}

// cancelled is the error of a call whose context ended.
func cancelled(cause error) error {
	return fmt.Errorf("%w: %w", ErrCancelled, cause)
}

// ServerError is an error reply (-PREFIX text) from the server.
type ServerError string

func (e ServerError) Error() string { return string(e) }

// prefix is the reply's first word (NOTOWNER, ERR, MOVED, ...).
func (e ServerError) prefix() string {
	s := string(e)
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return s
}

// mapServerError sorts an error reply into the sentinels callers act on.
func mapServerError(e ServerError) error {
	s := string(e)
	switch e.prefix() {
	case "NOTOWNER":
		return ErrNotOwner
	case "WRONGTYPE":
		return fmt.Errorf("%w: %s", ErrNotOwner, s)
	}
	switch {
	case strings.Contains(s, "holds the lock shared"):
		return ErrUpgrade
	case strings.Contains(s, "another LIMIT"):
		return ErrLimitMismatch
	case strings.Contains(s, "unknown command") && strings.Contains(strings.ToUpper(s), "LOCK."):
		return ErrModuleMissing
	}
	return transportError(e)
}
