package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/reqlock/reqlock/bench/internal/privateredis"
)

// The example's routes the scenarios load.
const (
	routeReport  = "GET /reports/{id}"
	routeRebuild = "POST /reports/{id}/rebuild"
	routeExports = "POST /exports"
)

// reportsTable is the example's route table for the report routes
// (examples/inventory/routes.yaml), %s the read's mode.
const reportsTable = `routes:
  GET /reports/{id}: "@lock key=report:<id> %swait=%v ttl=%v on-timeout=423 on-store-error=503"
  POST /reports/{id}/rebuild: "@lock key=report:<id> wait=%v ttl=%v on-timeout=423 on-store-error=503"
`

// answer is one request's outcome, as a client saw it.
type answer struct {
	kind       int // the request's kind, as next said
	status     int // 0: the request failed in transport
	retryAfter bool
	overlap    bool // a 500 whose body says "overlap"
	latency    time.Duration
}

// drive runs clients until stop is closed: client c sends the requests
// next(c, i) for i = 0, 1, ... to bases[c%len(bases)], each after the
// answer to the one before, and the answers are returned once every
// client has its last one.
func drive(ctx context.Context, clients int, bases []string, stop <-chan struct{},
	next func(c, i int) (kind int, method, path string, header http.Header)) []answer {
	tr := &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	results := make([][]answer, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				select {
				case <-stop:
					return
				default:
				}
				kind, method, path, header := next(c, i)
				a := answer{kind: kind}
				begin := time.Now()
				req, err := http.NewRequestWithContext(ctx, method, bases[c%len(bases)]+path, nil)
				if err != nil {
					panic(err) // the paths are ours
				}
				req.Header = header
				if resp, err := client.Do(req); err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After") != ""
					a.overlap = resp.StatusCode == http.StatusInternalServerError && strings.Contains(string(body), "overlap")
				}
				a.latency = time.Since(begin)
				results[c] = append(results[c], a)
			}
		})
	}
	wg.Wait()
	return slices.Concat(results...)
}

// instances starts two example instances on the Redis at addr, each with
// -work and its own -worklog in dir (named tag-0.log, tag-1.log), and args.
func instances(bin, addr string, work time.Duration, dir, tag string, args ...string) ([]*service, []string, error) {
	var svcs []*service
	var logs []string
	for i := range 2 {
		log := filepath.Join(dir, fmt.Sprintf("%s-%d.log", tag, i))
		cmd := exec.Command(bin, append([]string{"-framework", "gin", "-redis", redisURL(addr), "-addr", "127.0.0.1:0",
			"-work", work.String(), "-worklog", log}, args...)...)
		cmd.Env = withoutEnv(withoutEnv(os.Environ(), "REDIS_URL"), "REQLOCK_STORE")
		svc, err := startService(fmt.Sprintf("%s-%d", tag, i), cmd, inventoryListening)
		if err != nil {
			for _, s := range svcs {
				s.stop()
			}
			return nil, nil, err
		}
		svcs, logs = append(svcs, svc), append(logs, log)
	}
	return svcs, logs, nil
}

// bases returns the services' base URLs.
func bases(svcs []*service) []string {
	var b []string
	for _, s := range svcs {
		b = append(b, s.base)
	}
	return b
}

// readLogs reads the work logs, logs[i] of instance i.
func readLogs(logs []string) ([]span, error) {
	var all []span
	for i, l := range logs {
		s, err := readWorkLog(l, i)
		if err != nil {
			return nil, err
		}
		all = append(all, s...)
	}
	return all, nil
}

