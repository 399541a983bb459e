package redislock

import (
	"context"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"
)

// Backend is what the client needs from a Redis client library: where the
// server that serves a key is, and how to open a connection of its own to
// it. Every lock command then runs on such connections (kept in a small
// pool of idle ones), so that a wait never parks a shared connection and
// a cancelled call can clean up on the connection that asked. GoRedis is
// the go-redis v9 backend; another library plugs in the same way.
type Backend interface {
	// Endpoint: how to reach the master that serves key now.
	Endpoint(ctx context.Context, key string) (Endpoint, error)
	// Refresh is called after a MOVED redirection: the topology changed.
	Refresh(ctx context.Context)
}

// GoRedis adapts a go-redis v9 client: one server (*redis.Client), a
// Sentinel failover client (redis.NewFailoverClient, a *redis.Client whose
// dialer asks the Sentinels for the master) or a Cluster
// (*redis.ClusterClient). Its options (dialer and TLS, credentials,
// database) are used for the client's own connections.
func GoRedis(rdb redis.UniversalClient) Backend { return goRedis{rdb} }

type goRedis struct{ rdb redis.UniversalClient }

func (g goRedis) Endpoint(ctx context.Context, key string) (Endpoint, error) {
	switch c := g.rdb.(type) {
	case *redis.Client:
		return fromOptions(c.Options()), nil
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return Endpoint{}, transportError(err)
		}
		return fromOptions(m.Options()), nil
	}
	return Endpoint{}, fmt.Errorf("%w: %T is not supported (use a *redis.Client, a failover client or a *redis.ClusterClient)", ErrRefused, g.rdb)
}

func (g goRedis) Refresh(ctx context.Context) {
	if c, ok := g.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(ctx)
	}
}

func fromOptions(o *redis.Options) Endpoint {
	user, pass := o.Username, o.Password
	if o.CredentialsProvider != nil {
		user, pass = o.CredentialsProvider()
	}
	network, dial := o.Network, o.Dialer
	if network == "" {
		network = "tcp"
	}
	if dial == nil {
		dial = redis.NewDialer(o)
	}
	return Endpoint{
		Addr: o.Addr,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, network, addr)
		},
		Username: user,
		Password: pass,
		DB:       o.DB,
	}
}
