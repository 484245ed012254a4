package store

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/tiers"
)

// functionScripts are the scripts that run as Redis Functions.
var functionScripts = []*script{reserveScript, quotaScript, refusedScript, refundScript, holdScript, heldScript,
	settleScript, syncScript, slotsScript, lineScript, repayScript, checkScript, announceScript, tokenLeaseScript}

// TestScriptsRunAsFunctions: on a real redis-server every script's library
// loads; a call runs as FCALL (no EVALSHA), loading its library the first
// time; after FUNCTION FLUSH (a Redis restarted empty) the next call loads
// it again; another version's library stands beside it (a rolling
// deploy); and foreign data at a key is still a PACEKEY error.
func TestScriptsRunAsFunctions(t *testing.T) {
	tiers.Full(t)
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	for _, s := range functionScripts {
		if !strings.HasPrefix(s.fn, "pace_") || len(s.lib) == 0 {
			t.Fatalf("a script without a function: %q", s.fn)
		}
		if err := client.FunctionLoad(ctx, s.lib).Err(); err != nil {
			t.Errorf("library %s: %v", s.fn, err)
		}
	}
	if err := client.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls := NewCaller(client, 50*time.Millisecond)
	clock := func(when string) {
		t.Helper()
		if now, err := calls.Run(ctx, checkScript, nil).Int64(); err != nil || now < time.Now().Add(-time.Minute).UnixMicro() {
			t.Fatalf("%s: the check's clock %d, %v", when, now, err)
		}
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clock("first call")
	clock("second call")
	stats, err := redistest.CommandStats(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	if stats["evalsha"].Calls+stats["eval"].Calls != 0 || stats["fcall"].Calls != 3 || stats["function|load"].Calls != 1 {
		t.Errorf("two calls: %d FCALL, %d FUNCTION LOAD, %d EVALSHA, %d EVAL; want 3 FCALL (one not found), one load, no script",
			stats["fcall"].Calls, stats["function|load"].Calls, stats["evalsha"].Calls, stats["eval"].Calls)
	}

	client.FunctionFlush(ctx)
	clock("after FUNCTION FLUSH")

	next := newFunction("check", part("common"), part("check")+"\n-- the next version\n")
	if next.fn == checkScript.fn {
		t.Fatalf("two versions of the check named alike: %s", next.fn)
	}
	if err := calls.Run(ctx, next, nil).Err(); err != nil {
		t.Fatalf("the next version: %v", err)
	}
	clock("beside the next version")
	libs, err := client.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "pace_check_*"}).Result()
	if err != nil || len(libs) != 2 {
		t.Errorf("libraries of the check: %v (%v), want both versions", libs, err)
	}

	client.Set(ctx, "{k}#hold", "soon", 0)
	_, err = calls.Run(ctx, heldScript, []string{"{k}#hold"}).Int64()
	if err == nil || !strings.HasPrefix(err.Error(), keyErrorMarker+"1 ") {
		t.Errorf("foreign data at a hold: %v, want a %s error", err, keyErrorMarker)
	}
}

// TestScriptsWithoutFunctions: where Redis has no functions (the embedded
// store), a script runs by EVALSHA, and FCALL is not asked again.
func TestScriptsWithoutFunctions(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer client.Close()
	runsByScript(t, client)
}

// runsByScript makes two calls of the check through a new Caller of
// client, and holds them to EVALSHA: both answered, FCALL asked once in
// all, and functions known to be unavailable.
func runsByScript(t *testing.T, client *redis.Client) {
	t.Helper()
	fcalls := &fcallCounter{}
	client.AddHook(fcalls)
	calls := NewCaller(client, 50*time.Millisecond)
	for i := range 2 {
		if now, err := calls.Run(context.Background(), checkScript, nil).Int64(); err != nil || now <= 0 {
			t.Fatalf("call %d: %d, %v", i, now, err)
		}
	}
	if n := fcalls.n.Load(); n != 1 || !calls.fn.absent.Load() {
		t.Errorf("two calls asked FCALL %d times, functions given up %v; want once, and given up", n, calls.fn.absent.Load())
	}
}