// scenarioSetup starts a private Redis, builds the example if needed, and
// returns them with a temporary directory and a run marker; cleanup undoes
// it all.
func scenarioSetup(ctx context.Context, cfg config) (srv *privateredis.Server, bin, dir, marker string, cleanup func(), err error) {
	if srv, err = privateredis.Start(); err != nil {
		return nil, "", "", "", nil, err
	}
	if dir, err = os.MkdirTemp("", "httpbench-"); err != nil {
		srv.Stop()
		return nil, "", "", "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir); srv.Stop() }
	bin = cfg.inventory
	if bin == "" {
		if bin, err = buildInventory(ctx, cfg.reqlockDir, dir); err != nil {
			cleanup()
			return nil, "", "", "", nil, err
		}
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	return srv, bin, dir, "hb" + hex.EncodeToString(id[:]), cleanup, nil
}

// readsRound is one variant's window in one round of the reads scenario.
type readsRound struct {
	ok, all            float64 // answers per second: 200, any
	readP50, readP99   time.Duration
	writeP50, writeP99 time.Duration
	other              map[int]int64 // answers other than 200 by status
	overlaps           int           // 500 "overlap" answers
}

// readsReport is what benchReads printed, for tests.
type readsReport struct {
	rounds     [2][]readsRound // shared, exclusive
	okRatios   []float64       // per round: shared ok/s over exclusive ok/s
	waitRatios []float64       // per round: shared (write p99 - work) over exclusive's
	overlaps   [2]int          // per variant: rebuild spans overlapping another span of the report
	spans      [2]int
}

// benchReads runs the reads scenario: 90% GET /reports/{id} and 10%
// rebuilds of one report, through two instances, with the read shared
// and then exclusive, alternated in rounds.
func benchReads(ctx context.Context, cfg config, out io.Writer) (*readsReport, error) {
	runtime.LockOSThread() // the services die with this thread (pdeathsig)
	defer runtime.UnlockOSThread()
	srv, bin, dir, marker, cleanup, err := scenarioSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	names := [2]string{"shared", "exclusive"}
	var svcs [2][]*service
	var logs [2][]string
	for v, mode := range []string{"mode=shared ", ""} {
		table := filepath.Join(dir, names[v]+".yaml")
		if err := os.WriteFile(table, fmt.Appendf(nil, reportsTable, mode, cfg.wait, cfg.ttl, cfg.wait, cfg.ttl), 0o644); err != nil {
			return nil, err
		}
		if svcs[v], logs[v], err = instances(bin, srv.Addr(), cfg.work, dir, names[v], "-routes", table); err != nil {
			return nil, err
		}
		for _, s := range svcs[v] {
			defer s.stop()
		}
	}
	fmt.Fprintf(out, "httpbench -scenario reads: one report, %d clients over 2 instances each (client c on instance c%%2), "+
		"request i of client c a rebuild when (i+c)%%10 == 0, else a read; handler work %v; wait %v, ttl %v; %d rounds of %v per variant after a %v warm-up each\n",
		cfg.clients, cfg.work, cfg.wait, cfg.ttl, cfg.rounds, cfg.duration, cfg.warmup)
	fmt.Fprintf(out, "shared: GET /reports/{id} mode=shared, rebuild exclusive; exclusive: both exclusive; examples/inventory %s, Redis at %s; %d CPUs\n",
		bin, srv.Addr(), runtime.NumCPU())

	load := func(v int, d time.Duration) (readsRound, error) {
		report := marker + names[v][:1]
		stop := make(chan struct{})
		timer := time.AfterFunc(d, func() { close(stop) })
		defer timer.Stop()
		start := time.Now()
		answers := drive(ctx, cfg.clients, bases(svcs[v]), stop, func(c, i int) (int, string, string, http.Header) {
			if (i+c)%10 == 0 {
				return 1, http.MethodPost, "/reports/" + report + "/rebuild", nil
			}
			return 0, http.MethodGet, "/reports/" + report, nil
		})
		elapsed := time.Since(start).Seconds()
		if err := ctx.Err(); err != nil {
			return readsRound{}, err
		}
		r := readsRound{other: map[int]int64{}}
		var lat [2][]time.Duration
		for _, a := range answers {
			lat[a.kind] = append(lat[a.kind], a.latency)
			if a.status == http.StatusOK {
				r.ok++
			} else {
				r.other[a.status]++
			}
			if a.overlap {
				r.overlaps++
			}
		}
		r.ok, r.all = r.ok/elapsed, float64(len(answers))/elapsed
		slices.Sort(lat[0])
		slices.Sort(lat[1])
		r.readP50, r.readP99 = percentile(lat[0], 0.5), percentile(lat[0], 0.99)
		r.writeP50, r.writeP99 = percentile(lat[1], 0.5), percentile(lat[1], 0.99)
		return r, nil
	}
	for v := range names {
		if _, err := load(v, cfg.warmup); err != nil {
			return nil, err
		}
	}
	rep := &readsReport{}
	for n := range cfg.rounds {
		for v := range names {
			r, err := load(v, cfg.duration)
			if err != nil {
				return nil, err
			}
			rep.rounds[v] = append(rep.rounds[v], r)
			fmt.Fprintf(out, "round %d %-9s  %7.1f ok/s (%7.1f answers/s)  read p50 %-9v p99 %-9v  rebuild p50 %-9v p99 %-9v  other answers %s, overlap answers %d\n",
				n+1, names[v], r.ok, r.all, round(r.readP50), round(r.readP99), round(r.writeP50), round(r.writeP99), otherAnswers(r.other), r.overlaps)
		}
		s, x := rep.rounds[0][n], rep.rounds[1][n]
		rep.okRatios = append(rep.okRatios, s.ok/x.ok)
		rep.waitRatios = append(rep.waitRatios, float64(s.writeP99-cfg.work)/float64(x.writeP99-cfg.work))
	}
	for v := range names {
		spans, err := readLogs(logs[v])
		if err != nil {
			return nil, err
		}
		rep.spans[v], rep.overlaps[v] = len(spans), exclusiveOverlaps(spans, routeRebuild)
	}
	fmt.Fprintf(out, "ok/s shared/exclusive: median %.2fx (rounds %s)\n", median(rep.okRatios), ratioList(rep.okRatios))
	fmt.Fprintf(out, "rebuild p99 wait (p99 latency - work) shared/exclusive: median %.2fx (rounds %s)\n", median(rep.waitRatios), ratioList(rep.waitRatios))
	for v := range names {
		fmt.Fprintf(out, "%s: %d handler spans in the work logs of both instances, %d rebuilds overlapping another span of the report\n",
			names[v], rep.spans[v], rep.overlaps[v])
	}
	return rep, nil
}

// limitReport is what benchLimit printed, for tests.
type limitReport struct {
	maxRunning   int
	maxDone      int // the most at once of the handlers whose work ran to its end
	frozen       int // the stopped instance's spans running when it stopped
	util         float64
	statuses     map[int]int64
	noRetryAfter int64 // 429 answers without Retry-After
	outage       time.Duration
	firstAfterUp time.Duration // from Redis answering again to the next export's start
	phases       []phase
}

// phase is a stretch of the limit run and the slots' utilization in it.
type phase struct {
	name     string
	from, to int64
	util     float64
}

// benchLimit runs the limit scenario: POST /exports of one tenant (limit 3)
// through two instances, one stopped past the TTL, then a Redis restart.
func benchLimit(ctx context.Context, cfg config, out io.Writer) (*limitReport, error) {
	runtime.LockOSThread() // the services and Redis die with this thread (pdeathsig)
	defer runtime.UnlockOSThread()
	srv, bin, dir, tenant, cleanup, err := scenarioSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	svcs, logs, err := instances(bin, srv.Addr(), cfg.work, dir, "limit", "-wait", cfg.wait.String(), "-ttl", cfg.ttl.String())
	if err != nil {
		return nil, err
	}
	for _, s := range svcs {
		defer s.stop()
	}
	paused := svcs[1]
	defer paused.cmd.Process.Signal(syscall.SIGCONT) // before stop, on every path
	fmt.Fprintf(out, "httpbench -scenario limit: POST /exports, X-Tenant %s (limit=3), %d clients over 2 instances (client c on instance c%%2); "+
		"handler work %v; wait %v, ttl %v; examples/inventory %s, Redis at %s; %d CPUs\n",
		tenant, cfg.clients, cfg.work, cfg.wait, cfg.ttl, bin, srv.Addr(), runtime.NumCPU())
	fmt.Fprintf(out, "timeline: %v of load, instance 1 stopped (SIGSTOP) for %v, %v, Redis restarted (empty), %v; utilization from %v after the start\n",
		cfg.warmup+cfg.duration, cfg.pause, cfg.duration, cfg.duration, cfg.warmup)

	stop := make(chan struct{})
	var stopAt, contAt, downAt, upAt, end int64
	var frozenMetric string
	var timelineErr error
	start := time.Now()
	go func() {
		defer close(stop)
		sleep := func(d time.Duration) bool {
			select {
			case <-time.After(d):
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !sleep(cfg.warmup + cfg.duration) {
			return
		}
		frozenMetric = awaitHolder(paused.base)
		if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			timelineErr = err
			return
		}
		awaitState(paused.cmd.Process.Pid, 'T')
		stopAt = time.Now().UnixNano()
		if !sleep(cfg.pause) {
			return
		}
		contAt = time.Now().UnixNano()
		if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			timelineErr = err
			return
		}
		if !sleep(cfg.duration) {
			return
		}
		downAt = time.Now().UnixNano()
		if err := srv.Restart(); err != nil {
			timelineErr = fmt.Errorf("restarting Redis: %w", err)
			return
		}
		upAt = time.Now().UnixNano()
		sleep(cfg.duration)
		end = time.Now().UnixNano()
	}()
	header := http.Header{"X-Tenant": {tenant}}
	answers := drive(ctx, cfg.clients, bases(svcs), stop, func(c, i int) (int, string, string, http.Header) {
		return 0, http.MethodPost, "/exports", header
	})
	if err := errors.Join(ctx.Err(), timelineErr); err != nil {
		return nil, err
	}
	spans, err := readLogs(logs)
	if err != nil {
		return nil, err
	}
	rep := &limitReport{statuses: map[int]int64{}, outage: time.Duration(upAt - downAt)}
	for _, s := range spans {
		if s.inst == 1 && s.start <= stopAt && stopAt < s.end {
			rep.frozen++
		}
	}
	spans = withoutStop(spans, 1, stopAt, contAt)
	var mostAt int64
	rep.maxRunning, mostAt = maxRunning(spans)
	rep.maxDone, _ = maxRunning(slices.DeleteFunc(slices.Clone(spans), func(s span) bool { return !s.ok }))
	first := int64(0)
	for _, s := range spans {
		if s.start >= upAt && (first == 0 || s.start < first) {
			first = s.start
		}
	}
	if first > 0 {
		rep.firstAfterUp = time.Duration(first - upAt)
	} else {
		first = end
	}
	for _, a := range answers {
		rep.statuses[a.status]++
		if a.status == http.StatusTooManyRequests && !a.retryAfter {
			rep.noRetryAfter++
		}
	}
	from := start.UnixNano() + int64(cfg.warmup)
	util := func(from, to int64) float64 {
		if to <= from {
			return 0
		}
		return busy(spans, from, to).Seconds() / (3 * time.Duration(to-from).Seconds())
	}
	ttlEnd := min(stopAt+int64(cfg.ttl), contAt)
	rep.phases = []phase{
		{"before the stop", from, stopAt, 0},
		{"stopped, within a TTL of the stop", stopAt, ttlEnd, 0},
		{"stopped, past the TTL", ttlEnd, contAt, 0},
		{"resumed, before the restart", contAt, downAt, 0},
		{"Redis down (restart)", downAt, upAt, 0},
		{"Redis back, before the first export ran", upAt, first, 0},
		{"after the restart", first, end, 0},
	}
	for i := range rep.phases {
		rep.phases[i].util = util(rep.phases[i].from, rep.phases[i].to)
	}
	excl := busy(spans, from, downAt) + busy(spans, upAt, end)
	rep.util = excl.Seconds() / (3 * (time.Duration(downAt-from) + time.Duration(end-upAt)).Seconds())

	fmt.Fprintf(out, "instance 1 stopped while running %d export handlers (its holders gauge before SIGSTOP: %s)\n", rep.frozen, frozenMetric)
	fmt.Fprintf(out, "most export handlers running at once, both instances, from their work logs (instance 1's stopped time cut out): %d (%d spans), first at %v:",
		rep.maxRunning, len(spans), round(time.Duration(mostAt-start.UnixNano())))
	for _, s := range spans {
		if s.start <= mostAt && mostAt < s.end {
			fmt.Fprintf(out, " [instance %d, %v to %v, ran to its end %t]", s.inst, round(time.Duration(s.start-start.UnixNano())), round(time.Duration(s.end-start.UnixNano())), s.ok)
		}
	}
	fmt.Fprintf(out, "\nmost export handlers at once whose work ran to its end (done under a valid lock, as each handler checks): %d", rep.maxDone)
	fmt.Fprintf(out, "\n  (stop at %v, resume at %v, Redis down at %v, up at %v)\n", round(time.Duration(stopAt-start.UnixNano())),
		round(time.Duration(contAt-start.UnixNano())), round(time.Duration(downAt-start.UnixNano())), round(time.Duration(upAt-start.UnixNano())))
	fmt.Fprintf(out, "answers: %s; 429 without Retry-After: %d\n", statusList(rep.statuses), rep.noRetryAfter)
	fmt.Fprintf(out, "Redis restart: down %v (stop to PING answered); first export started %v after that\n", round(rep.outage), round(rep.firstAfterUp))
	for _, p := range rep.phases {
		fmt.Fprintf(out, "  utilization %-42s %7v  %.3f\n", p.name+":", round(time.Duration(p.to-p.from)), p.util)
	}
	fmt.Fprintf(out, "utilization of the 3 slots, the Redis downtime left out: %.3f\n", rep.util)
	return rep, nil
}

// statusList prints answers by status, "0" being transport failures.
func statusList(m map[int]int64) string {
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d: %d", s, m[s]))
	}
	return strings.Join(parts, ", ")
}

// awaitHolder polls the service's metrics, for up to 2s, until its export
// route has a holder, and returns the holders sample it saw last.
func awaitHolder(base string) string {
	last := "none seen"
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(string(body), "\n") {
				if strings.Contains(line, "lock_holders{") && strings.Contains(line, `"`+routeExports+`"`) {
					last = line
					f := strings.Fields(line)
					if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v >= 1 {
						return line
					}
				}
			}
		}
		time.Sleep(time.Millisecond) // polling the gauge
	}
	return last
}

// awaitState polls /proc until process pid is in state (such as 'T',
// stopped), for up to a second.
func awaitState(pid int, state byte) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // not Linux: the signal's return is the best we know
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == state {
			return
		}
		time.Sleep(time.Millisecond) // polling the process state
	}
}
