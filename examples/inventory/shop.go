package main

// This file holds the framework-neutral shop: the stock stores (in memory and
// in Redis), the shop's operations, and the mapping of requests and errors to
// HTTP answers that every router file shares.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// Errors of the shop and its stock stores.
var (
	// ErrInsufficientStock means a deduction asked for more than the stock.
	ErrInsufficientStock = errors.New("insufficient stock")

	// ErrStaleFence means a fenced read or write carried a fence lower than
	// one the stock store already saw for the SKU: a newer lock holder has
	// been there, so this holder's lock was lost (its lease expired).
	ErrStaleFence = errors.New("stale fence")

	// errStockStore marks a failure of the stock store itself.
	errStockStore = errors.New("stock store failed")
)

// staleFenceError is ErrStaleFence for one SKU.
type staleFenceError struct {
	op         string // "read", "write" or "deduct"
	sku        string
	fence, saw int64
}

func (e *staleFenceError) Error() string {
	return fmt.Sprintf("%v: %s with fence %d, SKU %q already saw fence %d", ErrStaleFence, e.op, e.fence, e.sku, e.saw)
}

func (e *staleFenceError) Unwrap() error { return ErrStaleFence }

// shortItem is a SKU whose stock is below what a deduction asks for.
type shortItem struct {
	SKU   string `json:"sku"`
	Qty   int64  `json:"qty"`
	Stock int64  `json:"stock"`
}

// shortError is ErrInsufficientStock for the SKUs of a multi-SKU deduction
// that are short, in the deduction's order.
type shortError struct{ items []shortItem }

func (e *shortError) Error() string {
	var b strings.Builder
	b.WriteString(ErrInsufficientStock.Error())
	for i, it := range e.items {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%sSKU %q has %d, asked for %d", sep, it.SKU, it.Stock, it.Qty)
	}
	return b.String()
}

func (e *shortError) Unwrap() error { return ErrInsufficientStock }

// deduction is one SKU of a multi-SKU deduction: the quantity to take and
// the fence of the lock on the SKU (0: unfenced).
type deduction struct {
	SKU   string
	Qty   int64
	Fence int64
}

// stockStore keeps, per SKU, the stock and the highest fence that read it
// for an update or wrote it. Fence 0 means "no lock" (the -nolock baseline):
// such reads and writes are neither checked nor recorded.
type stockStore interface {
	// Read returns the stock of sku and whether it was ever set. With
	// fence > 0 it is a fenced read for an update: it fails with
	// ErrStaleFence when the stored fence is higher, else it records fence,
	// so that every holder older than this one can no longer write.
	Read(ctx context.Context, sku string, fence int64) (stock int64, found bool, err error)

	// Write sets the stock of sku. With fence > 0 it fails with
	// ErrStaleFence when the stored fence is higher than fence, else it
	// stores the stock and the fence in one atomic step. With fence 0 it
	// stores the stock unchecked.
	Write(ctx context.Context, sku string, stock, fence int64) error

	// DeductAll takes each deduction's Qty from its SKU, all of them or
	// none, in one atomic step; a SKU whose stock was never set has
	// defaultStock. The SKUs must be distinct. It fails, changing nothing,
	// with ErrStaleFence (a *staleFenceError) when the stored fence of any
	// SKU is higher than its deduction's Fence > 0, and with a *shortError
	// naming every SKU whose stock is below its Qty. Else it stores the new
	// stocks, records each Fence > 0, and returns the stocks left, in the
	// order of ds.
	DeductAll(ctx context.Context, ds []deduction, defaultStock int64) ([]int64, error)
}

// memStock is a stockStore in process memory, guarded by a mutex.
type memStock struct {
	mu   sync.Mutex
	skus map[string]*memRecord
}

// memRecord is one SKU of a memStock.
type memRecord struct {
	stock    int64
	hasStock bool
	fence    int64
}

// newMemStock returns an empty in-memory stock store.
func newMemStock() *memStock { return &memStock{skus: make(map[string]*memRecord)} }

// Read implements stockStore.
func (m *memStock) Read(_ context.Context, sku string, fence int64) (int64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.skus[sku]
	if fence > 0 {
		if rec == nil {
			rec = &memRecord{}
			m.skus[sku] = rec
		}
		if fence < rec.fence {
			return 0, false, &staleFenceError{"read", sku, fence, rec.fence}
		}
		rec.fence = fence
	}
	if rec == nil || !rec.hasStock {
		return 0, false, nil
	}
	return rec.stock, true, nil
}

// Write implements stockStore.
func (m *memStock) Write(_ context.Context, sku string, stock, fence int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.skus[sku]
	if rec == nil {
		rec = &memRecord{}
		m.skus[sku] = rec
	}
	if fence > 0 {
		if fence < rec.fence {
			return &staleFenceError{"write", sku, fence, rec.fence}
		}
		rec.fence = fence
	}
	rec.stock, rec.hasStock = stock, true
	return nil
}

