// Package memstore is a stores.Store that keeps locks in the memory of one
// process. Use it for a single instance, tests and development; processes do
// not see each other's locks.
//
// Fences come from one counter shared by all keys, moved on by
// stores.FenceStride per grant, so they grow per key and across keys, and no
// per-key state outlives a lock. Expired locks are freed without a background
// goroutine: a min-heap orders locks by expiry, and every operation first
// drops the expired ones from its top, so memory stays bounded by the live
// locks however many distinct keys pass through.
//
// Acquire, Release and Refresh act on all their keys under one hold of the
// store's mutex, so a refused Acquire or Refresh changes nothing. A release
// that keeps the keys (keep positive) only sets their TTL and signals
// nothing, since they stay held; their expiry then signals like any other.
//
// # Release notification
//
// Store implements stores.Notifier, so a Locker's waiters wake as soon as a
// lock is released instead of polling. Release signals every subscriber of
// the key before it returns, and so does the freeing of an expired lock.
// Expired locks are only freed when an operation (of any key) runs, so a
// waiter on a lock that expires without further traffic still wakes by its
// own timer, which the Locker caps by the holder's remaining TTL.
// Subscriptions live in a map that holds only keys with a live subscriber; no
// goroutine is involved.
//
// # Fair mode
//
// Store implements stores.FairStore: see Store.AcquireFair.
//
// # Shared and limited grants
//
// Store implements stores.SharedStore: a key held shared keeps its holders
// beside the exclusive locks, one heap entry each, so each expires at its
// own TTL; a writer refused by holders is an entry of its own per token,
// which expires stores.WriterWindow after its last refusal and ends at the
// token's exclusive grant or its Release. Exclusive and shared grants draw
// their fences from the one counter.
//
// # Idempotency records
//
// Store implements stores.RecordStore: a claim is an exclusive lock of its
// key; FinishRecord turns that entry into a record, a copy of the caller's,
// which expires with the heap at the end of its retention like any lock,
// and which no lock operation grants, releases or refreshes. Records have
// no size or retention bound but memory; they count in Len.
package memstore
