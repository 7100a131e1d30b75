package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5"
)

// bench listen -channel C: a process that LISTENs on C on the server that
// nodeURLEnv names and writes, for each notification, "N <mono>
// <payload>" (mono: CLOCK_MONOTONIC when WaitForNotification returned),
// after "R" once it listens. It ends at the end of stdin. It is the
// successor (or the other node) of the one-write floor across processes
// (floorAcross).
func listenMain(args []string) error {
	fs := flag.NewFlagSet("bench listen", flag.ContinueOnError)
	channel := fs.String("channel", "", "channel to LISTEN on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *channel == "" {
		return errors.New("-channel is empty")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := pgx.Connect(ctx, os.Getenv(nodeURLEnv))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{*channel}.Sanitize()); err != nil {
		return err
	}
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString(0) // until the end of stdin
		cancel()
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "R")
	if err := out.Flush(); err != nil {
		return err
	}
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mono := monotonic()
		fmt.Fprintf(out, "N %d %s\n", mono, n.Payload)
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

// listenProc is a bench listen process.
type listenProc struct {
	cmd   *exec.Cmd
	stdin *os.File
	lines chan string
}

// startListener starts a bench listen process and waits until it listens.
func startListener(ctx context.Context, url, channel string) (*listenProc, error) {
	cmd := exec.Command(selfExe, "listen", "-channel", channel)
	cmd.Env = append(os.Environ(), nodeURLEnv+"="+url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start bench listen: %w", err)
	}
	r.Close()
	p := &listenProc{cmd: cmd, stdin: w, lines: make(chan string, 64)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = errors.New("bench listen: not listening within 15 s")
	select {
	case l, ok := <-p.lines:
		if ok && l == "R" {
			return p, nil
		}
		err = fmt.Errorf("bench listen: exited or wrote %q before it listened (its stderr says why)", l)
	case <-ctx.Done():
	}
	p.close()
	return nil, err
}

// next returns the stamp of the process's next notification, which must
// carry payload.
func (p *listenProc) next(ctx context.Context, payload string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case l, ok := <-p.lines:
		var mono int64
		var got string
		if !ok {
			return 0, errors.New("bench listen: exited")
		}
		if _, err := fmt.Sscanf(l, "N %d %s", &mono, &got); err != nil || got != payload {
			return 0, fmt.Errorf("bench listen: line %q, want the notification %q", l, payload)
		}
		return mono, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("bench listen: no notification %q within 5 s", payload)
	}
}

// close ends the process (end of stdin) and waits for it.
func (p *listenProc) close() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	for range p.lines {
	}
}