// DeductAll implements stockStore: under the mutex, it checks every fence
// and every stock before it changes anything.
func (m *memStock) DeductAll(_ context.Context, ds []deduction, defaultStock int64) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stocks := make([]int64, len(ds))
	var short []shortItem
	for i, d := range ds {
		rec := m.skus[d.SKU]
		if rec == nil {
			rec = &memRecord{}
		}
		if d.Fence > 0 && d.Fence < rec.fence {
			return nil, &staleFenceError{"deduct", d.SKU, d.Fence, rec.fence}
		}
		stocks[i] = defaultStock
		if rec.hasStock {
			stocks[i] = rec.stock
		}
		if stocks[i] < d.Qty {
			short = append(short, shortItem{SKU: d.SKU, Qty: d.Qty, Stock: stocks[i]})
		}
	}
	if short != nil {
		return nil, &shortError{short}
	}
	for i, d := range ds {
		rec := m.skus[d.SKU]
		if rec == nil {
			rec = &memRecord{}
			m.skus[d.SKU] = rec
		}
		stocks[i] -= d.Qty
		rec.stock, rec.hasStock = stocks[i], true
		if d.Fence > 0 {
			rec.fence = d.Fence
		}
	}
	return stocks, nil
}

// redisStockPrefix is put in front of the SKU to name its Redis hash.
const redisStockPrefix = "inventory:sku:"

// redisReadScript is the fenced read: KEYS[1] is the SKU's hash, ARGV[1]
// the fence. It returns {ok, found, stock, storedFence}: ok is 0 when the
// stored fence is higher than ARGV[1]; found is 0 when the stock was never
// set.
var redisReadScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'stock', 'fence')
local fence = tonumber(ARGV[1])
local stored = tonumber(v[2]) or 0
if fence > 0 then
  if fence < stored then
    return {0, 0, 0, stored}
  end
  if fence > stored then
    redis.call('HSET', KEYS[1], 'fence', ARGV[1])
  end
end
if v[1] == false then
  return {1, 0, 0, stored}
end
return {1, 1, tonumber(v[1]), stored}
`)

// redisWriteScript is the fenced write: KEYS[1] is the SKU's hash, ARGV[1]
// the stock, ARGV[2] the fence. It returns {ok, storedFence}: ok is 0, and
// nothing is written, when the stored fence is higher than ARGV[2].
var redisWriteScript = redis.NewScript(`
local fence = tonumber(ARGV[2])
if fence > 0 then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0
  if fence < stored then
    return {0, stored}
  end
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'fence', ARGV[2])
  return {1, fence}
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1])
return {1, 0}
`)

// redisDeductAllScript is the multi-SKU fenced check-and-deduct: KEYS are
// the SKUs' hashes, ARGV[1] the default stock, then ARGV[2i] and ARGV[2i+1]
// the quantity and the fence of KEYS[i]. It checks every fence, then every
// stock, and changes nothing unless all pass. It returns {1, left...} with
// the stocks left in the order of KEYS; {0, i, storedFence} when the fence
// of KEYS[i] is stale; {2, i, stock, j, stock, ...} with every short SKU.
//
// Stocks and quantities stay decimal strings and are compared as such, and
// the deduction is HINCRBY, so that every int64 is exact (Lua numbers are
// doubles). Fences, at most the server clock in microseconds, fit a double.
var redisDeductAllScript = redis.NewScript(`
local function atLeast(a, b) -- a >= b, both non-negative decimal integers
  if #a ~= #b then return #a > #b end
  return a >= b
end
for i, key in ipairs(KEYS) do
  local fence = tonumber(ARGV[2*i+1])
  if fence > 0 then
    local stored = tonumber(redis.call('HGET', key, 'fence')) or 0
    if fence < stored then
      return {0, i, stored}
    end
  end
