package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/bench/internal/plainshop"
	"github.com/reqlock/reqlock/bench/internal/redislockshop"
	"github.com/reqlock/reqlock/bench/internal/redisstats"
)

// addDelta adds d to into.
func addDelta(into, d map[string]int64) {
	for k, v := range d {
		into[k] += v
	}
}

// commandCount sums the calls of d.
func commandCount(d map[string]int64) int64 {
	var n int64
	for k, v := range d {
		if !redisstats.IsUsec(k) {
			n += v
		}
	}
	return n
}

// stockCmd queues on c (a client or a pipeline) the read of the stock of sku, as a service keeps it.
type stockCmd func(ctx context.Context, c redis.Cmdable, sku string) *redis.StringCmd

// hashStock reads the stock where the example and redislockshop keep it:
// the field stock of the hash inventory:sku:<id>.
func hashStock(ctx context.Context, c redis.Cmdable, sku string) *redis.StringCmd {
	return c.HGet(ctx, redislockshop.StockPrefix+sku, "stock")
}

// plainStock reads the stock where plainshop keeps it: the string
// plain:stock:<id>.
func plainStock(ctx context.Context, c redis.Cmdable, sku string) *redis.StringCmd {
	return c.Get(ctx, plainshop.StockPrefix+sku)
}

// stockMismatches reads the stock of every SKU of t and returns those that
// differ from initial less their 200 answers, as "sku: got N, want M",
// and how many SKUs are below that by no more than their 5xx answers (a
// deduction may have landed before its answer timed out): those are not
// mismatches.
func stockMismatches(ctx context.Context, c *redis.Client, t *target, initial int64) (bad []string, unsure int, err error) {
	cmds := make([]*redis.StringCmd, len(t.skus))
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, sku := range t.skus {
			cmds[i] = t.stock(ctx, p, sku)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("reading the stock: %w", err)
	}
	for i, cmd := range cmds {
		got := initial
		if s, err := cmd.Result(); err == nil {
			if got, err = strconv.ParseInt(s, 10, 64); err != nil {
				return nil, 0, fmt.Errorf("stock of %s: %q: %w", t.skus[i], s, err)
			}
		} else if !errors.Is(err, redis.Nil) {
			return nil, 0, fmt.Errorf("stock of %s: %w", t.skus[i], err)
		}
		want := initial - t.ok[i]
		switch {
		case got == want:
		case got < want && got >= want-t.unsure[i]:
			unsure++
		case t.unsure[i] > 0:
			bad = append(bad, fmt.Sprintf("%s: stock %d, want %d to %d (%d answers 5xx)", t.skus[i], got, want-t.unsure[i], want, t.unsure[i]))
		default:
			bad = append(bad, fmt.Sprintf("%s: stock %d, want %d", t.skus[i], got, want))
		}
	}
	return bad, unsure, nil
}

// deleteKeys deletes every key whose name contains marker.
func deleteKeys(ctx context.Context, c *redis.Client, marker string) (int, error) {
	n := 0
	iter := c.Scan(ctx, 0, "*"+marker+"*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.Del(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	return n, flush()
}
