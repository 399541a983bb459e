package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "github.com/redislock/redislock-go"
)

func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6390"})
	locks := redislock.New(rdb)
	defer locks.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lock, err := locks.Lock(ctx, "stock:sku-1", redislock.WithTTL(10*time.Second))
	switch {
	case errors.Is(err, redislock.ErrCancelled):
		fmt.Println("gave up waiting") // ctx ended: nothing is held
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer lock.Release(context.Background())
	// Work under lock.Context(): it is cancelled the moment the lock is
	// lost, with a *LostError as its cause.
	fmt.Println("fence", lock.Fence(), context.Cause(lock.Context()))
}

func ExampleRWMutex() {
	locks := redislock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6390"}))
	rw := locks.RWMutex("config")
	r, err := rw.RLock(context.Background())
	if err != nil {
		return
	}
	if _, err := rw.Lock(context.Background()); errors.Is(err, redislock.ErrUpgrade) {
		fmt.Println("release the read side before asking for the write side")
	}
	_ = r.Release(context.Background())
}