end
local stocks, short = {}, {}
for i, key in ipairs(KEYS) do
  stocks[i] = redis.call('HGET', key, 'stock')
  local stock = stocks[i] or ARGV[1]
  if not atLeast(stock, ARGV[2*i]) then
    short[#short+1] = i
    short[#short+1] = stock
  end
end
if #short > 0 then
  table.insert(short, 1, 2)
  return short
end
local left = {1}
for i, key in ipairs(KEYS) do
  if not stocks[i] then
    redis.call('HSET', key, 'stock', ARGV[1])
  end
  left[i+1] = redis.call('HINCRBY', key, 'stock', '-' .. ARGV[2*i])
  if tonumber(ARGV[2*i+1]) > 0 then
    redis.call('HSET', key, 'fence', ARGV[2*i+1])
  end
end
return left
`)

// redisStock is a stockStore in Redis: one hash per SKU with the fields
// stock and fence, read and written by Lua scripts so that the fence check
// and the update are one atomic step.
type redisStock struct {
	client redis.Scripter
}

// newRedisStock returns a stock store over client.
func newRedisStock(client redis.Scripter) *redisStock { return &redisStock{client: client} }

// Read implements stockStore.
func (s *redisStock) Read(ctx context.Context, sku string, fence int64) (int64, bool, error) {
	v, err := redisReadScript.Run(ctx, s.client, []string{redisStockPrefix + sku}, fence).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("%w: read %q: %w", errStockStore, sku, err)
	}
	if len(v) != 4 {
		return 0, false, fmt.Errorf("%w: read %q: script answered %v", errStockStore, sku, v)
	}
	if v[0] == 0 {
		return 0, false, &staleFenceError{"read", sku, fence, v[3]}
	}
	return v[2], v[1] == 1, nil
}

// Write implements stockStore.
func (s *redisStock) Write(ctx context.Context, sku string, stock, fence int64) error {
	v, err := redisWriteScript.Run(ctx, s.client, []string{redisStockPrefix + sku}, stock, fence).Int64Slice()
	if err != nil {
		return fmt.Errorf("%w: write %q: %w", errStockStore, sku, err)
	}
	if len(v) != 2 {
		return fmt.Errorf("%w: write %q: script answered %v", errStockStore, sku, v)
	}
	if v[0] == 0 {
		return &staleFenceError{"write", sku, fence, v[1]}
	}
	return nil
}

// DeductAll implements stockStore with redisDeductAllScript, one round
// trip. All the SKUs' hashes must live on one Redis server (no Cluster).
func (s *redisStock) DeductAll(ctx context.Context, ds []deduction, defaultStock int64) ([]int64, error) {
	keys := make([]string, len(ds))
	args := make([]any, 0, 1+2*len(ds))
	args = append(args, defaultStock)
	for i, d := range ds {
		keys[i] = redisStockPrefix + d.SKU
		args = append(args, d.Qty, d.Fence)
	}
	reply, err := redisDeductAllScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: deduct %d SKUs: %w", errStockStore, len(ds), err)
	}
	v, err := int64s(reply)
	bad := func() error {
		return fmt.Errorf("%w: deduct %d SKUs: script answered %v", errStockStore, len(ds), reply)
	}
	switch {
	case err != nil || len(v) == 0:
		return nil, bad()
	case v[0] == 0 && len(v) == 3 && v[1] >= 1 && v[1] <= int64(len(ds)):
		d := ds[v[1]-1]
		return nil, &staleFenceError{"deduct", d.SKU, d.Fence, v[2]}
	case v[0] == 1 && len(v) == 1+len(ds):
		return v[1:], nil
	case v[0] == 2 && len(v)%2 == 1:
		var short []shortItem
		for j := 1; j < len(v); j += 2 {
			if v[j] < 1 || v[j] > int64(len(ds)) {
				return nil, bad()
			}
			d := ds[v[j]-1]
			short = append(short, shortItem{SKU: d.SKU, Qty: d.Qty, Stock: v[j+1]})
		}
		return nil, &shortError{short}
	}
	return nil, bad()
}

// recordStock is a stockStore that also writes a request's idempotency
// record in the same atomic step as its deduction: redisStock, when the
// Locker's records live in the same Redis.
type recordStock interface {
	// DeductRecord is DeductAll that first checks that the record key of
	// rw holds the request's claim (else errClaimLost) and that each SKU's
	// stock is still before[i], as the request read it under its lock
	// (else errStockChanged), and that writes rw's record with the
	// deduction. Nothing changes unless all pass. When the record key
	// holds rw's record already (this deduction ran, and the client resent
	// it), it changes nothing and returns the stocks that deduction left.
	DeductRecord(ctx context.Context, ds []deduction, defaultStock int64, before []int64, rw redisstore.RecordWrite) ([]int64, error)
}

// Errors of DeductRecord; nothing changed.
var (
	// errClaimLost means the request's idempotency claim no longer held
	// its record key: it expired or was released, and a retry may run.
	errClaimLost = errors.New("the idempotency claim was lost")
	// errStockChanged means a SKU's stock changed after the request read
	// it under its lock: a writer without the lock was there.
	errStockChanged = errors.New("the stock changed since it was read")
)

// redisDeductRecordScript is redisDeductAllScript with the request's
// idempotency record, in one atomic step. KEYS are the SKUs' hashes, then
// the record key and its waiting key (redisstore.RecordWrite). ARGV[1] is
// the default stock, ARGV[2..4] the claim's token, the record and its
// retention in ms; then, per SKU i, ARGV[3i+2], ARGV[3i+3] and ARGV[3i+4]
// its quantity, fence and the stock the request read. It returns {1,
// left...}, or, changing nothing, {5} when the record key holds this
// script's record already (it ran, and its client resent it after losing
// the reply), {3} when the claim does not hold the record key, {0, i,
// storedFence} for a stale fence, {4, i, stock} for a stock that is not
// the one read.
var redisDeductRecordScript = redis.NewScript(redisstore.RecordLua + `
local n = #KEYS - 2
if not reqlock_claimed(KEYS[n+1], ARGV[2]) then
  if reqlock_recorded(KEYS[n+1], ARGV[3]) then
    return {5}
  end
  return {3}
end
for i = 1, n do
  local fence = tonumber(ARGV[3*i+3])
  if fence > 0 then
    local stored = tonumber(redis.call('HGET', KEYS[i], 'fence')) or 0
    if fence < stored then
      return {0, i, stored}
    end
  end
end
local stocks = {}
for i = 1, n do
  stocks[i] = redis.call('HGET', KEYS[i], 'stock')
  local stock = stocks[i] or ARGV[1]
  if stock ~= ARGV[3*i+4] then
    return {4, i, stock}
  end
end
local left = {1}
for i = 1, n do
  if not stocks[i] then
    redis.call('HSET', KEYS[i], 'stock', ARGV[1])
  end
  left[i+1] = redis.call('HINCRBY', KEYS[i], 'stock', '-' .. ARGV[3*i+2])
  if tonumber(ARGV[3*i+3]) > 0 then
    redis.call('HSET', KEYS[i], 'fence', ARGV[3*i+3])
  end
end
reqlock_record(KEYS[n+1], KEYS[n+2], ARGV[2], ARGV[3], ARGV[4])
return left
`)

// DeductRecord implements recordStock with redisDeductRecordScript, one
// round trip. The SKUs' hashes and the record key must live on one Redis
// server (no Cluster).
func (s *redisStock) DeductRecord(ctx context.Context, ds []deduction, defaultStock int64, before []int64, rw redisstore.RecordWrite) ([]int64, error) {
	keys := make([]string, 0, len(ds)+2)
	args := make([]any, 0, 4+3*len(ds))
	args = append(args, defaultStock, rw.Token, rw.Value, rw.RetentionMS)
	for i, d := range ds {
		keys = append(keys, redisStockPrefix+d.SKU)
		args = append(args, d.Qty, d.Fence, before[i])
	}
	keys = append(keys, rw.Key, rw.WaitingKey)
	reply, err := redisDeductRecordScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: deduct and record %d SKUs: %w", errStockStore, len(ds), err)
	}
	v, err := int64s(reply)
	switch {
	case err != nil || len(v) == 0:
	case v[0] == 1 && len(v) == 1+len(ds):
		return v[1:], nil
	case v[0] == 5 && len(v) == 1:
		// This deduction ran already (a resent script): it found each
		// stock at before[i], and left before[i] less the quantity.
		left := make([]int64, len(ds))
		for i, d := range ds {
			left[i] = before[i] - d.Qty
		}
		return left, nil
	case v[0] == 3 && len(v) == 1:
		return nil, errClaimLost
	case v[0] == 0 && len(v) == 3 && v[1] >= 1 && v[1] <= int64(len(ds)):
		d := ds[v[1]-1]
		return nil, &staleFenceError{"deduct", d.SKU, d.Fence, v[2]}
	case v[0] == 4 && len(v) == 3 && v[1] >= 1 && v[1] <= int64(len(ds)):
		return nil, fmt.Errorf("%w: SKU %q has %d, read %d", errStockChanged, ds[v[1]-1].SKU, v[2], before[v[1]-1])
	}
	return nil, fmt.Errorf("%w: deduct and record %d SKUs: script answered %v", errStockStore, len(ds), reply)
}

// int64s converts a script's reply of integers and decimal strings.
func int64s(reply []any) ([]int64, error) {
	v := make([]int64, len(reply))
	for i, r := range reply {
		switch r := r.(type) {
		case int64:
			v[i] = r
		case string:
			n, err := strconv.ParseInt(r, 10, 64)
			if err != nil {
				return nil, err
			}
			v[i] = n
		default:
			return nil, fmt.Errorf("element %d is a %T", i, r)
		}
	}
	return v, nil
}

// stockBudget is the time the stock calls of a request that holds its lock
// share: redisGrace less the release's share. A request without a lock (a
// GET, -nolock, a fail-open route whose lock store failed) releases nothing,
// and its calls share all of redisGrace.
const stockBudget = redisGrace - releaseTimeout

// budgetStock is a stockStore for the calls of one request, which share a
// budget of time: each call is bounded by what the calls before it left, so
// that a Redis that freezes or dies holds the request for the budget at
// most, however many calls it makes, while the request's own work (-work)
// does not count. A request makes its calls one after the other; so does
// budgetStock, which is not safe for concurrent use.
type budgetStock struct {
	store stockStore
	left  time.Duration
}

// call runs f with a context bounded by what is left of the budget, and
// takes the time f took from it.
func (b *budgetStock) call(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, b.left)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	b.left -= time.Since(start)
	return err
}

func (b *budgetStock) Read(ctx context.Context, sku string, fence int64) (stock int64, found bool, err error) {
	err = b.call(ctx, func(ctx context.Context) error {
		stock, found, err = b.store.Read(ctx, sku, fence)
		return err
	})
	return stock, found, err
}

func (b *budgetStock) Write(ctx context.Context, sku string, stock, fence int64) error {
	return b.call(ctx, func(ctx context.Context) error {
		return b.store.Write(ctx, sku, stock, fence)
	})
}

func (b *budgetStock) DeductAll(ctx context.Context, ds []deduction, defaultStock int64) (left []int64, err error) {
	err = b.call(ctx, func(ctx context.Context) error {
		left, err = b.store.DeductAll(ctx, ds, defaultStock)
		return err
	})
	return left, err
}

// DeductRecord implements recordStock when the budget's store does.
func (b *budgetStock) DeductRecord(ctx context.Context, ds []deduction, defaultStock int64, before []int64,
	rw redisstore.RecordWrite) (left []int64, err error) {
	rs, ok := b.store.(recordStock)
	if !ok {
		return nil, fmt.Errorf("%w: %T keeps no idempotency records", errStockStore, b.store)
	}
	err = b.call(ctx, func(ctx context.Context) error {
		left, err = rs.DeductRecord(ctx, ds, defaultStock, before, rw)
		return err
	})
	return left, err
}

// shop holds the stock and the operations the handlers call. A handler
// calls them on forRequest's shop.
type shop struct {
	store        stockStore
	defaultStock int64         // stock of a SKU never set
	work         time.Duration // simulated work between reading and writing
	reports      *reports      // the report and export routes' state (reports.go)

	// records is set when the stock store is a recordStock whose Redis
	// holds the Locker's idempotency records too: a deduction with an
	// idempotency key then writes its record in its own atomic step.
	records bool

	// testHookAfterRead, when set, runs in Deduct between the read and the
	// work. Tests use it as a barrier; it is nil in the service.
	testHookAfterRead func(ctx context.Context)
}

// forRequest returns the shop as one request sees it: its stock calls share
// a budget (budgetStock), stockBudget when the request holds a lock, which
// its release will then need time for, and redisGrace when it does not.
func (s *shop) forRequest(h holder) *shop {
	budget := redisGrace
	if h.lock != nil {
		budget = stockBudget
	}
	rs := *s
	rs.store = &budgetStock{store: s.store, left: budget}
	return &rs
}

// Get returns the stock of sku: the default stock for a SKU never set.
func (s *shop) Get(ctx context.Context, sku string) (int64, error) {
	stock, found, err := s.store.Read(ctx, sku, 0)
	if err != nil {
		return 0, err
	}
	if !found {
		return s.defaultStock, nil
	}
	return stock, nil
}

// Set sets the stock of sku with a fenced write (unfenced when fence is 0).
func (s *shop) Set(ctx context.Context, sku string, stock, fence int64) error {
	return written(s.store.Write(ctx, sku, stock, fence))
}

// Deduct takes qty from the stock of sku and returns what remains. It reads
// the stock, works for work (the critical section the lock protects), then
// writes the stock back with fence, so that a holder whose lock was lost
// meanwhile cannot write. Without a lock (fence 0) concurrent calls lose
// updates: that is the oversell the example shows.
//
// Errors: ErrInsufficientStock (with the current stock returned),
// ErrStaleFence, the context's error when ctx ends during the work, and
// errStockStore failures: of the write, as errOutcomeUnknown.
func (s *shop) Deduct(ctx context.Context, sku string, qty, fence int64, work time.Duration) (int64, error) {
	stock, found, err := s.store.Read(ctx, sku, fence)
	if err != nil {
		return 0, err
	}
	if !found {
		stock = s.defaultStock
	}
	if stock < qty {
		return stock, fmt.Errorf("%w: SKU %q has %d, asked for %d", ErrInsufficientStock, sku, stock, qty)
	}
	if s.testHookAfterRead != nil {
		s.testHookAfterRead(ctx)
	}
	if err := simulateWork(ctx, work); err != nil {
		return 0, err
	}
	if err := s.store.Write(ctx, sku, stock-qty, fence); err != nil {
		return 0, written(err)
	}
	return stock - qty, nil
}

// Checkout takes several SKUs' quantities, all of them or none: ds holds
// distinct SKUs, each with the fence of its lock. Like Deduct it reads every
// SKU with its fence (claiming it, so that an older holder can no longer
// write it) and answers a short cart before the work; then, after the work,
// it deducts them all in one atomic, fenced check-and-deduct
// (stockStore.DeductAll). It returns the stocks left, in the order of ds.
//
// Errors: a *shortError naming every short SKU (nothing changed),
// ErrStaleFence (nothing changed), the context's error when ctx ends during
// the work, and errStockStore failures: of the deduction, as
// errOutcomeUnknown.
func (s *shop) Checkout(ctx context.Context, ds []deduction, work time.Duration) ([]int64, error) {
	var short []shortItem
	for _, d := range ds {
		stock, found, err := s.store.Read(ctx, d.SKU, d.Fence)
		if err != nil {
			return nil, err
		}
		if !found {
			stock = s.defaultStock
		}
		if stock < d.Qty {
			short = append(short, shortItem{SKU: d.SKU, Qty: d.Qty, Stock: stock})
		}
	}
	if short != nil {
		return nil, &shortError{short}
	}
	if s.testHookAfterRead != nil {
		s.testHookAfterRead(ctx)
	}
	if err := simulateWork(ctx, work); err != nil {
		return nil, err
	}
	left, err := s.store.DeductAll(ctx, ds, s.defaultStock)
	return left, written(err)
}

// simulateWork stands for the slow part of a real deduction (pricing, a
// payment call). It returns ctx's error when ctx ends before the work does,
// or just as it does: its callers write next, and no write starts on an
// ended context.
func simulateWork(ctx context.Context, d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("work interrupted: %w", context.Cause(ctx))
	}
	return nil
}

// errOutcomeUnknown marks a write the stock store failed to answer: it may
// have been applied all the same, now or later (a frozen Redis applies it
// when it thaws), fenced as every write is.
var errOutcomeUnknown = errors.New("the write's outcome is unknown")

// written returns the error of a write: a refusal (stale fence, short
// stock) as it is, and any other failure as errOutcomeUnknown.
func written(err error) error {
	if err == nil || errors.Is(err, ErrStaleFence) || errors.Is(err, ErrInsufficientStock) ||
		errors.Is(err, errClaimLost) || errors.Is(err, errStockChanged) {
		return err
	}
	return fmt.Errorf("%w: %w", errOutcomeUnknown, err)
}

// maxBodyBytes bounds the request bodies the handlers decode.
const maxBodyBytes = 64 << 10

// reply is a framework-neutral HTTP answer: a status and a JSON body. The
// router files write it with their framework's JSON helper.
type reply struct {
	status int
	body   any
}

// rendered is a reply as a router writes it: the status, the Content-Type
// and the body's bytes. Each router renders with its framework's JSON
// conventions (renderNetHTTP, renderGin, renderEcho), and a deduction that
// records its answer itself (deductRecorded) records the same bytes.
type rendered struct {
	status      int
	contentType string
	body        []byte
}

// stockBody is the answer of GET and PUT /skus/{id}.
type stockBody struct {
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
}

// deductBody is the answer of a successful deduction.
type deductBody struct {
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
	Fence int64  `json:"fence"`
}

// errorBody is the answer of a failed request. Stock is set when it helps
// the client (409 insufficient stock), and Short for a short cart.
type errorBody struct {
	Error string      `json:"error"`
	SKU   string      `json:"sku,omitempty"`
	Stock *int64      `json:"stock,omitempty"`
	Short []shortItem `json:"short,omitempty"`
}

// badRequest answers 400 with msg.
func badRequest(msg string) reply {
	return reply{http.StatusBadRequest, errorBody{Error: msg}}
}

// getReply answers GET /skus/{id}.
func (s *shop) getReply(ctx context.Context, sku string) reply {
	if sku == "" {
		return badRequest("sku is empty")
	}
	stock, err := s.forRequest(holder{}).Get(ctx, sku)
	if err != nil {
		return s.errorReply(ctx, sku, 0, err)
	}
	return reply{http.StatusOK, stockBody{SKU: sku, Stock: stock}}
}

// setReply answers PUT /skus/{id} with body {"stock":N}.
func (s *shop) setReply(ctx context.Context, sku string, body io.Reader, h holder) reply {
	var req struct {
		Stock *int64 `json:"stock"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return bodyReply(err)
	}
	switch {
	case sku == "":
		return badRequest("sku is empty")
	case req.Stock == nil:
		return badRequest(`"stock" is missing`)
	case *req.Stock < 0:
		return badRequest(`"stock" must not be negative`)
	}
	fence, err := h.fence(sku)
	if err != nil {
		return s.errorReply(ctx, sku, 0, err)
	}
	if err := s.forRequest(h).Set(ctx, sku, *req.Stock, fence); err != nil {
		return s.errorReply(ctx, sku, 0, err)
	}
	return reply{http.StatusOK, stockBody{SKU: sku, Stock: *req.Stock}}
}

