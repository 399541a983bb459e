// Package redislock is the Go client of the redislock module: distributed
// locks kept inside redis-server (LOCK.ACQUIRE, LOCK.RELEASE, ...), with a
// wait served first come first served by the server, fences, a watchdog
// that renews the lease, and a context cancelled the moment a lock is lost.
//
//	locks := redislock.New(rdb) // rdb: a go-redis v9 client
//	lock, err := locks.Lock(ctx, "stock:sku-1")
//	if err != nil {
//		return err // ErrTimedOut, ErrCancelled, ErrTransport, ...
//	}
//	defer lock.Release(context.Background())
//	work := lock.Context() // cancelled if the lock is lost
//	return store.Write(work, item, lock.Fence())
//
// Layout:
//
//	client.go   Client: acquisitions on connections of its own, the wait, cancel clean-up
//	lock.go     Lock: the lease deadline, the loss signal, the watchdog, renew and release
//	handles.go  Handle (one owner, reentrant), RWMutex, Semaphore, Resume, sync.Locker
//	redlock.go  Redlock: a majority of independent servers and the fence round
//	backend.go  Backend: where a key's server is (go-redis v9 single, Sentinel, Cluster)
//	link.go     a connection of its own: replies in order, its close noticed at once
//	resp.go     the RESP2 reader and writer those connections use
//	options.go  Option, the lease's drift margin and renewal timing
//	errors.go   the sentinel errors and LostError
//
// Every lock command runs on a connection of the client's own (kept in a
// small pool), never on go-redis's shared pool: a parked WAIT would block
// whatever is pipelined behind it there, a cancelled call must release a
// grant that crossed its cancel on the very connection that asked, and an
// ephemeral hold must notice its connection closing within milliseconds.
// go-redis supplies the topology, the dialer (TLS included) and the
// credentials.
package redislock