// fcallCounter is a go-redis hook that counts the FCALLs a client sends.
type fcallCounter struct{ n atomic.Int64 }

func (f *fcallCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *fcallCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			f.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (f *fcallCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestScriptsOnServersWithoutFunctions: a Redis that runs scripts but no
// function of pace's still books, by EVALSHA, asking FCALL no more: FCALL
// or FUNCTION renamed away, or an ACL of pace's user without them.
func TestScriptsOnServersWithoutFunctions(t *testing.T) {
	tiers.Full(t)
	ctx := context.Background()
	for name, c := range map[string]struct {
		server []string
		acl    []any
	}{
		"FCALL renamed away":           {server: []string{"--rename-command", "FCALL", ""}},
		"FUNCTION renamed away":        {server: []string{"--rename-command", "FUNCTION", ""}},
		"an ACL without FCALL":         {acl: []any{"-fcall"}},
		"an ACL without FUNCTION LOAD": {acl: []any{"-function"}},
	} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t, c.server...)
			opts := &redis.Options{Addr: srv.Addr}
			if c.acl != nil {
				setup := append([]any{"ACL", "SETUSER", "pace", "on", ">pw", "~*", "&*", "+@all"}, c.acl...)
				if err := srv.Client(t).Do(ctx, setup...).Err(); err != nil {
					t.Fatal(err)
				}
				opts.Username, opts.Password = "pace", "pw"
			}
			client := redis.NewClient(opts)
			defer client.Close()
			runsByScript(t, client)
		})
	}
}

// TestUnrun: the answers to FCALL and FUNCTION LOAD that say Redis ran
// neither (so a script goes by EVALSHA), as Redis 6 and 7 write them, and
// a function's own errors and Redis's passing states, which are the
// caller's, as Redis 7 writes them.
func TestUnrun(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR Function not found": true,
		"ERR unknown command 'FCALL', with args beginning with: 'pace_reserve_28d28df82be1' '5' ":          true,
		"NOPERM User pace has no permissions to run the 'fcall' command":                                   true,
		"ERR Command is not available: 'FCALL'":                                                            true,
		"ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ":                                true,
		"NOPERM User pace has no permissions to run the 'function|load' command":                           true,
		"PACEKEY 1 holds a value that is not a whole number script: pace_held_0f3c, on @user_function:12.": false,
		"ERR user_function:2: attempt to index local 't' (a nil value) script: errf, on @user_function:2.": false,
		"OOM command not allowed when used memory > 'maxmemory'.":                                          false,
		"BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.":         false,
		"LOADING Redis is loading the dataset in memory":                                                   false,
	} {
		if got := unrun(errors.New(msg)); got != want {
			t.Errorf("unrun(%q) = %v, want %v", msg, got, want)
		}
	}
}

// TestLibraryRefusedForMemory: a library Redis cannot load while it is out
// of memory is that call's error, and functions stay: once memory is free,
// the next call loads it and runs as FCALL.
func TestLibraryRefusedForMemory(t *testing.T) {
	tiers.Full(t)
	ctx := context.Background()
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	client := srv.Client(t)
	if err := client.Set(ctx, "filler", strings.Repeat("x", 4<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	calls := NewCaller(client, 50*time.Millisecond)
	if _, err := calls.Run(ctx, checkScript, nil).Int64(); err == nil || !strings.HasPrefix(err.Error(), "OOM") || calls.fn.absent.Load() {
		t.Fatalf("out of memory: %v, functions given up %v; want the OOM, functions kept", err, calls.fn.absent.Load())
	}
	if err := client.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	client.ConfigResetStat(ctx)
	if _, err := calls.Run(ctx, checkScript, nil).Int64(); err != nil {
		t.Fatalf("memory free again: %v", err)
	}
	if stats, err := redistest.CommandStats(ctx, client); err != nil || stats["fcall"].Calls != 2 || stats["evalsha"].Calls != 0 {
		t.Errorf("memory free again: commandstats %v (%v), want the FCALL not found and the one after the load", stats, err)
	}
}