// deductReply answers POST /skus/{id}/deduct with body {"qty":Q}.
func (s *shop) deductReply(ctx context.Context, sku string, body io.Reader, h holder) reply {
	var req struct {
		Qty *int64 `json:"qty"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return bodyReply(err)
	}
	return s.deduct(ctx, sku, req.Qty, h)
}

// orderReply answers POST /orders with body {"sku":"…","qty":Q}.
func (s *shop) orderReply(ctx context.Context, body io.Reader, h holder) reply {
	var req struct {
		SKU string `json:"sku"`
		Qty *int64 `json:"qty"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return bodyReply(err)
	}
	return s.deduct(ctx, req.SKU, req.Qty, h)
}

// deduct validates a deduction and answers it.
func (s *shop) deduct(ctx context.Context, sku string, qty *int64, h holder) reply {
	switch {
	case sku == "":
		return badRequest(`"sku" is missing`)
	case qty == nil:
		return badRequest(`"qty" is missing`)
	case *qty < 1:
		return badRequest(`"qty" must be at least 1`)
	}
	fence, err := h.fence(sku)
	if err != nil {
		return s.errorReply(ctx, sku, 0, err)
	}
	if s.recorded(h) {
		return s.deductRecorded(ctx, []deduction{{SKU: sku, Qty: *qty, Fence: fence}}, h, func(left []int64) reply {
			return reply{http.StatusOK, deductBody{SKU: sku, Stock: left[0], Fence: fence}}
		})
	}
	remaining, err := s.forRequest(h).Deduct(ctx, sku, *qty, fence, s.work)
	if err != nil {
		return s.errorReply(ctx, sku, remaining, err)
	}
	return reply{http.StatusOK, deductBody{SKU: sku, Stock: remaining, Fence: fence}}
}

