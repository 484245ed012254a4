package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A script is one of pace's Lua scripts. Where the server has Redis
// Functions, it runs as one (FCALL), from a library of its own: the
// library defines the prelude's helpers once, when it is loaded, where a
// script (EVALSHA) defines them again at every call, about a quarter of
// Redis's time for a plain booking. Elsewhere (the embedded store, a
// client that cannot call functions) it runs by EVALSHA, as the same text.
type script struct {
	eval *redis.Script
	// fn is the function's name, which carries the library's version (the
	// SHA-1 of all its code: one name, one code), so that the libraries of
	// a rolling deploy's two versions stand side by side; "" for a script
	// that runs by EVALSHA alone.
	fn    string
	fnArg any    // fn, boxed once as a call's argument
	lib   string // the library's code, loaded when Redis has no fn
}

// keyArgs are a call's keys: their names, and the first len(boxed) of
// them boxed as a call's arguments, which a caller that books one key
// again and again keeps, so that a call boxes no name it boxed before.
type keyArgs struct {
	names []string
	boxed []any
}

// newFunction is the script of name whose prelude is the text helpers
// and whose body is body: as a script, the two in turn; as a library, the
// helpers once, and the body as the function, which sets the keys, the
// arguments and the clock the helpers read at each call.
func newFunction(name, helpers, body string) *script {
	text := constants() + helpers + body
	shared := strings.Replace(helpers, clockLines, "local KEYS, ARGV, now\n", 1)
	if shared == helpers {
		panic("store: the prelude of " + name + " does not read the clock as newFunction expects") // a mistake of the build
	}
	sum := sha1.Sum([]byte(constants() + shared + body))
	version := hex.EncodeToString(sum[:6])
	fn := "pace_" + name + "_" + version
	lib := "#!lua name=" + fn + "\n" + constants() + shared +
		"local function body()\n" + body + "\nend\n" +
		"redis.register_function('" + fn + "', function(keys, args)\n" +
		"  KEYS, ARGV = keys, args\n" +
		"  local clock = redis.call('TIME')\n" +
		"  now = clock[1] * 1000000 + clock[2]\n" +
		"  return body()\n" +
		"end)\n"
	return &script{eval: redis.NewScript(text), fn: fn, fnArg: fn, lib: lib}
}

// clockLines are the lines of lua/common.lua that read Redis's clock, at
// each call of a script.
const clockLines = "local clock = redis.call('TIME')\nlocal now = clock[1] * 1000000 + clock[2]\n"

// functionCaller is a client that calls Redis Functions: go-redis's
// Client, ClusterClient and Ring.
type functionCaller interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	FunctionLoad(ctx context.Context, code string) *redis.StringCmd
}

// functions runs scripts as Redis Functions, until Redis says it runs none
// for pace.
type functions struct {
	client functionCaller // nil: scripts run by EVALSHA
	absent atomic.Bool    // Redis runs no function for pace (the embedded store)
}

// run runs s on client: as its function, loading its library when Redis
// has not got it (a new version, a Redis restarted empty); by EVALSHA from
// the first answer that says Redis will not run it (no FCALL, a library
// refused, an ACL), which a server that serves scripts alone gives.
func (f *functions) run(ctx context.Context, client redis.Scripter, s *script, keys keyArgs, args ...any) *redis.Cmd {
	if f.client == nil || s.fn == "" || f.absent.Load() {
		return s.eval.Run(ctx, client, keys.names, args...)
	}
	cmd := f.fcall(ctx, s, keys, args)
	err := cmd.Err()
	if err == nil || !isRedisError(err) || !unrun(err) {
		return cmd
	}
	if strings.Contains(err.Error(), "Function not found") {
		if err = f.load(ctx, s.lib); err == nil {
			return f.fcall(ctx, s, keys, args)
		}
		if !isRedisError(err) || !unrun(err) { // a Redis away, out of memory, loading...
			cmd.SetErr(err)
			return cmd
		}
	}
	f.absent.Store(true)
	return s.eval.Run(ctx, client, keys.names, args...)
}

// fcall calls s's function on keys with args: go-redis's FCall, with the
// names a caller keeps boxed not boxed again.
func (f *functions) fcall(ctx context.Context, s *script, keys keyArgs, args []any) *redis.Cmd {
	call := make([]any, 0, 3+len(keys.names)+len(args))
	call = append(call, "fcall", s.fnArg, len(keys.names))
	call = append(call, keys.boxed...)
	for _, name := range keys.names[len(keys.boxed):] {
		call = append(call, name)
	}
	cmd := redis.NewCmd(ctx, append(call, args...)...)
	if len(keys.names) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = f.client.Process(ctx, cmd)
	return cmd
}

// load loads lib on every server that may run its function: on each
// master of a Cluster, or shard of a Ring, where go-redis would send the
// load to one of them.
func (f *functions) load(ctx context.Context, lib string) error {
	onEach := func(ctx context.Context, c *redis.Client) error { return loadOn(ctx, c, lib) }
	switch c := f.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, onEach)
	case *redis.Ring:
		return c.ForEachShard(ctx, onEach)
	}
	return loadOn(ctx, f.client, lib)
}

// loadOn loads lib with c, unless the server has it already.
func loadOn(ctx context.Context, c functionCaller, lib string) error {
	if err := c.FunctionLoad(ctx, lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	return nil
}

// unrun reports whether err, the answer to FCALL or FUNCTION LOAD, says
// Redis did not run the command at all: it has not got the function, or
// does not know the command (before Redis 7, a store without functions,
// the command renamed away), or will not let pace's user run it, or names
// the command in any other refusal. A function's own error names its
// library, never the command; Redis out of memory or loading names neither.
func unrun(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "function not found") || strings.Contains(msg, "unknown command") ||
		strings.HasPrefix(msg, "noperm") || strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function")
}

// IsScriptCall reports whether a command of the name given (as go-redis
// names it, lower case) runs one of pace's scripts: FCALL, EVALSHA or
// EVAL.
func IsScriptCall(name string) bool { return name == "fcall" || name == "evalsha" || name == "eval" }

// ScriptCounter is a go-redis hook that counts pace's script calls (see
// IsScriptCall): each is one round trip.
type ScriptCounter struct{ Calls atomic.Int64 }

func (s *ScriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *ScriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if IsScriptCall(cmd.Name()) {
			s.Calls.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (s *ScriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
