package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The multi workload runs each process as a child: this binary again, with
// the hidden -child flag. The protocol, one line at a time:
//
//	child -> parent  "ready"            after it connected and warmed its pool
//	parent -> child  "start <unix ns>"  once every child is ready and the
//	                                    parent has read INFO commandstats
//	child -> parent  one JSON procResult, then it exits
//
// So the connection set-up of the children stays out of the measured window,
// and all children start at one wall-clock time.

// childReadyTimeout bounds how long a child may take to connect and warm up.
const childReadyTimeout = 30 * time.Second

// splitWaiters divides total goroutines over procs processes as evenly as
// possible: the first total%procs processes get one more.
func splitWaiters(total, procs int) []int {
	out := make([]int, procs)
	for i := range out {
		out[i] = total / procs
		if i < total%procs {
			out[i]++
		}
	}
	return out
}

type childProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// runChildren runs the multi workload of lib in cfg.Procs child processes.
// When all are ready it calls ready (which reads INFO commandstats), then
// starts them at one time. It returns their merged results and the start.
func runChildren(ctx context.Context, cfg config, lib, prefix string, ready func() error,
	stderr io.Writer) (*procResult, time.Time, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, time.Time{}, err
	}
	// Every child ends by itself within duration + wait + hold + a release;
	// this bound only stops children that hang.
	limit := childReadyTimeout + cfg.Duration + cfg.Wait + cfg.Hold + 2*releaseTimeout + 30*time.Second
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	var children []*childProc
	defer func() {
		// Children still here failed or were never started: kill and reap them.
		if len(children) > 0 {
			cancel()
		}
		for _, c := range children {
			_ = c.stdin.Close()
			_ = c.cmd.Wait()
		}
	}()
	for i, n := range splitWaiters(cfg.Waiters, cfg.Procs) {
		args := []string{"-child",
			"-redis", cfg.Redis, "-lib", lib, "-child-prefix", prefix, "-child-waiters", strconv.Itoa(n),
			"-duration", cfg.Duration.String(), "-hold", cfg.Hold.String(), "-wait", cfg.Wait.String(),
			"-ttl", cfg.TTL.String(), "-poolsize", strconv.Itoa(cfg.PoolSize),
			"-redislock-min", cfg.RedislockMin.String(), "-redislock-max", cfg.RedislockMax.String(),
			"-fair=" + strconv.FormatBool(cfg.Fair),
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = stderr
		cmd.WaitDelay = 5 * time.Second
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, time.Time{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, time.Time{}, err
		}
		if err := cmd.Start(); err != nil {
			return nil, time.Time{}, fmt.Errorf("start child %d: %w", i, err)
		}
		children = append(children, &childProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)})
	}
	fail := func(err error) (*procResult, time.Time, error) {
		cancel() // kills the children still running
		return nil, time.Time{}, err
	}
	readyTimer := time.AfterFunc(childReadyTimeout, cancel)
	for i, c := range children {
		line, err := c.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			readyTimer.Stop()
			return fail(fmt.Errorf("child %d not ready: %q %v", i, line, err))
		}
	}
	if !readyTimer.Stop() {
		return fail(fmt.Errorf("children not ready within %v", childReadyTimeout))
	}
	if err := ready(); err != nil {
		return fail(err)
	}
	start := time.Now().Add(startDelay)
	for i, c := range children {
		if _, err := fmt.Fprintf(c.stdin, "start %d\n", start.UnixNano()); err != nil {
			return fail(fmt.Errorf("start child %d: %w", i, err))
		}
	}
	total := &procResult{}
	for i, c := range children {
		var r procResult
		if err := json.NewDecoder(c.out).Decode(&r); err != nil {
			return fail(fmt.Errorf("result of child %d: %w", i, err))
		}
		total.merge(&r)
	}
	for i, c := range children {
		_ = c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			children = children[i+1:]
			return fail(fmt.Errorf("child %d: %w", i, err))
		}
	}
	children = nil
	return total, start, nil
}

// runChild is a child of the multi workload: see the protocol above.
func runChild(ctx context.Context, cfg config, stdin io.Reader, stdout io.Writer) error {
	client, counter := newLibClient(cfg)
	defer client.Close()
	harness := newHarnessClient(cfg)
	defer harness.Close()
	lk, err := newLocker(cfg.Libs[0], client, cfg)
	if err != nil {
		return err
	}
	defer closeLocker(lk)
	if err := warmPool(ctx, client, cfg.childWaiters); err != nil {
		return err
	}
	if err := harness.Ping(ctx).Err(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("child: read start: %w", err)
	}
	ns, ok := strings.CutPrefix(strings.TrimSpace(line), "start ")
	startNS, perr := strconv.ParseInt(ns, 10, 64)
	if !ok || perr != nil {
		return errors.New("child: bad start line " + strconv.Quote(line))
	}
	start := time.Unix(0, startNS)
	s := hotSpec(cfg.childPrefix, cfg.childWaiters, cfg.Hold)
	trips, handshakes := counter.trips.Load(), counter.handshakes.Load()
	res := runWorkers(ctx, lk, harness, s, cfg.Wait, start, start.Add(cfg.Duration))
	res.RoundTrips = counter.trips.Load() - trips
	res.Handshakes = counter.handshakes.Load() - handshakes
	if err := ctx.Err(); err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}
