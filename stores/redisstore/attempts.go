package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores"
)

// A script that a client sends again after an attempt that reached Redis
// and failed (a connection reset, a lost reply) may have run, whatever the
// last attempt's error says: when that is a refused connection, the call
// did change something, and must not be reported as stores.ErrUnreachable.
// go-redis retries inside one call and tells nobody about the attempts, so
// on a client that can run a single attempt (Process, with a command that
// asks for no retry) the Store makes the attempts itself, as go-redis would
// (MaxRetries, MinRetryBackoff, MaxRetryBackoff), and knows whether any of
// them may have reached Redis. The scripts are idempotent for a retry: a key
// that holds the caller's token is its own grant.

// processor is a client that runs a command it is given; every go-redis
// client and UniversalClient is one.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// retryPolicy is how the Store retries a script attempt that got no reply.
type retryPolicy struct {
	max        int           // retries after the first attempt
	minBackoff time.Duration // before the first retry; doubled each time
	maxBackoff time.Duration
}

// retryPolicyOf returns the client's own retry settings, as go-redis
// normalised them, or go-redis's defaults for a client that does not say.
func retryPolicyOf(client redis.Scripter) retryPolicy {
	p := retryPolicy{max: 3, minBackoff: 8 * time.Millisecond, maxBackoff: 512 * time.Millisecond}
	set := func(retries int, minB, maxB time.Duration) {
		p.max = max(retries, 0)
		p.minBackoff, p.maxBackoff = max(minB, 0), max(maxB, 0)
	}
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		set(o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff)
	case *redis.ClusterClient:
		// A Cluster client retries a command on its nodes up to
		// MaxRedirects times; its nodes' clients do not retry.
		o := c.Options()
		set(o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff)
	case *redis.Ring:
		o := c.Options()
		set(o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff)
	}
	return p
}

// backoff returns the sleep before retry number n (0 for the first), with
// jitter.
func (p retryPolicy) backoff(n int) time.Duration {
	if p.minBackoff == 0 {
		return 0
	}
	d := p.minBackoff << min(n, 20)
	if d <= 0 || d > p.maxBackoff {
		d = p.maxBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// oneAttempt is a Scripter whose every command is sent once: go-redis does
// not retry it, so the Store counts its attempts.
type oneAttempt struct{ p processor }

// singleCmd is a script command that go-redis sends at most once.
type singleCmd struct{ *redis.Cmd }

func (singleCmd) NoRetry() bool { return true }

func (o oneAttempt) do(ctx context.Context, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	_ = o.p.Process(ctx, singleCmd{cmd})
	return cmd
}

func scriptArgs(name, script string, keys []string, args []any) []any {
	all := make([]any, 0, 3+len(keys)+len(args))
	all = append(all, name, script, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	return append(all, args...)
}

func (o oneAttempt) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return o.do(ctx, scriptArgs("eval", script, keys, args)...)
}

func (o oneAttempt) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return o.do(ctx, scriptArgs("evalsha", sha1, keys, args)...)
}

func (o oneAttempt) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return o.do(ctx, scriptArgs("eval_ro", script, keys, args)...)
}

func (o oneAttempt) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return o.do(ctx, scriptArgs("evalsha_ro", sha1, keys, args)...)
}

func (o oneAttempt) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	args := make([]any, 0, 2+len(hashes))
	args = append(args, "script", "exists")
	for _, h := range hashes {
		args = append(args, h)
	}
	cmd := redis.NewBoolSliceCmd(ctx, args...)
	_ = o.p.Process(ctx, cmd)
	return cmd
}

func (o oneAttempt) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, "script", "load", script)
	_ = o.p.Process(ctx, cmd)
	return cmd
}

var _ redis.Scripter = oneAttempt{}

// attempts runs script, retrying an attempt that got no reply from Redis as
// the client's own settings say, and reports whether any attempt may have
// reached Redis. On a client that cannot run a single attempt, the client
// retries by itself, and an attempt before the last may have reached Redis
// whatever the last one's error: reached is then true for every failure.
func (g *goRedis) attempts(ctx context.Context, script *Script, keys []string, args []any) (cmd *redis.Cmd, reached bool) {
	if g.single == nil {
		return runScript(ctx, g.client, script, keys, args), true
	}
	for n := 0; ; n++ {
		cmd = runScript(ctx, g.single, script, keys, args)
		err := cmd.Err()
		reached = reached || !neverSent(err)
		if err == nil || n >= g.retry.max || !retryable(err) || ctx.Err() != nil {
			return cmd, reached
		}
		if d := g.retry.backoff(n); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return cmd, reached
			}
		}
	}
}

// runScript runs script on c as redis.Script.Run does: EVALSHA, then EVAL
// when Redis has not cached the script.
func runScript(ctx context.Context, c redis.Scripter, script *Script, keys []string, args []any) *redis.Cmd {
	cmd := c.EvalSha(ctx, script.sha, keys, args...)
	// HasErrorPrefix allocates even for a nil error: check that first.
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return c.Eval(ctx, script.src, keys, args...)
	}
	return cmd
}

// neverSent reports whether err says that the attempt never reached Redis:
// no connection could be dialled, or none came free from the pool in time.
func neverSent(err error) bool {
	var op *net.OpError
	return err != nil && ((errors.As(err, &op) && op.Op == "dial") || errors.Is(err, redis.ErrPoolTimeout))
}

// retryable reports whether an attempt that failed with err is worth
// another, as go-redis would judge it: Redis did not answer (a connection
// reset, a timeout, a refused dial), or answered that it cannot serve yet
// (LOADING, READONLY after a failover, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, a
// full client table). A call whose context ended is not.
func retryable(err error) bool {
	if neverSent(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		msg := reply.Error()
		for _, p := range []string{"LOADING ", "READONLY ", "CLUSTERDOWN ", "TRYAGAIN ", "MASTERDOWN ", "ERR max number of clients reached"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// unreachable wraps err with stores.ErrUnreachable: the call never reached
// Redis, so it changed nothing and there is nothing to clean up after it.
func unreachable(err error) error {
	if errors.Is(err, stores.ErrUnreachable) {
		return err
	}
	return fmt.Errorf("%w: %w", stores.ErrUnreachable, err)
}
