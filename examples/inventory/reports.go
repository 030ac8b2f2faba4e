package main

// This file holds the report and export routes, which show the lock modes
// besides exclusive: GET /reports/{id} holds report:<id> shared, so reads of
// one report run together, and POST /reports/{id}/rebuild holds it
// exclusively, so a rebuild runs alone; POST /exports holds
// tenant:<header:X-Tenant> with a limit of 3, so at most three exports of a
// tenant run at once and a fourth is answered 429 with Retry-After. The
// handlers check what the locks promise: a read that sees a rebuild in
// progress, or a rebuild that sees a read, answers 500 "overlap".

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// reports holds the reports (a version each, which a rebuild raises) and
// what runs now: the reads and rebuild of each report, the exports of each
// tenant. It lives in the process: the overlap check sees this instance's
// requests.
type reports struct {
	mu       sync.Mutex
	byID     map[string]*report
	exports  map[string]int // running exports by tenant
	overlaps int            // reads and rebuilds that saw each other

	// workLog, when set (-worklog), gets a line per handler's work: start
	// and end (Unix nanoseconds), whether it ran to its end, the key (the
	// report or the tenant, quoted) and the route (quoted). Load programs
	// read the logs of all instances to check the locks across them.
	workLog   io.Writer
	workLogMu sync.Mutex

	// testHookWork, when set, runs in each handler's work with the route
	// ("GET /reports/{id}", ...). Tests use it as a barrier; it is nil in
	// the service.
	testHookWork func(ctx context.Context, route string)
}

// report is one report's state.
type report struct {
	version    int64
	readers    int
	rebuilding bool
}

func newReports() *reports {
	return &reports{byID: make(map[string]*report), exports: make(map[string]int)}
}

// reportOf returns id's report, creating it; r.mu is held.
func (r *reports) reportOf(id string) *report {
	rep := r.byID[id]
	if rep == nil {
		rep = new(report)
		r.byID[id] = rep
	}
	return rep
}

// reportBody is the answer of GET /reports/{id} and of a rebuild.
type reportBody struct {
	Report  string `json:"report"`
	Version int64  `json:"version"`
	Fence   int64  `json:"fence,omitempty"`
}

// exportBody is the answer of POST /exports.
type exportBody struct {
	Tenant  string `json:"tenant"`
	Running int    `json:"running"` // exports of the tenant running with this one, itself included
}

// work runs the route's simulated work for key and the test hook, and
// logs it to workLog. Work that ends after the lock's validity (h's) has
// passed fails as interrupted: the lock's context ends on a timer, which a
// process paused past the lock's TTL (SIGSTOP, a long GC) may not have run
// yet when the work's own timer wakes it, so the handler checks the
// validity by the clock before it counts its work as done under the lock.
func (r *reports) work(ctx context.Context, route, key string, d time.Duration, h holder) error {
	start := time.Now()
	if r.testHookWork != nil {
		r.testHookWork(ctx, route)
	}
	err := simulateWork(ctx, d)
	if err == nil && h.lock != nil && !time.Now().Before(h.lock.ValidUntil()) {
		err = errors.New("work interrupted: the lock's validity passed during the work")
	}
	if r.workLog != nil {
		line := fmt.Sprintf("%d %d %t %q %q\n", start.UnixNano(), time.Now().UnixNano(), err == nil, key, route)
		r.workLogMu.Lock()
		_, _ = io.WriteString(r.workLog, line)
		r.workLogMu.Unlock()
	}
	return err
}

// overlapReply counts an overlap and answers 500.
func (r *reports) overlapReply(what string) reply {
	r.overlaps++
	return reply{http.StatusInternalServerError, errorBody{Error: "overlap: " + what}}
}

// readReply answers GET /reports/{id}: it reads the report while no
// rebuild of it runs.
func (s *shop) readReply(ctx context.Context, id string, h holder) reply {
	r := s.reports
	r.mu.Lock()
	rep := r.reportOf(id)
	if rep.rebuilding {
		r.mu.Unlock()
		return r.overlapReply("a rebuild of the report is in progress")
	}
	rep.readers++
	r.mu.Unlock()
	err := r.work(ctx, routeReport, id, s.work, h)
	r.mu.Lock()
	defer r.mu.Unlock()
	rep.readers--
	switch {
	case rep.rebuilding:
		return r.overlapReply("a rebuild of the report started during the read")
	case err != nil:
		return reply{http.StatusServiceUnavailable, errorBody{Error: err.Error()}}
	}
	return reply{http.StatusOK, reportBody{Report: id, Version: rep.version, Fence: h.lockFence()}}
}

// rebuildReply answers POST /reports/{id}/rebuild: it raises the report's
// version while no read of it runs.
func (s *shop) rebuildReply(ctx context.Context, id string, h holder) reply {
	r := s.reports
	r.mu.Lock()
	rep := r.reportOf(id)
	if rep.readers > 0 || rep.rebuilding {
		r.mu.Unlock()
		return r.overlapReply("the report is being read or rebuilt")
	}
	rep.rebuilding = true
	r.mu.Unlock()
	err := r.work(ctx, routeRebuild, id, s.work, h)
	r.mu.Lock()
	defer r.mu.Unlock()
	rep.rebuilding = false
	if err != nil {
		return reply{http.StatusServiceUnavailable, errorBody{Error: err.Error()}}
	}
	rep.version++
	return reply{http.StatusOK, reportBody{Report: id, Version: rep.version, Fence: h.lockFence()}}
}

// exportReply answers POST /exports for tenant, the X-Tenant header.
func (s *shop) exportReply(ctx context.Context, tenant string, h holder) reply {
	if tenant == "" {
		return badRequest("the X-Tenant header is missing")
	}
	r := s.reports
	r.mu.Lock()
	r.exports[tenant]++
	running := r.exports[tenant]
	r.mu.Unlock()
	err := r.work(ctx, routeExports, tenant, s.work, h)
	r.mu.Lock()
	r.exports[tenant]--
	r.mu.Unlock()
	if err != nil {
		return reply{http.StatusServiceUnavailable, errorBody{Error: err.Error()}}
	}
	return reply{http.StatusOK, exportBody{Tenant: tenant, Running: running}}
}

// lockFence is the fence of the request's lock (one key), or 0 unlocked.
func (h holder) lockFence() int64 {
	if h.lock == nil {
		return 0
	}
	return h.lock.Fence()
}