// cartLine is one SKU of a checkout's answer: the quantity taken (the sum
// of the cart's items of that SKU), the stock left and the fence written.
type cartLine struct {
	SKU   string `json:"sku"`
	Qty   int64  `json:"qty"`
	Stock int64  `json:"stock"`
	Fence int64  `json:"fence"`
}

// checkoutBody is the answer of a successful checkout.
type checkoutBody struct {
	Items []cartLine `json:"items"`
}

// checkoutReply answers POST /carts/checkout with body
// {"items":[{"sku":"…","qty":Q},…]}: 200 with a line per SKU, sorted by SKU;
// 409 with the short SKUs, and nothing changed, when any is short.
func (s *shop) checkoutReply(ctx context.Context, body io.Reader, h holder) reply {
	var req struct {
		Items []struct {
			SKU string `json:"sku"`
			Qty *int64 `json:"qty"`
		} `json:"items"`
	}
	if err := decodeJSON(body, &req); err != nil {
		return bodyReply(err)
	}
	if len(req.Items) == 0 {
		return badRequest(`"items" is missing or empty`)
	}
	qty := make(map[string]int64, len(req.Items))
	for i, it := range req.Items {
		switch {
		case it.SKU == "":
			return badRequest(fmt.Sprintf(`items[%d]: "sku" is missing`, i))
		case it.Qty == nil:
			return badRequest(fmt.Sprintf(`items[%d]: "qty" is missing`, i))
		case *it.Qty < 1:
			return badRequest(fmt.Sprintf(`items[%d]: "qty" must be at least 1`, i))
		case qty[it.SKU] > math.MaxInt64-*it.Qty:
			return badRequest(fmt.Sprintf(`items[%d]: the quantities of SKU %q add up to more than %d`, i, it.SKU, int64(math.MaxInt64)))
		}
		qty[it.SKU] += *it.Qty
	}
	ds := make([]deduction, 0, len(qty))
	for _, sku := range slices.Sorted(maps.Keys(qty)) {
		fence, err := h.fence(sku)
		if err != nil {
			return s.errorReply(ctx, sku, 0, err)
		}
		ds = append(ds, deduction{SKU: sku, Qty: qty[sku], Fence: fence})
	}
	answer := func(left []int64) reply {
		lines := make([]cartLine, len(ds))
		for i, d := range ds {
			lines[i] = cartLine{SKU: d.SKU, Qty: d.Qty, Stock: left[i], Fence: d.Fence}
		}
		return reply{http.StatusOK, checkoutBody{Items: lines}}
	}
	if s.recorded(h) {
		return s.deductRecorded(ctx, ds, h, answer)
	}
	left, err := s.forRequest(h).Checkout(ctx, ds, s.work)
	if err != nil {
		return s.errorReply(ctx, "", 0, err)
	}
	return answer(left)
}

