package pace

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestCheck: Check passes on a real Redis and counts the fleet there (two
// other members beat already: the size is 3 before any request); it
// names the Redis and the cause of a wrong address and of a DB index out
// of range, and confirms that outage, whose event says that Redis has
// never answered and what follows: the first Wait then goes local at once
// (it took 2.5 s to find the wrong address out by itself).
func TestCheck(t *testing.T) {
	besideOthers(t) // mostly waits for dials that fail
	ctx := context.Background()
	c := newTestRedis(t)
	r := mustRedis(t, c, PerSecond(30))
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"host-a:1:x", "host-b:2:y"} {
		c.ZAdd(ctx, r.fleet.key, redis.Z{Score: float64(now.UnixMicro()), Member: other})
	}
	t.Cleanup(func() { c.Del(ctx, r.fleet.key) })
	if err := r.Check(ctx); err != nil {
		t.Fatalf("Check on a Redis that works: %v", err)
	}
	if got := r.fleet.Size(); got != 3 {
		t.Errorf("after Check, the fleet counts %d, want 3: this process and the two that beat", got)
	}

	addr := closedAddr(t)
	for name, tc := range map[string]struct {
		opts      *redis.Options
		want      []string
		unchecked bool // the first Wait finds the outage out
	}{
		"wrong address, unchecked": {&redis.Options{Addr: addr}, nil, true},
		"wrong address":            {&redis.Options{Addr: addr}, []string{"pace: Check: Redis at " + addr + " (DB 0)", "connection refused"}, false},
		"wrong DB":                 {&redis.Options{Addr: c.Options().Addr, DB: 99}, []string{"(DB 99)", "DB index is out of range"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client := redis.NewClient(tc.opts)
			t.Cleanup(func() { client.Close() })
			log := &eventLog{}
			r := mustRedis(t, client, PerSecond(30), WithObserver(log.observe))
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var err error
			if !tc.unchecked {
				err = r.Check(cctx)
			}
			began := time.Now()
			for _, want := range tc.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Check: %v, want an error containing %q", err, want)
				}
			}
			if err := r.Wait(ctx, "k", 1); err != nil {
				t.Fatalf("Wait under FallbackLocal: %v", err)
			}
			if waited := time.Since(began); waited > 500*time.Millisecond && !tc.unchecked {
				t.Errorf("the first Wait after a failed Check took %v: the Check confirmed the outage, and the Wait should go local at once", waited)
			}
			e, fell := log.last(EventFallback)
			if !fell || e.Err == nil || !containsAll(e.Reason, "Redis has never answered this process", "address, database and password", "paces at the whole limit") ||
				strings.Contains(e.Reason, "Check") || strings.Contains(e.Reason, "With") {
				t.Errorf("the first outage: %+v (fell back: %v), want its cause, and a Reason that says Redis never answered and what to check, in no Go names (pace serve logs it)", e, fell)
			}
		})
	}
}

// TestCheckNamesAnOldRedis: a server that runs pace's scripts but answers
// PEXPIRETIME with an error, as a Redis 6 does (a fake that speaks the
// protocol): Check fails, naming the Redis, its version and what it lacks.
func TestCheckNamesAnOldRedis(t *testing.T) {
	addr := fakeRedis(t, "6.2.14")
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	err := mustRedis(t, c, PerSecond(30), WithFleetSize(1)).Check(context.Background())
	t.Logf("Check: %v", err)
	for _, want := range []string{"pace: Check: Redis at " + addr, "Redis 6.2.14 lacks PEXPIRETIME", "unknown command", "Redis 7.0 or later"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check: %v, want an error that says %q", err, want)
		}
	}
}

// fakeRedis serves, on loopback, a server that speaks enough of Redis's
// protocol (RESP2) for a limiter's Check: it runs any script as the check
// script does (it answers Redis's clock), answers INFO with version, and
// every other command, PEXPIRETIME among them, with an error.
func fakeRedis(t *testing.T, version string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go serveFakeRedis(conn, version)
		}
	}()
	return l.Addr().String()
}

// serveFakeRedis answers the commands of one connection (see fakeRedis).
func serveFakeRedis(conn net.Conn, version string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		switch name := strings.ToUpper(args[0]); name {
		case "EVALSHA", "EVAL":
			fmt.Fprintf(conn, ":%d\r\n", time.Now().UnixMicro())
		case "INFO":
			info := "# Server\r\nredis_version:" + version + "\r\n"
			fmt.Fprintf(conn, "$%d\r\n%s\r\n", len(info), info)
		default:
			fmt.Fprintf(conn, "-ERR unknown command '%s', with args beginning with: \r\n", name)
		}
	}
}

// readCommand reads one command (an array of bulk strings) from r.
func readCommand(r *bufio.Reader) ([]string, error) {
	var n int
	if _, err := fmt.Fscanf(r, "*%d\r\n", &n); err != nil || n < 1 || n > 64 {
		return nil, fmt.Errorf("not a command: %v", err)
	}
	args := make([]string, n)
	for i := range args {
		var size int
		if _, err := fmt.Fscanf(r, "$%d\r\n", &size); err != nil || size < 0 || size > 1<<20 {
			return nil, fmt.Errorf("not a bulk string: %v", err)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}
