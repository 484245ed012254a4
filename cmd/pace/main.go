// Command pace shows operators what a fleet's limiters keep in Redis,
// clears a key's state, and serves pace's quota to fleets in any
// language, as a reverse proxy before each upstream (see docs/serve.md).
//
//	pace serve   -upstream URL -limit TEXT [-listen ADDR] [-redis URL]
//	pace serve   -config FILE
//	pace inspect -redis URL [-prefix P] [KEY...]
//	pace watch   -redis URL [-prefix P] [-every 1s] [KEY...]
//	pace inspect -cluster HOST:PORT,HOST:PORT [KEY...]
//	pace reset   -redis URL [-prefix P] [-yes] KEY...
//
// For each key: the kind of each limit, how far ahead its schedule is
// booked, how full each window is, holds in force and until when, the
// bookings given back (gaps), the slots of a cap in flight and the line
// for them; and the fleets' members with their last heartbeat. It scans
// (SCAN, never KEYS), every master of a cluster, and reads each key in
// bounded commands (a count and the first and last members of a set,
// never the whole set; the first KiB of a string), 500 keys a round trip,
// so that Redis is never blocked: 100,000 keys take about a second. Keys
// are quoted; a key whose data is not pace's, or that expired meanwhile,
// says so on its line, and the report goes on. watch refreshes the report
// every second. A KEY names a key as a limiter was given it, a rule's name
// (its keys begin with it) or a host, with or without its port. reset
// lists the Redis keys of the KEYs named, and unlinks them with -yes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "pace:", err)
		os.Exit(2)
	}
}

// A command is one of pace's commands: its line of the usage, and what
// runs it with its arguments, writing its report to out and its usage and
// logs to errOut. Each is in a file of its own.
type command struct {
	name, usage string
	run         func(ctx context.Context, args []string, out, errOut io.Writer) error
}

// commands returns pace's commands (a func: their runs print the usage,
// which lists them).
func commands() []command {
	return []command{
		{"serve", "serve -upstream URL -limit TEXT [-listen ADDR] [-redis URL]   a reverse proxy that paces (or -config FILE)", runServe},
		{"inspect", "inspect -redis URL [-prefix P] [-limit L]... [-json] [KEY...]   what pace keeps in Redis, per key", runInspect},
		{"watch", "watch -redis URL [-prefix P] [-limit L]... [-every D] [KEY...]   the same, again every D", runWatch},
		{"reset", "reset -redis URL [-prefix P] [-yes] KEY...         clear the keys' state (a dry run without -yes)", runReset},
	}
}

// usage lists the commands.
func usage() string {
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, c := range commands() {
		b.WriteString("  pace " + c.usage + "\n")
	}
	b.WriteString("(-cluster HOST:PORT,... instead of -redis for a Redis Cluster; a KEY is a key,\na rule's name, or a host, with or without its port)\n")
	return b.String()
}

// run runs the command of args.
func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	for _, c := range commands() {
		if len(args) > 0 && args[0] == c.name {
			return c.run(ctx, args[1:], out, errOut)
		}
	}
	fmt.Fprint(errOut, usage())
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return fmt.Errorf("want a command: %s", strings.Join(names, ", "))
}

// newFlags returns the flag set of command, whose usage prints the
// commands' and then its flags.
func newFlags(command string, errOut io.Writer) *flag.FlagSet {
	flags := flag.NewFlagSet("pace "+command, flag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.Usage = func() {
		fmt.Fprint(errOut, usage()+"\nflags of pace "+command+":\n")
		flags.PrintDefaults()
	}
	return flags
}

// A redisTarget is the Redis a command reads, from its flags.
type redisTarget struct {
	url, cluster, prefix *string
}

// redisFlags adds the flags that name the Redis to flags.
func redisFlags(flags *flag.FlagSet) redisTarget {
	return redisTarget{
		url:     flags.String("redis", "", "the Redis URL (redis://HOST:PORT/DB)"),
		cluster: flags.String("cluster", "", "the addresses of a Redis Cluster's nodes, separated by commas"),
		prefix:  flags.String("prefix", pace.DefaultPrefix, "the prefix of pace's keys (WithPrefix)"),
	}
}

// connect returns a client of the Redis at t's URL, or of the cluster whose
// nodes it lists.
func (t redisTarget) connect() (redis.UniversalClient, error) {
	switch {
	case (*t.url == "") == (*t.cluster == ""):
		return nil, errors.New("want one of -redis URL and -cluster HOST:PORT,...")
	case *t.cluster != "":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*t.cluster, ",")}), nil
	}
	options, err := redis.ParseURL(*t.url)
	if err != nil {
		return nil, fmt.Errorf("-redis %q: %w", *t.url, err)
	}
	return redis.NewClient(options), nil
}