// recorded reports whether the request of h writes its idempotency record
// itself, in the step of its deduction (deductRecorded): it has an
// idempotency key, and the stock's Redis holds the records.
func (s *shop) recorded(h holder) bool {
	return s.records && h.idem != nil && h.render != nil
}

// deductRecorded is a deduction (one SKU) or a checkout (several) whose
// request has an idempotency key, with the stock in the Redis of the
// Locker's records: it reads each SKU with its fence, as Deduct and
// Checkout do, and answers a short stock before the work; then it renders
// the answer the deduction will give (answer of the stocks left), has the
// middleware encode it as the route's record (IdempotentRequest.Record),
// and deducts and writes that record in one script (recordStock), guarded
// by the claim and the fences. So a client whose deduction answered 503
// "outcome unknown" and that retries with the same key gets the first
// answer if the script ran, and a deduction that runs once if it did not:
// never two deductions.
func (s *shop) deductRecorded(ctx context.Context, ds []deduction, h holder, answer func(left []int64) reply) reply {
	st := s.forRequest(h)
	before := make([]int64, len(ds))
	var short []shortItem
	for i, d := range ds {
		stock, found, err := st.store.Read(ctx, d.SKU, d.Fence)
		if err != nil {
			return s.errorReply(ctx, d.SKU, 0, err)
		}
		if !found {
			stock = s.defaultStock
		}
		before[i] = stock
		if stock < d.Qty {
			short = append(short, shortItem{SKU: d.SKU, Qty: d.Qty, Stock: stock})
		}
	}
	switch {
	case short != nil && len(ds) == 1:
		return s.errorReply(ctx, short[0].SKU, short[0].Stock,
			fmt.Errorf("%w: SKU %q has %d, asked for %d", ErrInsufficientStock, short[0].SKU, short[0].Stock, short[0].Qty))
	case short != nil:
		return s.errorReply(ctx, "", 0, &shortError{short})
	}
	if s.testHookAfterRead != nil {
		s.testHookAfterRead(ctx)
	}
	if err := simulateWork(ctx, s.work); err != nil {
		return s.errorReply(ctx, "", 0, err)
	}
	left := make([]int64, len(ds))
	for i, d := range ds {
		left[i] = before[i] - d.Qty
	}
	rep := answer(left)
	out := h.render(rep)
	rec, err := h.idem.Record(out.status, http.Header{"Content-Type": {out.contentType}}, out.body)
	if err != nil {
		return reply{http.StatusInternalServerError, errorBody{Error: err.Error()}}
	}
	rw, err := redisstore.NewRecordWrite(h.idem.Key, h.idem.Token, rec, h.idem.Retention)
	if err != nil {
		return reply{http.StatusInternalServerError, errorBody{Error: err.Error()}}
	}
	rs, _ := st.store.(recordStock)
	if _, err := rs.DeductRecord(ctx, ds, s.defaultStock, before, rw); err != nil {
		return s.errorReply(ctx, "", 0, written(err))
	}
	return rep
}

