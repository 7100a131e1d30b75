package base

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// The leader context must be found cancelled once the lease has ended even
// when the timer that cancels it has not fired yet (a loaded machine, a
// process woken from SIGSTOP): its Err compares the clock with the lease.
func TestLeaseContextErrChecksTheClock(t *testing.T) {
	c := newLeaseContext(time.Now().Add(time.Hour))
	if err := c.Err(); err != nil {
		t.Fatalf("Err() = %v during the lease", err)
	}
	if !c.extend(time.Now().Add(-time.Millisecond)) { // the lease now ended a moment ago
		t.Fatal("extend refused during the lease")
	}
	if err := c.Err(); err != context.Canceled {
		t.Fatalf("Err() = %v after the lease ended, want context.Canceled", err)
	}
	if cause := context.Cause(c); cause != ErrLeaseExpired {
		t.Fatalf("Cause = %v after the lease ended, want ErrLeaseExpired", cause)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done() not closed after Err() found the lease over")
	}
}

// A renewal whose reply comes after the lease ended must not revive the
// context: extend refuses, so the loop steps down.
func TestLeaseContextExtendAfterTheEnd(t *testing.T) {
	c := newLeaseContext(time.Now().Add(-time.Millisecond))
	if c.extend(time.Now().Add(time.Hour)) {
		t.Fatal("extend revived a lease that had ended")
	}
	if c.Err() == nil {
		t.Fatal("context live after a refused extend")
	}
	c2 := newLeaseContext(time.Now().Add(time.Hour))
	c2.cancel(nil)
	if c2.extend(time.Now().Add(time.Hour)) {
		t.Fatal("extend revived a cancelled context")
	}
}

// The lease timer of the old end can fire after a renewal extended the
// lease and before the loop re-armed the timer for the new end: it must
// leave the extended lease alone.
func TestLeaseTimerAfterAnExtension(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		leaseLost := make(chan struct{}, 1)
		l := &loop{box: mailbox.New(func(in input) {
			if _, ok := in.(leaseMsg); ok {
				leaseLost <- struct{}{}
			}
		}, nil, nil)}
		end := time.Now().Add(100 * time.Millisecond)
		c := newLeaseContext(end)
		l.armLease(c, end)
		if !c.extend(end.Add(time.Second)) {
			t.Fatal("extend refused during the lease")
		}
		time.Sleep(200 * time.Millisecond) // the old timer fires; no re-arm yet
		synctest.Wait()
		if err := c.Err(); err != nil {
			t.Fatalf("the old timer ended the extended lease: %v (cause %v)", err, context.Cause(c))
		}
		select {
		case <-leaseLost:
			t.Fatal("the old timer reported the extended lease lost")
		default:
		}
		l.armLease(c, end.Add(time.Second))
		time.Sleep(time.Second)
		synctest.Wait()
		if context.Cause(c) != ErrLeaseExpired {
			t.Fatalf("after the new end: cause %v, want ErrLeaseExpired", context.Cause(c))
		}
		select {
		case <-leaseLost:
		default:
			t.Fatal("the re-armed timer did not report the lease lost")
		}
	})
}