// errorReply maps a shop error to its answer; sku names the SKU concerned,
// when there is one, and stock is its current stock:
//   - ErrInsufficientStock: 409 with the current stock, or, for a cart
//     (a *shortError), with every short SKU, its stock and the quantity asked;
//   - ErrStaleFence: 409 as well. The request lost its lock before it could
//     write (its lease expired while it worked), and the store refused the
//     write, so nothing changed: like insufficient stock, it is a conflict
//     with the resource's current state that the client may retry;
//   - errNotCovered: 500. The route's lock configuration does not lock the
//     SKU in the sku: key space, so the handler writes nothing;
//   - errOutcomeUnknown: 503 with Retry-After, saying that the write may
//     still be applied. It comes before ErrLockLost: a request whose lock
//     was lost while its write was on its way cannot say it changed nothing;
//   - ErrLockLost, the cause of the request's context: 409. The request's
//     lease lapsed while it worked, and it wrote nothing more;
//   - the request's context ended: 499 when the client went away (nobody
//     reads it), 503 when a deadline passed;
//   - a stock store failure: 503 with Retry-After.
func (s *shop) errorReply(ctx context.Context, sku string, stock int64, err error) reply {
	var stale *staleFenceError
	if errors.As(err, &stale) {
		sku = stale.sku
	}
	var short *shortError
	switch {
	case errors.As(err, &short):
		return reply{http.StatusConflict, errorBody{Error: "insufficient stock", Short: short.items}}
	case errors.Is(err, ErrInsufficientStock):
		return reply{http.StatusConflict, errorBody{Error: "insufficient stock", SKU: sku, Stock: &stock}}
	case errors.Is(err, ErrStaleFence):
		return reply{http.StatusConflict, errorBody{
			Error: "stale fence: the lock expired before the write and a newer holder came first; nothing was changed",
			SKU:   sku,
		}}
	case errors.Is(err, errClaimLost), errors.Is(err, errStockChanged):
		return reply{http.StatusConflict, errorBody{Error: err.Error() + "; nothing was changed", SKU: sku}}
	case errors.Is(err, errNotCovered):
		return reply{http.StatusInternalServerError, errorBody{Error: err.Error(), SKU: sku}}
	case errors.Is(err, errOutcomeUnknown):
		return reply{http.StatusServiceUnavailable, errorBody{
			Error: "stock store unavailable: the write's outcome is unknown, it may still be applied; check the stock before you retry",
			SKU:   sku,
		}}
	case errors.Is(err, reqlock.ErrLockLost),
		ctx.Err() != nil && errors.Is(context.Cause(ctx), reqlock.ErrLockLost):
		// The request's lock lapsed (or was taken over) while it worked: its
		// context ended with the loss, and what it did not finish it left
		// undone. A conflict the client may retry, like a stale fence.
		return reply{http.StatusConflict, errorBody{
			Error: "lock lost: the request's lock lapsed before it finished; nothing more was changed",
			SKU:   sku,
		}}
	case errors.Is(err, context.Canceled):
		return reply{statusClientClosedRequest, errorBody{Error: "request cancelled", SKU: sku}}
	}
	return reply{http.StatusServiceUnavailable, errorBody{Error: "stock store unavailable; retry later", SKU: sku}}
}

// statusClientClosedRequest is recorded when the client went away (as nginx
// and reqlock's middleware do); the client never sees it.
const statusClientClosedRequest = 499

// retryAfter returns the Retry-After header value for an answer, or "".
func (r reply) retryAfter() string {
	if r.status == http.StatusServiceUnavailable {
		return "1"
	}
	return ""
}

// errBodyTooLarge means a request body exceeds maxBodyBytes.
var errBodyTooLarge = fmt.Errorf("request body exceeds %d bytes", maxBodyBytes)

// decodeJSON decodes one JSON object from body (at most maxBodyBytes) into
// v. A larger body fails with errBodyTooLarge, however its JSON reads.
func decodeJSON(body io.Reader, v any) error {
	if body == nil {
		return errors.New("request body is empty")
	}
	limited := &io.LimitedReader{R: body, N: maxBodyBytes + 1}
	dec := json.NewDecoder(limited)
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("request body has data after the JSON object")
	}
	if err != nil && limited.N <= 0 {
		return errBodyTooLarge
	}
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("request body is empty")
	case err != nil && !strings.HasPrefix(err.Error(), "request body"):
		return fmt.Errorf("request body is not valid JSON: %w", err)
	}
	return err
}

// bodyReply answers a body decodeJSON refused: 413 when it is too large,
// else 400.
func bodyReply(err error) reply {
	if errors.Is(err, errBodyTooLarge) {
		return reply{http.StatusRequestEntityTooLarge, errorBody{Error: err.Error()}}
	}
	return badRequest(err.Error())
}
